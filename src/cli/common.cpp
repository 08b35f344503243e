#include "common.h"

#include <iostream>

#include <nlohmann/json.hpp>

#include "deloco/fs.h"

namespace deloco::cli {

void add_common_options(CLI::App* sub, CommonOptions* opts, bool with_config) {
  if (with_config) sub->add_option("--config", opts->config_path, "TOML config file (see configs/)");
  sub->add_option("--set", opts->sets, "override a config key: --set section.key=value (repeatable)");
  sub->add_option("--summary", opts->summary_path, "write a JSON summary of the results to FILE");
}

void apply_config(ConfigSchema& schema, const CommonOptions& opts) {
  if (!opts.config_path.empty()) schema.load_file(opts.config_path);
  for (const auto& s : opts.sets) schema.apply_override(s);
  schema.validate();
}

void write_summary(const CommonOptions& opts, const nlohmann::json& summary) {
  if (opts.summary_path.empty()) return;
  write_file_atomic(opts.summary_path, summary.dump(2) + "\n");
  std::cerr << "summary written to " << opts.summary_path << "\n";
}

}  // namespace deloco::cli
