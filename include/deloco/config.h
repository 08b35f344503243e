// deloco/config.h — typed configuration: TOML files plus `--set section.key=value` overrides.
//
// Contract
//  * A ConfigSchema binds dotted keys ("train.lr") to fields of caller-owned structs. The structs must outlive
//    the schema; the schema never allocates the fields and never copies them.
//  * Loading a TOML file or applying an override writes straight into the bound field. Any key that is not
//    bound, any value of the wrong type (an integer key given 1.5, a bool given "yes"), or a malformed override
//    throws ConfigError whose message names the file (or "--set") and the key. Numbers must be finite: inf, -inf
//    and nan (TOML and strtod accept them) are refused for every number key and list, by the binder itself, so no
//    key's own check has to remember it. A failed load leaves earlier
//    fields as they were: values are parsed and checked first and written only when the whole file is valid.
//  * Not thread-safe; configure once at start-up, then read the structs.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "deloco/error.h"

namespace deloco {

// Thrown for every user-facing configuration problem. what() is a complete sentence for the terminal.
class ConfigError : public Error {
 public:
  using Error::Error;
};

class ConfigSchema {
 public:
  using Field = std::variant<int64_t*, double*, bool*, std::string*, std::vector<int64_t>*,
                             std::vector<double>*>;

  // Binds `key` ("section.name") to `field`. `help` documents the key beside its binding. A key may be bound once.
  // `check`, when given, validates the final value and returns an error message ("" when valid).
  void bind(const std::string& key, Field field, std::string help,
            std::function<std::string()> check = nullptr);

  // Reads a TOML file. Throws ConfigError naming the file for a syntax error, an unknown key or a wrong type.
  void load_file(const std::string& path);
  // Parses a TOML document held in memory; `origin` names it in errors.
  void load_string(const std::string& toml_text, const std::string& origin);
  // Applies one "section.key=value" override. The value is parsed by the bound field's type; lists are
  // written comma-separated ("goodput.chips=1000,2000").
  void apply_override(const std::string& assignment);
  // Runs every `check`; throws ConfigError listing the first failure.
  void validate() const;

  bool has(const std::string& key) const;
  // The current values as a nested JSON object {"section": {"key": value}} (used in manifests and summaries).
  nlohmann::json to_json() const;
  // Loads values from JSON produced by to_json(); unknown keys throw (used when resuming a checkpoint).
  void from_json(const nlohmann::json& j, const std::string& origin);

 private:
  struct Entry {
    std::string key;
    Field field;
    std::string help;
    std::function<std::string()> check;
  };
  const Entry* find(const std::string& key) const;
  std::vector<Entry> entries_;
};

}  // namespace deloco
