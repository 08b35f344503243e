// The chaos schedule of `deloco run` (contract in chaos.h).
#include "run/chaos.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace deloco::run {

std::string ChaosMark::text() const {
  std::ostringstream o;
  if (by_progress)
    o << std::setprecision(3) << at * 100 << "% of train.steps";
  else
    o << std::fixed << std::setprecision(0) << at << " s";
  return o.str();
}

ChaosSchedule::ChaosSchedule(const ChaosOptions& opts) : opts_(opts), rng_(static_cast<uint64_t>(opts.seed)) {
  if (!opts_.enabled) return;
  if (opts_.kill_interval > 0) next_kill_ = exp_delay(opts_.kill_interval);
  if (opts_.stop_interval > 0) next_stop_ = exp_delay(opts_.stop_interval);
  if (opts_.kill_interval_progress > 0) next_kill_progress_ = exp_delay(opts_.kill_interval_progress);
  syncer_kills_at_ = opts_.syncer_kill_at;
  std::sort(syncer_kills_at_.begin(), syncer_kills_at_.end());
  syncer_kills_at_progress_ = opts_.syncer_kill_at_progress;
  std::sort(syncer_kills_at_progress_.begin(), syncer_kills_at_progress_.end());
}

double ChaosSchedule::exp_delay(double mean) { return std::exponential_distribution<double>(1.0 / mean)(rng_); }

void ChaosSchedule::set_progress(double fraction) { progress_ = std::max(progress_, fraction); }

bool ChaosSchedule::learner_kill_due(double now) {
  if (next_kill_ >= 0 && now >= next_kill_) {
    next_kill_ = now + exp_delay(opts_.kill_interval);
    return true;
  }
  if (next_kill_progress_ >= 0 && progress_ >= next_kill_progress_) {
    next_kill_progress_ = progress_ + exp_delay(opts_.kill_interval_progress);
    return true;
  }
  return false;
}

bool ChaosSchedule::learner_stop_due(double now) {
  if (next_stop_ < 0 || now < next_stop_) return false;
  next_stop_ = now + exp_delay(opts_.stop_interval);
  return true;
}

bool ChaosSchedule::next_syncer_kill(double now, ChaosMark* mark) {
  if (next_syncer_kill_ < syncer_kills_at_.size() && now >= syncer_kills_at_[next_syncer_kill_]) {
    *mark = {syncer_kills_at_[next_syncer_kill_++], false};
    return true;
  }
  if (next_syncer_kill_progress_ < syncer_kills_at_progress_.size() &&
      progress_ >= syncer_kills_at_progress_[next_syncer_kill_progress_]) {
    *mark = {syncer_kills_at_progress_[next_syncer_kill_progress_++], true};
    return true;
  }
  return false;
}

bool ChaosSchedule::syncer_kill_due(double now) const {
  return (next_syncer_kill_ < syncer_kills_at_.size() && now >= syncer_kills_at_[next_syncer_kill_]) ||
         (next_syncer_kill_progress_ < syncer_kills_at_progress_.size() &&
          progress_ >= syncer_kills_at_progress_[next_syncer_kill_progress_]);
}

size_t ChaosSchedule::pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

double run_progress(const std::vector<int64_t>& learner_steps, int64_t steps) {
  if (steps <= 0) return 0;
  int64_t furthest = 0;
  for (int64_t s : learner_steps) furthest = std::max(furthest, s);
  return std::min(1.0, static_cast<double>(furthest) / static_cast<double>(steps));
}

bool chaos_may_hit(int64_t step, int64_t steps, int64_t sync_every) {
  const int64_t margin = std::max<int64_t>(sync_every, steps / 20);
  return step < steps - margin;
}

}  // namespace deloco::run
