// Helpers shared by the libFuzzer targets that work on real files: a scratch folder per fuzzer process and the one
// way a target reports a broken property (a message on stderr, then abort(), which libFuzzer records as a crash
// with the input that caused it).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace deloco::fuzz {

// Prints "<target>: property violated: <what> <detail>" and aborts.
[[noreturn]] inline void property_violated(const char* target, const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "%s: property violated: %s %s\n", target, what, detail.c_str());
  std::abort();
}

// A folder under /tmp made on the first call (name: /tmp/deloco-<stem>-XXXXXX) and removed, with everything in it,
// when the process exits. The same folder on every call; aborts when it cannot be made.
inline std::filesystem::path scratch_folder(const char* stem) {
  static const std::string path = [stem] {
    std::string templ = std::string("/tmp/deloco-") + stem + "-XXXXXX";
    if (!::mkdtemp(templ.data())) std::abort();
    return templ;
  }();
  static const bool cleanup = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    });
    return true;
  }();
  (void)cleanup;
  return std::filesystem::path(path);
}

}  // namespace deloco::fuzz
