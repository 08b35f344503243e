// The Syncer's admission of a contribution (deloco/sync.h): counters against the learner's budget, shapes, finite
// values, the norm against the recent ones (outliers); receive() holds what passes for its fragment's round.
#include "deloco/sync.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "sync/sync_internal.h"
#include "wire/quantize.h"

namespace deloco {

namespace {
// The step the syncer credits learner m with when a contribution arrives (Syncer::receive's contract).
int64_t credited_step(int64_t seen, int64_t reported, int64_t total) {
  const int64_t s = std::max(seen, reported);
  return total > 0 ? std::min(s, total) : s;
}
}  // namespace

SyncReject Syncer::check_counters(const Contribution& c) const {
  if (c.c_steps < 0 || c.c_tokens < 0) return SyncReject::kCounterOutOfRange;
  const LearnerBudget& b = budgets_[static_cast<size_t>(c.learner)];
  if (b.tokens_per_step > 0) {
    // c_tokens > c_steps · T, without overflowing the product.
    const bool product_fits = c.c_steps <= std::numeric_limits<int64_t>::max() / b.tokens_per_step;
    if (product_fits && c.c_tokens > c.c_steps * b.tokens_per_step) return SyncReject::kCounterOutOfRange;
  }
  if (b.total_steps > 0) {
    if (c.c_steps > b.total_steps) return SyncReject::kCounterOutOfRange;  // more than the whole run (also keeps the sum small)
    const int64_t s = credited_step(seen_step_[static_cast<size_t>(c.learner)], c.step, b.total_steps);
    const LastAccepted& last = last_[static_cast<size_t>(c.learner)][static_cast<size_t>(c.fragment)];
    const int64_t since =
        opts_.apply == "rebase" ? last.merged : last.base == c.base_version ? last.anchor : last.step;
    if (c.c_steps > (s - since) + kStepSlackPeriods * opts_.sync_every) return SyncReject::kCounterOutOfRange;
  }
  return SyncReject::kNone;
}

const char* sync_reject_name(SyncReject r) {
  switch (r) {
    case SyncReject::kNone: return "";
    case SyncReject::kUnknownFragment: return "unknown_fragment";
    case SyncReject::kUnknownLearner: return "unknown_learner";
    case SyncReject::kWrongTensorCount: return "wrong_tensor_count";
    case SyncReject::kFutureBase: return "future_base";
    case SyncReject::kCounterOutOfRange: return "counter_out_of_range";
    case SyncReject::kWrongShape: return "wrong_shape";
    case SyncReject::kNonFinite: return "non_finite";
    case SyncReject::kNormBound: return "norm_bound";
    case SyncReject::kNormRatio: return "norm_ratio";
    case SyncReject::kNormOutlier: return "norm_outlier";
    case SyncReject::kMergeNonFinite: return "merge_non_finite";
    case SyncReject::kMergeFailed: return "merge_failed";
  }
  return "unknown";
}

bool refusal_drops_drift(SyncReject reason) {
  return reason == SyncReject::kNormBound || reason == SyncReject::kNormRatio || reason == SyncReject::kNormOutlier;
}

namespace {
// ‖Δ‖ per inner step of the contribution (a push of no steps counts as one).
double per_step_norm(double norm, int64_t c_steps) { return norm / static_cast<double>(std::max<int64_t>(1, c_steps)); }
}  // namespace

SyncReject Syncer::check(const Contribution& c, double* norm, Held* measured) const {
  if (c.fragment < 0 || c.fragment >= static_cast<int64_t>(fragments_.size())) return SyncReject::kUnknownFragment;
  if (c.learner < 0 || c.learner >= opts_.learners) return SyncReject::kUnknownLearner;
  const size_t p = static_cast<size_t>(c.fragment);
  const Fragment& f = fragments_[p];
  const bool encoded = c.encoded.defined();
  if (encoded ? !c.deltas.empty() : c.deltas.size() != f.names.size()) return SyncReject::kWrongTensorCount;
  if (c.base_version < 0 || c.base_version > rounds_[p].version) return SyncReject::kFutureBase;
  const SyncReject counters = check_counters(c);
  if (counters != SyncReject::kNone) return counters;
  measured->sumsq.assign(f.names.size(), 0.0);
  measured->amax = 0;
  if (encoded) {
    // Held in its wire encoding: the element count is the shape; the norms come from the encoded blocks.
    if (c.encoded.elements != elements_[p]) return SyncReject::kWrongShape;
    std::vector<size_t> ends;
    size_t end = 0;
    for (const auto& n : f.names) ends.push_back(end += static_cast<size_t>(global_[index_.at(n)].second.numel()));
    try {
      const int threads = static_cast<int>(opts_.merge_threads > 0 ? opts_.merge_threads : at::get_num_threads());
      FloatScan scan = scan_floats(c.encoded.data, c.encoded.bytes, c.encoded.encoding,
                                   static_cast<size_t>(c.encoded.elements), ends, threads);
      measured->sumsq = std::move(scan.sumsq);
      measured->amax = scan.amax;
    } catch (const NonFiniteError&) {
      return SyncReject::kNonFinite;
    } catch (const WireError&) {  // a payload that does not match the layout (size, a malformed block)
      return SyncReject::kWrongShape;
    }
  } else {
    for (size_t i = 0; i < f.names.size(); ++i) {
      const at::Tensor& t = c.deltas[i];
      if (!t.defined() || t.sizes() != global_[index_.at(f.names[i])].second.sizes()) return SyncReject::kWrongShape;
    }
    for (size_t i = 0; i < f.names.size(); ++i) measured->sumsq[i] = sync_detail::squared_norm(c.deltas[i]);
  }
  double sq = 0;
  for (double x : measured->sumsq) sq += x;
  const double n = std::sqrt(sq);
  *norm = n;
  if (!std::isfinite(n)) return SyncReject::kNonFinite;
  if (opts_.max_delta_norm > 0 && n > opts_.max_delta_norm) return SyncReject::kNormBound;
  if (opts_.max_delta_ratio > 0) {
    const double scale = std::max(theta_norm_[p], std::sqrt(static_cast<double>(elements_[p])) * kDeltaRmsFloor);
    if (n > opts_.max_delta_ratio * scale) return SyncReject::kNormRatio;
  }
  // The outlier bound compares norms per inner step the push covers: after a partition a learner's next push carries
  // all its steps since its last accepted one (c_steps), and its drift grows at most linearly with them.
  const auto& recent = recent_norms_[p];
  if (opts_.max_delta_outlier > 0 && static_cast<int64_t>(recent.size()) >= opts_.delta_warmup) {
    std::vector<double> v(recent);
    auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    if (*mid > 0 && per_step_norm(n, c.c_steps) > opts_.max_delta_outlier * *mid)
      return SyncReject::kNormOutlier;  // a zero median bounds nothing
  }
  return SyncReject::kNone;
}

SyncReject Syncer::receive(double now, Contribution c) {
  double norm = 0;
  Held held;
  const SyncReject why = check(c, &norm, &held);
  if (c.learner >= 0 && c.learner < opts_.learners) {  // the highest step heard, whatever became of the push
    auto& seen = seen_step_[static_cast<size_t>(c.learner)];
    seen = credited_step(seen, c.step, budgets_[static_cast<size_t>(c.learner)].total_steps);
  }
  if (why != SyncReject::kNone) {
    ++rejected_[sync_reject_name(why)];
    return why;
  }
  if (c.step_time > 0 && std::isfinite(c.step_time)) {  // (a non-finite one would pin the grace window at its cap)
    stats_.step.add(c.step_time, opts_.ema);
    learner_step_[static_cast<size_t>(c.learner)].add(c.step_time, opts_.ema);
  }
  const int64_t learner = c.learner, fragment = c.fragment;
  const size_t p = static_cast<size_t>(fragment);
  LastAccepted& last = last_[static_cast<size_t>(learner)][p];
  if (last.base != c.base_version) last.anchor = last.step;  // a new base: its counter started after that push
  last.step = seen_step_[static_cast<size_t>(learner)];
  last.base = c.base_version;
  auto& recent = recent_norms_[p];
  if (static_cast<int64_t>(recent.size()) < opts_.delta_window) {
    recent.push_back(per_step_norm(norm, c.c_steps));
  } else {
    recent[recent_next_[p]] = per_step_norm(norm, c.c_steps);
    recent_next_[p] = (recent_next_[p] + 1) % recent.size();
  }
  Round& r = rounds_[p];
  if (r.waiting.empty()) r.first_arrival = now;
  auto& fl = floor_[static_cast<size_t>(learner)][p];
  fl = std::max(fl, c.base_version);  // it will never again reference an older version of this fragment
  prune_history(fragment);            // (which may free a version before the next merge needs the memory)
  if (!c.encoded.defined()) {
    for (const auto& t : c.deltas)
      if (t.numel() > 0) held.amax = std::max(held.amax, t.abs().max().item<double>());
  }
  held.c = std::move(c);
  held.credited = last.step;
  r.waiting[learner] = std::move(held);
  mark_quorum(now, fragment);
  return SyncReject::kNone;
}

}  // namespace deloco
