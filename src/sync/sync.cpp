// The algorithm core: fragments, weights, grace window, quorum decisions and the syncer (README: Algorithm options).
#include "deloco/sync.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "deloco/config.h"
#include "sync/fused_merge.h"
#include "wire/quantize.h"

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
  if (staleness != "none" && staleness != "poly" && staleness != "exp")
    fail("sync.staleness must be none, poly or exp (got '" + staleness + "')");
  if (!(staleness_exponent > 0) || !std::isfinite(staleness_exponent))
    fail("sync.staleness_exponent must be finite and > 0");
  if (dynamic_local_updates && wait_for_answer && quorum > 1 && fragments > 1)
    fail("sync.dynamic_local_updates with sync.wait_for_answer, sync.quorum > 1 and sync.fragments > 1 can "
         "deadlock: learners on different periods push the fragments in different orders, and each waits for a round "
         "the other has not reached (set sync.fragments = 1, sync.quorum = 1 or sync.wait_for_answer = false)");
  if (!(max_share > 0 && max_share <= 1)) fail("sync.max_share must be in (0, 1] (1 = off)");
  if (merge_threads < 0) fail("sync.merge_threads must be ≥ 0 (0 = the process's compute threads)");
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
  s.bind("sync.staleness", &staleness,
         "staleness-aware weights: none | poly ((1+k)^-a) | exp (e^(-a k)), k = merges since the contribution's base");
  s.bind("sync.staleness_exponent", &staleness_exponent, "a of sync.staleness (> 0)");
  s.bind("sync.dynamic_local_updates", &dynamic_local_updates,
         "each learner's H scales with its measured speed: H_m = H * fastest step time / its step time");
  s.bind("sync.max_share", &max_share, "cap on one contribution's share of a merge, in (0, 1] (1 = off)");
  s.bind("sync.fused_merge", &fused_merge,
         "merge mean/rda fragments in one cache-blocked pass from the pushes' wire payloads (false: the general path)");
  s.bind("sync.merge_threads", &merge_threads,
         "threads of the syncer's fused merge (0 = the process's compute threads)");
}

double contribution_weight(const std::string& mode, int64_t c_tokens, int64_t c_steps) {
  if (mode == "uniform") return 1.0;
  if (mode != "token") throw SyncError("unknown weighting '" + mode + "' (token, uniform)");
  if (c_steps <= 0) return 0.0;
  const double t = static_cast<double>(c_tokens);
  return t * (t / static_cast<double>(c_steps));
}

int64_t Syncer::local_updates(int64_t learner) const {
  const int64_t H = opts_.sync_every;
  if (!opts_.dynamic_local_updates || learner < 0 || learner >= opts_.learners) return H;
  const Ema& mine = learner_step_[static_cast<size_t>(learner)];
  if (!mine.seeded) return H;
  double fastest = mine.value;
  for (size_t m = 0; m < learner_step_.size(); ++m)
    if (learner_step_[m].seeded && !retired_[m]) fastest = std::min(fastest, learner_step_[m].value);
  return std::max(opts_.overlap + 1, dynamic_sync_every(H, fastest, mine.value));
}

double staleness_scale(const std::string& mode, double exponent, int64_t k) {
  const double x = static_cast<double>(std::max<int64_t>(0, k));
  if (mode == "none") return 1.0;
  if (mode == "poly") return std::pow(1.0 + x, -exponent);
  if (mode == "exp") return std::exp(-exponent * x);
  throw SyncError("unknown staleness mode '" + mode + "' (none, poly, exp)");
}

int64_t dynamic_sync_every(int64_t H, double fastest, double step_time) {
  if (!(fastest > 0) || !(step_time > 0) || !std::isfinite(fastest) || !std::isfinite(step_time)) return H;
  const double h = std::round(static_cast<double>(H) * fastest / step_time);
  return std::clamp<int64_t>(static_cast<int64_t>(h), 1, H);
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
    global_.emplace_back(name, t.detach());  // the caller's: replaced by our own copy below
  }
  for (const auto& f : fragments_)
    for (const auto& n : f.names)
      if (!index_.count(n)) throw SyncError("fragment " + std::to_string(f.id) + " names unknown tensor '" + n + "'");
  // Θ_p of each fp32 CPU fragment as one flat buffer its tensors view; every other tensor its own copy.
  const size_t P = fragments_.size();
  flat_.assign(P, at::Tensor());
  fusable_.assign(P, false);
  theta_amax_.assign(P, -1.0);
  buf_amax_.assign(P, -1.0);
  spare_.assign(P, at::Tensor());
  std::vector<bool> owned(global_.size(), false);
  for (size_t f = 0; f < P; ++f) {
    bool flat_ok = true, fuse_ok = plan.options.compute_dtype == at::kFloat;
    int64_t total = 0;
    for (const auto& n : fragments_[f].names) {
      const size_t i = index_.at(n);
      const at::Tensor& t = global_[i].second;
      if (owned[i] || t.scalar_type() != at::kFloat || !t.device().is_cpu()) flat_ok = false;
      const std::string method = selector_.select(n, t.dim()).name();
      if (method != "mean" && method != "rda") fuse_ok = false;
      total += t.numel();
    }
    if (!flat_ok) continue;
    at::Tensor flat = torch::empty({total}, torch::kFloat);
    int64_t off = 0;
    for (const auto& n : fragments_[f].names) {
      const size_t i = index_.at(n);
      const int64_t k = global_[i].second.numel();
      flat.narrow(0, off, k).copy_(global_[i].second.reshape({-1}));
      off += k;
      owned[i] = true;
    }
    install(static_cast<int64_t>(f), flat);
    fusable_[f] = fuse_ok;
  }
  for (size_t i = 0; i < global_.size(); ++i)
    if (!owned[i]) global_[i].second = global_[i].second.clone();
  in_flat_ = owned;
  rounds_.resize(fragments_.size());
  history_.resize(fragments_.size());
  connected_.assign(static_cast<size_t>(opts_.learners), true);
  retired_.assign(static_cast<size_t>(opts_.learners), false);
  learner_step_.assign(static_cast<size_t>(opts_.learners), Ema());
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
  // A learner that went silent without retiring pins its version; bound the memory (its next contribution, if
  // any, is then anchored at the current Θ_p and counted in stale_bases()).
  const size_t cap = 2 * floor_.size() + 8;
  while (!h.empty() && (h.begin()->first < lowest || h.size() > cap)) {
    Version v = std::move(h.begin()->second);
    h.erase(h.begin());
    recycle(fragment, std::move(v));
  }
}

void Syncer::recycle(int64_t fragment, Version v) {
  v.tensors.clear();
  at::Tensor& spare = spare_[static_cast<size_t>(fragment)];
  // Only a buffer nobody else holds (a broadcast still queued by the driver may): the next merge writes it.
  if (v.flat.defined() && !spare.defined() && v.flat.use_count() == 1 && v.flat.storage().use_count() == 1)
    spare = std::move(v.flat);
}

at::Tensor Syncer::new_flat(int64_t fragment) {
  at::Tensor& spare = spare_[static_cast<size_t>(fragment)];
  if (spare.defined()) return std::move(spare);  // its pages are mapped already: no page faults while merging
  return torch::empty({elements_[static_cast<size_t>(fragment)]}, torch::kFloat);
}

at::Tensor& Syncer::global_tensor(const std::string& name) { return global_[index_.at(name)].second; }

void Syncer::install(int64_t fragment, const at::Tensor& flat) {
  int64_t off = 0;
  for (const auto& n : fragments_[static_cast<size_t>(fragment)].names) {
    at::Tensor& t = global_tensor(n);
    const int64_t k = t.numel();
    t = flat.narrow(0, off, k).view(t.sizes());
    off += k;
  }
  flat_[static_cast<size_t>(fragment)] = flat;
}

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
  // Flat fragments get a new buffer (one handed out by RoundResult::flat is never written again).
  for (size_t f = 0; f < fragments_.size(); ++f) {
    if (!flat_[f].defined()) continue;
    at::Tensor flat = torch::empty({flat_[f].numel()}, torch::kFloat);
    int64_t off = 0;
    for (const auto& n : fragments_[f].names) {
      const int64_t k = global_tensor(n).numel();
      flat.narrow(0, off, k).copy_(global.at(n).reshape({-1}));
      off += k;
    }
    install(static_cast<int64_t>(f), flat);
  }
  for (size_t i = 0; i < global_.size(); ++i)
    if (!in_flat_[i]) global_[i].second.copy_(global.at(global_[i].first));
  std::fill(theta_amax_.begin(), theta_amax_.end(), -1.0);
  std::fill(buf_amax_.begin(), buf_amax_.end(), -1.0);
  for (size_t i = 0; i < rounds_.size(); ++i) {
    rounds_[i] = Round();
    rounds_[i].version = versions[i];
    theta_norm_[i] = fragment_norm(static_cast<int64_t>(i));
    recent_norms_[i].clear();
    recent_next_[i] = 0;
  }
  for (auto& h : history_) h.clear();
  for (auto& e : residual_) e.zero_();  // a checkpoint does not hold it: at most one merge's compression error
  std::fill(residual_amax_.begin(), residual_amax_.end(), 0.0);
  for (auto& fl : floor_)
    for (size_t i = 0; i < fl.size(); ++i) fl[i] = versions[i];
  std::fill(seen_step_.begin(), seen_step_.end(), 0);
  for (auto& l : last_) std::fill(l.begin(), l.end(), LastAccepted{});
  merged_ = merged;
}

Syncer::Image Syncer::image() const {
  Image im;
  for (const auto& [n, t] : global_) im.global.emplace(n, t);
  im.outer = outer_->state();
  im.versions = versions();
  im.merged = merged_;
  im.connected = connected_;
  im.retired = retired_;
  im.learner_step = learner_step_;
  im.stats = stats_;
  im.fused_merges = fused_merges_;
  im.general_merges = general_merges_;
  im.stale_bases = stale_bases_;
  im.rejected = rejected_;
  for (const auto& e : residual_) im.broadcast_residual.push_back(e.clone());
  return im;
}

void Syncer::resync(const Image& im) {
  const size_t M = static_cast<size_t>(opts_.learners);
  if (im.connected.size() != M || im.retired.size() != M || im.learner_step.size() != M)
    throw SyncError("replica image is for " + std::to_string(im.connected.size()) + " learners, this syncer has " +
                    std::to_string(M));
  if (!im.broadcast_residual.empty()) {
    if (im.broadcast_residual.size() != residual_.size())
      throw SyncError("replica image has a broadcast residual of " + std::to_string(im.broadcast_residual.size()) +
                      " fragments, this syncer " + std::to_string(residual_.size()) +
                      " (net.broadcast_encoding or net.broadcast_delta differ?)");
    for (size_t f = 0; f < residual_.size(); ++f)
      if (im.broadcast_residual[f].numel() != residual_[f].numel() ||
          !torch::isfinite(im.broadcast_residual[f]).all().item<bool>())
        throw SyncError("replica image's broadcast residual of fragment " + std::to_string(f) +
                        " has the wrong size or a non-finite value");
  }
  restore(im.global, im.outer, im.versions, im.merged);  // checks everything else; throws before changing anything
  for (size_t f = 0; f < im.broadcast_residual.size(); ++f) {
    residual_[f].copy_(im.broadcast_residual[f].reshape({-1}));
    residual_amax_[f] = -1;
  }
  connected_ = im.connected;
  retired_ = im.retired;
  learner_step_ = im.learner_step;
  stats_ = im.stats;
  fused_merges_ = im.fused_merges;
  general_merges_ = im.general_merges;
  stale_bases_ = im.stale_bases;
  rejected_ = im.rejected;
}

void Syncer::drop_waiting() {
  for (auto& r : rounds_) {
    const int64_t v = r.version;
    r = Round();
    r.version = v;
  }
}

std::vector<int64_t> Syncer::waiting(int64_t fragment) const {
  std::vector<int64_t> out;
  for (const auto& [m, h] : rounds_.at(static_cast<size_t>(fragment)).waiting) out.push_back(m);
  return out;
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
    for (size_t i = 0; i < f.names.size(); ++i) measured->sumsq[i] = squared_norm(c.deltas[i]);
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
  if (c.step_time > 0) stats_.step.add(c.step_time, opts_.ema);
  if (c.step_time > 0 && std::isfinite(c.step_time))
    learner_step_[static_cast<size_t>(c.learner)].add(c.step_time, opts_.ema);
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
  r.waiting[learner] = std::move(held);
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
  MergeOutcome out;
  out.fragment = fragment;
  std::vector<double> w;
  for (const auto& [m, h] : r.waiting) {
    out.learners.push_back(m);
    w.push_back(contribution_weight(opts_.weighting, h.c.c_tokens, h.c.c_steps));
  }
  double wsum = std::accumulate(w.begin(), w.end(), 0.0);
  if (!(wsum > 0) || !std::isfinite(wsum)) std::fill(w.begin(), w.end(), 1.0), wsum = static_cast<double>(w.size());
  for (double& x : w) x /= wsum;
  w = cap_shares(std::move(w), opts_.max_share);
  // Staleness: each normalised weight times s(k). The general path hands the merge method the weights (it
  // normalises them) and scales its result by their sum; the fused path's mean and rda are linear in the weights.
  {
    size_t i = 0;
    for (const auto& [m, h] : r.waiting) {
      const int64_t k = std::max<int64_t>(0, r.version - h.c.base_version);
      out.staleness.push_back(k);
      w[i++] *= staleness_scale(opts_.staleness, opts_.staleness_exponent, k);
    }
  }
  out.weights = w;
  torch::NoGradGuard ng;
  int64_t stale = 0;
  if (opts_.fused_merge && merge_fused(fragment, w, &out, &stale)) {
    ++fused_merges_;
  } else {
    merge_general(fragment, w, &out, &stale);
    ++general_merges_;
  }
  const int64_t n = static_cast<int64_t>(r.waiting.size());
  r.waiting.clear();
  r.quorum_time = -1;
  if (!out.ok()) {
    rejected_[sync_reject_name(out.rejected)] += n;
    out.version = r.version;
    return out;
  }
  merged_ += n;
  stale_bases_ += stale;
  out.version = ++r.version;
  prune_history(fragment);
  return out;
}

namespace {
// max |x| over a float CPU tensor (contiguous or not), without a temporary of its size.
double abs_max(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0.0;
  const at::Tensor c = t.contiguous();
  const float* x = c.data_ptr<float>();
  float m = 0.f;
  for (int64_t i = 0; i < c.numel(); ++i) m = std::max(m, std::fabs(x[i]));
  return static_cast<double>(m);
}
bool fp32_cpu(const at::Tensor& t) { return t.defined() && t.scalar_type() == at::kFloat && t.device().is_cpu(); }
// The fused pass may only start when no intermediate value can overflow fp32 (it writes the momentum in place and
// cannot roll back): every bound below stays under this, far from FLT_MAX ≈ 3.4e38, so rounding cannot carry it there.
constexpr double kFusedBound = 1e36;
}  // namespace

bool Syncer::merge_fused(int64_t fragment, const std::vector<double>& w, MergeOutcome* out, int64_t* stale) {
  const size_t p = static_cast<size_t>(fragment);
  if (!fusable_[p] || !flat_[p].defined()) return false;
  Round& r = rounds_[p];
  const Fragment& f = fragments_[p];
  const auto& hist = history_[p];
  const OuterOptimizer::Rule rule = outer_->rule();
  if (rule.delayed) return false;  // delayed_nesterov keeps more state than the pass updates: the general path
  const bool global_anchor = opts_.delta_anchor != "base";
  // The delta broadcast (anchor global) anchors every contribution at Θ_p + e_p, as merge_general does: e_p is one
  // more term of the pass, with the sum of the contributions' coefficients.
  const float* residual = delta_on_ && global_anchor ? residual_[p].data_ptr<float>() : nullptr;
  const size_t T = f.names.size();
  // Sources and their anchors: the version whose Θ^v anchors a contribution at the current Θ (−1: none needed).
  std::vector<const Held*> held;
  std::vector<int64_t> anchor;
  int64_t stale_here = 0;
  for (const auto& [m, h] : r.waiting) {
    if (!h.c.encoded.defined())
      for (const auto& d : h.c.deltas)
        if (!fp32_cpu(d) || !d.is_contiguous()) return false;
    held.push_back(&h);
    int64_t v = -1;
    if (global_anchor && h.c.base_version != r.version) {
      if (hist.count(h.c.base_version))
        v = h.c.base_version;
      else
        ++stale_here;  // no longer kept: anchored at the current Θ_p (Δ = Δ̂), counted
    }
    anchor.push_back(v);
  }
  if (rule.momentum)
    for (size_t i = 0; i < T; ++i) {
      const at::Tensor b = outer_->buffer(f.names[i]);
      if (b.defined() && (!fp32_cpu(b) || b.sizes() != global_tensor(f.names[i]).sizes())) return false;
    }
  // What can the pass reach? max |Θ|, max |b|, max |Θ^v| and each contribution's max |Δ̂| bound everything.
  if (theta_amax_[p] < 0) theta_amax_[p] = abs_max(flat_[p]);
  if (buf_amax_[p] < 0) {
    double m = 0;
    if (rule.momentum)
      for (const auto& n : f.names) m = std::max(m, abs_max(outer_->buffer(n)));
    buf_amax_[p] = m;
  }
  std::map<int64_t, double> hist_amax;
  for (int64_t v : anchor)
    if (v >= 0 && !hist_amax.count(v)) {
      Version& ver = history_[p].at(v);
      if (ver.amax < 0) {
        double m = 0;
        for (const auto& t : ver.tensors) m = std::max(m, abs_max(t));
        ver.amax = m;
      }
      hist_amax[v] = ver.amax;
    }
  const size_t M = held.size();
  if (residual != nullptr && residual_amax_[p] < 0) residual_amax_[p] = abs_max(residual_[p]);
  const double residual_amax = residual != nullptr ? residual_amax_[p] : 0.0;
  std::vector<double> reach(M);  // max |Δ_i|
  for (size_t i = 0; i < M; ++i)
    reach[i] = held[i]->amax + (anchor[i] >= 0 ? theta_amax_[p] + hist_amax[anchor[i]] : 0.0) + residual_amax;

  sync_detail::FusedJob job;
  job.elements = elements_[p];
  job.sources.resize(M);
  std::vector<std::vector<float>> densified;  // sparse pushes, decoded for the pass (it reads elements in blocks)
  densified.reserve(M);
  for (size_t i = 0; i < M; ++i) {
    const Contribution& c = held[i]->c;
    if (c.encoded.defined() && is_sparse(c.encoded.encoding)) {
      densified.push_back(decode_floats(c.encoded.data, c.encoded.bytes, c.encoded.encoding,
                                        static_cast<size_t>(c.encoded.elements)));  // validated by receive()
      job.sources[i].enc = wire_kernels::view(densified.back().data(), Encoding::kFp32, densified.back().size());
    } else if (c.encoded.defined()) {
      job.sources[i].enc =
          wire_kernels::view(c.encoded.data, c.encoded.encoding, static_cast<size_t>(c.encoded.elements));
    } else {
      for (const auto& d : c.deltas) job.sources[i].tensors.push_back(d.data_ptr<float>());
    }
  }
  const float* theta = flat_[p].data_ptr<float>();
  double g_bound = 0;
  int64_t off = 0;
  job.tensors.resize(T);
  for (size_t t = 0; t < T; ++t) {
    const std::string& name = f.names[t];
    const at::Tensor& th = global_tensor(name);
    sync_detail::FusedTensor& x = job.tensors[t];
    x.offset = off;
    x.numel = th.numel();
    off += x.numel;
    x.rda = std::string(selector_.select(name, th.dim()).name()) == "rda";
    x.coef.assign(M, 0.f);
    std::map<int64_t, float> per_version;
    double acc_bound = 0, coef_sum = 0;
    for (size_t i = 0; i < M; ++i) {
      double c = w[i];
      if (x.rda) {
        double sq = held[i]->sumsq[t];
        if (anchor[i] >= 0 || residual != nullptr)
          sq = sync_detail::fused_delta_sumsq(
              job.sources[i], t, x, theta + x.offset,
              anchor[i] >= 0 ? hist.at(anchor[i]).tensors[t].data_ptr<float>() : nullptr,
              residual != nullptr ? residual + x.offset : nullptr);
        const double norm = std::sqrt(sq);
        x.radius += w[i] * norm;
        c = norm > 0 ? w[i] / norm : 0.0;
      }
      x.coef[i] = static_cast<float>(c);
      acc_bound += std::fabs(static_cast<double>(x.coef[i])) * reach[i];
      coef_sum += static_cast<double>(x.coef[i]);
      if (anchor[i] >= 0) per_version[anchor[i]] += x.coef[i];
    }
    x.residual_coef = static_cast<float>(coef_sum);
    for (const auto& [v, c] : per_version) x.hist.emplace_back(hist.at(v).tensors[t].data_ptr<float>(), c);
    // |g| ≤ Σ |c_i|·max|Δ_i| for the mean; rda rescales to at most its radius (|s·dir_j| ≤ s·‖dir‖ = radius).
    if (!(acc_bound < kFusedBound)) return false;
    g_bound = std::max(g_bound, x.rda ? x.radius : acc_bound);
  }
  const double b_bound = rule.momentum ? rule.mu * buf_amax_[p] + g_bound : 0.0;
  const double u_bound = !rule.momentum ? g_bound : rule.nesterov ? g_bound + rule.mu * b_bound : b_bound;
  const double t_bound = theta_amax_[p] + rule.lr * u_bound;
  if (!(g_bound < kFusedBound && b_bound < kFusedBound && u_bound < kFusedBound && t_bound < kFusedBound))
    return false;  // the general path checks the result and rolls back

  // From here nothing can fail but an allocation, before the first write.
  at::Tensor next = new_flat(fragment);
  std::vector<at::Tensor> bufs(T);
  if (rule.momentum)
    for (size_t t = 0; t < T; ++t) {
      bufs[t] = outer_->buffer_for_update(f.names[t], global_tensor(f.names[t]));
      job.tensors[t].buf = bufs[t].data_ptr<float>();
    }
  job.theta = theta;
  job.residual = residual;
  job.theta_out = next.data_ptr<float>();
  job.momentum = rule.momentum;
  job.nesterov = rule.nesterov;
  job.lr = static_cast<float>(rule.lr);
  job.mu = static_cast<float>(rule.mu);
  job.threads = static_cast<int>(opts_.merge_threads > 0 ? opts_.merge_threads : at::get_num_threads());
  const sync_detail::FusedStats st = sync_detail::run_fused(job);

  Version before{{}, theta_amax_[p], flat_[p]};
  for (const auto& n : f.names) before.tensors.push_back(global_tensor(n));
  install(fragment, next);
  if (global_anchor)
    history_[p][r.version] = std::move(before);
  else
    recycle(fragment, std::move(before));
  theta_amax_[p] = st.theta_amax;
  buf_amax_[p] = rule.momentum ? st.buf_amax : 0.0;
  theta_norm_[p] = std::sqrt(st.theta_sumsq);
  out->delta_norm = std::sqrt(st.g_sumsq);
  *stale = stale_here;
  return true;
}

void Syncer::merge_general(int64_t fragment, const std::vector<double>& w, MergeOutcome* out, int64_t* stale_out) {
  const size_t p = static_cast<size_t>(fragment);
  Round& r = rounds_[p];
  const Fragment& f = fragments_[p];
  auto& hist = history_[p];
  // Θ_p and the outer state before the step: the rollback point, and (anchor global) the version being replaced,
  // which stays available while some learner may still hold it. The buffers are handles (never changed in place
  // by step()). A flat fragment is copied to a new buffer and stepped there (copy on write): the old one is the
  // rollback point as it is.
  std::vector<at::Tensor> before;
  std::vector<OuterOptimizer::Slot> buffers;
  const at::Tensor old_flat = flat_[p];
  for (const auto& n : f.names) {
    before.push_back(old_flat.defined() ? global_tensor(n) : global_tensor(n).clone());
    buffers.push_back(outer_->slot(n));
  }
  if (old_flat.defined()) install(fragment, new_flat(fragment).copy_(old_flat));
  double sq = 0;
  int64_t stale = 0;
  const double wscale = opts_.staleness == "none" ? 1.0 : std::accumulate(w.begin(), w.end(), 0.0);
  try {
    // Contributions held in their wire encoding are decoded here (this path merges tensor by tensor).
    std::vector<std::vector<at::Tensor>> decoded;
    for (const auto& [m, h] : r.waiting) {
      if (!h.c.encoded.defined()) {
        decoded.push_back(h.c.deltas);
        continue;
      }
      at::Tensor flat = torch::empty({h.c.encoded.elements}, torch::kFloat);
      decode_floats_into(h.c.encoded.data, h.c.encoded.bytes, h.c.encoded.encoding,
                         static_cast<size_t>(h.c.encoded.elements), flat.data_ptr<float>());
      std::vector<at::Tensor> views;
      int64_t off = 0;
      for (const auto& n : f.names) {
        const at::Tensor& g = global_tensor(n);
        views.push_back(flat.narrow(0, off, g.numel()).view(g.sizes()));
        off += g.numel();
      }
      decoded.push_back(std::move(views));
    }
    // The delta broadcast (anchor global): the learners hold Θ_p (what was broadcast), the merges have reached
    // Θ_p + e_p. Each Δ_m is anchored there, Δ_m = (Θ_p + e_p) − θ_m, so what the codec has not delivered yet is
    // neither lost nor proposed twice (a learner's progress from the lagging Θ_p covers it again).
    std::vector<at::Tensor> residual;
    if (delta_on_ && opts_.delta_anchor != "base") {
      int64_t off = 0;
      for (const auto& n : f.names) {
        const at::Tensor& g = global_tensor(n);
        residual.push_back(residual_[p].narrow(0, off, g.numel()).view(g.sizes()));
        off += g.numel();
      }
    }
    for (size_t i = 0; i < f.names.size() && out->ok(); ++i) {
      const std::string& name = f.names[i];
      at::Tensor& theta = global_tensor(name);
      MergeInput in;
      in.name = name;
      in.weights = w;
      in.round = static_cast<uint64_t>(r.version + 1);  // random methods (dare) draw fresh masks every outer step
      size_t k = 0;
      for (const auto& [m, h] : r.waiting) {
        const at::Tensor& d0 = decoded[k++][i];
        const at::Tensor d = residual.empty() ? d0 : d0 + residual[i];
        // θ_m = Θ^v − Δ̂. Anchor base: Δ_m = Θ^v − θ_m = Δ̂. Anchor global: Δ_m = Θ − θ_m = Δ̂ + (Θ − Θ^v).
        if (opts_.delta_anchor == "base" || h.c.base_version == r.version) {
          in.deltas.push_back(d);
          continue;
        }
        auto it = hist.find(h.c.base_version);
        if (it == hist.end()) {
          if (i == 0) ++stale;
          in.deltas.push_back(d);
        } else {
          in.deltas.push_back(d + (theta - it->second.tensors[i]));
        }
      }
      at::Tensor merged = selector_.select(name, theta.dim()).merge(in);
      if (wscale != 1.0) merged.mul_(wscale);  // staleness (Syncer::merge): the weights sum to less than 1
      const double msq = merged.to(torch::kDouble).pow(2).sum().item<double>();
      if (!std::isfinite(msq)) {
        out->rejected = SyncReject::kMergeNonFinite;
        out->detail = "the merged outer gradient of '" + name + "' holds NaN or Inf";
        break;
      }
      sq += msq;
      outer_->step(name, theta, merged);
      const OuterOptimizer::Slot st = outer_->slot(name);
      if (!torch::isfinite(theta).all().item<bool>() ||
          (st.buffer.defined() && !torch::isfinite(st.buffer).all().item<bool>()) ||
          (st.sum.defined() && !torch::isfinite(st.sum).all().item<bool>())) {
        out->rejected = SyncReject::kMergeNonFinite;
        out->detail = "the outer step made '" + name + "' (or its momentum) NaN or Inf";
      }
    }
  } catch (const std::exception& e) {  // a merge method or the outer step refused these inputs
    out->rejected = SyncReject::kMergeFailed;
    out->detail = e.what();
  }
  if (!out->ok()) {
    // Roll back: Θ_p and the momentum exactly as before; version, history, counters untouched.
    if (old_flat.defined()) {
      install(fragment, old_flat);
    } else {
      for (size_t i = 0; i < f.names.size(); ++i) global_tensor(f.names[i]).copy_(before[i]);
    }
    for (size_t i = 0; i < f.names.size(); ++i) outer_->set_slot(f.names[i], buffers[i]);
    return;
  }
  out->delta_norm = std::sqrt(sq);
  *stale_out = stale;
  if (opts_.delta_anchor != "base")
    hist[r.version] = Version{std::move(before), theta_amax_[p], old_flat};
  else
    recycle(fragment, Version{std::move(before), -1, old_flat});
  theta_amax_[p] = -1;  // not measured on this path
  buf_amax_[p] = -1;
  theta_norm_[p] = fragment_norm(fragment);
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

void Syncer::set_delta_broadcast(const Codec& codec) {
  if (codec.encoding == Encoding::kRaw || static_cast<uint8_t>(codec.encoding) > kMaxEncoding)
    throw SyncError(std::string("the delta broadcast needs a float encoding, not ") + encoding_name(codec.encoding));
  if (is_sparse(codec.encoding)) {
    try {
      validate_topk(codec.topk);
    } catch (const WireError& e) {
      throw SyncError(e.what());
    }
  }
  for (size_t f = 0; f < fragments_.size(); ++f)
    if (!flat_[f].defined())
      throw SyncError("the delta broadcast (net.broadcast_encoding=topk, net.broadcast_delta) needs every fragment in "
                      "fp32 on the CPU; fragment " + std::to_string(f) + " is not");
  delta_on_ = true;
  delta_codec_ = codec;
  residual_.clear();
  for (size_t f = 0; f < fragments_.size(); ++f) residual_.push_back(torch::zeros({elements_[f]}, torch::kFloat));
  residual_amax_.assign(fragments_.size(), 0.0);
}

std::shared_ptr<const std::string> Syncer::compress_version(int64_t fragment, const at::Tensor& prev) {
  const size_t p = static_cast<size_t>(fragment);
  const size_t n = static_cast<size_t>(elements_[p]);
  float* cur = flat_[p].data_ptr<float>();  // Θ_p', merged, not yet handed to anyone
  float* e = residual_[p].data_ptr<float>();
  const float* old = prev.data_ptr<float>();
  if (delta_scratch_.size() != flat_.size()) delta_scratch_.resize(flat_.size());
  std::vector<float>& d = delta_scratch_[p];  // D, then decode(D): one buffer kept across merges
  d.resize(n);
  // e ← T = Θ_p' + e_p (the merged version with what earlier broadcasts left out), D = T − Θ_p.
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float t = cur[i] + e[i];
    e[i] = t;
    d[i] = t - old[i];
    finite &= std::isfinite(d[i]) && std::isfinite(t);
  }
  std::shared_ptr<std::string> payload;
  if (finite) {
    try {
      payload = std::make_shared<std::string>(encode_floats(d.data(), n, delta_codec_));
      decode_floats_into(payload->data(), payload->size(), delta_codec_.encoding, n, d.data());
      // The next version, Θ_p + decode(D), as a learner computes it (add_delta, deloco/learner.h): checked first.
      for (size_t i = 0; i < n && finite; ++i) finite = std::isfinite(old[i] + d[i]);
    } catch (const WireError&) {
      finite = false;
    }
  }
  // The fused pass bounds what it can reach by max |Θ_p| and max |e_p|: both are taken here, as they are written,
  // rather than by two more reads of the fragment at the next merge.
  float theta_m = 0.f, e_m = 0.f;
  if (!finite) {  // T as merged, if finite; no delta (learners get the whole fragment)
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) ok = std::isfinite(e[i]);
    if (ok) std::copy(e, e + n, cur);
    std::fill(e, e + n, 0.f);
    payload.reset();
    theta_amax_[p] = -1;  // not measured on this rare path
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float v = old[i] + d[i];  // as add_delta
      cur[i] = v;
      e[i] -= v;  // e_p ← T − that
      theta_m = std::max(theta_m, std::fabs(v));
      e_m = std::max(e_m, std::fabs(e[i]));
    }
    theta_amax_[p] = theta_m;
  }
  residual_amax_[p] = e_m;
  theta_norm_[p] = fragment_norm(fragment);
  return payload;
}

void Syncer::merge_round(double now, int64_t fragment, RoundResult* r) {
  const double qt = quorum_time(fragment);
  r->grace = grace();
  r->grace_wait = qt >= 0 ? now - qt : 0.0;
  const size_t p = static_cast<size_t>(fragment);
  const at::Tensor prev = delta_on_ ? flat_[p] : at::Tensor();  // Θ_p^v (merge() installs a new buffer)
  r->outcome = merge(fragment);
  if (!r->outcome.ok()) return;
  if (delta_on_) r->delta = compress_version(fragment, prev);
  if (share_flat_ && flat_[p].defined()) {
    r->flat = flat_[p];  // never written again: the next merge or restore installs a new buffer
    return;
  }
  r->flat = torch::empty({elements_[p]}, torch::kFloat);
  flatten_into(fragment_tensors(fragment), r->flat.data_ptr<float>());
}

}  // namespace deloco
