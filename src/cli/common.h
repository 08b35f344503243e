// src/cli/common.h — options every subcommand shares: --config, --set, --summary.
#pragma once

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
// Loads opts.config_path (if set) into `schema`, applies every --set, then validates.
void apply_config(ConfigSchema& schema, const CommonOptions& opts);
// The run folder of a new run: `configured` when set, else "runs/<config stem or fallback_stem>-<YYYYmmdd-HHMMSS>".
// Throws ConfigError when that folder exists and is not empty (nothing is ever overwritten); `hint` ends the message.
std::string new_run_dir(const std::string& configured, const CommonOptions& opts, const std::string& fallback_stem,
                        const std::string& hint);
// Sets libtorch's intra-op threads: `threads`, or one per core when 0.
void configure_threads(int64_t threads);
// Writes `summary` to opts.summary_path atomically when one was given, and says where on stderr.
void write_summary(const CommonOptions& opts, const nlohmann::json& summary);

}  // namespace deloco::cli
