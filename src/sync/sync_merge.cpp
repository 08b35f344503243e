// The Syncer's merge of a fragment (deloco/sync.h): the fused path (one pass over the contributions, the outer step
// and the broadcast encoding) when it applies, else the general path; and the delta broadcast's compression.
#include "deloco/sync.h"
#include "sync/codec_fit.h"
#include "sync/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "sync/fused_merge.h"
#include "sync/sync_internal.h"
#include "wire/quantize.h"

namespace deloco {

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
  if (out.ok()) {
    for (const auto& [m, h] : r.waiting) {  // the step each learner's merged push was credited with
      auto& merged = last_[static_cast<size_t>(m)][static_cast<size_t>(fragment)].merged;
      merged = std::max(merged, h.credited);
    }
  }
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

void Syncer::set_delta_broadcast(const Codec& codec) {
  check_float_codec(codec, "the delta broadcast");
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

void Syncer::set_delta_codecs(const std::vector<Codec>& codecs) {
  if (!delta_on_) throw SyncError("set_delta_codecs: the delta broadcast is off");
  if (codecs.empty()) throw SyncError("set_delta_codecs: no codecs");
  for (const Codec& c : codecs) check_float_codec(c, "the delta broadcast");
  delta_codecs_ = codecs;
  for (const Codec& c : codecs)
    if (c.encoding == delta_codec_.encoding) return;  // the codec in use is listed: it stays
  delta_codec_ = codecs.front();
}

void Syncer::use_delta_encoding(Encoding e) {
  if (!delta_on_) throw SyncError("use_delta_encoding: the delta broadcast is off");
  if (e == delta_codec_.encoding) return;
  for (const Codec& c : delta_codecs_)
    if (c.encoding == e) {
      delta_codec_ = c;
      return;
    }
  throw SyncError(std::string("the delta broadcast may not switch to ") + encoding_name(e) +
                  " (not among net.broadcast_encoding = auto's codecs)");
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

}  // namespace deloco
