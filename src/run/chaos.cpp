// The chaos schedule of `deloco run` (contract in chaos.h).
#include "run/chaos.h"

#include <algorithm>

namespace deloco::run {

ChaosSchedule::ChaosSchedule(const ChaosOptions& opts) : opts_(opts), rng_(static_cast<uint64_t>(opts.seed)) {
  if (!opts_.enabled) return;
  if (opts_.kill_interval > 0) next_kill_ = exp_delay(opts_.kill_interval);
  if (opts_.stop_interval > 0) next_stop_ = exp_delay(opts_.stop_interval);
  syncer_kills_at_ = opts_.syncer_kill_at;
  std::sort(syncer_kills_at_.begin(), syncer_kills_at_.end());
}

double ChaosSchedule::exp_delay(double mean) { return std::exponential_distribution<double>(1.0 / mean)(rng_); }

bool ChaosSchedule::learner_kill_due(double now) {
  if (next_kill_ < 0 || now < next_kill_) return false;
  next_kill_ = now + exp_delay(opts_.kill_interval);
  return true;
}

bool ChaosSchedule::learner_stop_due(double now) {
  if (next_stop_ < 0 || now < next_stop_) return false;
  next_stop_ = now + exp_delay(opts_.stop_interval);
  return true;
}

bool ChaosSchedule::next_syncer_kill(double now, double* at) {
  if (next_syncer_kill_ >= syncer_kills_at_.size() || now < syncer_kills_at_[next_syncer_kill_]) return false;
  *at = syncer_kills_at_[next_syncer_kill_++];
  return true;
}

bool ChaosSchedule::syncer_kill_due(double now) const {
  return next_syncer_kill_ < syncer_kills_at_.size() && now >= syncer_kills_at_[next_syncer_kill_];
}

size_t ChaosSchedule::pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

bool chaos_may_hit(int64_t step, int64_t steps, int64_t sync_every) {
  const int64_t margin = std::max<int64_t>(sync_every, steps / 20);
  return step < steps - margin;
}

}  // namespace deloco::run
