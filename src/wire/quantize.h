// wire/quantize.h — float payload codecs for the wire (fp32, bf16, block-scaled int8, int4 and int2; the sparse
// top-k encodings are wire/sparse.h's, and every function here dispatches to it for them).
//
// Layouts (little-endian; n elements; blocks of kQuantBlock = 64 consecutive elements, the last one may be short):
//   kFp32  n × 4 bytes (IEEE binary32, exact)
//   kBf16  n × 2 bytes: the upper 16 bits of binary32 after round-to-nearest-even (relative error ≤ 2^-8)
//   kInt8  ceil(n/64) fp32 scales, then n int8 values q in [-127, 127]; x ≈ q · scale, scale = max|x| / 127
//   kInt4  ceil(n/64) fp32 scales, then ceil(n/2) bytes; element 2i in the low nibble of byte i, 2i+1 in the high
//          nibble; a nibble stores q + 8 with q in [-7, 7]; scale = max|x| / 7; an odd tail's high nibble is 0
//   kInt2  ceil(n/64) fp32 scales, then ceil(n/4) bytes; element 4i+j in bits 2j..2j+1 of byte i; a code stores
//          q + 2 with q in {-1, 0, 1} (ternary: code 0 is never written and is refused); scale = max|x|; unused
//          high bits of the last byte are 0
// For int8/int4/int2 every element is within half a quantization step (scale / 2) of its input (for a normal scale;
// a subnormal one is rounded to the subnormal grid). Decoding and validation take only this form: codes in
// [-qmax, qmax], zero bits after the last element, and a positive scale only over a block with a nonzero code
// (WireError otherwise: a scale over zeros would let a merge that folds its coefficient into the scale overflow).
//
// Contract
//  * encode_floats() rejects non-finite input (NonFiniteError), finite values that overflow bf16, and an int8/int4
//    block whose max|x| is so close to FLT_MAX that q · scale would overflow (WireError), naming the index (block)
//    and value. decode_floats() rejects a payload whose size does not match the encoding and n and a negative
//    block scale (WireError: malformed), and a NaN/Inf block scale or any non-finite decoded value
//    (NonFiniteError, index named), so garbage never reaches a merge and a receiver can tell the two apart.
//  * Output buffers are the caller's; sizes are those of encoded_bytes() (wire.h). Pure and reentrant.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "deloco/error.h"  // NonFiniteError
#include "deloco/wire.h"
#include "wire/sparse.h"

namespace deloco {

constexpr size_t kQuantBlock = 64;

// Writes encoded_bytes(e, n) bytes to `out`. e must be a dense float encoding (not kRaw, not sparse).
void encode_floats_into(const float* x, size_t n, Encoding e, char* out);
// Any float encoding, sparse ones included.
std::string encode_floats(const float* x, size_t n, const Codec& c);

// Reads n elements from a payload of `bytes` bytes into out[0..n) (a sparse payload: zeros where it holds nothing).
void decode_floats_into(const void* payload, size_t bytes, Encoding e, size_t n, float* out);
std::vector<float> decode_floats(const void* payload, size_t bytes, Encoding e, size_t n);

// Validates a payload exactly as decode_floats_into does (the same errors, WireError or NonFiniteError) without
// decoding it, and measures it: per segment [0, ends[0]), [ends[0], ends[1]), ... (ends non-decreasing, the last
// == n) the sum of squares of its elements in double, and the largest |element| of the whole payload. For the
// block-scaled encodings the sums are Σ q² · scale² (exact integer sums per block, then double): they differ from
// the squares of the decoded fp32 values by at most their rounding (≤ 2^-23 relative). What the syncer checks a
// push it holds encoded against (deloco/sync.h, Syncer::receive).
struct FloatScan {
  std::vector<double> sumsq;  // per segment
  double amax = 0;            // max |x|
};
// `threads` > 1 scans pieces of kScanPiece elements in parallel; the pieces are fixed and summed in order, so the
// result does not depend on `threads`.
constexpr size_t kScanPiece = size_t{1} << 20;
FloatScan scan_floats(const void* payload, size_t bytes, Encoding e, size_t n, const std::vector<size_t>& ends,
                      int threads = 1);
// Only the validation (the same errors as decode_floats_into), cheaper: for int8/int4 it reads the block scales only.
void validate_floats(const void* payload, size_t bytes, Encoding e, size_t n);

// Error feedback (learner side): y = x + decay·residual; returns encode(y); residual <- y - decode(encode(y)).
// `residual` holds n floats (start at zero); it is left untouched if encoding throws. decay = 1 (the default) is
// classic error feedback; decay = β < 1 is SparseLoCo's decayed accumulator (e ← βe + Δ, send Q(TopK(e)), e ← e −
// sent), whose carried mass takes the outer momentum's place. The caller checks 0 < decay ≤ 1.
std::string quantize_with_error_feedback(const float* x, float* residual, size_t n, const Codec& c, float decay = 1.0f);

}  // namespace deloco
