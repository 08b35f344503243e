#include "util/env.h"

#include <cstdlib>
#include <limits>
#include <stdexcept>

#include "deloco/config.h"

namespace deloco {

std::string environment_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::string(v);
}

int64_t environment_integer_in(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const std::string v = environment_string(name);
  if (v.empty()) return fallback;
  const bool whole_range = lo == std::numeric_limits<int64_t>::min() && hi == std::numeric_limits<int64_t>::max();
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
    if (x < lo || x > hi) throw std::out_of_range(v);
    return x;
  } catch (const std::exception&) {
    throw ConfigError(std::string(name) + "='" + v + "' is not an integer" +
                      (whole_range ? std::string() : " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"));
  }
}

}  // namespace deloco
