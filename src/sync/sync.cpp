// The algorithm core: fragments, weights, grace window, quorum decisions and the syncer (DESIGN.md §2.2–2.4).
#include "deloco/sync.h"

#include <algorithm>
#include <cmath>
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
  if (!(max_delta_norm >= 0)) fail("sync.max_delta_norm must be ≥ 0");
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
}

std::vector<Fragment> plan_fragments(const std::vector<std::pair<std::string, int64_t>>& tensors, int64_t P,
                                     int64_t H) {
  if (P < 1) throw SyncError("sync.fragments must be ≥ 1");
  if (H < 1) throw SyncError("sync.sync_every must be ≥ 1");
  if (P > static_cast<int64_t>(tensors.size()))
    throw SyncError("sync.fragments=" + std::to_string(P) + " is larger than the number of parameter tensors (" +
                    std::to_string(tensors.size()) + ")");
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].second > tensors[b].second; });
  std::vector<Fragment> frags(static_cast<size_t>(P));
  std::vector<std::vector<size_t>> members(frags.size());
  for (size_t i : order) {
    size_t best = 0;
    for (size_t f = 1; f < frags.size(); ++f)
      if (frags[f].bytes < frags[best].bytes) best = f;
    frags[best].bytes += tensors[i].second;
    members[best].push_back(i);
  }
  for (size_t f = 0; f < frags.size(); ++f) {
    std::sort(members[f].begin(), members[f].end());
    for (size_t i : members[f]) frags[f].names.push_back(tensors[i].first);
    frags[f].id = static_cast<int64_t>(f);
    frags[f].offset = (static_cast<int64_t>(f) * H / P) % H;
  }
  return frags;
}

double contribution_weight(const std::string& mode, int64_t c_tokens, int64_t c_steps) {
  if (mode == "uniform") return 1.0;
  if (mode != "token") throw SyncError("unknown weighting '" + mode + "' (token, uniform)");
  if (c_steps <= 0) return 0.0;
  const double t = static_cast<double>(c_tokens);
  return t * (t / static_cast<double>(c_steps));
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
  }
  for (auto& h : history_) h.clear();
  for (auto& fl : floor_)
    for (size_t i = 0; i < fl.size(); ++i) fl[i] = versions[i];
  merged_ = merged;
}

int64_t Syncer::rejected_contributions() const {
  int64_t n = 0;
  for (const auto& [k, v] : rejected_) n += v;
  return n;
}

std::string Syncer::check(const Contribution& c) const {
  if (c.fragment < 0 || c.fragment >= static_cast<int64_t>(fragments_.size())) return "unknown_fragment";
  if (c.learner < 0 || c.learner >= opts_.learners) return "unknown_learner";
  const Fragment& f = fragments_[static_cast<size_t>(c.fragment)];
  if (c.deltas.size() != f.names.size()) return "wrong_tensor_count";
  if (c.base_version < 0 || c.base_version > rounds_[static_cast<size_t>(c.fragment)].version) return "future_base";
  double sq = 0;
  for (size_t i = 0; i < f.names.size(); ++i) {
    const at::Tensor& g = global_[index_.at(f.names[i])].second;
    const at::Tensor& t = c.deltas[i];
    if (!t.defined() || t.sizes() != g.sizes()) return "wrong_shape";
    if (!torch::isfinite(t).all().item<bool>()) return "non_finite";
    if (opts_.max_delta_norm > 0) sq += t.to(torch::kDouble).pow(2).sum().item<double>();
  }
  if (opts_.max_delta_norm > 0 && std::sqrt(sq) > opts_.max_delta_norm) return "norm_bound";
  return "";
}

std::string Syncer::receive(double now, Contribution c) {
  const std::string why = check(c);
  if (!why.empty()) {
    ++rejected_[why];
    return why;
  }
  if (c.step_time > 0) stats_.step.add(c.step_time, opts_.ema);
  Round& r = rounds_[static_cast<size_t>(c.fragment)];
  if (r.waiting.empty()) r.first_arrival = now;
  const int64_t learner = c.learner, fragment = c.fragment;
  auto& fl = floor_[static_cast<size_t>(learner)][static_cast<size_t>(fragment)];
  fl = std::max(fl, c.base_version);  // it will never again reference an older version of this fragment
  r.waiting[learner] = std::move(c);
  mark_quorum(now, fragment);
  return "";
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
  if (!(wsum > 0)) std::fill(w.begin(), w.end(), 1.0), wsum = static_cast<double>(w.size());
  for (double& x : w) x /= wsum;
  out.weights = w;
  torch::NoGradGuard ng;
  auto& hist = history_[static_cast<size_t>(fragment)];
  // The version being replaced stays available while some learner may still hold it.
  std::vector<at::Tensor> before;
  if (opts_.delta_anchor != "base")
    for (const auto& n : f.names) before.push_back(global_tensor(n).clone());
  double sq = 0;
  for (size_t i = 0; i < f.names.size(); ++i) {
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
        if (i == 0) ++stale_bases_;
        in.deltas.push_back(c.deltas[i]);
      } else {
        in.deltas.push_back(c.deltas[i] + (theta - it->second[i]));
      }
    }
    at::Tensor merged = selector_.select(name, theta.dim()).merge(in);
    sq += merged.to(torch::kDouble).pow(2).sum().item<double>();
    outer_->step(name, theta, merged);
  }
  out.delta_norm = std::sqrt(sq);
  merged_ += static_cast<int64_t>(r.waiting.size());
  r.waiting.clear();
  r.quorum_time = -1;
  if (!before.empty()) hist[r.version] = std::move(before);
  out.version = ++r.version;
  prune_history(fragment);
  return out;
}

}  // namespace deloco
