// libFuzzer target: the float payload codecs (wire/quantize.h) alone, both directions.
//
// Input: byte 0 picks the encoding, bytes 1-2 the element count n (≤ 65535), the rest is the payload to decode and
// also, read as floats, an input to encode. Properties: decoding a payload of the wrong size, or any payload, throws
// only deloco::WireError; encoding finite floats succeeds and decodes back within the codec's error bound (fp32:
// bit-exact; bf16: relative 2^-8, or half its subnormal spacing; int8/int4: half a quantisation step of the block's scale, plus float rounding, also of a subnormal scale);
// error feedback leaves a finite residual.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "deloco/wire.h"
#include "wire/quantize.h"

namespace {
[[noreturn]] void fail(const char* what, size_t i) {
  std::fprintf(stderr, "fuzz_codecs: property violated: %s (index %zu)\n", what, i);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const auto e = static_cast<deloco::Encoding>(1 + data[0] % deloco::kMaxDenseEncoding);  // a dense float encoding (fuzz_topk: sparse)
  const size_t n = static_cast<size_t>(data[1]) | (static_cast<size_t>(data[2]) << 8);
  const char* payload = reinterpret_cast<const char*>(data + 3);
  const size_t bytes = size - 3;

  std::vector<float> out(n);
  try {
    deloco::decode_floats_into(payload, bytes, e, n, out.data());
    if (bytes != deloco::encoded_bytes(e, n)) fail("decoded a payload of the wrong size", bytes);
  } catch (const deloco::WireError&) {
  }

  // Encode direction: the payload bytes read as floats, non-finite values replaced (the encoder refuses them).
  std::vector<float> x(bytes / 4);
  if (!x.empty()) std::memcpy(x.data(), payload, x.size() * 4);
  for (auto& v : x)
    if (!std::isfinite(v)) v = 0.f;
  std::string enc;
  try {
    enc = deloco::encode_floats(x.data(), x.size(), e);
  } catch (const deloco::WireError&) {
    // fp32 never refuses finite input; bf16 only a value that rounds to infinity (|x| ≥ 0x7F7F8000 as bits: the
    // midpoint above the largest bf16, which round-to-nearest-even takes up); int8/int4 a block near FLT_MAX.
    if (e == deloco::Encoding::kFp32) fail("fp32 refused finite input", 0);
    if (e == deloco::Encoding::kBf16) {
      bool overflows = false;
      for (float v : x) {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        overflows |= (u & 0x7fffffffu) >= 0x7f7f8000u;
      }
      if (!overflows) fail("bf16 refused input that does not overflow bf16", 0);
    }
    return 0;
  }
  if (enc.size() != deloco::encoded_bytes(e, x.size())) fail("encoded size differs from encoded_bytes", enc.size());
  const std::vector<float> y = deloco::decode_floats(enc.data(), enc.size(), e, x.size());
  for (size_t b = 0; b < x.size(); b += deloco::kQuantBlock) {
    const size_t hi = std::min(x.size(), b + deloco::kQuantBlock);
    float amax = 0.f;
    for (size_t i = b; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
    for (size_t i = b; i < hi; ++i) {
      const double err = std::fabs(static_cast<double>(x[i]) - static_cast<double>(y[i]));
      double bound = 0;
      switch (e) {
        case deloco::Encoding::kFp32: bound = 0; break;
        case deloco::Encoding::kBf16: bound = std::fabs(static_cast<double>(x[i])) * (1.0 / 256) + std::ldexp(1.0, -134); break;  // bf16 subnormal half-spacing
        // A scale in the subnormal range is itself rounded by up to 2^-150, which q ≤ qmax multiplies.
        case deloco::Encoding::kInt8: bound = amax / 127.0 * 0.5 * 1.0001 + amax * 1e-6 + 127 * std::ldexp(1.0, -149); break;
        case deloco::Encoding::kInt4: bound = amax / 7.0 * 0.5 * 1.0001 + amax * 1e-6 + 7 * std::ldexp(1.0, -149); break;
        case deloco::Encoding::kInt2: bound = amax * 0.5 * 1.0001 + amax * 1e-6 + std::ldexp(1.0, -149); break;
        default: break;
      }
      if (!(err <= bound)) fail("round trip outside the codec's error bound", i);
    }
  }
  std::vector<float> residual(x.size(), 0.f);
  try {
    deloco::quantize_with_error_feedback(x.data(), residual.data(), x.size(), e);
  } catch (const deloco::WireError&) {
    return 0;
  }
  for (size_t i = 0; i < residual.size(); ++i)
    if (!std::isfinite(residual[i])) fail("non-finite error-feedback residual", i);
  return 0;
}
