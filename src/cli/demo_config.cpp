// The built-in demo config (see demo_config.h).
#include "demo_config.h"

#include <filesystem>
#include <system_error>

namespace deloco::cli {

const char* const kDemoConfigToml =
#include "demo_config.inc"
    ;

std::string demo_data_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (p.empty() || p.is_absolute() || fs::exists(p, ec)) return path;
  const fs::path in_tree = fs::path(DELOCO_SOURCE_TREE) / p;
  return fs::exists(in_tree, ec) ? in_tree.string() : path;
}

const char* build_source_tree() { return DELOCO_SOURCE_TREE; }

}  // namespace deloco::cli
