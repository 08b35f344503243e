// util/clock.h — the wall clock as every record and report shows it.
//
// Contract: unix_now() is the system clock in seconds since the Unix epoch (the "t" of every JSON-lines metrics
// record, comparable across processes on one machine); it may jump with the system clock, so measure intervals
// with std::chrono::steady_clock instead. format_duration() is pure. Both are thread-safe.
#pragma once

#include <string>

namespace deloco {

// Seconds since the Unix epoch, with sub-second resolution.
double unix_now();

// A duration for people: whole seconds (truncated; negative and NaN count as 0) written "45s", "1m58s" (seconds
// two digits) or "2h05m" (minutes two digits, no seconds).
std::string format_duration(double seconds);

}  // namespace deloco
