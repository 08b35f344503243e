// `deloco config keys` and `deloco config presets`: what a config can say, read from the bindings themselves, so
// that scripts (scripts/science.py) check their keys and read the presets' rates instead of copying them.
#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "deloco/algorithm.h"
#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "deloco/merge.h"
#include "deloco/runtime.h"
#include "deloco/sim.h"
#include "goodput/goodput.h"

namespace deloco::cli {
namespace {

// The keys of every command that reads a config, bound as the command binds them (defaults before any file).
const std::vector<std::string> kCommands = {"train", "sim", "run", "merge", "goodput"};

nlohmann::json keys_of(const std::string& command) {
  ConfigSchema schema;
  if (command == "train") {
    RunConfig run;
    run.bind(schema);
    return schema.describe();
  }
  if (command == "sim") {
    RunConfig run;
    SimConfig sim;
    run.bind(schema);
    sim.bind(schema);
    return schema.describe();
  }
  if (command == "run") {
    RuntimeConfig cfg;
    cfg.bind(schema);
    return schema.describe();
  }
  if (command == "merge") {
    MergeConfig merge;
    merge.bind(schema, MergeConfig::Use::kCheckpoints);
    return schema.describe();
  }
  GoodputParams p;
  bind_goodput_config(schema, p);
  return schema.describe();
}

// Every key of `commands`, each once with the commands that take it; value → default. NaN (outer.lr before its
// preset) is null in JSON.
nlohmann::json list_keys(const std::vector<std::string>& commands) {
  nlohmann::json out = nlohmann::json::array();
  std::map<std::string, size_t> at;
  for (const auto& c : commands) {
    for (auto k : keys_of(c)) {
      const std::string key = k["key"];
      if (auto it = at.find(key); it != at.end()) {
        out[it->second]["commands"].push_back(c);
        continue;
      }
      k["default"] = std::move(k["value"]);
      k.erase("value");
      k["commands"] = nlohmann::json::array({c});
      at[key] = out.size();
      out.push_back(std::move(k));
    }
  }
  return out;
}

std::string text_of(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>().empty() ? "\"\"" : v.get<std::string>();
  if (v.is_array()) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + text_of(x);
    return s;
  }
  return v.is_null() ? "-" : v.dump();
}

nlohmann::json presets_json() {
  nlohmann::json presets = nlohmann::json::array();
  for (const auto& p : algorithm_presets()) {
    nlohmann::json rules = nlohmann::json::array();
    for (const auto& r : p.plan.rules) rules.push_back({{"pattern", r.pattern}, {"method", r.method}});
    presets.push_back({{"name", p.name},
                       {"merge", {{"method", p.plan.method}, {"rules", rules}, {"vector_method", p.plan.vector_method}}},
                       {"outer", {{"kind", p.outer.kind}, {"lr", p.outer.lr}, {"momentum", p.outer.momentum}}},
                       {"inner", p.inner}});
  }
  return {{"presets", presets}, {"merge_methods", merger_names()}, {"merge_plans", merge_plan_names()}};
}

}  // namespace

void add_config_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("config", "list the config keys, or the merge.preset table (for scripts: --json)");
  cmd->require_subcommand(1);

  struct KeysArgs {
    std::string command;
    bool json = false;
  };
  auto ka = std::make_shared<KeysArgs>();
  CLI::App* keys = cmd->add_subcommand("keys", "every config key: type, default, commands that take it, meaning");
  keys->add_option("--for", ka->command, "only the keys of this command (run: also syncer and learner)")
      ->check(CLI::IsMember(kCommands));
  keys->add_flag("--json", ka->json, "a JSON array of {key, type, default, help, commands}");
  keys->callback([ka] {
    const nlohmann::json list = list_keys(ka->command.empty() ? kCommands : std::vector<std::string>{ka->command});
    if (ka->json) {
      std::cout << list.dump(2) << "\n";
      return;
    }
    for (const auto& k : list) {
      std::string cmds;
      for (const auto& c : k["commands"]) cmds += (cmds.empty() ? "" : ",") + c.get<std::string>();
      std::cout << std::left << std::setw(32) << k["key"].get<std::string>() << " " << std::setw(13)
                << k["type"].get<std::string>() << " " << std::setw(12) << text_of(k["default"]) << " ["
                << cmds << "] " << k["help"].get<std::string>() << "\n";
    }
  });

  auto pjson = std::make_shared<bool>(false);
  CLI::App* presets = cmd->add_subcommand("presets", "the merge.preset table: inner optimizer, merge plan, outer optimizer, eta, mu");
  presets->add_flag("--json", *pjson, "a JSON object {presets: [{name, merge, outer, inner}], merge_methods, merge_plans}");
  presets->callback([pjson] {
    const nlohmann::json j = presets_json();
    if (*pjson) {
      std::cout << j.dump(2) << "\n";
      return;
    }
    std::cout << std::left << std::setw(11) << "preset" << std::setw(7) << "inner" << std::setw(10) << "outer"
              << std::setw(6) << "eta" << std::setw(5) << "mu" << "merge\n";
    for (const auto& p : j["presets"]) {
      std::string merge = p["merge"]["method"];
      std::map<std::string, std::string> by_method;  // rules grouped by method: "mean for *embed* *wte*"
      for (const auto& r : p["merge"]["rules"]) {
        std::string& pats = by_method[r["method"].get<std::string>()];
        pats += (pats.empty() ? "" : " ") + r["pattern"].get<std::string>();
      }
      for (const auto& [m, pats] : by_method) merge += "; " + m + " for " + pats;
      std::ostringstream eta, mu;
      eta << p["outer"]["lr"].get<double>();
      mu << p["outer"]["momentum"].get<double>();
      std::cout << std::setw(11) << p["name"].get<std::string>() << std::setw(7) << p["inner"].get<std::string>()
                << std::setw(10) << p["outer"]["kind"].get<std::string>()
                << std::setw(6) << eta.str() << std::setw(5) << mu.str() << merge << "\n";
    }
  });
}

}  // namespace deloco::cli
