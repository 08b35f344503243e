// Tests for the sparse (top-k) codec: what it keeps, its size, its error bound, error feedback, and every malformed
// payload the decoder must refuse without writing anything. The references here (sort-based top-k, the byte count
// from the layout in docs/wire.md) are written from the format's definition, not from sparse.cpp.
#include "wire/sparse.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "wire/quantize.h"

namespace deloco {
namespace sparse_cases {

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng);
  return x;
}

// The reference: indices of the k largest |x| (ties: lower index), ascending, zeros never.
std::vector<uint32_t> reference_topk(const std::vector<float>& x, size_t lo, size_t hi, size_t k) {
  std::vector<uint32_t> idx(hi - lo);
  std::iota(idx.begin(), idx.end(), static_cast<uint32_t>(lo));
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  idx.resize(std::min(k, idx.size()));
  idx.erase(std::remove_if(idx.begin(), idx.end(), [&](uint32_t i) { return x[i] == 0.f; }), idx.end());
  std::sort(idx.begin(), idx.end());
  return idx;
}

size_t varint_bytes(uint64_t v) {
  size_t b = 1;
  while (v >= 128) v >>= 7, ++b;
  return b;
}

// The payload size the layout defines for these indices.
size_t layout_bytes(const std::vector<uint32_t>& idx, Encoding e) {
  size_t b = 4 + encoded_bytes(topk_values(e), idx.size());
  for (size_t j = 0; j < idx.size(); ++j) b += varint_bytes(j == 0 ? idx[0] : idx[j] - idx[j - 1]);
  return b;
}

TopkOptions at(double density, int64_t chunk = 0) {
  TopkOptions o;
  o.density = density;
  o.chunk = chunk;
  return o;
}

TEST(Topk, KeepsTheLargestEntriesWithinHalfAStep) {
  const std::vector<float> x = gaussian(10000, 1);
  for (Encoding e : {Encoding::kTopk8, Encoding::kTopk4, Encoding::kTopk2}) {
    const std::string enc = encode_floats(x.data(), x.size(), Codec(e, at(0.03)));
    const SparseEntries s = decode_topk(enc.data(), enc.size(), e, x.size());
    const std::vector<uint32_t> want = reference_topk(x, 0, x.size(), 300);
    EXPECT_EQ(s.index, want) << encoding_name(e);
    EXPECT_EQ(enc.size(), layout_bytes(want, e));
    const int qmax = e == Encoding::kTopk8 ? 127 : e == Encoding::kTopk4 ? 7 : 1;
    for (size_t j = 0; j < s.index.size(); ++j) {
      const size_t lo = j / kQuantBlock * kQuantBlock, hi = std::min(s.index.size(), lo + kQuantBlock);
      float amax = 0;
      for (size_t t = lo; t < hi; ++t) amax = std::max(amax, std::fabs(x[want[t]]));
      EXPECT_LE(std::fabs(s.value[j] - x[s.index[j]]), amax / qmax * 0.5f * 1.0001f) << j;
    }
    // The dense decode: the kept values where they were, zero elsewhere.
    const std::vector<float> d = decode_floats(enc.data(), enc.size(), e, x.size());
    size_t nz = 0;
    for (size_t i = 0; i < d.size(); ++i) nz += d[i] != 0.f;
    EXPECT_LE(nz, want.size());
    for (size_t j = 0; j < s.index.size(); ++j) EXPECT_EQ(d[s.index[j]], s.value[j]);
  }
}

TEST(Topk, BytesPerElementAtThreePercent) {
  // 3% with 2-bit values: ≈ 0.03 · (1 byte of gap + 1/4 byte of value + 4/64 of scale) ≈ 0.039 bytes per element,
  // under a fourteenth of int4's 0.5625.
  const std::vector<float> x = gaussian(1 << 20, 2);
  const std::string enc = encode_floats(x.data(), x.size(), Codec(Encoding::kTopk2, at(0.03)));
  const double per = static_cast<double>(enc.size()) / static_cast<double>(x.size());
  EXPECT_LT(per, 0.042);
  EXPECT_GT(per, 0.035);
  EXPECT_LT(per * 14, static_cast<double>(encoded_bytes(Encoding::kInt4, x.size())) / static_cast<double>(x.size()));
}

TEST(Topk, TiesGoToTheLowerIndexAndZerosAreNeverKept) {
  std::vector<float> x(100, 0.f);
  for (int i : {5, 17, 40, 41, 90}) x[static_cast<size_t>(i)] = (i % 2 ? -1.f : 1.f);
  // k = 3 of five equal magnitudes: the three lowest indices.
  std::string enc = encode_floats(x.data(), x.size(), Codec(Encoding::kTopk8, at(0.03)));
  EXPECT_EQ(decode_topk(enc.data(), enc.size(), Encoding::kTopk8, x.size()).index,
            (std::vector<uint32_t>{5, 17, 40}));
  // k = 50 but five non-zeros: five entries.
  enc = encode_floats(x.data(), x.size(), Codec(Encoding::kTopk8, at(0.5)));
  EXPECT_EQ(decode_topk(enc.data(), enc.size(), Encoding::kTopk8, x.size()).index,
            (std::vector<uint32_t>{5, 17, 40, 41, 90}));
  // No elements at all (whole-fragment and chunked): a payload of k = 0.
  for (int64_t chunk : {0, 16}) {
    enc = encode_floats(x.data(), 0, Codec(Encoding::kTopk4, at(0.1, chunk)));
    EXPECT_EQ(enc, std::string(4, '\0'));
    EXPECT_TRUE(decode_floats(enc.data(), enc.size(), Encoding::kTopk4, 0).empty());
  }
  // All zeros: an empty payload, which decodes to zeros.
  std::vector<float> z(64, 0.f);
  enc = encode_floats(z.data(), z.size(), Codec(Encoding::kTopk2, at(0.1)));
  EXPECT_EQ(enc.size(), 4u);
  EXPECT_EQ(decode_floats(enc.data(), enc.size(), Encoding::kTopk2, z.size()), z);
}

TEST(Topk, ChunkedKeepsItsShareOfEveryChunk) {
  const std::vector<float> x = gaussian(10000, 3);
  const std::string enc = encode_floats(x.data(), x.size(), Codec(Encoding::kTopk4, at(0.05, 1024)));
  const SparseEntries s = decode_topk(enc.data(), enc.size(), Encoding::kTopk4, x.size());
  std::vector<uint32_t> want;
  for (size_t lo = 0; lo < x.size(); lo += 1024) {
    const size_t hi = std::min(x.size(), lo + 1024);
    const size_t k = std::max<size_t>(1, static_cast<size_t>(std::lround(0.05 * static_cast<double>(hi - lo))));
    for (uint32_t i : reference_topk(x, lo, hi, k)) want.push_back(i);
  }
  EXPECT_EQ(s.index, want);
}

TEST(Topk, ErrorFeedbackLosesNothing) {
  // Over many pushes, what was sent plus what is still held equals what went in (to float rounding).
  const size_t n = 4096;
  std::vector<float> residual(n, 0.f);
  std::vector<double> in(n, 0.0), sent(n, 0.0);
  for (uint32_t r = 0; r < 40; ++r) {
    const std::vector<float> x = gaussian(n, 100 + r);
    const std::string enc =
        quantize_with_error_feedback(x.data(), residual.data(), n, Codec(Encoding::kTopk2, at(0.03)));
    const std::vector<float> d = decode_floats(enc.data(), enc.size(), Encoding::kTopk2, n);
    for (size_t i = 0; i < n; ++i) in[i] += x[i], sent[i] += d[i];
  }
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(in[i] - sent[i] - residual[i]));
    scale = std::max(scale, std::fabs(in[i]));
  }
  EXPECT_LT(worst, 1e-4 * scale);
  // And the residual stays bounded: entries that wait long enough are sent.
  double rms = 0;
  for (float v : residual) rms += static_cast<double>(v) * v;
  EXPECT_LT(std::sqrt(rms / n), 40.0);
}

// SparseLoCo's accumulator (decay β < 1), from the paper's formulas: e ← βe + Δ; send Q(TopK(e)); e ← e − sent.
// Each push is the codec applied to that accumulator, and unrolled, what is still held is the β-discounted sum of
// what went in less the β-discounted sum of what was sent: e_T = Σ_t β^(T−t) (x_t − sent_t).
TEST(Topk, DecayedErrorFeedbackIsSparseLoCosAccumulator) {
  const size_t n = 4096;
  const float beta = 0.9f;
  const Codec c(Encoding::kTopk2, at(0.03));
  std::vector<float> residual(n, 0.f), e_ref(n, 0.f);
  std::vector<double> in(n, 0.0), sent(n, 0.0);
  for (uint32_t r = 0; r < 30; ++r) {
    const std::vector<float> x = gaussian(n, 300 + r);
    std::vector<float> acc(n);
    for (size_t i = 0; i < n; ++i) acc[i] = beta * e_ref[i] + x[i];
    const std::string enc = quantize_with_error_feedback(x.data(), residual.data(), n, c, beta);
    ASSERT_EQ(enc, encode_floats(acc.data(), n, c)) << "push " << r << " is not the codec of βe + Δ";
    const std::vector<float> d = decode_floats(enc.data(), enc.size(), Encoding::kTopk2, n);
    for (size_t i = 0; i < n; ++i) {
      e_ref[i] = acc[i] - d[i];
      in[i] = beta * in[i] + x[i];
      sent[i] = beta * sent[i] + d[i];
    }
    ASSERT_EQ(residual, e_ref) << "after push " << r;
  }
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(in[i] - sent[i] - residual[i]));
    scale = std::max(scale, std::fabs(in[i]));
  }
  EXPECT_LT(worst, 1e-4 * scale);
  // β = 1 is classic error feedback, bit for bit, and β < 1 changes what is sent.
  std::vector<float> r1(n, 0.f), r2(n, 0.f), r3(n, 0.f);
  for (uint32_t r = 0; r < 3; ++r) {
    const std::vector<float> x = gaussian(n, 500 + r);
    const std::string a = quantize_with_error_feedback(x.data(), r1.data(), n, c);
    EXPECT_EQ(a, quantize_with_error_feedback(x.data(), r2.data(), n, c, 1.0f));
    const std::string b = quantize_with_error_feedback(x.data(), r3.data(), n, c, 0.5f);
    if (r == 0) EXPECT_EQ(a, b);  // nothing carried yet
    else EXPECT_NE(a, b);
  }
}

TEST(Topk, ScanMatchesTheDecodedValues) {
  const std::vector<float> x = gaussian(3000, 4);
  const std::string enc = encode_floats(x.data(), x.size(), Codec(Encoding::kTopk4, at(0.1)));
  const std::vector<float> d = decode_floats(enc.data(), enc.size(), Encoding::kTopk4, x.size());
  const std::vector<size_t> ends{1000, 1000, 2500, 3000};
  const FloatScan s = scan_floats(enc.data(), enc.size(), Encoding::kTopk4, x.size(), ends);
  size_t lo = 0;
  double amax = 0;
  for (size_t k = 0; k < ends.size(); ++k) {
    double sq = 0;
    for (size_t i = lo; i < ends[k]; ++i) sq += static_cast<double>(d[i]) * d[i], amax = std::max(amax, std::fabs(double{d[i]}));
    EXPECT_NEAR(s.sumsq[k], sq, 1e-9 * (1 + sq)) << k;
    lo = ends[k];
  }
  EXPECT_EQ(s.amax, amax);
}

// ---- Malformed payloads: refused by name, nothing written --------------------------------------------------

std::string u32le(uint32_t v) {
  std::string s(4, '\0');
  for (int b = 0; b < 4; ++b) s[static_cast<size_t>(b)] = static_cast<char>((v >> (8 * b)) & 0xff);
  return s;
}

// A payload of the given k, values (fp32 scale 1, int8 codes 1) and raw index bytes, for kTopk8.
std::string craft(uint32_t k, const std::string& index_bytes, float scale = 1.f) {
  std::string s = u32le(k);
  const size_t blocks = (k + 63) / 64;
  for (size_t b = 0; b < blocks; ++b) {
    uint32_t u;
    std::memcpy(&u, &scale, 4);
    s += u32le(u);
  }
  s += std::string(k, '\x01');
  return s + index_bytes;
}

void expect_refused(const std::string& payload, size_t n, const std::string& says) {
  std::vector<float> out(n, 7.f);
  try {
    decode_floats_into(payload.data(), payload.size(), Encoding::kTopk8, n, out.data());
    ADD_FAILURE() << "accepted: expected '" << says << "'";
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
  for (float v : out) ASSERT_EQ(v, 7.f) << "a refused payload wrote to the output";
  EXPECT_THROW(validate_floats(payload.data(), payload.size(), Encoding::kTopk8, n), WireError);
  EXPECT_THROW(scan_floats(payload.data(), payload.size(), Encoding::kTopk8, n, {n}), WireError);
}

TEST(TopkDecode, RefusesMalformedPayloads) {
  EXPECT_NO_THROW(decode_floats(craft(2, std::string("\x03\x04", 2)).data(), craft(2, "\x03\x04").size(),
                                Encoding::kTopk8, 10));
  expect_refused("\x01\x00", 10, "truncated (no count)");
  expect_refused(craft(11, std::string(11, '\x00')), 10, "exceeds the 10 elements");
  expect_refused(u32le(0xffffffffu) + std::string(16, '\x01'), 10, "exceeds the 10 elements");
  expect_refused(u32le(5) + std::string(4, '\0'), 1u << 20, "truncated");  // a count the bytes cannot hold
  expect_refused(craft(3, "\x01\x02"), 10, "truncated");                     // too few index bytes
  expect_refused(craft(2, "\x03\x80"), 10, "truncated");                     // a varint that runs off the end
  expect_refused(craft(2, "\x03\x07"), 10, "out of range");                  // 3 + 7 = 10
  expect_refused(craft(1, "\x0a"), 10, "out of range");
  expect_refused(craft(2, std::string("\x03\x00", 2)), 10, "duplicate index");
  expect_refused(craft(1, std::string("\x83\x00", 2)), 200, "overlong");
  expect_refused(craft(1, "\xff\xff\xff\xff\x7f"), 10, "wider than 32 bits");
  expect_refused(craft(1, "\x01\x02"), 10, "trailing");
  expect_refused(craft(1, "\x01", -1.f), 10, "negative scale");
  try {
    const std::string nan = craft(1, "\x01", std::numeric_limits<float>::quiet_NaN());
    decode_floats(nan.data(), nan.size(), Encoding::kTopk8, 10);
    ADD_FAILURE() << "a NaN scale was accepted";
  } catch (const NonFiniteError&) {
  }
}

TEST(TopkDecode, EveryTruncationIsRefused) {
  const std::vector<float> x = gaussian(5000, 5);
  const std::string enc = encode_floats(x.data(), x.size(), Codec(Encoding::kTopk8, at(0.02)));
  for (size_t len = 0; len < enc.size(); ++len)
    EXPECT_THROW(validate_floats(enc.data(), len, Encoding::kTopk8, x.size()), WireError) << len;
}

TEST(TopkEncode, RefusesBadInputAndOptions) {
  std::vector<float> x(10, 1.f);
  x[3] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(encode_floats(x.data(), x.size(), Codec(Encoding::kTopk2, at(0.5))), NonFiniteError);
  x[3] = 1.f;
  EXPECT_THROW(encode_floats(x.data(), x.size(), Codec(Encoding::kTopk2, at(0.0))), WireError);
  EXPECT_THROW(encode_floats(x.data(), x.size(), Codec(Encoding::kTopk2, at(1.5))), WireError);
  EXPECT_THROW(encode_floats(x.data(), x.size(), Codec(Encoding::kTopk2, at(0.5, -1))), WireError);
  // A dense-only entry point refuses a sparse encoding by name.
  std::string out(100, '\0');
  try {
    encode_floats_into(x.data(), x.size(), Encoding::kTopk2, out.data());
    ADD_FAILURE();
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find("topk2 is sparse"), std::string::npos) << e.what();
  }
}

TEST(TopkWire, HeaderBoundsASparsePayload) {
  MessageHeader h;
  h.kind = MessageKind::kFragmentPush;
  h.encoding = Encoding::kTopk2;
  h.element_count = 1000;
  const std::vector<float> x = gaussian(1000, 6);
  const std::string enc = encode_floats(x.data(), x.size(), Codec(Encoding::kTopk2, at(0.03)));
  const std::string frame = encode_message(h, enc);
  const DecodedMessage m = decode_message(frame.data(), frame.size());
  EXPECT_EQ(m.header.encoding, Encoding::kTopk2);
  EXPECT_EQ(m.payload_size, enc.size());
  EXPECT_THROW(encode_message(h, std::string(3, '\0')), WireError);  // no room for the count
  EXPECT_THROW(encode_message(h, std::string(max_encoded_bytes(Encoding::kTopk2, 1000) + 1, '\0')), WireError);
  h.kind = MessageKind::kStateChunk;  // a state download is always dense
  EXPECT_THROW(encode_message(h, enc), WireError);
  h.kind = MessageKind::kFragmentBroadcast;  // so is a whole fragment: decoded, a sparse one would zero ~97 % of Θ_p
  EXPECT_THROW(encode_message(h, enc), WireError);
  h.kind = MessageKind::kFragmentDelta;  // a change against the learner's version: sparse is what it is for
  EXPECT_NO_THROW(encode_message(h, enc));
  h.element_count = uint64_t{1} << 33;
  WireLimits big;
  big.max_elements = uint64_t{1} << 40;
  EXPECT_THROW(encode_message(h, enc, big), WireError);
  EXPECT_THROW(encoded_bytes(Encoding::kTopk2, 10), WireError);
  EXPECT_EQ(parse_encoding("topk4"), Encoding::kTopk4);
}

// ---- topk2b: SparseLoCo's 2-bit values (four bins around the block's mean, each decoded as its values' mean) ----

std::string f32le(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u32le(u);
}

// Worked by hand from the definition (docs/wire.md): kept 4, −2, 6, −8 at indices 1, 3, 5, 7; mean 0, σ (n − 1) =
// √(120/3) = 6.32, width 1.5σ = 9.49; (v − μ)/w = 0.42, −0.21, 0.63, −0.84 → bins 2, 2, 3, 1; levels: bin 1 −8,
// bin 2 (4 − 2)/2 = 1, bin 3 6, bin 0 empty (the mean, 0).
TEST(TopkBins, AWorkedExample) {
  const std::vector<float> x = {0, 4, 0, -2, 0, 6, 0, -8, 1};
  const std::string enc = encode_floats(x.data(), x.size(), Codec(Encoding::kTopk2b, at(0.45)));
  const std::string want = u32le(4) + f32le(0.f) + f32le(-8.f) + f32le(1.f) + f32le(6.f) +
                           std::string(1, static_cast<char>(2 | 2 << 2 | 3 << 4 | 1 << 6)) + std::string("\x01\x02\x02\x02");
  EXPECT_EQ(enc, want);
  const std::vector<float> back = decode_floats(enc.data(), enc.size(), Encoding::kTopk2b, x.size());
  EXPECT_EQ(back, (std::vector<float>{0, 1, 0, 1, 0, 6, 0, -8, 0}));
  EXPECT_EQ(topk_values_bytes(Encoding::kTopk2b, 4), 17u);
  EXPECT_EQ(topk_values_bytes(Encoding::kTopk2b, 1024), 16u + 256u);
  EXPECT_EQ(topk_values_bytes(Encoding::kTopk2b, 1025), 32u + 257u);
  EXPECT_EQ(parse_encoding("topk2b"), Encoding::kTopk2b);
}

// On heavy-tailed values (Student's t, 3 degrees of freedom) at 3% in chunks of 4096: every block decodes to at
// most four levels, each the mean of the inputs it stands for, in the inputs' order; no kept value is lost as 0. The
// absmax code (topk2) zeroes most of them there (a value under half its block's largest decodes as 0).
TEST(TopkBins, EachLevelIsTheMeanOfItsValuesAndNoneIsDropped) {
  std::mt19937 rng(7);
  std::student_t_distribution<float> t3(3.f);
  std::vector<float> x(40 * 4096 + 100);
  for (auto& v : x) v = t3(rng);
  const TopkOptions o = at(0.03, 4096);
  const std::string enc = encode_floats(x.data(), x.size(), Codec(Encoding::kTopk2b, o));
  const SparseEntries s = decode_topk(enc.data(), enc.size(), Encoding::kTopk2b, x.size());
  const SparseEntries a = [&] {
    const std::string e2 = encode_floats(x.data(), x.size(), Codec(Encoding::kTopk2, o));
    return decode_topk(e2.data(), e2.size(), Encoding::kTopk2, x.size());
  }();
  ASSERT_EQ(s.index, a.index);  // the same entries kept: only the values' code differs
  ASSERT_GT(s.index.size(), 4 * kBinBlock);  // five blocks, the last one short
  size_t zero_bins = 0, zero_absmax = 0;
  for (size_t lo = 0; lo < s.index.size(); lo += kBinBlock) {
    const size_t hi = std::min<size_t>(s.index.size(), lo + kBinBlock);
    std::map<float, std::pair<double, double>> groups;  // decoded level → (sum, count) of its inputs
    for (size_t j = lo; j < hi; ++j) {
      auto& g = groups[s.value[j]];
      g.first += x[s.index[j]];
      g.second += 1;
    }
    EXPECT_LE(groups.size(), 4u);
    for (const auto& [level, g] : groups) EXPECT_NEAR(level, g.first / g.second, 1e-5 * (1 + std::fabs(level)));
    for (size_t j = lo; j < hi; ++j)
      for (size_t i = lo; i < hi; ++i)
        if (x[s.index[i]] < x[s.index[j]]) ASSERT_LE(s.value[i], s.value[j]) << "levels out of the inputs' order";
  }
  for (size_t j = 0; j < s.index.size(); ++j) {
    zero_bins += s.value[j] == 0.f;
    zero_absmax += a.value[j] == 0.f;
  }
  EXPECT_EQ(zero_bins, 0u);
  EXPECT_GT(zero_absmax, s.index.size() / 2) << "the absmax code was expected to zero most of these";
  // Error feedback carries exactly what the code did not deliver.
  std::vector<float> residual(x.size(), 0.f);
  const std::string fb = quantize_with_error_feedback(x.data(), residual.data(), x.size(), Codec(Encoding::kTopk2b, o));
  const std::vector<float> got = decode_floats(fb.data(), fb.size(), Encoding::kTopk2b, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_FLOAT_EQ(got[i] + residual[i], x[i]) << i;
}

TEST(TopkBins, RefusesMalformedValueSections) {
  const std::string idx = "\x01\x02";  // indices 1, 3
  const std::string levels = f32le(-1.f) + f32le(0.f) + f32le(1.f) + f32le(2.f);
  const auto refused = [](const std::string& p, const std::string& says, bool non_finite) {
    std::vector<float> out(10, 7.f);
    try {
      decode_floats_into(p.data(), p.size(), Encoding::kTopk2b, 10, out.data());
      ADD_FAILURE() << "accepted: expected '" << says << "'";
    } catch (const NonFiniteError& e) {
      EXPECT_TRUE(non_finite) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    } catch (const WireError& e) {
      EXPECT_FALSE(non_finite) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    for (float v : out) EXPECT_EQ(v, 7.f) << "a refused payload wrote to the output";
  };
  const std::string ok = u32le(2) + levels + std::string(1, static_cast<char>(3 | 1 << 2)) + idx;
  std::vector<float> out(10, 0.f);
  decode_floats_into(ok.data(), ok.size(), Encoding::kTopk2b, 10, out.data());
  EXPECT_EQ(out[1], 2.f);
  EXPECT_EQ(out[3], 0.f);
  refused(u32le(2) + levels + std::string(1, static_cast<char>(3 | 1 << 2 | 1 << 6)) + idx, "unused bits", false);
  refused(u32le(2) + f32le(std::numeric_limits<float>::infinity()) + f32le(0.f) + f32le(1.f) + f32le(2.f) +
              std::string(1, '\x03') + idx,
          "level 0 of value block 0 is non-finite", true);
  refused(u32le(2) + levels, "truncated", false);
}

}  // namespace
}  // namespace deloco
