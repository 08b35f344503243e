// src/run/chaos.h — when `deloco run` injects chaos (DESIGN.md §4): SIGKILLs and SIGSTOPs of random learners at
// exponentially distributed intervals, and SIGKILLs of the syncer at fixed times.
//
// Contract
//  * Deterministic by chaos.seed: the same options and the same sequence of calls give the same due times and
//    the same picks (one std::mt19937_64 draws, in call order, every interval and every pick).
//  * Times are seconds since the run started. A disabled kind (chaos.enabled false, an interval of 0, no syncer
//    kill times) is never due. Pure bookkeeping: this class sends no signals. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "deloco/runtime.h"

namespace deloco::run {

class ChaosSchedule {
 public:
  // Draws the first learner kill and stop times (when enabled) and sorts the syncer kill times.
  explicit ChaosSchedule(const ChaosOptions& opts);

  // True when a learner kill is due at `now`; the next one is then drawn at now + Exp(mean kill_interval).
  bool learner_kill_due(double now);
  // True when a learner stop is due at `now`; the next one is then drawn at now + Exp(mean stop_interval).
  bool learner_stop_due(double now);
  // The syncer kill times up to `now` not returned before, one per call, in order: true and *at set, or false.
  bool next_syncer_kill(double now, double* at);
  // Whether next_syncer_kill(now, ...) would return one (without taking it: a kill may wait for its target).
  bool syncer_kill_due(double now) const;
  // A uniform index in [0, n) for n ≥ 1: which of n eligible learners is hit.
  size_t pick(size_t n);

 private:
  double exp_delay(double mean);

  ChaosOptions opts_;
  std::mt19937_64 rng_;
  double next_kill_ = -1, next_stop_ = -1;  // -1: never
  std::vector<double> syncer_kills_at_;
  size_t next_syncer_kill_ = 0;
};

// Whether chaos may still hit a learner at inner step `step` of `steps`: not in its last max(sync_every, steps/20)
// steps, where a kill would only delay the end of the run.
bool chaos_may_hit(int64_t step, int64_t steps, int64_t sync_every);

}  // namespace deloco::run
