#include "util/shell.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

namespace deloco {

std::string shell_word(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_./-+:@%,=", c) != nullptr;
  });
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

bool have_program(const std::string& name) {
  return std::system(("command -v " + shell_word(name) + " >/dev/null 2>&1").c_str()) == 0;
}

bool run_gnuplot(const std::string& dir, const std::string& script, bool quiet) {
  const std::string cmd = "cd " + shell_word(dir) + " && gnuplot " + shell_word(script) + (quiet ? " 2>/dev/null" : "");
  return std::system(cmd.c_str()) == 0;
}

}  // namespace deloco
