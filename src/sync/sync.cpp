// The algorithm core: fragments, weights, grace window, quorum decisions and the syncer (README: Algorithm options).
#include "deloco/sync.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <torch/torch.h>

#include "deloco/config.h"

namespace deloco {

void SyncOptions::validate() const {
  auto fail = [](const std::string& m) { throw SyncError("invalid sync options: " + m); };
  const bool auto_m = learners == 0 && learners_auto_ok;  // resolved later to one learner per core
  if (learners < 1 && !auto_m) fail("sync.learners must be ≥ 1 (got " + std::to_string(learners) + ")");
  if (quorum < 1 || (!auto_m && quorum > learners))
    fail("sync.quorum K must be in [1, sync.learners=" + std::to_string(learners) + "] (got " +
         std::to_string(quorum) + ")");
  if (fragments < 1) fail("sync.fragments must be ≥ 1 (got " + std::to_string(fragments) + ")");
  if (sync_every < 1) fail("sync.sync_every H must be ≥ 1 (got " + std::to_string(sync_every) + ")");
  if (overlap < 0 || overlap >= sync_every)
    fail("sync.overlap τ must be in [0, sync.sync_every H=" + std::to_string(sync_every) + ") (got " +
         std::to_string(overlap) + ")");
  if (!(grace_gamma >= 0)) fail("sync.grace_gamma must be ≥ 0");
  if (!(grace_cap >= 0)) fail("sync.grace_cap must be ≥ 0");
  if (!(ema >= 0 && ema < 1)) fail("sync.ema must be in [0, 1)");
  if (weighting != "token" && weighting != "uniform") fail("sync.weighting must be token or uniform (got '" + weighting + "')");
  if (delta_anchor != "global" && delta_anchor != "base")
    fail("sync.delta_anchor must be global or base (got '" + delta_anchor + "')");
  if (!(alpha >= 0 && alpha < 1)) fail("sync.alpha must be in [0, 1)");
  if (!(max_delta_norm >= 0) || !std::isfinite(max_delta_norm)) fail("sync.max_delta_norm must be finite and ≥ 0");
  if (!(max_delta_ratio >= 0) || !std::isfinite(max_delta_ratio))
    fail("sync.max_delta_ratio must be finite and ≥ 0 (0 = off)");
  if (!(max_delta_outlier >= 0) || !std::isfinite(max_delta_outlier))
    fail("sync.max_delta_outlier must be finite and ≥ 0 (0 = off)");
  if (delta_window < 1) fail("sync.delta_window must be ≥ 1 (got " + std::to_string(delta_window) + ")");
  if (delta_warmup < 1 || delta_warmup > delta_window)
    fail("sync.delta_warmup must be in [1, sync.delta_window=" + std::to_string(delta_window) + "] (got " +
         std::to_string(delta_warmup) + ")");
  if (!(max_share > 0 && max_share <= 1)) fail("sync.max_share must be in (0, 1] (1 = off)");
}

void SyncOptions::bind(ConfigSchema& s) {
  auto check = [this] {
    try {
      validate();
    } catch (const SyncError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  s.bind("sync.learners", &learners, "M: number of learners", check);
  s.bind("sync.quorum", &quorum, "K: minimum contributions per merge");
  s.bind("sync.fragments", &fragments, "P: number of parameter fragments");
  s.bind("sync.sync_every", &sync_every, "H: inner steps between two sends of a fragment");
  s.bind("sync.overlap", &overlap, "tau: inner steps between sending a fragment and applying the answer");
  s.bind("sync.wait_for_answer", &wait_for_answer, "learners block at send+tau until the answer came");
  s.bind("sync.grace", &grace, "adaptive grace window after the quorum");
  s.bind("sync.grace_gamma", &grace_gamma, "gamma: fraction of the slack used as grace");
  s.bind("sync.grace_cap", &grace_cap, "hard cap on the grace window (seconds)");
  s.bind("sync.ema", &ema, "decay of the moving averages of step, quorum and sync times");
  s.bind("sync.weighting", &weighting, "token | uniform");
  s.bind("sync.delta_anchor", &delta_anchor, "global | base");
  s.bind("sync.alpha", &alpha, "learner apply: theta <- (1-alpha) Theta + alpha theta");
  s.bind("sync.max_delta_norm", &max_delta_norm, "reject contributions with a larger delta norm (0 = off)");
  s.bind("sync.max_delta_ratio", &max_delta_ratio,
         "reject a delta whose norm exceeds this multiple of the fragment's norm (0 = off)");
  s.bind("sync.max_delta_outlier", &max_delta_outlier,
         "reject a delta whose norm per inner step exceeds this multiple of the median of the fragment's recent ones "
         "(0 = off)");
  s.bind("sync.delta_window", &delta_window,
         "accepted delta norms (per inner step) per fragment the outlier median is taken over");
  s.bind("sync.delta_warmup", &delta_warmup, "accepted delta norms needed before the outlier bound applies");
  s.bind("sync.max_share", &max_share, "cap on one contribution's share of a merge, in (0, 1] (1 = off)");
}

double contribution_weight(const std::string& mode, int64_t c_tokens, int64_t c_steps) {
  if (mode == "uniform") return 1.0;
  if (mode != "token") throw SyncError("unknown weighting '" + mode + "' (token, uniform)");
  if (c_steps <= 0) return 0.0;
  const double t = static_cast<double>(c_tokens);
  return t * (t / static_cast<double>(c_steps));
}

std::vector<double> cap_shares(std::vector<double> w, double cap) {
  const size_t n = w.size();
  if (n == 0 || cap >= 1) return w;
  const double c = std::max(cap, 1.0 / static_cast<double>(n));
  std::vector<bool> capped(n, false);
  for (size_t round = 0; round < n; ++round) {
    double excess = 0;
    for (size_t i = 0; i < n; ++i)
      if (!capped[i] && w[i] > c) {
        excess += w[i] - c;
        w[i] = c;
        capped[i] = true;
      }
    if (excess <= 0) break;
    double free_sum = 0;
    size_t free_n = 0;
    for (size_t i = 0; i < n; ++i)
      if (!capped[i]) free_sum += w[i], ++free_n;
    if (free_n == 0) break;  // every weight at the cap (n · c ≥ 1 leaves no excess but rounding)
    for (size_t i = 0; i < n; ++i)
      if (!capped[i]) w[i] += free_sum > 0 ? excess * (w[i] / free_sum) : excess / static_cast<double>(free_n);
  }
  return w;
}

double grace_window(const GraceStats& s, const SyncOptions& o) {
  if (!o.grace) return 0.0;
  const double slack = static_cast<double>(o.overlap) * s.step.value - (s.quorum.value + s.sync.value);
  return std::min(o.grace_cap, std::max(0.0, o.grace_gamma * slack));
}

int64_t effective_quorum(const RoundState& s, const SyncOptions& o) {
  return std::max<int64_t>(1, std::min(o.quorum, o.learners - s.retired));
}

RoundDecision decide_round(double now, const RoundState& s, const SyncOptions& o, double grace) {
  RoundDecision d;
  if (s.arrivals == 0 || s.arrivals < effective_quorum(s, o)) return d;  // below the quorum: wait for arrivals
  if (s.connected > 0 && s.connected_arrived >= s.connected) {
    d.kind = RoundDecision::kMerge;  // nobody else can come
    return d;
  }
  if (!o.grace || grace <= 0) {
    d.kind = RoundDecision::kMerge;
    return d;
  }
  const double deadline = s.quorum_time + grace;
  if (now >= deadline) {
    d.kind = RoundDecision::kMerge;
  } else {
    d.kind = RoundDecision::kWaitUntil;
    d.until = deadline;
  }
  return d;
}

void apply_global(at::Tensor& local, const at::Tensor& global, double alpha) {
  torch::NoGradGuard ng;
  if (alpha == 0.0) {
    local.copy_(global);
  } else {
    local.mul_(alpha).add_(global.to(local.dtype()), 1.0 - alpha);
  }
}

// ---- Syncer ---------------------------------------------------------------------------------------------

Syncer::Syncer(const SyncOptions& opts, std::vector<Fragment> fragments,
               const std::vector<std::pair<std::string, at::Tensor>>& global, const MergePlan& plan,
               const OuterOptions& outer)
    : opts_(opts), fragments_(std::move(fragments)), selector_(plan), outer_(make_outer_optimizer(outer)) {
  opts_.validate();
  torch::NoGradGuard ng;
  for (const auto& [name, t] : global) {
    index_[name] = global_.size();
    global_.emplace_back(name, t.detach().clone());
  }
  for (const auto& f : fragments_)
    for (const auto& n : f.names)
      if (!index_.count(n)) throw SyncError("fragment " + std::to_string(f.id) + " names unknown tensor '" + n + "'");
  rounds_.resize(fragments_.size());
  history_.resize(fragments_.size());
  connected_.assign(static_cast<size_t>(opts_.learners), true);
  retired_.assign(static_cast<size_t>(opts_.learners), false);
  floor_.assign(static_cast<size_t>(opts_.learners), std::vector<int64_t>(fragments_.size(), 0));
  theta_norm_.assign(fragments_.size(), 0.0);
  elements_.assign(fragments_.size(), 0);
  for (size_t f = 0; f < fragments_.size(); ++f) {
    for (const auto& n : fragments_[f].names) elements_[f] += global_tensor(n).numel();
    theta_norm_[f] = fragment_norm(static_cast<int64_t>(f));
  }
  recent_norms_.assign(fragments_.size(), {});
  recent_next_.assign(fragments_.size(), 0);
  budgets_.assign(static_cast<size_t>(opts_.learners), LearnerBudget{});
  seen_step_.assign(static_cast<size_t>(opts_.learners), 0);
  last_.assign(static_cast<size_t>(opts_.learners), std::vector<LastAccepted>(fragments_.size()));
}

void Syncer::set_budget(int64_t learner, const LearnerBudget& budget) {
  if (learner < 0 || learner >= opts_.learners)
    throw SyncError("set_budget: learner " + std::to_string(learner) + " is not in [0, " +
                    std::to_string(opts_.learners) + ")");
  if (budget.tokens_per_step < 0 || budget.total_steps < 0)
    throw SyncError("set_budget: learner " + std::to_string(learner) + ": negative tokens per step or total steps");
  budgets_[static_cast<size_t>(learner)] = budget;
}

namespace {
// Σ x² over a tensor in double: finite for every finite float input (3.4e38² ≈ 1.2e77), NaN/Inf for a NaN/Inf.
double squared_norm(const at::Tensor& t) { return t.to(torch::kDouble).pow(2).sum().item<double>(); }
}  // namespace

double Syncer::fragment_norm(int64_t fragment) const {
  double sq = 0;
  for (const auto& n : fragments_.at(static_cast<size_t>(fragment)).names) sq += squared_norm(global_[index_.at(n)].second);
  return std::sqrt(sq);
}

void Syncer::retire(double now, int64_t learner) {
  retired_.at(static_cast<size_t>(learner)) = true;
  connected_.at(static_cast<size_t>(learner)) = false;
  for (size_t f = 0; f < rounds_.size(); ++f) {
    // A lowered quorum reached now starts its grace window now, as after a K-th arrival.
    mark_quorum(now, static_cast<int64_t>(f));
    prune_history(static_cast<int64_t>(f));
  }
}

bool Syncer::stalled() const {
  for (size_t f = 0; f < rounds_.size(); ++f) {
    RoundState s = round_state(static_cast<int64_t>(f));
    if (s.arrivals > 0 && s.arrivals < effective_quorum(s, opts_)) return true;
  }
  return false;
}

void Syncer::set_connected(int64_t learner, bool c) { connected_.at(static_cast<size_t>(learner)) = c; }

void Syncer::note_joined(int64_t learner) {
  auto& fl = floor_.at(static_cast<size_t>(learner));
  for (size_t f = 0; f < rounds_.size(); ++f) {
    fl[f] = rounds_[f].version;
    prune_history(static_cast<int64_t>(f));
  }
}

void Syncer::prune_history(int64_t fragment) {
  auto& h = history_.at(static_cast<size_t>(fragment));
  if (h.empty()) return;
  int64_t lowest = rounds_[static_cast<size_t>(fragment)].version;
  for (size_t m = 0; m < floor_.size(); ++m)
    if (!retired_[m]) lowest = std::min(lowest, floor_[m][static_cast<size_t>(fragment)]);
  h.erase(h.begin(), h.lower_bound(lowest));
  // A learner that went silent without retiring pins its version; bound the memory (its next contribution, if
  // any, is then anchored at the current Θ_p and counted in stale_bases()).
  const size_t cap = 2 * floor_.size() + 8;
  while (h.size() > cap) h.erase(h.begin());
}

at::Tensor& Syncer::global_tensor(const std::string& name) { return global_[index_.at(name)].second; }

std::vector<at::Tensor> Syncer::fragment_tensors(int64_t fragment) const {
  std::vector<at::Tensor> out;
  for (const auto& n : fragments_.at(static_cast<size_t>(fragment)).names) out.push_back(global_[index_.at(n)].second);
  return out;
}

std::vector<int64_t> Syncer::versions() const {
  std::vector<int64_t> v;
  for (const auto& r : rounds_) v.push_back(r.version);
  return v;
}

void Syncer::restore(const std::map<std::string, at::Tensor>& global,
                     const std::map<std::string, at::Tensor>& outer_state, const std::vector<int64_t>& versions,
                     int64_t merged) {
  if (versions.size() != rounds_.size())
    throw SyncError("checkpoint has " + std::to_string(versions.size()) + " fragment versions, the syncer has " +
                    std::to_string(rounds_.size()) + " fragments (sync.fragments changed?)");
  if (global.size() != global_.size())
    throw SyncError("checkpoint has " + std::to_string(global.size()) + " tensors, the model has " +
                    std::to_string(global_.size()));
  for (const auto& [name, t] : global_) {
    auto it = global.find(name);
    if (it == global.end()) throw SyncError("checkpoint lacks tensor '" + name + "'");
    if (it->second.sizes() != t.sizes() || it->second.scalar_type() != t.scalar_type())
      throw SyncError("checkpoint tensor '" + name + "' has another shape or dtype than the model's");
  }
  // A non-finite global or outer state would be broadcast to every learner and break the next merge: refuse it.
  for (const auto& [name, t] : global_)
    if (!torch::isfinite(global.at(name)).all().item<bool>())
      throw SyncError("checkpoint tensor '" + name + "' holds NaN or Inf values: refusing to resume from a poisoned "
                      "model (resume from an earlier checkpoint, or start afresh)");
  for (const auto& [key, t] : outer_state)
    if (t.defined() && at::isFloatingType(t.scalar_type()) && !torch::isfinite(t).all().item<bool>())
      throw SyncError("checkpoint outer-optimizer tensor '" + key + "' holds NaN or Inf values: refusing to resume "
                      "from a poisoned state (resume from an earlier checkpoint, or start afresh)");
  try {
    outer_->load_state(outer_state);
  } catch (const OuterError& e) {
    throw SyncError(std::string("checkpoint outer-optimizer state: ") + e.what());
  }
  torch::NoGradGuard ng;
  for (auto& [name, t] : global_) t.copy_(global.at(name));
  for (size_t i = 0; i < rounds_.size(); ++i) {
    rounds_[i] = Round();
    rounds_[i].version = versions[i];
    theta_norm_[i] = fragment_norm(static_cast<int64_t>(i));
    recent_norms_[i].clear();
    recent_next_[i] = 0;
  }
  for (auto& h : history_) h.clear();
  for (auto& fl : floor_)
    for (size_t i = 0; i < fl.size(); ++i) fl[i] = versions[i];
  std::fill(seen_step_.begin(), seen_step_.end(), 0);
  for (auto& l : last_) std::fill(l.begin(), l.end(), LastAccepted{});
  merged_ = merged;
}

int64_t Syncer::rejected_contributions() const {
  int64_t n = 0;
  for (const auto& [k, v] : rejected_) n += v;
  return n;
}

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
    const int64_t since = last.base == c.base_version ? last.anchor : last.step;
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

SyncReject Syncer::check(const Contribution& c, double* norm) const {
  if (c.fragment < 0 || c.fragment >= static_cast<int64_t>(fragments_.size())) return SyncReject::kUnknownFragment;
  if (c.learner < 0 || c.learner >= opts_.learners) return SyncReject::kUnknownLearner;
  const size_t p = static_cast<size_t>(c.fragment);
  const Fragment& f = fragments_[p];
  if (c.deltas.size() != f.names.size()) return SyncReject::kWrongTensorCount;
  if (c.base_version < 0 || c.base_version > rounds_[p].version) return SyncReject::kFutureBase;
  const SyncReject counters = check_counters(c);
  if (counters != SyncReject::kNone) return counters;
  for (size_t i = 0; i < f.names.size(); ++i) {
    const at::Tensor& t = c.deltas[i];
    if (!t.defined() || t.sizes() != global_[index_.at(f.names[i])].second.sizes()) return SyncReject::kWrongShape;
  }
  double sq = 0;
  for (const auto& t : c.deltas) sq += squared_norm(t);
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
  const SyncReject why = check(c, &norm);
  if (c.learner >= 0 && c.learner < opts_.learners) {  // the highest step heard, whatever became of the push
    auto& seen = seen_step_[static_cast<size_t>(c.learner)];
    seen = credited_step(seen, c.step, budgets_[static_cast<size_t>(c.learner)].total_steps);
  }
  if (why != SyncReject::kNone) {
    ++rejected_[sync_reject_name(why)];
    return why;
  }
  if (c.step_time > 0) stats_.step.add(c.step_time, opts_.ema);
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
  r.waiting[learner] = std::move(c);
  mark_quorum(now, fragment);
  return SyncReject::kNone;
}

void Syncer::mark_quorum(double now, int64_t fragment) {
  Round& r = rounds_.at(static_cast<size_t>(fragment));
  if (r.quorum_time >= 0 || r.waiting.empty()) return;
  if (static_cast<int64_t>(r.waiting.size()) < effective_quorum(round_state(fragment), opts_)) return;
  r.quorum_time = now;
  stats_.quorum.add(now - r.first_arrival, opts_.ema);
}

RoundState Syncer::round_state(int64_t fragment) const {
  const Round& r = rounds_.at(static_cast<size_t>(fragment));
  RoundState s;
  s.arrivals = static_cast<int64_t>(r.waiting.size());
  for (size_t m = 0; m < connected_.size(); ++m) {
    if (!connected_[m]) continue;
    ++s.connected;
    if (r.waiting.count(static_cast<int64_t>(m))) ++s.connected_arrived;
  }
  for (bool x : retired_) s.retired += x ? 1 : 0;
  s.first_arrival = r.first_arrival;
  s.quorum_time = r.quorum_time;
  return s;
}

RoundDecision Syncer::decide(double now, int64_t fragment) const {
  return decide_round(now, round_state(fragment), opts_, grace());
}

MergeOutcome Syncer::merge(int64_t fragment) {
  Round& r = rounds_.at(static_cast<size_t>(fragment));
  if (r.waiting.empty()) throw SyncError("merge of fragment " + std::to_string(fragment) + " with no contributions");
  const Fragment& f = fragments_[static_cast<size_t>(fragment)];
  MergeOutcome out;
  out.fragment = fragment;
  std::vector<double> w;
  for (const auto& [m, c] : r.waiting) {
    out.learners.push_back(m);
    w.push_back(contribution_weight(opts_.weighting, c.c_tokens, c.c_steps));
  }
  double wsum = std::accumulate(w.begin(), w.end(), 0.0);
  if (!(wsum > 0) || !std::isfinite(wsum)) std::fill(w.begin(), w.end(), 1.0), wsum = static_cast<double>(w.size());
  for (double& x : w) x /= wsum;
  w = cap_shares(std::move(w), opts_.max_share);
  out.weights = w;
  torch::NoGradGuard ng;
  auto& hist = history_[static_cast<size_t>(fragment)];
  // Θ_p and the outer state before the step: the rollback point, and (anchor global) the version being replaced,
  // which stays available while some learner may still hold it. The buffers are handles (never changed in place).
  std::vector<at::Tensor> before, buffers;
  for (const auto& n : f.names) {
    before.push_back(global_tensor(n).clone());
    buffers.push_back(outer_->buffer(n));
  }
  double sq = 0;
  int64_t stale = 0;
  try {
    for (size_t i = 0; i < f.names.size() && out.ok(); ++i) {
      const std::string& name = f.names[i];
      at::Tensor& theta = global_tensor(name);
      MergeInput in;
      in.name = name;
      in.weights = w;
      in.round = static_cast<uint64_t>(r.version + 1);  // random methods (dare) draw fresh masks every outer step
      for (const auto& [m, c] : r.waiting) {
        // θ_m = Θ^v − Δ̂. Anchor base: Δ_m = Θ^v − θ_m = Δ̂. Anchor global: Δ_m = Θ − θ_m = Δ̂ + (Θ − Θ^v).
        if (opts_.delta_anchor == "base" || c.base_version == r.version) {
          in.deltas.push_back(c.deltas[i]);
          continue;
        }
        auto it = hist.find(c.base_version);
        if (it == hist.end()) {
          if (i == 0) ++stale;
          in.deltas.push_back(c.deltas[i]);
        } else {
          in.deltas.push_back(c.deltas[i] + (theta - it->second[i]));
        }
      }
      at::Tensor merged = selector_.select(name, theta.dim()).merge(in);
      const double msq = merged.to(torch::kDouble).pow(2).sum().item<double>();
      if (!std::isfinite(msq)) {
        out.rejected = SyncReject::kMergeNonFinite;
        out.detail = "the merged outer gradient of '" + name + "' holds NaN or Inf";
        break;
      }
      sq += msq;
      outer_->step(name, theta, merged);
      const at::Tensor buf = outer_->buffer(name);
      if (!torch::isfinite(theta).all().item<bool>() || (buf.defined() && !torch::isfinite(buf).all().item<bool>())) {
        out.rejected = SyncReject::kMergeNonFinite;
        out.detail = "the outer step made '" + name + "' (or its momentum) NaN or Inf";
      }
    }
  } catch (const std::exception& e) {  // a merge method or the outer step refused these inputs
    out.rejected = SyncReject::kMergeFailed;
    out.detail = e.what();
  }
  const int64_t n = static_cast<int64_t>(r.waiting.size());
  r.waiting.clear();
  r.quorum_time = -1;
  if (!out.ok()) {
    // Roll back: Θ_p and the momentum exactly as before; version, history, counters untouched.
    for (size_t i = 0; i < f.names.size(); ++i) {
      global_tensor(f.names[i]).copy_(before[i]);
      outer_->set_buffer(f.names[i], buffers[i]);
    }
    rejected_[sync_reject_name(out.rejected)] += n;
    out.version = r.version;
    return out;
  }
  out.delta_norm = std::sqrt(sq);
  merged_ += n;
  stale_bases_ += stale;
  if (opts_.delta_anchor != "base") hist[r.version] = std::move(before);
  out.version = ++r.version;
  prune_history(fragment);
  theta_norm_[static_cast<size_t>(fragment)] = fragment_norm(fragment);
  return out;
}

RoundResult Syncer::on_round(double now, int64_t fragment) {
  RoundResult r;
  r.decision = decide(now, fragment);
  if (r.decision.kind == RoundDecision::kMerge) merge_round(now, fragment, &r);
  return r;
}

std::vector<RoundResult> Syncer::drain(double now) {
  std::vector<RoundResult> out;
  for (int64_t p = 0; p < static_cast<int64_t>(rounds_.size()); ++p) {
    if (pending(p) == 0) continue;
    RoundResult r;
    r.decision.kind = RoundDecision::kMerge;  // whatever the quorum: nobody can send again
    merge_round(now, p, &r);
    out.push_back(std::move(r));
  }
  return out;
}

void Syncer::merge_round(double now, int64_t fragment, RoundResult* r) {
  const double qt = quorum_time(fragment);
  r->grace = grace();
  r->grace_wait = qt >= 0 ? now - qt : 0.0;
  r->outcome = merge(fragment);
  if (!r->outcome.ok()) return;
  r->flat = torch::empty({elements_[static_cast<size_t>(fragment)]}, torch::kFloat);
  flatten_into(fragment_tensors(fragment), r->flat.data_ptr<float>());
}

}  // namespace deloco
