// src/cli/demo_config.h — the built-in demo config: configs/demo.toml compiled into the binary (CMakeLists.txt,
// cmake/embed_text.cmake). `deloco run`, `deloco syncer` and `deloco learner` start from it when no --config is
// given, so the bare `deloco run` is the README's main job from any directory.
#pragma once

#include <string>

namespace deloco::cli {

extern const char* const kDemoConfigToml;
inline constexpr const char* kDemoConfigOrigin = "the built-in demo config (configs/demo.toml)";

// The demo's corpus path (`data.path`, relative) when it does not exist under the working directory: the same
// path under the source tree this binary was built from, when it exists there; otherwise `path` unchanged (and
// loading the corpus then fails naming it).
std::string demo_data_path(const std::string& path);

// The source tree this binary was built from (CMake's source folder, compiled into demo_config.cpp); it may have
// moved or gone since. `deloco run` takes the testbed script from there when the testbed's state file names none.
const char* build_source_tree();

}  // namespace deloco::cli
