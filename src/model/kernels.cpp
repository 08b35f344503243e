// Fused element-wise kernels of the GPT's training step (contract in model/kernels.h).
//
// Layout: row primitives on float32 rows (an AVX-512 set and a portable set, one chosen at run time), the
// dtype-generic row loops over them (bf16 rows are widened into a float scratch row and narrowed back), and the
// autograd functions that call those loops or, off the fused path, the ATen compositions.
#include "model/kernels.h"

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/autograd/custom_function.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "util/blas.h"  // host_cpu_features

namespace deloco::kernels {
namespace {

// ---- Row primitives ------------------------------------------------------------------------------------------
struct RowOps {
  float (*max)(const float* x, int64_t n);
  // y = exp(a·x − b), returns Σ y.
  float (*exp_shift)(const float* x, float* y, int64_t n, float a, float b);
  void (*scale)(float* y, int64_t n, float c);
  float (*dot)(const float* a, const float* b, int64_t n);
  // dx = s · y · (g − d)
  void (*softmax_grad)(const float* y, const float* g, float* dx, int64_t n, float d, float s);
  // y = x·Φ(x) (exact GELU); dx = g·(Φ(x) + x·φ(x)), its derivative times g
  void (*gelu)(const float* x, float* y, int64_t n);
  void (*gelu_grad)(const float* x, const float* g, float* dx, int64_t n);
  // Layer norm of one row: mean and 1/sqrt(var + eps); y = (x − mean)·rstd·w + b; and the backward
  // (dh = rstd·(gy·w − mean(gy·w) − x̂·mean(gy·w·x̂)) + gh, with gh null for none; dw += gy·x̂, db += gy).
  void (*ln_stats)(const float* x, int64_t n, float eps, float* mean, float* rstd);
  void (*ln_apply)(const float* x, const float* w, const float* b, float* y, int64_t n, float mean, float rstd);
  void (*ln_grad)(const float* h, const float* w, const float* gy, const float* gh, float* dh, float* dw, float* db,
                  int64_t n, float mean, float rstd);
  void (*add)(const float* a, const float* b, float* y, int64_t n);  // y = a + b
  void (*widen)(const uint16_t* bf16, float* f, int64_t n);
  void (*narrow)(const float* f, uint16_t* bf16, int64_t n);
};

namespace portable {
float max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}
float exp_shift(const float* x, float* y, int64_t n, float a, float b) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += (y[i] = std::exp(a * x[i] - b));
  return s;
}
void scale(float* y, int64_t n, float c) {
  for (int64_t i = 0; i < n; ++i) y[i] *= c;
}
float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
void softmax_grad(const float* y, const float* g, float* dx, int64_t n, float d, float s) {
  for (int64_t i = 0; i < n; ++i) dx[i] = s * y[i] * (g[i] - d);
}
constexpr float kInvSqrt2 = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
void gelu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * std::erfc(-x[i] * kInvSqrt2);
}
void gelu_grad(const float* x, const float* g, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dx[i] = g[i] * (0.5f * std::erfc(-x[i] * kInvSqrt2) + x[i] * kInvSqrt2Pi * std::exp(-0.5f * x[i] * x[i]));
}
void ln_stats(const float* x, int64_t n, float eps, float* mean, float* rstd) {
  float s = 0, q = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  const float m = s / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) q += (x[i] - m) * (x[i] - m);
  *mean = m;
  *rstd = 1.0f / std::sqrt(q / static_cast<float>(n) + eps);
}
void ln_apply(const float* x, const float* w, const float* b, float* y, int64_t n, float mean, float rstd) {
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * rstd * w[i] + b[i];
}
void ln_grad(const float* h, const float* w, const float* gy, const float* gh, float* dh, float* dw, float* db, int64_t n,
             float mean, float rstd) {
  float c1 = 0, c2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float xh = (h[i] - mean) * rstd, gw = gy[i] * w[i];
    c1 += gw;
    c2 += gw * xh;
    dw[i] += gy[i] * xh;
    db[i] += gy[i];
  }
  c1 /= static_cast<float>(n);
  c2 /= static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i)
    dh[i] = rstd * (gy[i] * w[i] - c1 - (h[i] - mean) * rstd * c2) + (gh != nullptr ? gh[i] : 0.0f);
}
void add(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
void widen(const uint16_t* h, float* f, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
    std::memcpy(&f[i], &bits, 4);
  }
}
void narrow(const float* f, uint16_t* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] = c10::BFloat16(f[i]).x;  // round to nearest even, NaN kept
}
constexpr RowOps kOps{max,      exp_shift, scale,   dot, softmax_grad, gelu,  gelu_grad,
                      ln_stats, ln_apply,  ln_grad, add, widen,        narrow};
}  // namespace portable

#if defined(__x86_64__)
#define DELOCO_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
// GCC 12's AVX-512 intrinsic headers start their masked-off operands as `__m512 __Y = __Y;`, which its uninitialized
// checks report at every inlined use: false positives, silenced here only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace avx512 {
DELOCO_AVX512 inline __mmask16 tail(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

// exp(x) to a few 1e-7 relative: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in two for the reduction), exp(r) by
// its degree-7 Taylor polynomial, 2^n by scalef (which underflows to 0 and needs no exponent arithmetic).
DELOCO_AVX512 inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

DELOCO_AVX512 float max(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  if (i < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, tail(n - i), x + i));
  return _mm512_reduce_max_ps(m);
}
DELOCO_AVX512 float exp_shift(const float* x, float* y, int64_t n, float a, float b) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp512(_mm512_fmsub_ps(va, _mm512_loadu_ps(x + i), vb));
    _mm512_storeu_ps(y + i, e);
    s = _mm512_add_ps(s, e);
  }
  if (i < n) {
    const __mmask16 k = tail(n - i);
    const __m512 e = exp512(_mm512_fmsub_ps(va, _mm512_maskz_loadu_ps(k, x + i), vb));
    _mm512_mask_storeu_ps(y + i, k, e);
    s = _mm512_mask_add_ps(s, k, s, e);
  }
  return _mm512_reduce_add_ps(s);
}
DELOCO_AVX512 void scale(float* y, int64_t n, float c) {
  const __m512 vc = _mm512_set1_ps(c);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), vc));
  if (i < n) {
    const __mmask16 k = tail(n - i);
    _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + i), vc));
  }
}
DELOCO_AVX512 float dot(const float* a, const float* b, int64_t n) {
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
  if (i < n) {
    const __mmask16 k = tail(n - i);
    s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), s);
  }
  return _mm512_reduce_add_ps(s);
}
DELOCO_AVX512 void softmax_grad(const float* y, const float* g, float* dx, int64_t n, float d, float s) {
  const __m512 vd = _mm512_set1_ps(d), vs = _mm512_set1_ps(s);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dx + i, _mm512_mul_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(y + i)),
                                           _mm512_sub_ps(_mm512_loadu_ps(g + i), vd)));
  if (i < n) {
    const __mmask16 k = tail(n - i);
    _mm512_mask_storeu_ps(dx + i, k, _mm512_mul_ps(_mm512_mul_ps(vs, _mm512_maskz_loadu_ps(k, y + i)),
                                                   _mm512_sub_ps(_mm512_maskz_loadu_ps(k, g + i), vd)));
  }
}
// Φ(x) = erfc(−x/√2)/2 with erfc(z), z ≥ 0, as t·exp(−z² + P(t)), t = 1/(1 + z/2), P the degree-9 Chebyshev fit of
// Press et al. (Numerical Recipes, erfcc): relative error below 1.2e-7 for every z ≥ 0, so Φ stays accurate far
// into the negative tail; for x ≥ 0, Φ = 1 − erfc(|x|/√2)/2.
DELOCO_AVX512 inline __m512 phi512(__m512 x) {
  const __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));
  // t = 1/d by the 14-bit reciprocal and one Newton step (about 1 ulp; a division costs far more)
  const __m512 d = _mm512_fmadd_ps(z, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f));
  const __m512 t0 = _mm512_rcp14_ps(d);
  const __m512 t = _mm512_mul_ps(t0, _mm512_fnmadd_ps(d, t0, _mm512_set1_ps(2.0f)));
  __m512 p = _mm512_set1_ps(0.17087277f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.82215223f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.48851587f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.13520398f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.27886807f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.18628806f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.09678418f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.37409196f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.00002368f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.26551223f));
  const __m512 half_erfc = _mm512_mul_ps(_mm512_set1_ps(0.5f), _mm512_mul_ps(t, exp512(_mm512_fnmadd_ps(z, z, p))));
  const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(neg, _mm512_sub_ps(_mm512_set1_ps(1.0f), half_erfc), half_erfc);
}
DELOCO_AVX512 void gelu(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(y + i, _mm512_mul_ps(v, phi512(v)));
  }
  if (i < n) {
    const __mmask16 k = tail(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(v, phi512(v)));
  }
}
DELOCO_AVX512 inline __m512 gelu_grad512(__m512 v, __m512 g) {
  const __m512 density = _mm512_mul_ps(_mm512_set1_ps(0.39894228040143268f),
                                       exp512(_mm512_mul_ps(_mm512_set1_ps(-0.5f), _mm512_mul_ps(v, v))));
  return _mm512_mul_ps(g, _mm512_fmadd_ps(v, density, phi512(v)));
}
DELOCO_AVX512 void gelu_grad(const float* x, const float* g, float* dx, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dx + i, gelu_grad512(_mm512_loadu_ps(x + i), _mm512_loadu_ps(g + i)));
  if (i < n) {
    const __mmask16 k = tail(n - i);
    _mm512_mask_storeu_ps(dx + i, k, gelu_grad512(_mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, g + i)));
  }
}
DELOCO_AVX512 void ln_stats(const float* x, int64_t n, float eps, float* mean, float* rstd) {
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + i));
  if (i < n) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(tail(n - i), x + i));
  const float m = _mm512_reduce_add_ps(s) / static_cast<float>(n);
  const __m512 vm = _mm512_set1_ps(m);
  __m512 q = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
    q = _mm512_fmadd_ps(d, d, q);
  }
  if (i < n) {
    const __mmask16 k = tail(n - i);
    const __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + i), vm);
    q = _mm512_fmadd_ps(d, d, q);
  }
  *mean = m;
  *rstd = 1.0f / std::sqrt(_mm512_reduce_add_ps(q) / static_cast<float>(n) + eps);
}
DELOCO_AVX512 void ln_apply(const float* x, const float* w, const float* b, float* y, int64_t n, float mean, float rstd) {
  const __m512 vm = _mm512_set1_ps(mean), vr = _mm512_set1_ps(rstd);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm), vr);
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(xh, _mm512_loadu_ps(w + i), _mm512_loadu_ps(b + i)));
  }
  if (i < n) {
    const __mmask16 k = tail(n - i);
    const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm), vr);
    _mm512_mask_storeu_ps(y + i, k, _mm512_fmadd_ps(xh, _mm512_maskz_loadu_ps(k, w + i), _mm512_maskz_loadu_ps(k, b + i)));
  }
}
DELOCO_AVX512 void ln_grad(const float* h, const float* w, const float* gy, const float* gh, float* dh, float* dw,
                           float* db, int64_t n, float mean, float rstd) {
  const __m512 vm = _mm512_set1_ps(mean), vr = _mm512_set1_ps(rstd);
  __m512 c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail(n - i);
    const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, h + i), vm), vr);
    const __m512 g = _mm512_maskz_loadu_ps(k, gy + i);
    const __m512 gw = _mm512_mul_ps(g, _mm512_maskz_loadu_ps(k, w + i));
    c1 = _mm512_add_ps(c1, gw);
    c2 = _mm512_fmadd_ps(gw, xh, c2);
    _mm512_mask_storeu_ps(dw + i, k, _mm512_fmadd_ps(g, xh, _mm512_maskz_loadu_ps(k, dw + i)));
    _mm512_mask_storeu_ps(db + i, k, _mm512_add_ps(g, _mm512_maskz_loadu_ps(k, db + i)));
  }
  const __m512 m1 = _mm512_set1_ps(_mm512_reduce_add_ps(c1) / static_cast<float>(n));
  const __m512 m2 = _mm512_set1_ps(_mm512_reduce_add_ps(c2) / static_cast<float>(n));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail(n - i);
    const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, h + i), vm), vr);
    const __m512 gw = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, gy + i), _mm512_maskz_loadu_ps(k, w + i));
    __m512 d = _mm512_mul_ps(vr, _mm512_sub_ps(_mm512_sub_ps(gw, m1), _mm512_mul_ps(xh, m2)));
    if (gh != nullptr) d = _mm512_add_ps(d, _mm512_maskz_loadu_ps(k, gh + i));
    _mm512_mask_storeu_ps(dh + i, k, d);
  }
}
DELOCO_AVX512 void add(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : tail(n - i);
    _mm512_mask_storeu_ps(y + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i)));
  }
}
DELOCO_AVX512 void widen(const uint16_t* h, float* f, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i));
    _mm512_storeu_ps(f + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
  }
  if (i < n) {
    const __mmask16 k = tail(n - i);
    const __m256i v = _mm256_maskz_loadu_epi16(k, h + i);
    _mm512_mask_storeu_ps(f + i, k, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
  }
}
DELOCO_AVX512 inline __m256i to_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}
DELOCO_AVX512 void narrow(const float* f, uint16_t* h, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + i), to_bf16(_mm512_loadu_ps(f + i)));
  if (i < n) {
    const __mmask16 k = tail(n - i);
    _mm256_mask_storeu_epi16(h + i, k, to_bf16(_mm512_maskz_loadu_ps(k, f + i)));
  }
}
constexpr RowOps kOps{max,      exp_shift, scale,   dot, softmax_grad, gelu,  gelu_grad,
                      ln_stats, ln_apply,  ln_grad, add, widen,        narrow};
}  // namespace avx512
#pragma GCC diagnostic pop
#endif

bool cpu_has_avx512() {
  static const bool has = host_cpu_features().avx512;
  return has;
}
std::atomic<bool> g_avx512{true};

const RowOps& ops() {
#if defined(__x86_64__)
  if (g_avx512.load(std::memory_order_relaxed) && cpu_has_avx512()) return avx512::kOps;
#endif
  return portable::kOps;
}

// ---- Rows of either dtype ------------------------------------------------------------------------------------
// A row of float32 or bf16 seen as float32: float rows are used in place, bf16 rows through a scratch row.
template <typename E>
struct Rows;
template <>
struct Rows<float> {
  static const float* in(const RowOps&, const float* p, int64_t, float*) { return p; }
  static float* out(float* p, float*) { return p; }
  static void done(const RowOps&, float*, const float*, int64_t) {}
};
template <>
struct Rows<c10::BFloat16> {
  static const float* in(const RowOps& o, const c10::BFloat16* p, int64_t n, float* scratch) {
    o.widen(reinterpret_cast<const uint16_t*>(p), scratch, n);
    return scratch;
  }
  static float* out(c10::BFloat16*, float* scratch) { return scratch; }
  static void done(const RowOps& o, c10::BFloat16* p, const float* scratch, int64_t n) {
    o.narrow(scratch, reinterpret_cast<uint16_t*>(p), n);
  }
};

int64_t grain_rows(int64_t row_len) { return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, row_len)); }

// ---- Causal softmax ------------------------------------------------------------------------------------------
template <typename E>
void causal_softmax_fwd(const E* x, E* y, int64_t rows, int64_t T, float scale) {
  const RowOps& o = ops();
  at::parallel_for(0, rows, grain_rows(T), [&](int64_t begin, int64_t end) {
    std::vector<float> a(T), b(T);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r % T + 1;  // query i sees keys 0..i
      const float* xf = Rows<E>::in(o, x + r * T, n, a.data());
      float* yf = Rows<E>::out(y + r * T, b.data());
      const float m = o.max(xf, n);
      const float sum = o.exp_shift(xf, yf, n, scale, scale * m);
      o.scale(yf, n, 1.0f / sum);
      std::fill(yf + n, yf + T, 0.0f);
      Rows<E>::done(o, y + r * T, yf, T);
    }
  });
}

template <typename E>
void causal_softmax_bwd(const E* y, const E* g, E* dx, int64_t rows, int64_t T, float scale) {
  const RowOps& o = ops();
  at::parallel_for(0, rows, grain_rows(T), [&](int64_t begin, int64_t end) {
    std::vector<float> a(T), b(T), c(T);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r % T + 1;
      const float* yf = Rows<E>::in(o, y + r * T, n, a.data());
      const float* gf = Rows<E>::in(o, g + r * T, n, b.data());
      float* df = Rows<E>::out(dx + r * T, c.data());
      o.softmax_grad(yf, gf, df, n, o.dot(yf, gf, n), scale);
      std::fill(df + n, df + T, 0.0f);
      Rows<E>::done(o, dx + r * T, df, T);
    }
  });
}

// Calls f(E{}) with E the element type of a float32 or bfloat16 tensor.
template <typename F>
void dispatch(at::ScalarType t, F f) {
  if (t == at::kBFloat16)
    f(c10::BFloat16());
  else
    f(0.0f);
}

bool fusable(const at::Tensor& t) {
  return t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16) && t.is_contiguous();
}

class CausalSoftmaxFn : public torch::autograd::Function<CausalSoftmaxFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& s, double scale) {
    const int64_t T = s.size(-1), rows = s.numel() / T;
    at::Tensor y = at::empty_like(s);
    dispatch(s.scalar_type(), [&](auto tag) {
      using scalar_t = decltype(tag);
      causal_softmax_fwd<scalar_t>(s.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), rows, T, static_cast<float>(scale));
    });
    ctx->save_for_backward({y});
    ctx->saved_data["scale"] = scale;
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    const at::Tensor g = grads[0].to(y.scalar_type()).contiguous();
    const int64_t T = y.size(-1), rows = y.numel() / T;
    at::Tensor dx = at::empty_like(y);
    const float scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    dispatch(y.scalar_type(), [&](auto tag) {
      using scalar_t = decltype(tag);
      causal_softmax_bwd<scalar_t>(y.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), rows, T,
                                   scale);
    });
    return {dx, at::Tensor()};
  }
};

// ---- Cross-entropy -------------------------------------------------------------------------------------------
template <typename E>
double cross_entropy_fwd(const E* x, const int64_t* t, float* lse, int64_t N, int64_t V) {
  const RowOps& o = ops();
  return at::parallel_reduce(
      0, N, grain_rows(V), 0.0,
      [&](int64_t begin, int64_t end, double acc) {
        std::vector<float> a(V), e(V);
        for (int64_t r = begin; r < end; ++r) {
          const float* xf = Rows<E>::in(o, x + r * V, V, a.data());
          const float m = o.max(xf, V);
          lse[r] = m + std::log(o.exp_shift(xf, e.data(), V, 1.0f, m));
          acc += static_cast<double>(lse[r]) - static_cast<double>(xf[t[r]]);
        }
        return acc;
      },
      [](double p, double q) { return p + q; });
}

template <typename E>
void cross_entropy_bwd(const E* x, const int64_t* t, const float* lse, E* dx, int64_t N, int64_t V, float c) {
  const RowOps& o = ops();
  at::parallel_for(0, N, grain_rows(V), [&](int64_t begin, int64_t end) {
    std::vector<float> a(V), b(V);
    for (int64_t r = begin; r < end; ++r) {
      const float* xf = Rows<E>::in(o, x + r * V, V, a.data());
      float* df = Rows<E>::out(dx + r * V, b.data());
      o.exp_shift(xf, df, V, 1.0f, lse[r]);
      o.scale(df, V, c);
      df[t[r]] -= c;
      Rows<E>::done(o, dx + r * V, df, V);
    }
  });
}

class CrossEntropyFn : public torch::autograd::Function<CrossEntropyFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets) {
    const int64_t N = logits.size(0), V = logits.size(1);
    TORCH_CHECK(N == 0 || (targets.min().item<int64_t>() >= 0 && targets.max().item<int64_t>() < V),
                "cross_entropy: target ids must lie in [0, ", V, ")");
    at::Tensor lse = at::empty({N}, logits.options().dtype(at::kFloat));
    double total = 0;
    dispatch(logits.scalar_type(), [&](auto tag) {
      using scalar_t = decltype(tag);
      total = cross_entropy_fwd<scalar_t>(logits.data_ptr<scalar_t>(), targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                          N, V);
    });
    ctx->save_for_backward({logits, targets, lse});
    return at::scalar_tensor(N > 0 ? total / static_cast<double>(N) : std::nan(""), logits.options().dtype(at::kFloat));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const int64_t N = logits.size(0), V = logits.size(1);
    const float c = static_cast<float>(grads[0].item<double>() / static_cast<double>(N));
    at::Tensor dx = at::empty_like(logits);
    dispatch(logits.scalar_type(), [&](auto tag) {
      using scalar_t = decltype(tag);
      cross_entropy_bwd<scalar_t>(logits.data_ptr<scalar_t>(), saved[1].data_ptr<int64_t>(), saved[2].data_ptr<float>(),
                                  dx.data_ptr<scalar_t>(), N, V, c);
    });
    return {dx, at::Tensor()};
  }
};

// ---- GELU ----------------------------------------------------------------------------------------------------
constexpr int64_t kChunk = 1024;  // elements per row-primitive call (fits the scratch rows in L1)

template <typename E>
void gelu_fwd(const E* x, E* y, int64_t n) {
  const RowOps& o = ops();
  at::parallel_for(0, (n + kChunk - 1) / kChunk, 16, [&](int64_t begin, int64_t end) {
    float a[kChunk], b[kChunk];
    for (int64_t c = begin; c < end; ++c) {
      const int64_t off = c * kChunk, len = std::min(kChunk, n - off);
      float* yf = Rows<E>::out(y + off, b);
      o.gelu(Rows<E>::in(o, x + off, len, a), yf, len);
      Rows<E>::done(o, y + off, yf, len);
    }
  });
}

template <typename E>
void gelu_bwd(const E* x, const E* g, E* dx, int64_t n) {
  const RowOps& o = ops();
  at::parallel_for(0, (n + kChunk - 1) / kChunk, 16, [&](int64_t begin, int64_t end) {
    float a[kChunk], b[kChunk], c2[kChunk];
    for (int64_t c = begin; c < end; ++c) {
      const int64_t off = c * kChunk, len = std::min(kChunk, n - off);
      float* df = Rows<E>::out(dx + off, c2);
      o.gelu_grad(Rows<E>::in(o, x + off, len, a), Rows<E>::in(o, g + off, len, b), df, len);
      Rows<E>::done(o, dx + off, df, len);
    }
  });
}

class GeluFn : public torch::autograd::Function<GeluFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor y = at::empty_like(x);
    dispatch(x.scalar_type(), [&](auto tag) {
      using scalar_t = decltype(tag);
      gelu_fwd<scalar_t>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), x.numel());
    });
    ctx->save_for_backward({x});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor g = grads[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty_like(x);
    dispatch(x.scalar_type(), [&](auto tag) {
      using scalar_t = decltype(tag);
      gelu_bwd<scalar_t>(x.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), x.numel());
    });
    return {dx};
  }
};

// ---- Layer norm, with the residual add before it ---------------------------------------------------------------
// Forward over rows of C: h = x + r (r optional, float32 or bf16), y = layer_norm(h)·w + b written as Y.
template <typename R, typename Y>
void layer_norm_fwd(const float* x, const R* r, const float* w, const float* b, float* h, Y* y, float* mean, float* rstd,
                    int64_t N, int64_t C, float eps) {
  const RowOps& o = ops();
  at::parallel_for(0, N, grain_rows(C), [&](int64_t begin, int64_t end) {
    std::vector<float> a(C), c(C);
    for (int64_t row = begin; row < end; ++row) {
      const float* hr = x + row * C;
      if (r != nullptr) {
        o.add(hr, Rows<R>::in(o, r + row * C, C, a.data()), h + row * C, C);
        hr = h + row * C;
      }
      o.ln_stats(hr, C, eps, &mean[row], &rstd[row]);
      float* yf = Rows<Y>::out(y + row * C, c.data());
      o.ln_apply(hr, w, b, yf, C, mean[row], rstd[row]);
      Rows<Y>::done(o, y + row * C, yf, C);
    }
  });
}

// Backward: dh = layer norm's input gradient for gy, plus gh (the gradient reaching h itself; null: none); dw, db
// summed over rows in blocks of a fixed size and then in block order, so the result does not depend on the thread
// count (a resumed run repeats the same sums).
template <typename Y>
void layer_norm_bwd(const float* h, const float* w, const Y* gy, const float* gh, float* dh, float* dw, float* db,
                    const float* mean, const float* rstd, int64_t N, int64_t C) {
  const RowOps& o = ops();
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  std::vector<float> pw(blocks * C, 0.0f), pb(blocks * C, 0.0f);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> a(C);
    for (int64_t blk = begin; blk < end; ++blk)
      for (int64_t row = blk * kBlock; row < std::min(N, (blk + 1) * kBlock); ++row)
        o.ln_grad(h + row * C, w, Rows<Y>::in(o, gy + row * C, C, a.data()), gh != nullptr ? gh + row * C : nullptr,
                  dh + row * C, &pw[blk * C], &pb[blk * C], C, mean[row], rstd[row]);
  });
  std::fill(dw, dw + C, 0.0f);
  std::fill(db, db + C, 0.0f);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    o.add(dw, &pw[blk * C], dw, C);
    o.add(db, &pb[blk * C], db, C);
  }
}

// Calls f(R{}, Y{}) for the dtypes of the residual (float when there is none) and of the output.
template <typename F>
void dispatch2(at::ScalarType r, at::ScalarType y, F f) {
  dispatch(r, [&](auto rt) { dispatch(y, [&](auto yt) { f(rt, yt); }); });
}

// Shared by the two autograd functions: forward returns {h or undefined, y}, saving what backward needs.
torch::autograd::variable_list ln_forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& r,
                                          const at::Tensor& w, const at::Tensor& b, at::ScalarType out, double eps) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  at::Tensor h = r.defined() ? at::empty_like(x) : x;
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(out));
  at::Tensor mean = at::empty({N}, x.options()), rstd = at::empty({N}, x.options());
  dispatch2(r.defined() ? r.scalar_type() : at::kFloat, out, [&](auto rt, auto yt) {
    using R = decltype(rt);
    using Y = decltype(yt);
    layer_norm_fwd<R, Y>(x.data_ptr<float>(), r.defined() ? r.data_ptr<R>() : nullptr, w.data_ptr<float>(),
                         b.data_ptr<float>(), h.data_ptr<float>(), y.data_ptr<Y>(), mean.data_ptr<float>(),
                         rstd.data_ptr<float>(), N, C, static_cast<float>(eps));
  });
  ctx->save_for_backward({h, w, mean, rstd});
  ctx->saved_data["residual_dtype"] = static_cast<int64_t>(r.defined() ? r.scalar_type() : at::kFloat);
  return {r.defined() ? h : at::Tensor(), y};
}

// Returns {dh, dw, db} for the incoming gradients of h (may be undefined) and y.
std::array<at::Tensor, 3> ln_backward(torch::autograd::AutogradContext* ctx, const at::Tensor& gh_in,
                                      const at::Tensor& gy_in, at::ScalarType out) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor &h = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
  const int64_t C = h.size(-1), N = h.numel() / C;
  const at::Tensor gy = gy_in.defined() ? gy_in.to(out).contiguous() : at::zeros(h.sizes(), h.options().dtype(out));
  const at::Tensor gh = gh_in.defined() ? gh_in.to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor dh = at::empty_like(h), dw = at::empty_like(w), db = at::empty_like(w);
  dispatch(out, [&](auto yt) {
    using Y = decltype(yt);
    layer_norm_bwd<Y>(h.data_ptr<float>(), w.data_ptr<float>(), gy.data_ptr<Y>(), gh.defined() ? gh.data_ptr<float>() : nullptr,
                      dh.data_ptr<float>(), dw.data_ptr<float>(), db.data_ptr<float>(), mean.data_ptr<float>(),
                      rstd.data_ptr<float>(), N, C);
  });
  return {dh, dw, db};
}

class LayerNormFn : public torch::autograd::Function<LayerNormFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b, int64_t out, double eps) {
    ctx->saved_data["out"] = out;
    return ln_forward(ctx, x, at::Tensor(), w, b, static_cast<at::ScalarType>(out), eps)[1];
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto d = ln_backward(ctx, at::Tensor(), grads[0], static_cast<at::ScalarType>(ctx->saved_data["out"].toInt()));
    return {d[0], d[1], d[2], at::Tensor(), at::Tensor()};
  }
};

class AddLayerNormFn : public torch::autograd::Function<AddLayerNormFn> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& r, const at::Tensor& w, const at::Tensor& b,
                                                int64_t out, double eps) {
    ctx->saved_data["out"] = out;
    return ln_forward(ctx, x, r, w, b, static_cast<at::ScalarType>(out), eps);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto d = ln_backward(ctx, grads[0], grads[1], static_cast<at::ScalarType>(ctx->saved_data["out"].toInt()));
    const auto rt = static_cast<at::ScalarType>(ctx->saved_data["residual_dtype"].toInt());
    return {d[0], rt == at::kFloat ? d[0] : d[0].to(rt), d[1], d[2], at::Tensor(), at::Tensor()};
  }
};

bool ln_fusable(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::ScalarType out) {
  const int64_t C = x.dim() > 0 ? x.size(-1) : 0;
  return fusable(x) && x.scalar_type() == at::kFloat && C > 0 && fusable(w) && w.scalar_type() == at::kFloat &&
         fusable(b) && b.scalar_type() == at::kFloat && w.dim() == 1 && w.size(0) == C && b.dim() == 1 &&
         b.size(0) == C && (out == at::kFloat || out == at::kBFloat16);
}

}  // namespace

// ---- Public entry points -------------------------------------------------------------------------------------
at::Tensor causal_softmax_reference(const at::Tensor& scores, double scale) {
  const int64_t T = scores.size(-1);
  auto future = at::ones({T, T}, scores.options().dtype(at::kBool)).triu(1);
  return at::softmax((scores * scale).masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
}

at::Tensor causal_softmax(const at::Tensor& scores, double scale) {
  const bool fused = fusable(scores) && scores.dim() >= 2 && scores.size(-1) == scores.size(-2) && scores.size(-1) > 0 &&
                     scale > 0 && scores.scalar_type() != at::kDouble;
  if (!fused) return causal_softmax_reference(scores, scale);
  return CausalSoftmaxFn::apply(scores, scale);
}

at::Tensor cross_entropy_reference(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.to(at::kFloat), targets);
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  const bool fused = fusable(logits) && logits.dim() == 2 && logits.size(1) > 0 && targets.device().is_cpu() &&
                     targets.scalar_type() == at::kLong && targets.dim() == 1 && targets.is_contiguous() &&
                     targets.size(0) == logits.size(0);
  if (!fused) return cross_entropy_reference(logits, targets);
  return CrossEntropyFn::apply(logits, targets);
}

at::Tensor gelu(const at::Tensor& x) {
  if (!fusable(x)) return at::gelu(x);
  return GeluFn::apply(x);
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, at::ScalarType out) {
  if (!ln_fusable(x, w, b, out)) {
    at::Tensor y = at::layer_norm(x, {x.size(-1)}, w, b, eps);
    return y.scalar_type() == out || !x.device().is_cpu() ? y : y.to(out);
  }
  return LayerNormFn::apply(x, w, b, static_cast<int64_t>(out), eps);
}

std::pair<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& w,
                                                 const at::Tensor& b, double eps, at::ScalarType out) {
  if (!ln_fusable(x, w, b, out) || !fusable(r) || r.sizes() != x.sizes()) {
    at::Tensor h = x + r;
    at::Tensor y = at::layer_norm(h, {h.size(-1)}, w, b, eps);
    return {h, y.scalar_type() == out || !x.device().is_cpu() ? y : y.to(out)};
  }
  auto hy = AddLayerNormFn::apply(x, r, w, b, static_cast<int64_t>(out), eps);
  return {hy[0], hy[1]};
}

bool avx512_active() {
#if defined(__x86_64__)
  return g_avx512.load() && cpu_has_avx512();
#else
  return false;
#endif
}

void set_avx512(bool on) { g_avx512.store(on); }

}  // namespace deloco::kernels
