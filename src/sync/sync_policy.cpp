// The algorithm core's policy (deloco/sync.h): SyncOptions' checks and keys, contribution weights, staleness
// scaling, the dynamic sync period, weight caps, the grace window and the quorum decision of a round.
#include "deloco/sync.h"
#include "sync/policy.h"

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
  if (apply != "overwrite" && apply != "rebase") fail("sync.apply must be overwrite or rebase (got '" + apply + "')");
  if (apply == "rebase" && alpha != 0) fail("sync.apply = rebase keeps the learner's own progress: it needs sync.alpha = 0");
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
  s.bind("sync.grace_cap", &grace_cap,
         "hard cap on the grace window (seconds; with sync.apply = rebase, times the stretch of a period fitted "
         "to a slow link: docs/runtime.md)");
  s.bind("sync.ema", &ema, "decay of the moving averages of step, quorum and sync times");
  s.bind("sync.weighting", &weighting, "token | uniform");
  s.bind("sync.delta_anchor", &delta_anchor, "global | base");
  s.bind("sync.alpha", &alpha, "learner apply: theta <- (1-alpha) Theta + alpha theta");
  s.bind("sync.apply", &apply,
         "how a learner applies a new version: overwrite (theta <- Theta', the papers') | rebase (theta <- Theta' + "
         "(theta - R): keeps the steps trained since its push, R = theta at the push the version answers, else the "
         "version held)");
  s.bind("sync.final_round", &final_round,
         "after its last step each learner sends its whole state once its answers are in; the final model is their "
         "weighted mean (sync.weighting), anchored as pushes are (sync.delta_anchor)");
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
  // The steps a merge may take before its answer is late: τ for a learner that overwrites (it applies at send + τ);
  // H for one that rebases (it applies whenever the answer comes, and needs it only before its next push), or its
  // period as a fitted codec stretched it.
  const int64_t window = o.apply == "rebase" ? std::max(o.sync_every, s.period) : o.overlap;
  const double slack = static_cast<double>(window) * s.step.value - (s.quorum.value + s.sync.value);
  // The cap bounds the window of one period of H steps; a stretched period stretches it by as much.
  const double cap = o.apply == "rebase" && o.sync_every > 0
                         ? o.grace_cap * static_cast<double>(window) / static_cast<double>(o.sync_every)
                         : o.grace_cap;
  // A period stretched by a slow link (rebasing learners): the window spans the whole period. Every live learner's
  // push of the fragment is due within it, and a merge that holds them all answers them all at once, so their next
  // pushes go together too; a merge of one push answers one learner, and the phases, once apart, stay apart (on the
  // testbed at 1 Mbit/s: 6 and 7 of 17 merges paired, the larger model 2.23 and 2.02; quorum 2 pairing all: 1.76).
  if (o.apply == "rebase" && s.period > o.sync_every)
    return std::min(cap, static_cast<double>(window) * s.step.value);
  return std::min(cap, std::max(0.0, o.grace_gamma * slack));
}

int64_t effective_quorum(const RoundState& s, const SyncOptions& o) {
  return std::max<int64_t>(1, std::min(o.quorum, o.learners - s.retired));
}

RoundDecision decide_round(double now, const RoundState& s, const SyncOptions& o, double grace) {
  RoundDecision d;
  if (s.arrivals == 0 || s.arrivals < effective_quorum(s, o)) return d;  // below the quorum: wait for arrivals
  if ((s.connected > 0 && s.connected_arrived >= s.connected) || (s.finished > 0 && s.retired >= o.learners)) {
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

}  // namespace deloco
