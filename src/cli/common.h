// src/cli/common.h — options every subcommand shares: --config, --set, --summary.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include "deloco/config.h"

namespace deloco::cli {

struct CommonOptions {
  std::string config_path;          // --config F (TOML)
  std::vector<std::string> sets;    // --set section.key=value (repeatable)
  std::string summary_path;         // --summary FILE (JSON of results)
};

// Adds --config (when `with_config`), --set and --summary to `sub`, storing into `opts` (which must outlive it).
void add_common_options(CLI::App* sub, CommonOptions* opts, bool with_config = true);
// What a command starts from when no --config is given: the defaults bound in the code (train, sim, goodput), or
// the built-in demo config (run, syncer, learner: configs/demo.toml compiled in, see demo_config.h).
enum class NoConfig { kBoundDefaults, kDemo };
// Loads opts.config_path into `schema` (or, without one, the demo config when `fallback` is kDemo).
void load_base_config(ConfigSchema& schema, const CommonOptions& opts, NoConfig fallback);
// The one load order (deloco/config.h's load_config): load_base_config, then the environment (`environment`, the
// command's own variables, then DELOCO_SET), then every --set, then `flags` (the command's own options), then
// validates. Every command that reads a config calls this.
void apply_config(ConfigSchema& schema, const CommonOptions& opts, NoConfig fallback = NoConfig::kBoundDefaults,
                  std::function<void()> environment = nullptr, std::function<void()> flags = nullptr);
// Whether this command runs the built-in demo config (no --config, and the command falls back to the demo).
inline bool runs_demo(const CommonOptions& opts, NoConfig fallback) {
  return opts.config_path.empty() && fallback == NoConfig::kDemo;
}
// The run folder of a new run: `configured` when set, else "runs/<config stem or fallback_stem>-<YYYYmmdd-HHMMSS>".
// Throws ConfigError when that folder exists and is not empty (nothing is ever overwritten); `hint` ends the message.
std::string new_run_dir(const std::string& configured, const CommonOptions& opts, const std::string& fallback_stem,
                        const std::string& hint);
// The program as the user invoked it (argv[0], e.g. "./build/deloco"; "deloco" when it came from PATH), for the
// commands a run prints. main() records it.
void set_program(const char* argv0);
std::string self_command();
// Sets libtorch's intra-op threads: `threads`, or one per core when 0.
void configure_threads(int64_t threads);
// Writes `summary` to opts.summary_path atomically when one was given, and says where on stderr.
void write_summary(const CommonOptions& opts, const nlohmann::json& summary);

}  // namespace deloco::cli
