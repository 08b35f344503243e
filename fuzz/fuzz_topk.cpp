// libFuzzer target: the sparse (top-k) codec (wire/sparse.h), both directions.
//
// Input: byte 0 picks the encoding (topk8/4/2/2b) and, in its high bits, a density and a chunk; bytes 1-2 the element
// count n (≤ 65535); the rest is a payload to decode and also, read as floats, an input to encode. Properties:
//  * decoding any payload either succeeds or throws deloco::WireError (NonFiniteError included) and then leaves the
//    output untouched; a payload that decodes has ascending indices < n, at most n entries and finite values, and
//    validate_floats / scan_floats agree with decode on whether it is valid;
//  * encoding finite floats succeeds; its payload decodes; every kept entry is within half a quantisation step of
//    its input (topk2b: within the range of its value block's inputs, as a bin's mean is) and no dropped entry is
//    larger in magnitude than a kept one (of the same chunk);
//  * error feedback leaves a finite residual, and input = decoded + residual (to the float rounding of input −
//    decoded: a topk2b level, a bin's mean, can be far larger than a small value in its bin).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "deloco/wire.h"
#include "wire/quantize.h"
#include "wire/sparse.h"

namespace {
[[noreturn]] void fail(const char* what, size_t i) {
  std::fprintf(stderr, "fuzz_topk: property violated: %s (index %zu)\n", what, i);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  static const deloco::Encoding kinds[4] = {deloco::Encoding::kTopk8, deloco::Encoding::kTopk4,
                                            deloco::Encoding::kTopk2, deloco::Encoding::kTopk2b};
  const deloco::Encoding e = kinds[data[0] % 4];
  const size_t n = static_cast<size_t>(data[1]) | (static_cast<size_t>(data[2]) << 8);
  const char* payload = reinterpret_cast<const char*>(data + 3);
  const size_t bytes = size - 3;

  // Decode direction.
  std::vector<float> out(n, 7.f);
  bool ok = true;
  try {
    deloco::decode_floats_into(payload, bytes, e, n, out.data());
  } catch (const deloco::WireError&) {
    ok = false;
    for (size_t i = 0; i < n; ++i)
      if (out[i] != 7.f) fail("a refused payload wrote to the output", i);
  }
  bool valid = true;
  try {
    deloco::validate_floats(payload, bytes, e, n);
    if (n > 0) deloco::scan_floats(payload, bytes, e, n, {n});
  } catch (const deloco::WireError&) {
    valid = false;
  }
  if (valid != ok) fail("validate/scan and decode disagree", bytes);
  if (ok) {
    const deloco::SparseEntries s = deloco::decode_topk(payload, bytes, e, n);
    if (s.index.size() > n) fail("more entries than elements", s.index.size());
    for (size_t j = 0; j < s.index.size(); ++j) {
      if (s.index[j] >= n) fail("index out of range", j);
      if (j > 0 && s.index[j] <= s.index[j - 1]) fail("indices not ascending", j);
      if (!std::isfinite(s.value[j])) fail("non-finite value", j);
    }
  }

  // Encode direction: the payload read as floats, non-finite values replaced (the encoder refuses them).
  std::vector<float> x(bytes / 4);
  if (!x.empty()) std::memcpy(x.data(), payload, x.size() * 4);
  for (auto& v : x)
    if (!std::isfinite(v)) v = 0.f;
  // Values near FLT_MAX cannot be block-quantised (their decoded q · scale would overflow): keep them in range.
  for (auto& v : x) v = std::fmax(std::fmin(v, 1e30f), -1e30f);
  deloco::TopkOptions o;
  o.density = 0.01 + 0.99 * static_cast<double>((data[0] >> 2) & 15) / 15.0;
  o.chunk = (data[0] & 0x40) ? 37 : 0;
  std::string enc;
  try {
    enc = deloco::encode_floats(x.data(), x.size(), deloco::Codec(e, o));
  } catch (const deloco::WireError&) {
    fail("encoding finite floats failed", 0);
  }
  const deloco::SparseEntries s = deloco::decode_topk(enc.data(), enc.size(), e, x.size());
  const int qmax = e == deloco::Encoding::kTopk8 ? 127 : e == deloco::Encoding::kTopk4 ? 7 : 1;
  const size_t chunk = o.chunk > 0 ? static_cast<size_t>(o.chunk) : std::max<size_t>(x.size(), 1);
  std::vector<float> kept_min((x.size() + chunk - 1) / chunk, INFINITY);
  std::vector<char> kept(x.size(), 0);
  for (size_t j = 0; j < s.index.size(); ++j) {
    if (e == deloco::Encoding::kTopk2b) {
      const size_t lo = j / deloco::kBinBlock * deloco::kBinBlock;
      const size_t hi = std::min<size_t>(s.index.size(), lo + deloco::kBinBlock);
      double vmin = INFINITY, vmax = -INFINITY;
      for (size_t t = lo; t < hi; ++t) {
        vmin = std::fmin(vmin, x[s.index[t]]);
        vmax = std::fmax(vmax, x[s.index[t]]);
      }
      const double slack = 1e-6 * std::fmax(std::fabs(vmin), std::fabs(vmax));
      if (!(s.value[j] >= vmin - slack && s.value[j] <= vmax + slack)) fail("kept value outside its block's range", j);
      kept[s.index[j]] = 1;
      float& m = kept_min[s.index[j] / chunk];
      m = std::fmin(m, std::fabs(x[s.index[j]]));
      continue;
    }
    const size_t lo = j / deloco::kQuantBlock * deloco::kQuantBlock;
    const size_t hi = std::min(s.index.size(), lo + deloco::kQuantBlock);
    double amax = 0;
    for (size_t t = lo; t < hi; ++t) amax = std::fmax(amax, std::fabs(static_cast<double>(x[s.index[t]])));
    const double err = std::fabs(static_cast<double>(x[s.index[j]]) - static_cast<double>(s.value[j]));
    if (!(err <= amax / qmax * 0.5 * 1.0001 + amax * 1e-6 + qmax * std::ldexp(1.0, -149)))
      fail("kept value outside half a step", j);
    kept[s.index[j]] = 1;
    float& m = kept_min[s.index[j] / chunk];
    m = std::fmin(m, std::fabs(x[s.index[j]]));
  }
  for (size_t i = 0; i < x.size(); ++i)
    if (!kept[i] && std::fabs(x[i]) > kept_min[i / chunk]) fail("dropped an entry larger than a kept one", i);

  // Error feedback.
  std::vector<float> residual(x.size(), 0.f);
  std::string ef;
  try {
    ef = deloco::quantize_with_error_feedback(x.data(), residual.data(), x.size(), deloco::Codec(e, o));
  } catch (const deloco::WireError&) {
    fail("error feedback failed on finite input", 0);
  }
  const std::vector<float> back = deloco::decode_floats(ef.data(), ef.size(), e, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(residual[i])) fail("non-finite residual", i);
    const double d = std::fabs(static_cast<double>(x[i]) - back[i] - residual[i]);
    if (d > 1e-6 * (std::fabs(static_cast<double>(x[i])) + std::fabs(static_cast<double>(back[i]))) + 1e-37)
      fail("input != decoded + residual", i);
  }
  return 0;
}
