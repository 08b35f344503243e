// tests/support/shell.h — run a shell command from a test (the PyTorch references under /usr/bin/python3) and take
// its exit status and output (stdout and stderr together).
#pragma once

#include <cstdio>
#include <string>
#include <utility>

namespace deloco::test {

inline std::pair<int, std::string> shell(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed: " + cmd};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  return {::pclose(p), out};
}

}  // namespace deloco::test
