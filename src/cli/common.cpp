#include "common.h"
#include "demo_config.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <thread>

#include <ATen/Parallel.h>

#include <nlohmann/json.hpp>

#include "util/fs.h"

namespace deloco::cli {

void add_common_options(CLI::App* sub, CommonOptions* opts, bool with_config) {
  if (with_config) sub->add_option("--config", opts->config_path, "TOML config file (see configs/)");
  sub->add_option("--set", opts->sets, "override a config key: --set section.key=value (repeatable)");
  sub->add_option("--summary", opts->summary_path, "write a JSON summary of the results to FILE");
}

void load_base_config(ConfigSchema& schema, const CommonOptions& opts, NoConfig fallback) {
  if (!opts.config_path.empty()) {
    schema.load_file(opts.config_path);
  } else if (fallback == NoConfig::kDemo) {
    schema.load_string(kDemoConfigToml, kDemoConfigOrigin);
    const std::string path = schema.to_json()["data"]["path"].get<std::string>();
    const std::string found = demo_data_path(path);
    if (found != path) schema.apply_override("data.path=" + found);
  }
}

void apply_config(ConfigSchema& schema, const CommonOptions& opts, NoConfig fallback,
                  std::function<void()> environment, std::function<void()> flags) {
  ConfigSources src;
  src.base = [&] { load_base_config(schema, opts, fallback); };
  src.environment = std::move(environment);
  src.sets = opts.sets;
  src.flags = std::move(flags);
  load_config(schema, src);
}

std::string new_run_dir(const std::string& configured, const CommonOptions& opts, const std::string& fallback_stem,
                        const std::string& hint) {
  namespace fs = std::filesystem;
  std::string dir = configured;
  if (dir.empty()) {
    std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
    const std::string stem = opts.config_path.empty() ? fallback_stem : fs::path(opts.config_path).stem().string();
    dir = "runs/" + stem + "-" + stamp;
  }
  if (fs::exists(dir) && !fs::is_empty(dir))
    throw ConfigError("run folder '" + dir + "' already exists and is not empty; " + hint);
  return dir;
}

namespace {
std::string& program() {
  static std::string p = "deloco";
  return p;
}
}  // namespace

void set_program(const char* argv0) {
  if (argv0 != nullptr && std::strchr(argv0, '/') != nullptr) program() = argv0;
}

std::string self_command() { return program(); }

void configure_threads(int64_t threads) {
  at::set_num_threads(threads > 0 ? static_cast<int>(threads)
                                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

void write_summary(const CommonOptions& opts, const nlohmann::json& summary) {
  if (opts.summary_path.empty()) return;
  write_file_atomic(opts.summary_path, summary.dump(2) + "\n");
  std::cerr << "summary written to " << opts.summary_path << "\n";
}

}  // namespace deloco::cli
