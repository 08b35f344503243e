// Tests for the float payload codecs: error bounds of each encoding, error feedback, and bad input.
#include "wire/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace deloco {
namespace quantize_cases {

std::vector<float> random_values(size_t n, uint32_t seed, float spread = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, spread);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng);
  // Blocks of very different magnitudes, so per-block scales matter.
  for (size_t i = 0; i < n; ++i) x[i] *= std::pow(10.f, static_cast<float>((i / kQuantBlock) % 5) - 2.f);
  return x;
}

std::vector<float> round_trip(const std::vector<float>& x, Encoding e) {
  const std::string enc = encode_floats(x.data(), x.size(), e);
  EXPECT_EQ(enc.size(), encoded_bytes(e, x.size()));
  return decode_floats(enc.data(), enc.size(), e, x.size());
}

float block_step(const std::vector<float>& x, size_t i, int qmax) {
  const size_t lo = i / kQuantBlock * kQuantBlock, hi = std::min(x.size(), lo + kQuantBlock);
  float amax = 0;
  for (size_t j = lo; j < hi; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax / static_cast<float>(qmax);
}

TEST(Quantize, Fp32IsExact) {
  std::vector<float> x = random_values(1000, 1);
  x.push_back(std::numeric_limits<float>::max());
  x.push_back(std::numeric_limits<float>::denorm_min());
  x.push_back(-0.f);
  const std::vector<float> y = round_trip(x, Encoding::kFp32);
  ASSERT_EQ(y.size(), x.size());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), 4 * x.size()), 0);
}

TEST(Quantize, Bf16WithinHalfAnUlpAndRoundsToNearestEven) {
  const std::vector<float> x = random_values(5000, 2);
  const std::vector<float> y = round_trip(x, Encoding::kBf16);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_LE(std::fabs(y[i] - x[i]), std::ldexp(std::fabs(x[i]), -8)) << "index " << i;  // 8 significant bits
  // Ties: 1 + 2^-8 lies halfway between bf16 1 and 1 + 2^-7; even mantissa wins (1). 1 + 3·2^-8 goes up.
  const std::vector<float> ties = {1.f + std::ldexp(1.f, -8), 1.f + 3 * std::ldexp(1.f, -8), 1.f + std::ldexp(1.f, -9)};
  const std::vector<float> r = round_trip(ties, Encoding::kBf16);
  EXPECT_EQ(r[0], 1.f);
  EXPECT_EQ(r[1], 1.f + std::ldexp(1.f, -6));
  EXPECT_EQ(r[2], 1.f);
  // Values that round past the largest bf16 are refused rather than sent as infinity.
  const float big = std::numeric_limits<float>::max();
  EXPECT_THROW(encode_floats(&big, 1, Encoding::kBf16), WireError);
}

TEST(Quantize, Int8Int4AndInt2WithinHalfAStepOfEachBlock) {
  for (size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1001}}) {
    const std::vector<float> x = random_values(n, 3 + static_cast<uint32_t>(n));
    for (auto [e, qmax] : {std::pair{Encoding::kInt8, 127}, std::pair{Encoding::kInt4, 7}, std::pair{Encoding::kInt2, 1}}) {
      const std::vector<float> y = round_trip(x, e);
      ASSERT_EQ(y.size(), n);
      for (size_t i = 0; i < n; ++i) {
        const float step = block_step(x, i, qmax);
        ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * step * (1 + 1e-5f)) << encoding_name(e) << " n=" << n << " i=" << i;
      }
    }
  }
}

TEST(Quantize, Int4UsesTheFullRangeAndZeroBlocksStayZero) {
  std::vector<float> x(130, 0.f);
  for (size_t i = 64; i < 128; ++i) x[i] = static_cast<float>(static_cast<int>(i % 15) - 7);  // -7..7 exactly
  x[129] = 3.f;                                                                             // odd tail block
  const std::vector<float> y = round_trip(x, Encoding::kInt4);
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(y[i], 0.f);
  for (size_t i = 64; i < 128; ++i) EXPECT_EQ(y[i], x[i]) << i;  // scale = 1 exactly
  EXPECT_EQ(y[129], 3.f);
  EXPECT_EQ(y[128], 0.f);
}

// int2 is ternary: {−1, 0, 1} × max|x| of the block, four elements a byte, bits 2j..2j+1 for element 4i+j; the code
// that no encoder writes is refused.
TEST(Quantize, Int2IsTernaryFourToAByte) {
  const std::vector<float> x{2.f, -2.f, 0.9f, 1.1f, -0.5f, 0.f};
  const std::string enc = encode_floats(x.data(), x.size(), Encoding::kInt2);
  ASSERT_EQ(enc.size(), 4u + 2u);  // one scale, ceil(6/4) bytes
  const std::vector<float> y = decode_floats(enc.data(), enc.size(), Encoding::kInt2, x.size());
  // scale 2: 2 → 1, −2 → −1, 0.9 → 0 (0.45 rounds to 0), 1.1 → 1 (0.55), −0.5 → 0 (−0.25), 0 → 0
  EXPECT_EQ(y, (std::vector<float>{2.f, -2.f, 0.f, 2.f, 0.f, 0.f}));
  // Codes q + 2: 3, 1, 2, 3 in the first byte (element 0 in the low bits), 2, 2 in the second.
  EXPECT_EQ(static_cast<unsigned char>(enc[4]), 3u | (1u << 2) | (2u << 4) | (3u << 6));
  EXPECT_EQ(static_cast<unsigned char>(enc[5]), 2u | (2u << 2));
  std::string bad = enc;
  bad[5] = static_cast<char>(0);  // element 4: code 0
  EXPECT_THROW(decode_floats(bad.data(), bad.size(), Encoding::kInt2, x.size()), WireError);
  EXPECT_EQ(parse_encoding("int2"), Encoding::kInt2);
  EXPECT_EQ(encoded_bytes(Encoding::kInt2, 65), 8u + 17u);
}

// Validation and decoding take only the canonical form encode_blocks writes (found by review: a block with a huge scale
// over zero codes decoded to zeros and measured as nothing, yet the fused merge multiplies its coefficient into the
// scale first, c · FLT_MAX = inf, and inf · 0 put NaN into Θ). Codes outside [−qmax, qmax], a positive scale over
// zeros only, and set bits after the last element are refused as malformed (WireError, not NonFiniteError).
TEST(Quantize, OnlyTheCanonicalBlockFormIsAccepted) {
  auto refused = [](const std::string& payload, Encoding e, size_t n, const char* what) {
    EXPECT_THROW(decode_floats(payload.data(), payload.size(), e, n), WireError) << what;
    EXPECT_THROW(validate_floats(payload.data(), payload.size(), e, n), WireError) << what;
    try {
      validate_floats(payload.data(), payload.size(), e, n);
    } catch (const NonFiniteError&) {
      ADD_FAILURE() << what << ": malformed, not non-finite";
    } catch (const WireError& err) {
      EXPECT_NE(std::string(err.what()).find("which no encoder writes"), std::string::npos) << err.what();
    }
  };
  const float big = std::numeric_limits<float>::max();
  for (Encoding e : {Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    SCOPED_TRACE(encoding_name(e));
    const size_t n = 130;  // three blocks, the last of two elements
    std::vector<float> x(n, 0.f);
    x[64] = 1e-3f;  // block 1 holds one value; blocks 0 and 2 are zero
    const std::string ok = encode_floats(x.data(), n, e);
    EXPECT_NO_THROW(validate_floats(ok.data(), ok.size(), e, n));
    std::string over_zeros = ok;
    std::memcpy(over_zeros.data(), &big, 4);  // block 0's scale
    refused(over_zeros, e, n, "a scale over zeros only");
  }
  std::vector<float> x(5, 0.5f);
  std::string i8 = encode_floats(x.data(), x.size(), Encoding::kInt8);
  i8[4 + 2] = static_cast<char>(0x80);  // element 2: −128
  refused(i8, Encoding::kInt8, x.size(), "int8 code -128");
  std::string i4 = encode_floats(x.data(), x.size(), Encoding::kInt4);
  i4[4 + 1] = static_cast<char>(i4[4 + 1] & 0xf0);  // element 2: nibble 0 (−8)
  refused(i4, Encoding::kInt4, x.size(), "int4 code 0");
  i4 = encode_floats(x.data(), x.size(), Encoding::kInt4);
  i4[4 + 2] = static_cast<char>(i4[4 + 2] | 0x10);  // the nibble after element 4 (n = 5 is odd)
  refused(i4, Encoding::kInt4, x.size(), "int4 padding");
  std::string i2 = encode_floats(x.data(), x.size(), Encoding::kInt2);
  i2[4 + 1] = static_cast<char>(i2[4 + 1] | 0x40);  // the bits after element 4
  refused(i2, Encoding::kInt2, x.size(), "int2 padding");
  // What the encoder writes is canonical, subnormal blocks included (a positive scale always comes with a nonzero
  // code): every block of k · 2^-149 for k up to 600 decodes.
  for (Encoding e : {Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    for (int k = 1; k <= 600; ++k) {
      std::vector<float> y(64, 0.f);
      y[k % 64] = std::ldexp(static_cast<float>(k), -149);
      y[(k + 7) % 64] = -std::ldexp(static_cast<float>(k / 3), -149);
      const std::string enc = encode_floats(y.data(), y.size(), e);
      ASSERT_NO_THROW(validate_floats(enc.data(), enc.size(), e, y.size())) << encoding_name(e) << " k = " << k;
    }
  }
}

TEST(Quantize, ErrorFeedbackTracksTheCumulativeSum) {
  // cumsum(x) - cumsum(dequant) equals the final residual, which stays within one quantization step (int8/int4:
  // of the block; bf16: 2^-8 relative). Plain quantization (no feedback) drifts by several steps.
  const size_t n = 256;
  for (Encoding e : {Encoding::kBf16, Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    std::vector<float> residual(n, 0.f);
    std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0), sum_plain(n, 0.0), prev_drift(n, 0.0);
    double worst = 0.0, worst_plain = 0.0;  // in units of one step
    for (int round = 0; round < 300; ++round) {
      std::vector<float> x = random_values(n, 100 + round, 0.01f);
      for (size_t i = 0; i < n; i += 7) x[i] += 0.2f * block_step(x, i, 7);  // a bias plain rounding loses
      const std::string enc = quantize_with_error_feedback(x.data(), residual.data(), n, e);
      const std::vector<float> y = decode_floats(enc.data(), enc.size(), e, n);
      const std::vector<float> p = round_trip(x, e);
      for (size_t i = 0; i < n; ++i) {
        sum_in[i] += x[i];
        sum_out[i] += y[i];
        sum_plain[i] += p[i];
        const double drift = std::fabs(sum_in[i] - sum_out[i]);
        const double step = e == Encoding::kBf16 ? std::ldexp(std::fabs(x[i]) + prev_drift[i], -8)
                                                 : block_step(x, i, e == Encoding::kInt4 ? 7 : e == Encoding::kInt2 ? 1 : 127);
        const double slack = 1e-4 * std::fabs(x[i]) + 1e-12;  // float rounding of x + residual over the rounds
        // int2's step is the block's max|x| itself, and the residual it carries raises the next block max of
        // x + residual noticeably: the bound holds with a little more room.
        const double k = e == Encoding::kInt2 ? 1.25 : 1.01;
        ASSERT_LE(drift, k * step + slack) << encoding_name(e) << " round " << round << " i=" << i;
        prev_drift[i] = drift;
        if (e != Encoding::kBf16) {
          worst = std::max(worst, drift / step);
          worst_plain = std::max(worst_plain, std::fabs(sum_in[i] - sum_plain[i]) / step);
        }
      }
    }
    if (e != Encoding::kBf16) {
      EXPECT_LE(worst, e == Encoding::kInt2 ? 1.25 : 1.01) << encoding_name(e);
      EXPECT_GT(worst_plain, 3.0) << encoding_name(e) << ": plain quantization should drift by several steps";
    }
  }
}

TEST(Quantize, NonFiniteInputIsRejectedWithItsIndex) {
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4}) {
    std::vector<float> x(100, 1.f);
    x[42] = std::numeric_limits<float>::quiet_NaN();
    try {
      encode_floats(x.data(), x.size(), e);
      FAIL() << "NaN accepted by " << encoding_name(e);
    } catch (const WireError& err) {
      EXPECT_NE(std::string(err.what()).find("index 42"), std::string::npos) << err.what();
    }
    x[42] = -std::numeric_limits<float>::infinity();
    EXPECT_THROW(encode_floats(x.data(), x.size(), e), WireError);
    std::vector<float> residual(100, 0.f);
    EXPECT_THROW(quantize_with_error_feedback(x.data(), residual.data(), x.size(), e), WireError);
    for (float r : residual) ASSERT_EQ(r, 0.f);  // untouched on failure
  }
  const float one = 1.f;
  EXPECT_THROW(encode_floats(&one, 1, Encoding::kRaw), WireError);
}

TEST(Quantize, DecodeRejectsBadPayloads) {
  const std::vector<float> x = random_values(100, 7);
  std::string enc = encode_floats(x.data(), x.size(), Encoding::kInt8);
  // Wrong size for the element count.
  EXPECT_THROW(decode_floats(enc.data(), enc.size() - 1, Encoding::kInt8, 100), WireError);
  EXPECT_THROW(decode_floats(enc.data(), enc.size(), Encoding::kInt8, 101), WireError);
  // A huge element count is caught by the size check before any allocation.
  EXPECT_THROW(decode_floats(enc.data(), enc.size(), Encoding::kFp32, size_t{1} << 60), WireError);
  // A NaN or negative block scale (a peer with a valid checksum can still send one).
  const float nan = std::numeric_limits<float>::quiet_NaN(), neg = -1.f;
  std::string bad = enc;
  std::memcpy(bad.data() + 4, &nan, 4);  // block 1's scale (host order is little-endian on our targets)
  EXPECT_THROW(decode_floats(bad.data(), bad.size(), Encoding::kInt8, 100), WireError);
  std::memcpy(bad.data() + 4, &neg, 4);
  EXPECT_THROW(decode_floats(bad.data(), bad.size(), Encoding::kInt8, 100), WireError);
  // fp32 and bf16 payloads holding a NaN: named by index.
  std::string f32 = encode_floats(x.data(), x.size(), Encoding::kFp32);
  std::memcpy(f32.data() + 4 * 17, &nan, 4);
  try {
    decode_floats(f32.data(), f32.size(), Encoding::kFp32, 100);
    FAIL() << "NaN payload decoded";
  } catch (const WireError& err) {
    EXPECT_NE(std::string(err.what()).find("index 17"), std::string::npos) << err.what();
  }
  std::string b16 = encode_floats(x.data(), x.size(), Encoding::kBf16);
  b16[2 * 5] = static_cast<char>(0xc1);
  b16[2 * 5 + 1] = static_cast<char>(0x7f);  // 0x7fc1: a bf16 NaN
  EXPECT_THROW(decode_floats(b16.data(), b16.size(), Encoding::kBf16, 100), WireError);
}

// Found by fuzz/fuzz_codecs: a block whose max |x| is within a rounding of FLT_MAX encoded "fine" but decoded to
// inf (q · scale overflows), so a learner's own push was refused by the syncer as non-finite. The encoder refuses it.
TEST(Quantize, BlockNearFloatMaxIsRefusedAtEncodeNotAtDecode) {
  std::vector<float> x(10, 1.0f);
  x[3] = -std::numeric_limits<float>::max();
  try {
    encode_floats(x.data(), x.size(), Encoding::kInt8);
    FAIL() << "int8 encoded a block it cannot decode";
  } catch (const WireError& err) {
    EXPECT_NE(std::string(err.what()).find("block 0"), std::string::npos) << err.what();
  }
  // The invariant for both block codecs: whatever encodes also decodes (7 · (FLT_MAX / 7) happens not to overflow).
  for (float big : {std::numeric_limits<float>::max(), std::nextafter(std::numeric_limits<float>::max(), 0.f)}) {
    x[3] = big;
    for (Encoding e : {Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
      std::string enc;
      try {
        enc = encode_floats(x.data(), x.size(), e);
      } catch (const WireError&) {
        continue;
      }
      EXPECT_NO_THROW(decode_floats(enc.data(), enc.size(), e, x.size())) << encoding_name(e);
    }
  }
  // Still representable a little further from the edge: decodes back finite and within half a step.
  x[3] = -std::numeric_limits<float>::max() / 2;
  for (Encoding e : {Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    const std::string enc = encode_floats(x.data(), x.size(), e);
    const std::vector<float> y = decode_floats(enc.data(), enc.size(), e, x.size());
    EXPECT_TRUE(std::isfinite(y[3]));
  }
}

// Bad numbers and bad framing are told apart (the syncer counts them as non_finite and malformed_frame): a NaN or
// infinite block scale of int8/int4, and NaN/Inf elements of fp32/bf16, are NonFiniteError; a negative scale or a
// wrong size is a plain WireError.
TEST(Quantize, NonFiniteScalesAndValuesAreNonFiniteErrorsNotMalformed) {
  const std::vector<float> x = random_values(100, 11);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float neg = -1.f, huge = 3e38f;
  auto is_non_finite = [](const std::string& payload, Encoding e) {
    try {
      decode_floats(payload.data(), payload.size(), e, 100);
    } catch (const NonFiniteError&) {
      return 1;
    } catch (const WireError&) {
      return 0;
    }
    return -1;  // accepted
  };
  for (Encoding e : {Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    const std::string enc = encode_floats(x.data(), x.size(), e);
    for (float scale : {nan, inf, -inf}) {
      std::string bad = enc;
      std::memcpy(bad.data() + 4, &scale, 4);  // block 1's scale
      EXPECT_EQ(is_non_finite(bad, e), 1) << encoding_name(e) << " scale " << scale;
    }
    std::string bad = enc;
    std::memcpy(bad.data() + 4, &neg, 4);
    EXPECT_EQ(is_non_finite(bad, e), 0) << encoding_name(e) << ": a negative scale is malformed";
    std::memcpy(bad.data() + 4, &huge, 4);  // finite, but 3e38 × q overflows to inf for |q| ≥ 2 (int2: |q| ≤ 1)
    if (e != Encoding::kInt2) EXPECT_EQ(is_non_finite(bad, e), 1) << encoding_name(e) << ": an overflowing scale";
    EXPECT_EQ(is_non_finite(enc.substr(1), e), 0) << encoding_name(e) << ": wrong size";
  }
  std::string f32 = encode_floats(x.data(), x.size(), Encoding::kFp32);
  std::memcpy(f32.data() + 4 * 3, &inf, 4);
  EXPECT_EQ(is_non_finite(f32, Encoding::kFp32), 1);
  std::string b16 = encode_floats(x.data(), x.size(), Encoding::kBf16);
  b16[0] = static_cast<char>(0x80);
  b16[1] = static_cast<char>(0x7f);  // 0x7f80: bf16 +inf
  EXPECT_EQ(is_non_finite(b16, Encoding::kBf16), 1);
  // The encoder names non-finite input the same way.
  std::vector<float> y(x);
  y[5] = nan;
  EXPECT_THROW(encode_floats(y.data(), y.size(), Encoding::kInt8), NonFiniteError);
}

}  // namespace
}  // namespace deloco
