// iso_c_ns (Newton–Schulz Iso-C) against an independent reference: the exact Iso-C σ̄·U Vᵀ computed here from
// torch's SVD in fp64 (not from any of our merge code), plus the schedule's scalar behaviour and edge cases.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/merge.h"
#include "merge/methods.h"
#include "merge/test_util.h"

namespace deloco {
namespace iso_c_ns_cases {

using test::rel_err;

// Exact Iso-C of one matrix, fp64: mean(S)·U Vᵀ over the thin SVD.
at::Tensor exact_iso_c(const at::Tensor& M) {
  auto [U, S, Vh] = at::linalg_svd(M.to(at::kDouble), /*full_matrices=*/false);
  return at::matmul(U, Vh) * S.mean();
}

at::Tensor ns(const at::Tensor& M, int steps, at::ScalarType iter = at::kFloat,
              at::ScalarType compute = at::kFloat) {
  MergeOptions o;
  o.iso_ns_steps = steps;
  o.iso_ns_dtype = iter;
  o.compute_dtype = compute;
  return make_merger("iso_c_ns", o)->merge({"w", {M}, {}});
}

at::Tensor gaussian(int64_t m, int64_t n, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn({m, n}, gen, at::TensorOptions().dtype(at::kFloat));
}

// The composed scalar map p_K ∘ … ∘ p_1 on [ℓ₀, 1] (ℓ₀ the design limit) lands within ε of 1: checks the
// coefficient table itself, independently of any matrix code.
TEST(MergeIsoCNs, ScheduleMapsTheDesignBandToOne) {
  struct Case {
    int steps;
    double l0, eps;
  };
  // ℓ₀ for K steps: 4.9e-3 (6), 2.8e-4 (8), 1.7e-5 (10), 4.0e-6/4.17 (12: one repeated growth step).
  for (const Case& c : {Case{6, 4.9e-3, 1e-6}, Case{8, 2.8e-4, 1e-6}, Case{10, 1.7e-5, 1e-6},
                        Case{12, 4.0e-6 / 4.17, 1e-6}}) {
    const auto sched = merge_detail::iso_ns_schedule(c.steps);
    ASSERT_EQ(static_cast<int>(sched.size()), c.steps);
    double worst = 0;
    for (int i = 0; i <= 2000; ++i) {
      double x = c.l0 * std::pow(1.0 / c.l0, i / 2000.0);
      for (const auto& q : sched) x = q[0] * x + q[1] * x * x * x + q[2] * x * x * x * x * x;
      worst = std::max(worst, std::abs(1 - x));
    }
    EXPECT_LT(worst, c.eps) << c.steps << " steps";
    // Below the design limit singular values are not brought to 1 (that is the method's error).
    double x = c.l0 / 100;
    for (const auto& q : sched) x = q[0] * x + q[1] * x * x * x + q[2] * x * x * x * x * x;
    EXPECT_LT(x, 0.9) << c.steps << " steps";
  }
  // 0 stays 0; odd polynomials keep signs.
  for (const auto& q : merge_detail::iso_ns_schedule(8)) EXPECT_GT(q[0], 0);
}

double quintic(const std::array<double, 3>& q, double x) {
  return q[0] * x + q[1] * x * x * x + q[2] * x * x * x * x * x;
}

// bf16's cushioned schedule: the same design band mapped to 1 (its ℓ₀ per K, from bench/merge_reference.py
// ns-coefficients), and no step maps a value of its band's top decade far below the top. The steep schedule's first
// step for K = 8 maps 0.84 to 2.3e-3, below bf16's resolution relative to the top: what the cushion prevents.
TEST(MergeIsoCNs, Bf16ScheduleIsCushioned) {
  for (auto [steps, l0] : {std::pair<int, double>{5, 2.3e-2}, {6, 6.0e-3}, {8, 4.2e-4}, {10, 2.9e-5}}) {
    const auto sched = merge_detail::iso_ns_schedule(steps, true);
    ASSERT_EQ(static_cast<int>(sched.size()), steps);
    double worst = 0;
    for (int i = 0; i <= 2000; ++i) {
      double x = l0 * std::pow(1.0 / l0, i / 2000.0);
      for (const auto& q : sched) x = quintic(q, x);
      worst = std::max(worst, std::abs(1 - x));
    }
    EXPECT_LT(worst, 1e-6) << steps << " steps";
    // Each step's band: [lo, hi] from [ℓ₀, 1.02]; over its top decade [hi/10, hi] the step stays above hi/10.
    double lo = l0, hi = 1.02, dip_cushioned = 1, dip_steep = 1;
    for (size_t j = 0; j < sched.size(); ++j) {
      double plo = 1e9, phi = 0;
      for (int i = 0; i <= 4000; ++i) {
        const double x = lo * std::pow(hi / lo, i / 4000.0), p = quintic(sched[j], x);
        if (x >= hi / 10) dip_cushioned = std::min(dip_cushioned, p / hi);
        plo = std::min(plo, p);
        phi = std::max(phi, p);
      }
      lo = plo;
      hi = phi * 1.02;
    }
    for (int i = 0; i <= 4000; ++i) {
      const double x = 0.102 + (1.02 - 0.102) * i / 4000.0;
      dip_steep = std::min(dip_steep, quintic(merge_detail::iso_ns_schedule(steps)[0], x));
    }
    EXPECT_GT(dip_cushioned, 0.1) << steps << " steps";
    if (steps >= 8) EXPECT_LT(dip_steep, 0.01) << steps << " steps";  // the steep first step's dip
  }
  // Up to one minimax step the two schedules agree.
  for (int steps : {1, 2, 3}) EXPECT_EQ(merge_detail::iso_ns_schedule(steps, true), merge_detail::iso_ns_schedule(steps));
}

// In bf16 the cushioned schedule holds on small and flat matrices at every step count: the steep one lost their
// largest directions at K ≥ 6 (errors of 0.3–0.7 against exact Iso-C).
TEST(MergeIsoCNs, Bf16HoldsOnSmallMatricesAtEveryStepCount) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{64, 32}, {32, 64}}) {
    for (uint64_t seed = 0; seed < 2; ++seed) {
      at::Tensor M = gaussian(m, n, 100 + seed);
      at::Tensor want = exact_iso_c(M);
      for (int steps : {5, 6, 8, 10}) EXPECT_LT(rel_err(ns(M, steps, at::kBFloat16), want), 0.02) << m << "x" << n << " seed " << seed << ", " << steps << " steps";
    }
  }
}

// What the iteration must compute, from torch's SVD: every σ_i goes through the scalar map p_K(σ_i/s) with
// s = (Σσ⁸)^{1/8}, the singular vectors stay, and the scale is Σ_i p_K(σ_i/s)·σ_i / r.
at::Tensor spectral_map(const at::Tensor& M, int steps) {
  auto [U, S, Vh] = at::linalg_svd(M.to(at::kDouble), false);
  const double s = S.pow(8).sum().pow(1.0 / 8).item<double>();
  at::Tensor x = S / s;
  for (const auto& q : merge_detail::iso_ns_schedule(steps)) x = q[0] * x + q[1] * x.pow(3) + q[2] * x.pow(5);
  const double sbar = (x * S).sum().item<double>() / static_cast<double>(S.size(0));
  return at::matmul(U * x, Vh) * sbar;
}

TEST(MergeIsoCNs, ComputesTheScheduleOnTheSpectrum) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{96, 96}, {150, 60}, {40, 130}}) {
    at::Tensor M = gaussian(m, n, 40 + n);
    for (int steps : {3, 6, 8}) {
      EXPECT_LT(rel_err(ns(M, steps), spectral_map(M, steps)), 2e-5) << m << "x" << n << ", " << steps;
      EXPECT_LT(rel_err(ns(M.to(at::kDouble), steps, at::kFloat, at::kDouble), spectral_map(M, steps)), 1e-10);
    }
  }
}

TEST(MergeIsoCNs, MatchesExactIsoCOnGaussianMatrices) {
  // Square (κ ≈ 2n: its smallest σ/s is below 8 steps' design limit, so 10), tall and wide (well conditioned:
  // 8 steps). fp32 round-off, amplified by the growth steps, leaves ~1e-5.
  for (auto [m, n] : {std::pair<int64_t, int64_t>{128, 128}, {300, 120}, {64, 257}}) {
    at::Tensor M = gaussian(m, n, 17 + m);
    at::Tensor want = exact_iso_c(M);
    const int steps = m == n ? 10 : 8;
    const double err = rel_err(ns(M, steps), want);
    EXPECT_LT(err, 1e-4) << m << "x" << n;
    // The cosine to the exact result.
    at::Tensor got = ns(M, steps).to(at::kDouble);
    EXPECT_GT((got * want).sum().item<double>() / (got.norm() * want.norm()).item<double>(), 1 - 1e-8);
  }
  // Too few steps leave the small singular values of the square one short of σ̄: the bound can fail.
  at::Tensor M = gaussian(128, 128, 17 + 128);
  EXPECT_GT(rel_err(ns(M, 3), exact_iso_c(M)), 1e-2);
  EXPECT_GT(rel_err(ns(M, 8), exact_iso_c(M)), 1e-3);
}

TEST(MergeIsoCNs, LowRankPlusNoiseConvergesWithMoreSteps) {
  // A pseudo-gradient-like spectrum: rank 8 signal plus 1e-2 noise (σ spread over ~4 decades).
  auto gen = at::detail::createCPUGenerator(5);
  auto opt = at::TensorOptions().dtype(at::kFloat);
  at::Tensor M = at::matmul(at::randn({200, 8}, gen, opt), at::randn({8, 160}, gen, opt)) +
                 1e-2 * at::randn({200, 160}, gen, opt);
  at::Tensor want = exact_iso_c(M);
  const double e6 = rel_err(ns(M, 6), want), e8 = rel_err(ns(M, 8), want), e12 = rel_err(ns(M, 12), want);
  EXPECT_LT(e12, 1e-3);
  EXPECT_LT(e12, e8);
  EXPECT_LT(e8, e6);
  // fp64 compute runs the iteration in fp64.
  EXPECT_LT(rel_err(ns(M.to(at::kDouble), 14, at::kFloat, at::kDouble), want), 1e-7);
}

TEST(MergeIsoCNs, Bf16IterationOnAWellConditionedMatrix) {
  // Tall Gaussian 512×64: σ_min/σ_max ≈ 0.5. bf16 rounds every iterate to 8 bits: below 1 %, not fp32's 1e-6.
  at::Tensor M = gaussian(512, 64, 3);
  at::Tensor want = exact_iso_c(M);
  at::Tensor R = ns(M, 8, at::kBFloat16);
  EXPECT_EQ(R.scalar_type(), at::kFloat);
  const double err = rel_err(R, want);
  EXPECT_LT(err, 0.02);
  EXPECT_GT(err, 10 * rel_err(ns(M, 8), want));
}

TEST(MergeIsoCNs, TransposeWeightsRankDeficiencyAndZeros) {
  at::Tensor M = gaussian(40, 90, 8);
  EXPECT_LT(rel_err(ns(M.t().contiguous(), 8), ns(M, 8).t()), 1e-6);
  // Weighted contributions: the merge of the weighted mean.
  at::Tensor N = gaussian(40, 90, 9);
  MergeOptions o;
  auto m = make_merger("iso_c_ns", o);
  EXPECT_LT(rel_err(m->merge({"w", {M, N}, {3, 1}}), exact_iso_c(0.75 * M + 0.25 * N)), 2e-3);
  // Rank 2 in a 30×20 matrix: σ̄ over all r = 20, the null space stays null (like iso_c_fast).
  at::Tensor L = at::matmul(gaussian(30, 2, 10).to(at::kDouble), gaussian(2, 20, 11).to(at::kDouble));
  auto [U, S, Vh] = at::linalg_svd(L, false);
  at::Tensor range = at::matmul(U.narrow(1, 0, 2), Vh.narrow(0, 0, 2)) * (S.sum() / 20);
  // In fp32 the rounding noise of the null space (σ ~ 1e-7·σ_max) is lifted toward σ̄ too, by ~10⁴ in 8 steps.
  EXPECT_LT(rel_err(ns(L.to(at::kFloat), 8), range), 2e-3);
  EXPECT_LT(rel_err(ns(L, 8, at::kFloat, at::kDouble), range), 1e-10);
  // Zero matrix → zeros; vectors fall back to the mean.
  EXPECT_EQ(ns(at::zeros({5, 7}), 8).abs().max().item<float>(), 0.0f);
  at::Tensor v1 = at::randn({9}), v2 = at::randn({9});
  EXPECT_LT(rel_err(m->merge({"b", {v1, v2}, {}}), (v1 + v2) / 2), 1e-7);
  // Huge but finite entries do not overflow the Gram products.
  at::Tensor big = gaussian(64, 64, 12) * 1e30f;
  EXPECT_LT(rel_err(ns(big, 8), exact_iso_c(big)), 2e-3);
}

TEST(MergeIsoCNs, DefaultStepsDependOnThePrecision) {
  at::Tensor M = gaussian(48, 40, 21);
  EXPECT_TRUE(at::equal(make_merger("iso_c_ns")->merge({"w", {M}, {}}), ns(M, 10)));
  EXPECT_FALSE(at::equal(ns(M, 8), ns(M, 10)));
  MergeOptions bf;
  bf.iso_ns_dtype = at::kBFloat16;
  EXPECT_TRUE(at::equal(make_merger("iso_c_ns", bf)->merge({"w", {M}, {}}), ns(M, 8, at::kBFloat16)));
}

TEST(MergeIsoCNs, BadOptionsAndInputsAreNamed) {
  for (int steps : {-1, 31}) {
    MergeOptions o;
    o.iso_ns_steps = steps;
    try {
      make_merger("iso_c_ns", o);
      ADD_FAILURE() << steps;
    } catch (const MergeError& e) {
      EXPECT_NE(std::string(e.what()).find("iso_ns_steps"), std::string::npos) << e.what();
    }
  }
  MergeOptions half;
  half.iso_ns_dtype = at::kHalf;
  EXPECT_THROW(make_merger("iso_c_ns", half), MergeError);
  try {
    make_merger("iso_c_ns")->merge({"h.0.w", {at::zeros({4, 4}), at::full({4, 4}, NAN)}, {}});
    ADD_FAILURE();
  } catch (const MergeError& e) {
    EXPECT_NE(std::string(e.what()).find("contribution 1 contains NaN"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("h.0.w"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deloco
