// The Syncer's final round (deloco/sync.h: receive_final, final_round; SyncOptions::final_round): the learners'
// final states, held until nobody will send again, become the final model as their weighted mean.
#include "deloco/sync.h"

#include <cmath>

#include <torch/torch.h>

#include "wire/quantize.h"

namespace deloco {

SyncReject Syncer::receive_final(Contribution c) {
  double norm = 0;
  Held held;
  const SyncReject why = check(c, &norm, &held);
  if (why != SyncReject::kNone) {
    ++rejected_[sync_reject_name(why)];
    return why;
  }
  const int64_t learner = c.learner;
  held.c = std::move(c);
  rounds_[static_cast<size_t>(held.c.fragment)].finals[learner] = std::move(held);
  return SyncReject::kNone;
}

int64_t Syncer::finals_held() const {
  int64_t n = 0;
  for (const auto& r : rounds_) n += static_cast<int64_t>(r.finals.size());
  return n;
}

std::vector<RoundResult> Syncer::final_round() {
  torch::NoGradGuard ng;
  std::vector<RoundResult> out;
  for (size_t p = 0; p < rounds_.size(); ++p) {
    Round& r = rounds_[p];
    if (r.finals.empty()) continue;
    const int64_t fragment = static_cast<int64_t>(p);
    const auto n = static_cast<size_t>(elements_[p]);
    RoundResult res;
    res.decision.kind = RoundDecision::kMerge;
    MergeOutcome& o = res.outcome;
    o.fragment = fragment;
    o.version = r.version;
    // Θ_p now, flat, and Θ_p + e_p (the anchor of a state rebased onto the current model).
    std::vector<float> now(n), rebased(n);
    flatten_into(fragment_tensors(fragment), now.data());
    rebased = now;
    if (delta_on_ && residual_[p].defined()) {
      const float* e = residual_[p].data_ptr<float>();
      for (size_t i = 0; i < n; ++i) rebased[i] += e[i];
    }
    double wsum = 0;
    for (const auto& [m, h] : r.finals) {
      const int64_t tps = budgets_[static_cast<size_t>(m)].tokens_per_step;
      const double w = opts_.weighting == "token" && tps > 0 ? static_cast<double>(tps) : 1.0;
      o.learners.push_back(m);
      o.weights.push_back(w);
      wsum += w;
    }
    for (double& w : o.weights) w /= wsum;
    std::vector<double> mean(n, 0.0);
    std::vector<float> delta(n), base(n);
    size_t k = 0;
    for (const auto& [m, h] : r.finals) {
      const Contribution& c = h.c;
      if (c.encoded.defined()) {
        decode_floats_into(c.encoded.data, c.encoded.bytes, c.encoded.encoding, n, delta.data());
      } else {
        flatten_into(c.deltas, delta.data());
      }
      // The anchor: the version the learner holds (its state exactly), else the current model.
      const float* a = rebased.data();
      int64_t stale = 0;
      if (opts_.delta_anchor == "global") {
        if (c.base_version == r.version) {
          a = now.data();
        } else if (auto it = history_[p].find(c.base_version); it != history_[p].end()) {
          flatten_into(it->second.tensors, base.data());
          a = base.data();
        } else {
          stale = 1;
        }
      }
      stale_bases_ += stale;
      o.staleness.push_back(r.version - c.base_version);
      const double w = o.weights[k++];
      for (size_t i = 0; i < n; ++i) mean[i] += w * (static_cast<double>(a[i]) - static_cast<double>(delta[i]));
    }
    at::Tensor next = torch::empty({elements_[p]}, torch::kFloat);
    float* x = next.data_ptr<float>();
    bool finite = true;
    double sq = 0;
    for (size_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(mean[i]);
      finite &= std::isfinite(x[i]);
      const double d = static_cast<double>(x[i]) - static_cast<double>(now[i]);
      sq += d * d;
    }
    if (!finite) {
      o.rejected = SyncReject::kMergeNonFinite;
      o.detail = "the final round's mean of fragment " + std::to_string(fragment) + " is not finite";
      rejected_[sync_reject_name(o.rejected)] += static_cast<int64_t>(r.finals.size());
      r.finals.clear();
      out.push_back(std::move(res));
      continue;
    }
    o.delta_norm = std::sqrt(sq);
    if (flat_[p].defined()) {
      install(fragment, next);
    } else {  // a fragment held per tensor: copied in place
      int64_t off = 0;
      for (const auto& name : fragments_[p].names) {
        at::Tensor& t = global_tensor(name);
        t.copy_(next.narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
      }
    }
    if (delta_on_ && residual_[p].defined()) {
      residual_[p].zero_();
      residual_amax_[p] = 0;
    }
    theta_amax_[p] = -1;  // not measured here
    theta_norm_[p] = fragment_norm(fragment);
    o.version = ++r.version;
    finals_merged_ += static_cast<int64_t>(r.finals.size());
    r.finals.clear();
    res.flat = share_flat_ && flat_[p].defined() ? next : next.clone();
    out.push_back(std::move(res));
  }
  return out;
}

}  // namespace deloco
