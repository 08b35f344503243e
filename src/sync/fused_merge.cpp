// The syncer's fused merge pass (contract in fused_merge.h).
#include "sync/fused_merge.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

namespace deloco::sync_detail {
namespace {

struct Segment {
  int64_t lo, hi;  // flat element range, inside one chunk and one tensor
  size_t t;        // tensor index
};

struct Plan {
  std::vector<Segment> segs;
  std::vector<size_t> chunk_begin;  // per chunk: its first segment (size chunks + 1)
};

Plan make_plan(const FusedJob& job) {
  Plan p;
  const int64_t chunks = (job.elements + kFusedChunk - 1) / kFusedChunk;
  size_t t = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    p.chunk_begin.push_back(p.segs.size());
    const int64_t cl = c * kFusedChunk, ch = std::min(job.elements, cl + kFusedChunk);
    while (t < job.tensors.size() && job.tensors[t].offset + job.tensors[t].numel <= cl) ++t;
    for (size_t u = t; u < job.tensors.size() && job.tensors[u].offset < ch; ++u) {
      const int64_t lo = std::max(cl, job.tensors[u].offset);
      const int64_t hi = std::min(ch, job.tensors[u].offset + job.tensors[u].numel);
      if (hi > lo) p.segs.push_back({lo, hi, u});
    }
  }
  p.chunk_begin.push_back(p.segs.size());
  return p;
}

// acc[0, hi − lo) = Σ_i c_i Δ̂_i + Σ_v C_v·(Θ − Θ^v) (+ (Σ_i c_i)·e_p) over [lo, hi) of tensor t.
DELOCO_ALWAYS_INLINE void accumulate(const FusedJob& job, const Segment& s, float* __restrict acc) {
  const FusedTensor& t = job.tensors[s.t];
  const size_t len = static_cast<size_t>(s.hi - s.lo);
  const size_t in_tensor = static_cast<size_t>(s.lo - t.offset);
  for (size_t i = 0; i < job.sources.size(); ++i) {
    const FusedSource& src = job.sources[i];
    const float c = t.coef[i];
    if (src.enc.p != nullptr) {
      if (i == 0)
        wire_kernels::axpy<true>(src.enc, static_cast<size_t>(s.lo), static_cast<size_t>(s.hi), c, acc);
      else
        wire_kernels::axpy<false>(src.enc, static_cast<size_t>(s.lo), static_cast<size_t>(s.hi), c, acc);
    } else {
      const float* x = src.tensors[s.t] + in_tensor;
      if (i == 0)
        wire_kernels::axpy_fp32<true>(x, len, c, acc);
      else
        wire_kernels::axpy_fp32<false>(x, len, c, acc);
    }
  }
  const float* __restrict th = job.theta + s.lo;
  for (const auto& [h, c] : t.hist) {
    const float* __restrict hv = h + in_tensor;
    for (size_t k = 0; k < len; ++k) acc[k] += c * (th[k] - hv[k]);
  }
  if (job.residual != nullptr) wire_kernels::axpy_fp32<false>(job.residual + s.lo, len, t.residual_coef, acc);
}

// The outer rule over one segment: Rule 0 no momentum, 1 heavy ball, 2 nesterov. `acc` may alias theta_out (rda).
template <int Rule>
DELOCO_ALWAYS_INLINE void apply(const FusedJob& job, const Segment& s, const float* acc, FusedStats* st) {
  const float sc = job.tensors[s.t].scale, lr = job.lr, mu = job.mu;
  const float* __restrict th = job.theta + s.lo;
  float* tout = job.theta_out + s.lo;
  float* __restrict b = Rule > 0 ? job.tensors[s.t].buf + (s.lo - job.tensors[s.t].offset) : nullptr;
  const int64_t len = s.hi - s.lo;
  constexpr int L = 16;
  double gs[L] = {}, ts[L] = {};
  float tm[L] = {}, bm[L] = {};
  int64_t k0 = 0;
  auto one = [&](int64_t k, int l) {
    const float g = sc * acc[k];
    float u = g;
    if (Rule > 0) {
      const float bn = mu * b[k] + g;
      b[k] = bn;
      u = Rule == 2 ? g + mu * bn : bn;
      bm[l] = std::max(bm[l], std::fabs(bn));
    }
    const float tn = th[k] - lr * u;
    tout[k] = tn;
    gs[l] += static_cast<double>(g) * static_cast<double>(g);
    ts[l] += static_cast<double>(tn) * static_cast<double>(tn);
    tm[l] = std::max(tm[l], std::fabs(tn));
  };
  for (; k0 + L <= len; k0 += L)
    for (int l = 0; l < L; ++l) one(k0 + l, l);
  for (int l = 0; k0 < len; ++k0, ++l) one(k0, l);
  for (int l = 0; l < L; ++l) {
    st->g_sumsq += gs[l];
    st->theta_sumsq += ts[l];
    st->theta_amax = std::max(st->theta_amax, tm[l]);
    st->buf_amax = std::max(st->buf_amax, bm[l]);
  }
}

// Pass 1 of one chunk: the rda tensors' accumulators into theta_out, their squares summed per segment.
DELOCO_ALWAYS_INLINE void pass1_impl(const FusedJob& job, const Plan& plan, int64_t chunk, double* seg_sumsq) {
  for (size_t k = plan.chunk_begin[chunk]; k < plan.chunk_begin[chunk + 1]; ++k) {
    const Segment& s = plan.segs[k];
    if (!job.tensors[s.t].rda) continue;
    float* acc = job.theta_out + s.lo;
    accumulate(job, s, acc);
    const int64_t len = s.hi - s.lo;
    constexpr int L = 16;
    double q[L] = {};
    int64_t i = 0;
    for (; i + L <= len; i += L)
      for (int l = 0; l < L; ++l) q[l] += static_cast<double>(acc[i + l]) * static_cast<double>(acc[i + l]);
    for (int l = 0; i < len; ++i, ++l) q[l] += static_cast<double>(acc[i]) * static_cast<double>(acc[i]);
    double sum = 0;
    for (int l = 0; l < L; ++l) sum += q[l];
    seg_sumsq[k] = sum;
  }
}

// Pass 2 of one chunk: every segment's outer step (mean: accumulated here; rda: read back from pass 1).
DELOCO_ALWAYS_INLINE void pass2_impl(const FusedJob& job, const Plan& plan, int64_t chunk, FusedStats* st) {
  alignas(64) float acc[kFusedChunk];
  const int rule = !job.momentum ? 0 : job.nesterov ? 2 : 1;
  const int64_t cl = chunk * kFusedChunk;
  for (size_t k = plan.chunk_begin[chunk]; k < plan.chunk_begin[chunk + 1]; ++k) {
    const Segment& s = plan.segs[k];
    const float* a;
    if (job.tensors[s.t].rda) {
      a = job.theta_out + s.lo;
    } else {
      accumulate(job, s, acc + (s.lo - cl));
      a = acc + (s.lo - cl);
    }
    if (rule == 0)
      apply<0>(job, s, a, st);
    else if (rule == 1)
      apply<1>(job, s, a, st);
    else
      apply<2>(job, s, a, st);
  }
}

using Pass1 = void (*)(const FusedJob&, const Plan&, int64_t, double*);
using Pass2 = void (*)(const FusedJob&, const Plan&, int64_t, FusedStats*);

void pass1_generic(const FusedJob& j, const Plan& p, int64_t c, double* s) { pass1_impl(j, p, c, s); }
void pass2_generic(const FusedJob& j, const Plan& p, int64_t c, FusedStats* s) { pass2_impl(j, p, c, s); }
#if defined(__x86_64__) && defined(__GNUC__)
#define DELOCO_FUSED_X86 1
__attribute__((target("avx2,fma"))) void pass1_avx2(const FusedJob& j, const Plan& p, int64_t c, double* s) {
  pass1_impl(j, p, c, s);
}
__attribute__((target("avx2,fma"))) void pass2_avx2(const FusedJob& j, const Plan& p, int64_t c, FusedStats* s) {
  pass2_impl(j, p, c, s);
}
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl"))) void pass1_avx512(const FusedJob& j, const Plan& p,
                                                                                int64_t c, double* s) {
  pass1_impl(j, p, c, s);
}
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl"))) void pass2_avx512(const FusedJob& j, const Plan& p,
                                                                                int64_t c, FusedStats* s) {
  pass2_impl(j, p, c, s);
}
#endif

struct Isa {
  Pass1 p1 = pass1_generic;
  Pass2 p2 = pass2_generic;
  const char* name = "generic";
};

const Isa& isa() {
  static const Isa chosen = [] {
    Isa i;
#ifdef DELOCO_FUSED_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
      i.p1 = pass1_avx512;
      i.p2 = pass2_avx512;
      i.name = "avx512";
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      i.p1 = pass1_avx2;
      i.p2 = pass2_avx2;
      i.name = "avx2";
    }
#endif
    return i;
  }();
  return chosen;
}

// fn(i) for i in [0, n) on `threads` threads (the caller's included), items handed out in order.
template <typename F>
void parallel(int64_t n, int threads, const F& fn) {
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int k = 1; k < threads; ++k) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

}  // namespace

const char* fused_isa() { return isa().name; }

FusedStats run_fused(FusedJob& job) {
  const Plan plan = make_plan(job);
  const int64_t chunks = static_cast<int64_t>(plan.chunk_begin.size()) - 1;
  // Below ~256K elements per thread the threads cost more than they save.
  const int threads = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(job.threads, job.elements / (int64_t{1} << 18))));
  const Isa& f = isa();
  const bool any_rda = std::any_of(job.tensors.begin(), job.tensors.end(), [](const FusedTensor& t) { return t.rda; });
  if (any_rda) {
    std::vector<double> seg(plan.segs.size(), 0.0);
    parallel(chunks, threads, [&](int64_t c) { f.p1(job, plan, c, seg.data()); });
    std::vector<double> dir(job.tensors.size(), 0.0);
    for (size_t k = 0; k < plan.segs.size(); ++k) dir[plan.segs[k].t] += seg[k];  // segment order: deterministic
    for (size_t t = 0; t < job.tensors.size(); ++t) {
      FusedTensor& x = job.tensors[t];
      if (!x.rda) continue;
      const double dn = std::sqrt(dir[t]);
      x.scale = dn > 0 && x.radius > 0 ? static_cast<float>(x.radius / dn) : 0.f;
    }
  }
  std::vector<FusedStats> part(static_cast<size_t>(chunks));
  parallel(chunks, threads, [&](int64_t c) { f.p2(job, plan, c, &part[static_cast<size_t>(c)]); });
  FusedStats st;
  for (const FusedStats& p : part) {
    st.g_sumsq += p.g_sumsq;
    st.theta_sumsq += p.theta_sumsq;
    st.theta_amax = std::max(st.theta_amax, p.theta_amax);
    st.buf_amax = std::max(st.buf_amax, p.buf_amax);
  }
  return st;
}

double fused_delta_sumsq(const FusedSource& s, size_t t, const FusedTensor& tensor, const float* theta_t,
                         const float* hist_t, const float* residual_t) {
  alignas(64) float tmp[kFusedChunk];
  double sum = 0;
  for (int64_t lo = 0; lo < tensor.numel; lo += kFusedChunk) {
    const int64_t hi = std::min(tensor.numel, lo + kFusedChunk);
    const size_t len = static_cast<size_t>(hi - lo);
    if (s.enc.p != nullptr)
      wire_kernels::axpy<true>(s.enc, static_cast<size_t>(tensor.offset + lo), static_cast<size_t>(tensor.offset + hi),
                               1.f, tmp);
    else
      wire_kernels::axpy_fp32<true>(s.tensors[t] + lo, len, 1.f, tmp);
    if (hist_t != nullptr)
      for (size_t k = 0; k < len; ++k) tmp[k] += theta_t[lo + static_cast<int64_t>(k)] - hist_t[lo + static_cast<int64_t>(k)];
    if (residual_t != nullptr) wire_kernels::axpy_fp32<false>(residual_t + lo, len, 1.f, tmp);
    for (size_t k = 0; k < len; ++k) sum += static_cast<double>(tmp[k]) * static_cast<double>(tmp[k]);
  }
  return sum;
}

}  // namespace deloco::sync_detail
