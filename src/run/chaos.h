// src/run/chaos.h — when `deloco run` injects chaos (DESIGN.md §4): SIGKILLs and SIGSTOPs of random learners at
// exponentially distributed intervals, and SIGKILLs of the syncer at fixed marks.
//
// Two clocks (docs/cluster.md, "Chaos"):
//  * seconds since the run started: chaos.kill_interval, chaos.stop_interval, chaos.syncer_kill_at;
//  * the run's progress, a fraction of train.steps in [0, 1] (run_progress: the furthest learner's inner step over
//    train.steps, as `deloco run` reads it from the learners' records): chaos.kill_interval_progress and
//    chaos.syncer_kill_at_progress. These hit the same point of a run however fast the machine or the code is, so
//    a demo that got faster still sees its syncer kill mid-run.
//
// Contract
//  * Deterministic by chaos.seed: the same options and the same sequence of calls give the same due marks and the
//    same picks (one std::mt19937_64 draws, in call order, every interval and every pick; the construction draws the
//    first learner kill in seconds, then the first stop, then the first learner kill in progress).
//  * Progress only rises: set_progress keeps the highest value it was given (a restarted learner's records may
//    report a lower step than before). Before the first call it is 0, so a progress mark is never due.
//  * A disabled kind (chaos.enabled false, an interval of 0, no syncer kill marks) is never due. A learner kill in
//    progress that comes due is drawn again from the progress at that moment: however far progress jumped, one
//    kill per due. Pure bookkeeping: this class sends no signals. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "deloco/runtime.h"

namespace deloco::run {

// One syncer kill of the schedule: at `at` seconds after the start, or (by_progress) when the run's progress
// reaches the fraction `at`.
struct ChaosMark {
  double at = 0;
  bool by_progress = false;
  // How the chaos lines name it: "75 s" or "50% of train.steps".
  std::string text() const;
};

class ChaosSchedule {
 public:
  // Draws the first learner kill and stop marks (when enabled) and sorts the syncer kill marks of each clock.
  explicit ChaosSchedule(const ChaosOptions& opts);

  // The run's progress now (a fraction of train.steps; see the contract: only rises).
  void set_progress(double fraction);
  double progress() const { return progress_; }

  // True when a learner kill is due at `now` seconds or at the current progress; the next one of that clock is
  // then drawn: at now + Exp(mean kill_interval), or at progress + Exp(mean kill_interval_progress).
  bool learner_kill_due(double now);
  // True when a learner stop is due at `now`; the next one is then drawn at now + Exp(mean stop_interval).
  bool learner_stop_due(double now);
  // The syncer kill marks reached by `now` seconds or by the current progress and not returned before, one per
  // call: true and *mark set, or false. Each clock's marks come in their order; a seconds mark before a progress
  // mark when both are due.
  bool next_syncer_kill(double now, ChaosMark* mark);
  // Whether next_syncer_kill(now, ...) would return one (without taking it: a kill may wait for its target).
  bool syncer_kill_due(double now) const;
  // A uniform index in [0, n) for n ≥ 1: which of n eligible learners is hit.
  size_t pick(size_t n);

 private:
  double exp_delay(double mean);

  ChaosOptions opts_;
  std::mt19937_64 rng_;
  double progress_ = 0;
  double next_kill_ = -1, next_stop_ = -1, next_kill_progress_ = -1;  // -1: never
  std::vector<double> syncer_kills_at_, syncer_kills_at_progress_;
  size_t next_syncer_kill_ = 0, next_syncer_kill_progress_ = 0;
};

// The run's progress for the schedule: the highest of the learners' inner steps (`learner_steps`, -1: none seen
// yet) over train.steps, clamped to [0, 1]; 0 when no learner reported a step or `steps` ≤ 0.
double run_progress(const std::vector<int64_t>& learner_steps, int64_t steps);

// Whether chaos may still hit a learner at inner step `step` of `steps`: not in its last max(sync_every, steps/20)
// steps, where a kill would only delay the end of the run.
bool chaos_may_hit(int64_t step, int64_t steps, int64_t sync_every);

}  // namespace deloco::run
