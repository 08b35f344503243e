// Float payload codecs: fp32, bf16 (round to nearest even), block-scaled int8, int4 and int2 (contract in quantize.h).
#include "wire/quantize.h"
#include "wire/le.h"
#include "util/text.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <cmath>
#include <cstring>

namespace deloco {
namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
using le::get_u32;
using le::put_u32;

void check_finite(const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) throw NonFiniteError("quantize: non-finite input at index " + std::to_string(i) + ": " + exact_number(x[i]));
}

void require_float_encoding(Encoding e) {
  if (e == Encoding::kRaw || static_cast<uint8_t>(e) > kMaxEncoding)
    throw WireError(std::string("quantize: encoding ") + encoding_name(e) + " (" +
                    std::to_string(static_cast<int>(e)) + ") is not a float encoding");
}

void require_dense(Encoding e) {
  require_float_encoding(e);
  if (is_sparse(e))
    throw WireError(std::string("quantize: ") + encoding_name(e) +
                    " is sparse: its payload has no fixed size (encode_floats with a Codec)");
}

// A sparse payload decoded into n dense elements (zeros where it holds nothing).
void decode_sparse_into(const void* payload, size_t bytes, Encoding e, size_t n, float* out) {
  const SparseEntries s = decode_topk(payload, bytes, e, n);  // validates everything before out is written
  std::fill(out, out + n, 0.f);
  for (size_t j = 0; j < s.index.size(); ++j) out[s.index[j]] = s.value[j];
}

// Block scales for int8 (qmax 127), int4 (qmax 7) or int2 (qmax 1), written before the values. `bits`: 8, 4, 2.
void encode_blocks(const float* x, size_t n, int qmax, int bits, char* out) {
  const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
  unsigned char* vals = reinterpret_cast<unsigned char*>(out + 4 * blocks);
  const size_t per_byte = static_cast<size_t>(8 / bits);
  if (bits < 8) std::memset(vals, 0, (n + per_byte - 1) / per_byte);
  const int offset = 1 << (bits - 1);  // int4: q + 8; int2: q + 2
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * kQuantBlock, hi = std::min(n, lo + kQuantBlock);
    float amax = 0.f;
    for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax / static_cast<float>(qmax);
    // Decoding computes q × scale in float: for |x| within a rounding of FLT_MAX that product overflows to inf,
    // so such a block cannot be represented (found by fuzz/fuzz_codecs).
    if (!std::isfinite(scale * static_cast<float>(qmax)))
      throw WireError("quantize: block " + std::to_string(b) + " has |x| up to " + exact_number(amax) + ", too large for int" +
                      std::to_string(bits) + " (its decoded values would overflow)");
    put_u32(out + 4 * b, float_bits(scale));
    for (size_t i = lo; i < hi; ++i) {
      // x/scale rather than x*inv keeps the rounding within half a step of the exact quotient.
      float q = scale > 0.f ? std::nearbyint(x[i] / scale) : 0.f;
      q = std::min(std::max(q, -static_cast<float>(qmax)), static_cast<float>(qmax));
      const int qi = static_cast<int>(q);
      if (bits == 8) {
        vals[i] = static_cast<unsigned char>(static_cast<int8_t>(qi));
      } else {
        const unsigned code = static_cast<unsigned>(qi + offset) & ((1u << bits) - 1);
        vals[i / per_byte] |= static_cast<unsigned char>(code << (bits * (i % per_byte)));
      }
    }
  }
}

// The canonical form encode_blocks writes, which validation and decoding both require (a WireError otherwise): every
// code in [−qmax, qmax] (int8 never −128, int4 never the nibble 0, int2 never the code 0), the bits after the last
// element zero, and a block with a positive scale holding a nonzero value (its largest |x| quantizes to ±qmax, or to
// at least ±1 where the scale is subnormal). A positive scale over zeros decodes to zeros, but the fused merge folds a
// coefficient into the scale first (c·scale, then ·q): a huge scale overflows that product to inf and inf·0 is NaN,
// and the push's measured largest value (which bounds the merge) says nothing of a scale over zeros.
void check_codes(const unsigned char* p, size_t n, int bits) {
  const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
  const unsigned char* vals = p + 4 * blocks;
  const size_t per_byte = static_cast<size_t>(8 / bits);
  const int offset = 1 << (bits - 1);
  const int qmax = bits == 8 ? 127 : bits == 4 ? 7 : 1;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * kQuantBlock, hi = std::min(n, lo + kQuantBlock);
    bool nonzero = false;
    for (size_t i = lo; i < hi; ++i) {
      const int q = bits == 8 ? static_cast<int>(static_cast<int8_t>(vals[i]))
                              : static_cast<int>((vals[i / per_byte] >> (bits * (i % per_byte))) & ((1u << bits) - 1)) -
                                    offset;
      if (q < -qmax)
        throw WireError("quantize: element " + std::to_string(i) + " has the int" + std::to_string(bits) + " code " +
                        (bits == 8 ? std::string("-128") : std::to_string(q + offset)) + ", which no encoder writes");
      nonzero |= q != 0;
    }
    const float scale = bits_float(get_u32(p + 4 * b));
    if (scale > 0.f && !nonzero)
      throw WireError("quantize: block " + std::to_string(b) + " has the scale " + exact_number(scale) +
                      " over zeros only, which no encoder writes");
  }
  const size_t used = n % per_byte;
  if (bits < 8 && used != 0 && (vals[n / per_byte] >> (bits * used)) != 0)
    throw WireError("quantize: the bits after element " + std::to_string(n - 1) + " are not zero, which no encoder writes");
}

void decode_blocks(const unsigned char* in, size_t n, int bits, float* out) {
  const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
  const unsigned char* vals = in + 4 * blocks;
  const size_t per_byte = static_cast<size_t>(8 / bits);
  const int offset = 1 << (bits - 1);
  for (size_t b = 0; b < blocks; ++b) {
    const float scale = bits_float(get_u32(in + 4 * b));
    // A NaN or infinite scale is a number problem (non-finite), a negative one a framing problem: our encoder
    // never writes it.
    if (!std::isfinite(scale))
      throw NonFiniteError("quantize: block " + std::to_string(b) + " has a non-finite scale " + exact_number(scale));
    if (scale < 0.f) throw WireError("quantize: block " + std::to_string(b) + " has a negative scale " + exact_number(scale));
    const size_t lo = b * kQuantBlock, hi = std::min(n, lo + kQuantBlock);
    for (size_t i = lo; i < hi; ++i) {
      int q;
      if (bits == 8) {
        q = static_cast<int8_t>(vals[i]);
      } else {
        q = static_cast<int>((vals[i / per_byte] >> (bits * (i % per_byte))) & ((1u << bits) - 1)) - offset;
      }
      out[i] = static_cast<float>(q) * scale;
    }
  }
}

}  // namespace

void encode_floats_into(const float* x, size_t n, Encoding e, char* out) {
  require_dense(e);
  check_finite(x, n);
  switch (e) {
    case Encoding::kFp32:
      for (size_t i = 0; i < n; ++i) put_u32(out + 4 * i, float_bits(x[i]));
      break;
    case Encoding::kBf16:
      for (size_t i = 0; i < n; ++i) {
        const uint32_t u = float_bits(x[i]);
        const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest, ties to even
        if ((r & 0x7f80u) == 0x7f80u)
          throw WireError("quantize: value at index " + std::to_string(i) + " (" + exact_number(x[i]) + ") overflows bf16");
        out[2 * i] = static_cast<char>(r & 0xff);
        out[2 * i + 1] = static_cast<char>((r >> 8) & 0xff);
      }
      break;
    case Encoding::kInt8: encode_blocks(x, n, 127, 8, out); break;
    case Encoding::kInt4: encode_blocks(x, n, 7, 4, out); break;
    case Encoding::kInt2: encode_blocks(x, n, 1, 2, out); break;
    default: break;  // unreachable: require_float_encoding
  }
}

std::string encode_floats(const float* x, size_t n, const Codec& c) {
  const Encoding e = c.encoding;
  require_float_encoding(e);
  if (is_sparse(e)) return encode_topk(x, n, e, c.topk);
  std::string out(encoded_bytes(e, n), '\0');
  encode_floats_into(x, n, e, out.data());
  return out;
}

void decode_floats_into(const void* payload, size_t bytes, Encoding e, size_t n, float* out) {
  require_float_encoding(e);
  if (is_sparse(e)) return decode_sparse_into(payload, bytes, e, n, out);
  const size_t want = encoded_bytes(e, n);
  if (bytes != want)
    throw WireError("quantize: payload of " + std::to_string(bytes) + " bytes for " + std::to_string(n) +
                    " elements in " + encoding_name(e) + " (expected " + std::to_string(want) + ")");
  const unsigned char* p = static_cast<const unsigned char*>(payload);
  switch (e) {
    case Encoding::kFp32:
      for (size_t i = 0; i < n; ++i) out[i] = bits_float(get_u32(p + 4 * i));
      break;
    case Encoding::kBf16:
      for (size_t i = 0; i < n; ++i) out[i] = bits_float((uint32_t{p[2 * i]} | (uint32_t{p[2 * i + 1]} << 8)) << 16);
      break;
    case Encoding::kInt8: decode_blocks(p, n, 8, out); break;
    case Encoding::kInt4: decode_blocks(p, n, 4, out); break;
    case Encoding::kInt2: decode_blocks(p, n, 2, out); break;
    default: break;
  }
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(out[i]))
      throw NonFiniteError("quantize: decoded non-finite value at index " + std::to_string(i) + ": " + exact_number(out[i]));
  // Last, as validate_floats checks: scales, then finite values, then the codes' form.
  if (e == Encoding::kInt8 || e == Encoding::kInt4 || e == Encoding::kInt2)
    check_codes(p, n, e == Encoding::kInt8 ? 8 : e == Encoding::kInt4 ? 4 : 2);
}

std::vector<float> decode_floats(const void* payload, size_t bytes, Encoding e, size_t n) {
  require_float_encoding(e);
  if (is_sparse(e)) {
    const SparseEntries s = decode_topk(payload, bytes, e, n);  // checks n and the payload before allocating
    std::vector<float> out(n, 0.f);
    for (size_t j = 0; j < s.index.size(); ++j) out[s.index[j]] = s.value[j];
    return out;
  }
  const size_t want = encoded_bytes(e, n);  // checks n against the payload before allocating n floats
  if (bytes != want)
    throw WireError("quantize: payload of " + std::to_string(bytes) + " bytes for " + std::to_string(n) +
                    " elements in " + encoding_name(e) + " (expected " + std::to_string(want) + ")");
  std::vector<float> out(n);
  decode_floats_into(payload, bytes, e, n, out.data());
  return out;
}

namespace {

// The first non-finite element of an fp32 or bf16 payload in [lo, hi) (called once a vectorised pass found one).
[[noreturn]] void throw_first_non_finite(const unsigned char* p, Encoding e, size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; ++i) {
    const float x = e == Encoding::kFp32 ? bits_float(get_u32(p + 4 * i))
                                         : bits_float((uint32_t{p[2 * i]} | (uint32_t{p[2 * i + 1]} << 8)) << 16);
    if (!std::isfinite(x))
      throw NonFiniteError("quantize: decoded non-finite value at index " + std::to_string(i) + ": " + exact_number(x));
  }
  throw NonFiniteError("quantize: decoded non-finite value");  // unreachable
}

void check_size(size_t bytes, Encoding e, size_t n) {
  require_float_encoding(e);
  const size_t want = encoded_bytes(e, n);
  if (bytes != want)
    throw WireError("quantize: payload of " + std::to_string(bytes) + " bytes for " + std::to_string(n) +
                    " elements in " + encoding_name(e) + " (expected " + std::to_string(want) + ")");
}

void check_scales(const unsigned char* p, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b) {
    const float scale = bits_float(get_u32(p + 4 * b));
    if (!std::isfinite(scale))
      throw NonFiniteError("quantize: block " + std::to_string(b) + " has a non-finite scale " + exact_number(scale));
    if (scale < 0.f) throw WireError("quantize: block " + std::to_string(b) + " has a negative scale " + exact_number(scale));
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// Compiled for AVX-512, AVX2 and generic x86-64, picked when the program loads.
#define DELOCO_SCAN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DELOCO_SCAN_CLONES
#endif

// Σ q²·scale² (double) over elements [lo, hi) of an int8 or int4 payload (`bits`), and max |q·scale| into *amax.
DELOCO_SCAN_CLONES double scan_blocks_q(const unsigned char* p, size_t blocks, int bits, size_t lo, size_t hi,
                                        double* amax) {
  const unsigned char* vals = p + 4 * blocks;
  double sq = 0;
  size_t i = lo;
  while (i < hi) {
    const size_t b = i / kQuantBlock;
    const size_t end = std::min(hi, (b + 1) * kQuantBlock);
    int32_t qq = 0, qm = 0;
    if (bits == 8) {
      const int8_t* q = reinterpret_cast<const int8_t*>(vals);
      for (size_t k = i; k < end; ++k) {
        const int32_t v = q[k];
        qq += v * v;
        qm = std::max(qm, v < 0 ? -v : v);
      }
    } else {
      for (size_t k = i; k < end; ++k) {
        const int32_t v = static_cast<int32_t>((vals[k >> 1] >> (4 * (k & 1))) & 15u) - 8;
        qq += v * v;
        qm = std::max(qm, v < 0 ? -v : v);
      }
    }
    float scale;
    std::memcpy(&scale, p + 4 * b, 4);  // little-endian hosts only (callers check)
    sq += static_cast<double>(qq) * static_cast<double>(scale) * static_cast<double>(scale);
    *amax = std::max(*amax, static_cast<double>(static_cast<float>(qm) * scale));
    i = end;
  }
  return sq;
}

// Σx² (double) and max|x| of fp32/bf16 elements [lo, hi); false when one is non-finite (nothing is thrown from a
// function compiled as target clones: an exception could not unwind through its dispatch).
DELOCO_SCAN_CLONES bool scan_plain_clone(const unsigned char* p, Encoding e, size_t lo, size_t hi, double* sumsq,
                                         float* amax) {
  constexpr int L = 16;
  double sq[L] = {};
  float m[L] = {};
  uint32_t bad = 0;
  const bool f32 = e == Encoding::kFp32;
  auto one = [&](size_t i, int l) {
    uint32_t u;
    if (f32) {
      std::memcpy(&u, p + 4 * i, 4);  // little-endian hosts; see get_u32
    } else {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      u = static_cast<uint32_t>(h) << 16;
    }
    bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
    const float x = bits_float(u);
    sq[l] += static_cast<double>(x) * static_cast<double>(x);
    m[l] = std::max(m[l], std::fabs(x));
  };
  size_t i = lo;
  for (; i + L <= hi; i += L)
    for (int l = 0; l < L; ++l) one(i + l, l);
  for (int l = 0; i < hi; ++i, ++l) one(i, l);
  if (bad) return false;
  for (int l = 0; l < L; ++l) {
    *sumsq += sq[l];
    *amax = std::max(*amax, m[l]);
  }
  return true;
}

// The same; throws NonFiniteError naming the first non-finite element.
void scan_plain(const unsigned char* p, Encoding e, size_t lo, size_t hi, double* sumsq, float* amax) {
  if (!scan_plain_clone(p, e, lo, hi, sumsq, amax)) throw_first_non_finite(p, e, lo, hi);
}

bool host_little_endian() {
  const uint32_t one = 1;
  unsigned char c;
  std::memcpy(&c, &one, 1);
  return c == 1;
}

}  // namespace

void validate_floats(const void* payload, size_t bytes, Encoding e, size_t n) {
  require_float_encoding(e);
  if (is_sparse(e)) {
    decode_topk(payload, bytes, e, n);
    return;
  }
  check_size(bytes, e, n);
  const unsigned char* p = static_cast<const unsigned char*>(payload);
  if (e == Encoding::kFp32 || e == Encoding::kBf16) {
    double sq = 0;
    float m = 0;
    if (host_little_endian()) {
      scan_plain(p, e, 0, n, &sq, &m);
    } else {
      for (size_t i = 0; i < n; ++i) {
        const float x = e == Encoding::kFp32 ? bits_float(get_u32(p + 4 * i))
                                             : bits_float((uint32_t{p[2 * i]} | (uint32_t{p[2 * i + 1]} << 8)) << 16);
        if (!std::isfinite(x)) throw_first_non_finite(p, e, i, i + 1);
      }
    }
    return;
  }
  const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
  check_scales(p, blocks);
  const unsigned char* vals = p + 4 * blocks;
  const int qmax = e == Encoding::kInt8 ? 127 : e == Encoding::kInt4 ? 7 : 1;
  for (size_t b = 0; b < blocks; ++b) {  // q · scale must stay finite, as decoding computes it
    const float scale = bits_float(get_u32(p + 4 * b));
    const float top = (e == Encoding::kInt8 ? 128.f : static_cast<float>(qmax + 1)) * scale;
    if (!std::isfinite(top)) {
      // Only the values actually present matter: check them one by one.
      const size_t lo = b * kQuantBlock, hi = std::min(n, lo + kQuantBlock);
      for (size_t i = lo; i < hi; ++i) {
        int q;
        if (e == Encoding::kInt8) q = static_cast<int8_t>(vals[i]);
        else if (e == Encoding::kInt4) q = static_cast<int>((vals[i >> 1] >> (4 * (i & 1))) & 15u) - 8;
        else q = static_cast<int>((vals[i >> 2] >> (2 * (i & 3))) & 3u) - 2;
        const float x = static_cast<float>(q) * scale;
        if (!std::isfinite(x))
          throw NonFiniteError("quantize: decoded non-finite value at index " + std::to_string(i) + ": " + exact_number(x));
      }
    }
  }
  check_codes(p, n, e == Encoding::kInt8 ? 8 : e == Encoding::kInt4 ? 4 : 2);
}

namespace {

// One segment's part [lo, hi) of a validated payload: adds its Σx² to *sq and raises *amax (little-endian hosts).
void scan_span(const unsigned char* p, Encoding e, size_t blocks, size_t lo, size_t hi, double* sq, double* amax) {
  if (e == Encoding::kFp32 || e == Encoding::kBf16) {
    float m = 0.f;
    scan_plain(p, e, lo, hi, sq, &m);  // throws for a non-finite element
    *amax = std::max(*amax, static_cast<double>(m));
    return;
  }
  if (e != Encoding::kInt2) {
    *sq += scan_blocks_q(p, blocks, e == Encoding::kInt8 ? 8 : 4, lo, hi, amax);
    return;
  }
  const unsigned char* vals = p + 4 * blocks;
  size_t i = lo;
  while (i < hi) {
    const size_t b = i / kQuantBlock;
    const size_t end = std::min(hi, (b + 1) * kQuantBlock);
    int32_t qq = 0, qm = 0;
    for (size_t k = i; k < end; ++k) {
      const int32_t v = static_cast<int32_t>((vals[k >> 2] >> (2 * (k & 3))) & 3u) - 2;
      qq += v * v;
      qm = std::max(qm, v < 0 ? -v : v);
    }
    const float scale = bits_float(get_u32(p + 4 * b));
    *sq += static_cast<double>(qq) * static_cast<double>(scale) * static_cast<double>(scale);
    *amax = std::max(*amax, static_cast<double>(static_cast<float>(qm) * scale));
    i = end;
  }
}

}  // namespace

FloatScan scan_floats(const void* payload, size_t bytes, Encoding e, size_t n, const std::vector<size_t>& ends,
                      int threads) {
  require_float_encoding(e);
  if (!is_sparse(e)) check_size(bytes, e, n);
  if (ends.empty() || ends.back() != n)
    throw WireError("quantize: scan segments end at " + std::to_string(ends.empty() ? 0 : ends.back()) +
                    ", the payload has " + std::to_string(n) + " elements");
  for (size_t s = 1; s < ends.size(); ++s)
    if (ends[s] < ends[s - 1]) throw WireError("quantize: scan segments must not decrease");
  const unsigned char* p = static_cast<const unsigned char*>(payload);
  FloatScan out;
  out.sumsq.assign(ends.size(), 0.0);
  if (is_sparse(e)) {  // the kept entries only, in index order
    const SparseEntries sp = decode_topk(payload, bytes, e, n);
    size_t s = 0;
    for (size_t j = 0; j < sp.index.size(); ++j) {
      while (ends[s] <= sp.index[j]) ++s;
      const double x = sp.value[j];
      out.sumsq[s] += x * x;
      out.amax = std::max(out.amax, std::fabs(x));
    }
    return out;
  }
  if (!host_little_endian()) {  // the portable (slow) way: decode, then measure
    std::vector<float> x = decode_floats(payload, bytes, e, n);
    size_t lo = 0;
    for (size_t s = 0; s < ends.size(); ++s) {
      for (size_t i = lo; i < ends[s]; ++i) {
        out.sumsq[s] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
        out.amax = std::max(out.amax, static_cast<double>(std::fabs(x[i])));
      }
      lo = ends[s];
    }
    return out;
  }
  if (e != Encoding::kFp32 && e != Encoding::kBf16) validate_floats(payload, bytes, e, n);
  const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
  // Fixed pieces of kScanPiece elements, summed in order: the result does not depend on the thread count.
  const size_t pieces = (n + kScanPiece - 1) / kScanPiece;
  struct Part {
    std::vector<std::pair<size_t, double>> sums;  // (segment, Σx² of its part in this piece)
    double amax = 0;
    std::exception_ptr error;
  };
  std::vector<Part> parts(pieces);
  auto run = [&](size_t k) {
    const size_t a = k * kScanPiece, b = std::min(n, a + kScanPiece);
    try {
      for (size_t s = static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), a) - ends.begin());
           s < ends.size(); ++s) {
        const size_t lo = std::max(a, s == 0 ? size_t{0} : ends[s - 1]), hi = std::min(b, ends[s]);
        if (lo >= b) break;
        if (hi <= lo) continue;
        double sq = 0;
        scan_span(p, e, blocks, lo, hi, &sq, &parts[k].amax);
        parts[k].sums.emplace_back(s, sq);
      }
    } catch (...) {
      parts[k].error = std::current_exception();
    }
  };
  const size_t workers = std::min(pieces, static_cast<size_t>(std::max(1, threads)));
  if (workers <= 1) {
    for (size_t k = 0; k < pieces; ++k) run(k);
  } else {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t k; (k = next.fetch_add(1)) < pieces;) run(k);
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < workers; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
  }
  for (const Part& part : parts) {  // the first error by position, as a sequential scan would report it
    if (part.error) std::rethrow_exception(part.error);
    for (const auto& [seg, sq] : part.sums) out.sumsq[seg] += sq;
    out.amax = std::max(out.amax, part.amax);
  }
  return out;
}

std::string quantize_with_error_feedback(const float* x, float* residual, size_t n, const Codec& c, float decay) {
  const Encoding e = c.encoding;
  std::vector<float> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] + decay * residual[i];  // decay = 1: exactly x + r (1·r is exact)
  std::string enc = encode_floats(y.data(), n, c);
  std::vector<float> back = decode_floats(enc.data(), enc.size(), e, n);
  for (size_t i = 0; i < n; ++i) residual[i] = y[i] - back[i];
  return enc;
}

}  // namespace deloco
