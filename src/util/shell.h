// src/util/shell.h — the few shell commands deloco runs itself (gnuplot for charts), and quoting for the commands it
// prints for the user to paste.
//
// Contract
//  * shell_word(s): `s` as one POSIX shell word: unchanged when it holds only characters that need no quoting
//    (letters, digits, _ . / - + : @ % , =), else single-quoted with every ' written as '\''. Never empty ('').
//  * have_program(name): whether `name` is on PATH (`command -v`).
//  * run_gnuplot(dir, script): runs `gnuplot SCRIPT` inside `dir` (the scripts name their data and output files
//    relative to it); gnuplot's stderr is discarded when `quiet`. Returns whether it exited 0.
#pragma once

#include <string>

namespace deloco {

std::string shell_word(const std::string& s);
bool have_program(const std::string& name);
bool run_gnuplot(const std::string& dir, const std::string& script, bool quiet);

}  // namespace deloco
