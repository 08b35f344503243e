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
//  * load_config() is the one load order of every command that reads a config (the CLI, the embedded learner of
//    deloco/embed.h, `deloco merge`, `deloco goodput`): file, environment, --set, flags; later wins.
//  * Not thread-safe; configure once at start-up, then read the structs.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "deloco/error.h"

namespace deloco {

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
  // written comma-separated ("goodput.chips=1000,2000"). Errors begin with `origin` (where the override came
  // from: "--set", "DELOCO_SET", "--chips '1,x'") and name the key.
  void apply_override(const std::string& assignment, const std::string& origin = "--set");
  // Runs every `check`; throws ConfigError listing the first failure.
  void validate() const;

  bool has(const std::string& key) const;
  // Whether a config file, an override or from_json gave `key` a value (rather than its bound default): for a
  // default that depends on the rest of the config (`deloco run` on a testbed fits its codecs, net.encoding = auto).
  bool assigned(const std::string& key) const { return assigned_.count(key) > 0; }
  // The current values as a nested JSON object {"section": {"key": value}} (used in manifests and summaries).
  nlohmann::json to_json() const;
  // Loads values from JSON produced by to_json(); unknown keys throw (used when resuming a checkpoint).
  void from_json(const nlohmann::json& j, const std::string& origin);
  // Every bound key in binding order: [{"key", "type" ("integer" | "number" | "boolean" | "string" |
  // "integer list" | "number list"), "value" (the field's current value: its default before any load), "help"}].
  nlohmann::json describe() const;

 private:
  struct Entry {
    std::string key;
    Field field;
    std::string help;
    std::function<std::string()> check;
  };
  const Entry* find(const std::string& key) const;
  std::vector<Entry> entries_;
  std::set<std::string> assigned_;
};

// ---- The load order ------------------------------------------------------------------------------------------
// Where a command's configuration comes from, in the order load_config() applies it; every stage is optional.
struct ConfigSources {
  // 1. The base: the config file, or the command's starting point without one (the demo config, a checkpoint's
  //    manifest); empty: the bound defaults.
  std::function<void()> base;
  // 2. The environment: first the command's own variables (`deloco syncer`/`learner`: DELOCO_SYNCER,
  //    DELOCO_SECRET_KEY, ...), then every override of DELOCO_SET (environment_sets()).
  std::function<void()> environment;
  // 3. The overrides: first the flags that are another spelling of a key (`deloco goodput --chips 1,2`: pairs of
  //    origin for errors, e.g. "--chips '1,2'", and "goodput.chips=1,2"), then every --set in order.
  std::vector<std::pair<std::string, std::string>> key_flags;
  std::vector<std::string> sets;
  // 4. The command's own flags (--connect, --bind, `deloco merge --method`), which win over everything.
  std::function<void()> flags;
};
// Applies `sources` to `schema` in that order, then runs schema.validate(). Throws ConfigError naming the origin
// (file, DELOCO_SET, --set, flag) and the key.
void load_config(ConfigSchema& schema, const ConfigSources& sources);
// The overrides of DELOCO_SET: one "section.key=value" a line (empty lines skipped); none when it is unset or empty.
std::vector<std::string> environment_sets();

}  // namespace deloco
