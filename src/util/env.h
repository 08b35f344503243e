// src/util/env.h — reading deloco's environment variables, one way everywhere.
//
// Contract
//  * environment_string(name, fallback): the variable's value when it is set and not empty, else `fallback`. An
//    empty variable counts as unset, so `X= deloco ...` never overrides a config value with nothing.
//  * environment_integer_in(name, fallback, lo, hi): the variable as a whole decimal integer in [lo, hi], or
//    `fallback` when it is unset or empty. Anything else (text, trailing characters, out of range) throws
//    ConfigError naming the variable, its value and, when [lo, hi] is narrower than int64, the range.
//    deloco/runtime.h's environment_integer is this over the whole int64 range.
#pragma once

#include <cstdint>
#include <string>

namespace deloco {

std::string environment_string(const char* name, const std::string& fallback = {});
int64_t environment_integer_in(const char* name, int64_t fallback, int64_t lo, int64_t hi);

}  // namespace deloco
