// The algorithm core's Syncer: fragments, versions, budgets, rounds and images (docs/commands.md: Algorithm options).
// Beside it: sync_policy.cpp (options, weights, the grace window, quorum decisions), sync_admission.cpp (a
// contribution's checks), sync_merge.cpp (the two merge paths and the delta broadcast).
#include "deloco/sync.h"
#include "sync/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "deloco/config.h"
#include "sync/sync_internal.h"

namespace deloco {

int64_t Syncer::local_updates(int64_t learner) const {
  const int64_t H = opts_.sync_every;
  if (!opts_.dynamic_local_updates || learner < 0 || learner >= opts_.learners) return H;
  const Ema& mine = learner_step_[static_cast<size_t>(learner)];
  if (!mine.seeded) return H;
  double fastest = mine.value;
  for (size_t m = 0; m < learner_step_.size(); ++m)
    if (learner_step_[m].seeded && !retired_[m] && !finished_[m]) fastest = std::min(fastest, learner_step_[m].value);
  return std::max(opts_.overlap + 1, dynamic_sync_every(H, fastest, mine.value));
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
  finished_.assign(static_cast<size_t>(opts_.learners), false);
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

double Syncer::fragment_norm(int64_t fragment) const {
  double sq = 0;
  for (const auto& n : fragments_.at(static_cast<size_t>(fragment)).names) sq += sync_detail::squared_norm(global_[index_.at(n)].second);
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

void Syncer::set_finished(double now, int64_t learner, bool finished) {
  if (!opts_.final_round)
    throw SyncError("set_finished: learner " + std::to_string(learner) +
                    " is marked past its last step, but sync.final_round is off (its last step pushes)");
  if (learner < 0 || learner >= opts_.learners)
    throw SyncError("set_finished: no learner " + std::to_string(learner));
  finished_[static_cast<size_t>(learner)] = finished;
  for (size_t f = 0; f < rounds_.size(); ++f) {
    // Undone (it resumed from an earlier step), the quorum may rise again above a round's arrivals: that round has
    // not reached it after all, and its grace window starts when it does (not at the lowered quorum's time).
    Round& r = rounds_[f];
    if (!finished && r.quorum_time >= 0 &&
        static_cast<int64_t>(r.waiting.size()) < effective_quorum(round_state(static_cast<int64_t>(f)), opts_))
      r.quorum_time = -1;
    // A quorum lowered by it is reached now, as after a retirement.
    mark_quorum(now, static_cast<int64_t>(f));
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
  // A push waiting in the round, and a final state held for the final round, is anchored at the version its learner
  // held, also once that learner has retired (its goodbye may come before the round merges its last push, and it
  // follows its final states).
  const Round& r = rounds_[static_cast<size_t>(fragment)];
  for (const auto& [m, held] : r.waiting) lowest = std::min(lowest, held.c.base_version);
  for (const auto& [m, held] : r.finals) lowest = std::min(lowest, held.c.base_version);
  // Asked only of versions kept past the cap (rare): no allocation on the path every accepted push takes.
  auto pinned = [&r](int64_t version) {
    for (const auto& [m, held] : r.waiting)
      if (held.c.base_version == version) return true;
    for (const auto& [m, held] : r.finals)
      if (held.c.base_version == version) return true;
    return false;
  };
  // A learner that went silent without retiring pins its version; bound the memory (its next contribution, if
  // any, is then anchored at the current Θ_p and counted in stale_bases()). The cap takes the oldest versions
  // first but never one a held push or final state is anchored at (at most 2M of them): pruned, its contribution
  // would be rebuilt against a later Θ_p and carry the merges in between a second time (set_finished's promise).
  const size_t cap = 2 * floor_.size() + 8;
  for (auto it = h.begin(); it != h.end();) {
    const bool below = it->first < lowest;
    if (!below && h.size() <= cap) break;
    if (!below && pinned(it->first)) {
      ++it;
      continue;
    }
    Version v = std::move(it->second);
    it = h.erase(it);
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
  for (size_t f = 0; f < versions.size(); ++f)
    if (versions[f] < 0)
      throw SyncError("checkpoint has version " + std::to_string(versions[f]) + " for fragment " + std::to_string(f) +
                      " (versions are counts of merges: a damaged or edited manifest)");
  if (merged < 0)
    throw SyncError("checkpoint counts " + std::to_string(merged) + " merged contributions (a damaged or edited manifest)");
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
  im.finished = finished_;
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
  if (!im.finished.empty() && im.finished.size() != M)
    throw SyncError("replica image marks " + std::to_string(im.finished.size()) + " learners finished, this syncer has " +
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
  finished_ = im.finished.empty() ? std::vector<bool>(M, false) : im.finished;
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
    auto finals = std::move(r.finals);
    r = Round();
    r.version = v;
    r.finals = std::move(finals);
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
    if (!connected_[m] || finished_[m]) continue;  // a finished learner pushes nothing more: nobody waits for it
    ++s.connected;
    if (r.waiting.count(static_cast<int64_t>(m))) ++s.connected_arrived;
  }
  for (size_t m = 0; m < retired_.size(); ++m) {
    s.retired += retired_[m] || finished_[m] ? 1 : 0;
    s.finished += finished_[m] && !retired_[m] ? 1 : 0;
  }
  s.first_arrival = r.first_arrival;
  s.quorum_time = r.quorum_time;
  return s;
}

RoundDecision Syncer::decide(double now, int64_t fragment) const {
  return decide_round(now, round_state(fragment), opts_, grace());
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
