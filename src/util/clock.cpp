// The wall clock and duration text (contract in src/util/clock.h).
#include "util/clock.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iomanip>
#include <sstream>

namespace deloco {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string format_duration(double s) {
  const int64_t t = static_cast<int64_t>(std::max(0.0, s));
  std::ostringstream o;
  if (t >= 3600) o << t / 3600 << "h" << std::setw(2) << std::setfill('0') << (t % 3600) / 60 << "m";
  else if (t >= 60) o << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else o << t << "s";
  return o.str();
}

}  // namespace deloco
