// The sparse (top-k) float codec (contract and layout in wire/sparse.h).
#include "wire/sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "deloco/error.h"
#include "wire/quantize.h"
#include "util/text.h"

namespace deloco {
namespace {

void require_sparse(Encoding e) {
  if (!is_sparse(e))
    throw WireError(std::string("topk: encoding ") + encoding_name(e) + " (" + std::to_string(static_cast<int>(e)) +
                    ") is not a sparse encoding");
}

// Appends to `out` the indices in [lo, hi) of the (up to) k entries of x of largest |x|, ascending; exact zeros are
// never taken, ties at the threshold go to the lower index. `mag` is scratch.
void select(const float* x, size_t lo, size_t hi, size_t k, std::vector<float>& mag, std::vector<uint32_t>* out) {
  const size_t len = hi - lo;
  if (k == 0 || len == 0) return;
  if (k >= len) {
    for (size_t i = lo; i < hi; ++i)
      if (x[i] != 0.f) out->push_back(static_cast<uint32_t>(i));
    return;
  }
  mag.resize(len);
  for (size_t i = 0; i < len; ++i) mag[i] = std::fabs(x[lo + i]);
  std::nth_element(mag.begin(), mag.begin() + static_cast<std::ptrdiff_t>(k - 1), mag.end(), std::greater<float>());
  const float t = mag[k - 1];  // the k-th largest magnitude
  if (t == 0.f) {              // fewer than k non-zeros: all of them
    for (size_t i = lo; i < hi; ++i)
      if (x[i] != 0.f) out->push_back(static_cast<uint32_t>(i));
    return;
  }
  size_t above = 0;
  for (size_t i = lo; i < hi; ++i) above += std::fabs(x[i]) > t;
  size_t at = k - above;  // entries equal to t still to take, lowest index first
  for (size_t i = lo; i < hi; ++i) {
    const float a = std::fabs(x[i]);
    if (a > t || (a == t && at > 0)) {
      if (a == t) --at;
      out->push_back(static_cast<uint32_t>(i));
    }
  }
}

size_t keep_of(double density, size_t len) {
  if (len == 0) return 0;
  const double k = std::round(density * static_cast<double>(len));
  return static_cast<size_t>(std::clamp(k, 1.0, static_cast<double>(len)));
}

// kTopk2b's values: each block of up to kBinBlock values (in index order) in four bins of width 1.5 σ around the
// block's mean (±3 σ in all; outside it, the outer bins), each bin's level the mean of the values it received (an
// empty bin's, the block's mean). Out: 16 bytes of fp32 levels per block, then the 2-bit codes, four to a byte (the
// first in the low bits), the unused bits of the last byte zero.
void encode_bins(const float* v, size_t k, unsigned char* out) {
  const size_t blocks = (k + kBinBlock - 1) / kBinBlock;
  unsigned char* codes = out + 16 * blocks;
  std::memset(codes, 0, (k + 3) / 4);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * kBinBlock, hi = std::min<size_t>(k, lo + kBinBlock);
    const double m = static_cast<double>(hi - lo);
    double mean = 0;
    for (size_t i = lo; i < hi; ++i) mean += v[i];
    mean /= m;
    double ss = 0;
    for (size_t i = lo; i < hi; ++i) ss += (v[i] - mean) * (v[i] - mean);
    const double width = hi - lo > 1 ? 1.5 * std::sqrt(ss / (m - 1)) : 0.0;
    double sum[4] = {0, 0, 0, 0}, count[4] = {0, 0, 0, 0};
    for (size_t i = lo; i < hi; ++i) {
      const double c = v[i] - mean;
      // Bin 2 holds the values within half a width of the mean; ties of the rounding go to the even bin.
      const int q = width > 0 ? static_cast<int>(std::clamp(std::nearbyint(c / width) + 2.0, 0.0, 3.0)) : 2;
      sum[q] += c;
      count[q] += 1;
      codes[i / 4] = static_cast<unsigned char>(codes[i / 4] | (q << (2 * (i % 4))));
    }
    for (int q = 0; q < 4; ++q) {
      const float level = static_cast<float>(count[q] > 0 ? mean + sum[q] / count[q] : mean);
      uint32_t bits;
      std::memcpy(&bits, &level, 4);
      for (int j = 0; j < 4; ++j) out[16 * b + 4 * static_cast<size_t>(q) + static_cast<size_t>(j)] =
          static_cast<unsigned char>((bits >> (8 * j)) & 0xff);
    }
  }
}

// Decodes encode_bins' section of k values into out[0..k): a non-finite level is a NonFiniteError, a set unused bit
// of the last code byte a WireError.
void decode_bins(const unsigned char* p, size_t k, float* out) {
  const size_t blocks = (k + kBinBlock - 1) / kBinBlock;
  std::vector<float> levels(4 * blocks);
  for (size_t j = 0; j < levels.size(); ++j) {
    const uint32_t bits = uint32_t{p[4 * j]} | (uint32_t{p[4 * j + 1]} << 8) | (uint32_t{p[4 * j + 2]} << 16) |
                          (uint32_t{p[4 * j + 3]} << 24);
    float x;
    std::memcpy(&x, &bits, 4);
    if (!std::isfinite(x))
      throw NonFiniteError("topk: level " + std::to_string(j % 4) + " of value block " + std::to_string(j / 4) +
                           " is non-finite: " + exact_number(x));
    levels[j] = x;
  }
  const unsigned char* codes = p + 16 * blocks;
  if (k % 4 != 0 && (codes[k / 4] >> (2 * (k % 4))) != 0)
    throw WireError("topk: the unused bits after the last of " + std::to_string(k) + " value codes are not zero");
  for (size_t i = 0; i < k; ++i) out[i] = levels[4 * (i / kBinBlock) + ((codes[i / 4] >> (2 * (i % 4))) & 3)];
}

void put_varint(uint32_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

}  // namespace

void validate_topk(const TopkOptions& o) {
  if (!(o.density > 0.0 && o.density <= 1.0))
    throw WireError("topk: density " + exact_number(o.density) + " must be in (0, 1] (net.topk_density)");
  if (o.chunk < 0) throw WireError("topk: chunk " + std::to_string(o.chunk) + " must be ≥ 0 (net.topk_chunk)");
}

uint32_t topk_count(const void* payload) {
  const unsigned char* p = static_cast<const unsigned char*>(payload);
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

std::string encode_topk(const float* x, size_t n, Encoding e, const TopkOptions& o) {
  require_sparse(e);
  validate_topk(o);
  if (n > kMaxSparseElements)
    throw WireError("topk: " + std::to_string(n) + " elements exceed the " + std::to_string(kMaxSparseElements) +
                    " a sparse payload can index");
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      throw NonFiniteError("topk: non-finite input at index " + std::to_string(i) + ": " + exact_number(x[i]));
  std::vector<uint32_t> idx;
  // The magnitudes' scratch, kept per thread at the largest chunk encoded: a fresh one every push cost more in page
  // faults than the selection itself (a syncer re-encoding a 67M-parameter fragment every merge, on a VM).
  thread_local std::vector<float> mag;
  // (n = 0: one empty chunk; found by fuzz/fuzz_topk, where n − 1 wrapped the reserve size around)
  const size_t chunk = o.chunk > 0 ? static_cast<size_t>(o.chunk) : std::max<size_t>(n, 1);
  idx.reserve(keep_of(o.density, n) + (n + chunk - 1) / chunk);
  for (size_t lo = 0; lo < n; lo += chunk) {
    const size_t hi = std::min(n, lo + chunk);
    select(x, lo, hi, keep_of(o.density, hi - lo), mag, &idx);
  }
  const size_t k = idx.size();
  std::vector<float> vals(k);
  for (size_t j = 0; j < k; ++j) vals[j] = x[idx[j]];
  const size_t vbytes = topk_values_bytes(e, k);
  std::string out(4 + vbytes, '\0');
  for (int b = 0; b < 4; ++b) out[b] = static_cast<char>((k >> (8 * b)) & 0xff);
  if (e == Encoding::kTopk2b)
    encode_bins(vals.data(), k, reinterpret_cast<unsigned char*>(out.data() + 4));
  else
    encode_floats_into(vals.data(), k, topk_values(e), out.data() + 4);
  out.reserve(out.size() + 2 * k);
  uint32_t prev = 0;
  for (size_t j = 0; j < k; ++j) {
    put_varint(j == 0 ? idx[0] : idx[j] - prev, &out);
    prev = idx[j];
  }
  return out;
}

SparseEntries decode_topk(const void* payload, size_t bytes, Encoding e, size_t n) {
  require_sparse(e);
  if (n > kMaxSparseElements)
    throw WireError("topk: " + std::to_string(n) + " elements exceed the " + std::to_string(kMaxSparseElements) +
                    " a sparse payload can index");
  if (bytes < 4) throw WireError("topk: payload of " + std::to_string(bytes) + " bytes is truncated (no count)");
  const unsigned char* p = static_cast<const unsigned char*>(payload);
  const uint64_t k = topk_count(p);
  if (k > n)
    throw WireError("topk: count " + std::to_string(k) + " exceeds the " + std::to_string(n) + " elements");
  const size_t vbytes = topk_values_bytes(e, k);
  // Each index takes at least one byte: a count the payload cannot hold is refused before anything is allocated.
  if (bytes - 4 < vbytes || bytes - 4 - vbytes < k)
    throw WireError("topk: payload of " + std::to_string(bytes) + " bytes is truncated: " + std::to_string(k) +
                    " entries need " + std::to_string(4 + vbytes) + " bytes of values and at least " +
                    std::to_string(k) + " of indices");
  SparseEntries out;
  out.index.resize(k);
  const unsigned char* q = p + 4 + vbytes;
  const unsigned char* end = p + bytes;
  uint64_t prev = 0;
  for (size_t j = 0; j < k; ++j) {
    uint64_t v = 0;
    int shift = 0;
    for (;;) {
      if (q == end)
        throw WireError("topk: index " + std::to_string(j) + " of " + std::to_string(k) + " is truncated");
      const unsigned char b = *q++;
      if (shift == 28 && (b & 0xf0))
        throw WireError("topk: index " + std::to_string(j) + " is a varint wider than 32 bits");
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) {
        if (b == 0 && shift > 0) throw WireError("topk: index " + std::to_string(j) + " is an overlong varint");
        break;
      }
      shift += 7;
    }
    if (j > 0 && v == 0)
      throw WireError("topk: index " + std::to_string(j) + " repeats index " + std::to_string(prev) +
                      " (duplicate index)");
    const uint64_t i = j == 0 ? v : prev + v;
    if (i >= n)
      throw WireError("topk: index " + std::to_string(j) + " is " + std::to_string(i) + ", out of range for " +
                      std::to_string(n) + " elements");
    out.index[j] = static_cast<uint32_t>(i);
    prev = i;
  }
  if (q != end)
    throw WireError("topk: " + std::to_string(end - q) + " trailing bytes after the " + std::to_string(k) +
                    " indices");
  out.value.resize(k);
  if (e == Encoding::kTopk2b)
    decode_bins(p + 4, k, out.value.data());
  else
    decode_floats_into(p + 4, vbytes, topk_values(e), k, out.value.data());  // scales, int2 codes, finite values
  return out;
}

}  // namespace deloco
