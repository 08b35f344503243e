// wire/quantize_kernels.h — reading elements of a float payload straight from its wire bytes, for loops that
// consume a payload without decoding it into a buffer first (the syncer's fused merge, src/sync/fused_merge.cpp).
//
// Contract
//  * The payload must have been validated (scan_floats or decode_floats in wire/quantize.h): the right size, finite
//    non-negative block scales, finite fp32/bf16 values, no int2 code 0. Nothing here checks again.
//  * axpy<Init>(v, lo, hi, c, out): out[j − lo] = c · x_j (Init) or out[j − lo] += c · x_j for j in [lo, hi), x_j the
//    element j as decode_floats gives it, except that a block-scaled encoding folds c into the block scale first
//    ((c · scale) · q rather than c · (q · scale): one rounding of difference, ≤ 2^-24 relative).
//  * Header-only and always inlined, so that a caller compiled for a wider instruction set (a function with
//    __attribute__((target(...)))) vectorises these loops for that set. Pure and reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "deloco/wire.h"
#include "wire/quantize.h"

#if defined(__GNUC__)
#define DELOCO_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define DELOCO_ALWAYS_INLINE inline
#endif

namespace deloco::wire_kernels {

// A validated payload of n elements in a float encoding.
struct View {
  const unsigned char* p = nullptr;
  size_t n = 0;
  Encoding e = Encoding::kFp32;
  size_t blocks = 0;  // block-scaled encodings: ceil(n / kQuantBlock)
};

inline View view(const void* payload, Encoding e, size_t n) {
  View v;
  v.p = static_cast<const unsigned char*>(payload);
  v.n = n;
  v.e = e;
  v.blocks = (n + kQuantBlock - 1) / kQuantBlock;
  return v;
}

DELOCO_ALWAYS_INLINE float load_f32(const unsigned char* p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  float f;
  std::memcpy(&f, p, 4);
  return f;
#else
  const uint32_t u = uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

DELOCO_ALWAYS_INLINE float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// out[k] (=|+=) c · x[k] for k in [0, len): a contribution held as fp32 values in memory.
template <bool Init>
DELOCO_ALWAYS_INLINE void axpy_fp32(const float* __restrict x, size_t len, float c, float* __restrict out) {
  for (size_t k = 0; k < len; ++k) out[k] = (Init ? 0.f : out[k]) + c * x[k];
}

template <bool Init>
DELOCO_ALWAYS_INLINE void axpy(const View& v, size_t lo, size_t hi, float c, float* __restrict out) {
  switch (v.e) {
    case Encoding::kFp32: {
      const unsigned char* __restrict p = v.p + 4 * lo;  // any alignment: memcpy loads
      const size_t len = hi - lo;
      for (size_t k = 0; k < len; ++k) out[k] = (Init ? 0.f : out[k]) + c * load_f32(p + 4 * k);
      return;
    }
    case Encoding::kBf16: {
      const unsigned char* __restrict p = v.p + 2 * lo;
      const size_t len = hi - lo;
      for (size_t k = 0; k < len; ++k) {
        const uint16_t h = static_cast<uint16_t>(p[2 * k] | (p[2 * k + 1] << 8));
        const float x = bf16_to_f32(h);
        out[k] = (Init ? 0.f : out[k]) + c * x;
      }
      return;
    }
    default: break;
  }
  const unsigned char* scales = v.p;
  const unsigned char* __restrict vals = v.p + 4 * v.blocks;
  size_t j = lo;
  while (j < hi) {
    const size_t b = j / kQuantBlock;
    const size_t end = (b + 1) * kQuantBlock < hi ? (b + 1) * kQuantBlock : hi;
    const float k = c * load_f32(scales + 4 * b);
    float* __restrict o = out + (j - lo);
    const size_t len = end - j;
    if (v.e == Encoding::kInt8) {
      const int8_t* __restrict q = reinterpret_cast<const int8_t*>(vals) + j;
      for (size_t t = 0; t < len; ++t) o[t] = (Init ? 0.f : o[t]) + k * static_cast<float>(q[t]);
    } else if (v.e == Encoding::kInt4) {
      size_t t = 0;
      if (j & 1) {  // a high nibble first
        o[0] = (Init ? 0.f : o[0]) + k * static_cast<float>(static_cast<int>(vals[j >> 1] >> 4) - 8);
        t = 1;
      }
      const unsigned char* __restrict pb = vals + ((j + t) >> 1);
      const size_t pairs = (len - t) / 2;
      float* __restrict oo = o + t;
      for (size_t i = 0; i < pairs; ++i) {
        const unsigned byte = pb[i];
        const float lo4 = static_cast<float>(static_cast<int>(byte & 15u) - 8);
        const float hi4 = static_cast<float>(static_cast<int>(byte >> 4) - 8);
        oo[2 * i] = (Init ? 0.f : oo[2 * i]) + k * lo4;
        oo[2 * i + 1] = (Init ? 0.f : oo[2 * i + 1]) + k * hi4;
      }
      t += 2 * pairs;
      if (t < len) {  // a low nibble last
        const size_t e = j + t;
        o[t] = (Init ? 0.f : o[t]) + k * static_cast<float>(static_cast<int>(vals[e >> 1] & 15u) - 8);
      }
    } else {  // kInt2
      for (size_t t = 0; t < len; ++t) {
        const size_t e = j + t;
        const int q = static_cast<int>((vals[e >> 2] >> (2 * (e & 3))) & 3u) - 2;
        o[t] = (Init ? 0.f : o[t]) + k * static_cast<float>(q);
      }
    }
    j = end;
  }
}

}  // namespace deloco::wire_kernels
