// wire/sparse.h — the sparse (top-k) float codec: the k entries of largest magnitude, their values in 8, 4 or 2 bits,
// their indices as gaps (Encoding kTopk8 / kTopk4 / kTopk2 / kTopk2b, deloco/wire.h). What a learner pushes with
// net.encoding = "topk" and what a syncer broadcasts as a delta with net.broadcast_encoding = "topk".
//
// Layout (little-endian; n elements, 0 ≤ k ≤ n < 2^32):
//   off 0   u32 k                 entries kept
//   off 4   values                the k kept values in index order, encoded as kInt8 / kInt4 / kInt2 of k elements
//                                 (wire/quantize.h: ceil(k/64) fp32 block scales, then the packed codes); kTopk2b:
//                                 ceil(k/1024) blocks' four fp32 levels (16 bytes each), then ceil(k/4) bytes of
//                                 2-bit codes, four to a byte, the first in the low bits, unused bits zero
//                                 (topk_values_bytes in deloco/wire.h)
//   then    k indices             ascending, each an unsigned LEB128 varint: the first index itself, then the gap to
//                                 the previous index (≥ 1); canonical (no trailing 0x80 / 0x00 byte), ≤ 5 bytes each
// The payload ends with the last index byte. Gaps at density d average 1/d, so at d ≥ 1% most take one byte; a
// payload at density d with b-bit values costs ≈ d·(1 + b/8 + 4/64) bytes per element.
//
// kTopk2b is SparseLoCo's 2-bit code for the kept values (Sarfi et al. 2025, as their code quantises them): per block
// of up to kBinBlock = 1024 kept values (in index order), the mean μ and the standard deviation σ (n − 1); four bins
// of width w = 1.5 σ centred on μ − 2w, μ − w, μ, μ + w (a value goes to round((v − μ)/w) + 2, clamped to 0..3,
// ties to the even bin); each bin decodes as the mean of the values it received. Top-k values lie far from their
// mean, so in practice a block's positive values share one level and its negative values one or two: a sign with a
// magnitude per side. (kTopk2 keeps −s, 0, +s per 64 values with s the largest magnitude: values under s/2 decode
// as 0.)
//
// Selection (encode): k = max(1, round(d·n)) over the whole input, or with a chunk C > 0 the same per chunk of C
// consecutive elements (the last one may be short) — cheaper, and it spreads the kept entries. Exact zeros are
// never kept (a payload may hold fewer than k entries). Ties at the threshold go to the lower index, so the result
// does not depend on the selection algorithm.
//
// Contract
//  * decode (decode_floats_into and the others in wire/quantize.h, which dispatch here for a sparse encoding)
//    checks everything before writing: a payload under 4 bytes, k > n, a value section or an index that runs past
//    the end (truncated), an index ≥ n (out of range), a zero gap (duplicate index), an overlong or over-wide varint,
//    bytes after the k-th index (trailing) — WireError naming the field, the position and the values; a non-finite
//    block scale, level (kTopk2b) or decoded value — NonFiniteError; a negative scale or an int2 code 0 — WireError,
//    as the dense codecs; a set unused bit after kTopk2b's last code — WireError. Nothing is written to `out` unless
//    the whole payload is valid.
//  * encode rejects non-finite input (NonFiniteError) and n ≥ 2^32 (WireError). Pure and reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "deloco/wire.h"

namespace deloco {

// Throws WireError for a density outside (0, 1] or a negative chunk.
void validate_topk(const TopkOptions& o);

// The sparse payload of x[0..n) in sparse encoding e. Keeps a scratch buffer of the largest chunk's size per thread.
std::string encode_topk(const float* x, size_t n, Encoding e, const TopkOptions& o);

// A sparse payload's entries, validated: indices ascending < n, values finite.
struct SparseEntries {
  std::vector<uint32_t> index;
  std::vector<float> value;
};
// Parses and validates a payload of `bytes` bytes describing n elements (the errors of the contract).
SparseEntries decode_topk(const void* payload, size_t bytes, Encoding e, size_t n);
// k, read from a payload whose size was checked to be ≥ 4 (the header, or decode_topk).
uint32_t topk_count(const void* payload);

}  // namespace deloco
