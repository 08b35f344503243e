// Properties of the merge methods that must hold whatever the implementation: identities, invariants,
// hand-checkable examples, determinism, bad input.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/merge.h"
#include "merge/test_util.h"

namespace deloco {
namespace merge_cases {

using test::rel_err;

std::vector<at::Tensor> randn_list(int T, std::vector<int64_t> shape, uint64_t seed,
                                   at::ScalarType dt = at::kFloat) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> v;
  for (int i = 0; i < T; ++i) v.push_back(at::randn(shape, gen, at::TensorOptions().dtype(dt)));
  return v;
}

at::Tensor merge(const std::string& method, std::vector<at::Tensor> d, std::vector<double> w = {},
                 MergeOptions o = {}) {
  return make_merger(method, o)->merge({"t", std::move(d), std::move(w)});
}

TEST(MergeBasics, MeanOfOneIsIdentity) {
  auto d = randn_list(1, {7, 5}, 1);
  EXPECT_TRUE(at::equal(merge("mean", d), d[0]));
  EXPECT_LT(rel_err(merge("rda", d), d[0]), 1e-6);
  EXPECT_LT(rel_err(merge("tsv", d), d[0]), 1e-5);  // full rank, T = 1: all triplets kept
  MergeOptions keep_all;
  keep_all.ties_keep = 1.0;
  keep_all.dare_drop = 0.0;
  EXPECT_LT(rel_err(merge("ties", d, {}, keep_all), d[0]), 1e-7);
  EXPECT_LT(rel_err(merge("dare", d, {}, keep_all), d[0]), 1e-7);
}

TEST(MergeBasics, WeightsAreRespected) {
  auto d = randn_list(2, {6, 4}, 2);
  EXPECT_LT(rel_err(merge("mean", d, {3, 1}), 0.75 * d[0] + 0.25 * d[1]), 1e-6);
  EXPECT_LT(rel_err(merge("mean", d, {2, 2}), merge("mean", d)), 1e-7);
  // A zero weight removes a contribution entirely.
  for (const char* m : {"mean", "rda", "iso_c", "iso_c_fast", "tsv", "iso_cts", "ties"}) {
    at::Tensor only = merge(m, {d[0]});
    EXPECT_LT(rel_err(merge(m, d, {1, 0}), only), 1e-5) << m;
    EXPECT_GT(rel_err(merge(m, d, {1, 1}), only), 1e-2) << m;  // and a positive one does not
  }
}

TEST(MergeBasics, SignEquivariance) {
  auto d = randn_list(3, {8, 6}, 3);
  std::vector<at::Tensor> neg;
  for (auto& x : d) neg.push_back(-x);
  for (const auto& m : merger_names()) {
    at::Tensor a = merge(m, d, {1, 2, 3});
    at::Tensor b = merge(m, neg, {1, 2, 3});
    EXPECT_LT(rel_err(b, -a), 1e-5) << m;
  }
}

TEST(MergeBasics, ResultKeepsDtypeShapeAndComputesInFp64OnRequest) {
  auto d = randn_list(3, {4, 3, 2}, 4, at::kDouble);
  MergeOptions o64;
  o64.compute_dtype = at::kDouble;
  for (const auto& m : merger_names()) {
    at::Tensor r = merge(m, d, {}, o64);
    EXPECT_EQ(r.scalar_type(), at::kDouble) << m;
    EXPECT_EQ(r.sizes(), d[0].sizes()) << m;
  }
  std::vector<at::Tensor> bf;
  for (auto& x : d) bf.push_back(x.to(at::kBFloat16));
  EXPECT_EQ(merge("iso_c", bf).scalar_type(), at::kBFloat16);
  // fp64 compute tracks the fp64 mean to round-off; fp32 compute does not.
  at::Tensor exact = (d[0] + d[1] + d[2]) / 3;
  EXPECT_LT(rel_err(merge("mean", d, {}, o64), exact), 1e-14);
  std::vector<at::Tensor> d32;
  for (auto& x : d) d32.push_back(x.to(at::kFloat).to(at::kDouble));
  MergeOptions o32;
  EXPECT_GT(rel_err(make_merger("mean", o32)->merge({"t", d32, {}}), (d32[0] + d32[1] + d32[2]) / 3), 0.0);
}

TEST(MergeIsoC, FlatSpectrumWithTheInputsSingularVectors) {
  MergeOptions o;
  o.compute_dtype = at::kDouble;
  for (std::vector<int64_t> shape : {std::vector<int64_t>{9, 5}, {4, 11}}) {
    auto d = randn_list(3, shape, 5, at::kDouble);
    at::Tensor M = (d[0] + d[1] + d[2]) / 3;
    at::Tensor R = merge("iso_c", d, {}, o);
    auto [U, S, Vh] = at::linalg_svd(M, false);
    at::Tensor Sr = at::linalg_svdvals(R);
    EXPECT_LT((Sr - S.mean()).abs().max().item<double>(), 1e-10);
    // Same singular vectors: Uᵀ R V = mean(S)·I.
    at::Tensor core = at::matmul(U.t(), at::matmul(R, Vh.t()));
    EXPECT_LT(rel_err(core, S.mean() * at::eye(S.size(0), at::kDouble)), 1e-10);
  }
}

TEST(MergeIsoC, FastVariantWithinToleranceOfExact) {
  for (auto dt : {at::kFloat, at::kDouble}) {
    MergeOptions o;
    o.compute_dtype = dt;
    for (std::vector<int64_t> shape : {std::vector<int64_t>{64, 64}, {96, 32}, {20, 70}, {3, 2, 4}}) {
      auto d = randn_list(4, shape, 6, dt);
      const double err = rel_err(merge("iso_c_fast", d, {}, o), merge("iso_c", d, {}, o));
      EXPECT_LT(err, dt == at::kFloat ? 1e-3 : 1e-9) << shape.size() << " dims";
    }
  }
}

TEST(MergeIsoC, MeanIsOverTheFullThinRank) {
  // M = diag(3, 1) in a 3×2 matrix: r = 2, σ̄ = 2, result 2·[e1 e2].
  at::Tensor M = at::zeros({3, 2}, at::kDouble);
  M[0][0] = 3.0;
  M[1][1] = 1.0;
  at::Tensor want = at::zeros({3, 2}, at::kDouble);
  want[0][0] = 2.0;
  want[1][1] = 2.0;
  for (const char* m : {"iso_c", "iso_c_fast"}) EXPECT_LT(rel_err(merge(m, {M}), want), 1e-6) << m;
  // Rank-deficient diag(4, 0): the zero counts in the mean (σ̄ = 2, not 4). iso_c also gives the null
  // direction σ̄, along the SVD's completion u₂v₂ᵀ (u₂ any unit vector of span(e2, e3): not unique), so check
  // the range part and the spectrum.
  at::Tensor D = at::zeros({3, 2}, at::kDouble);
  D[0][0] = 4.0;
  at::Tensor R = merge("iso_c", {D});
  EXPECT_NEAR(R[0][0].item<double>(), 2.0, 1e-12);
  EXPECT_NEAR(R[0][1].item<double>(), 0.0, 1e-12);
  EXPECT_NEAR(R[1][0].item<double>(), 0.0, 1e-12);
  EXPECT_NEAR(R[2][0].item<double>(), 0.0, 1e-12);
  at::Tensor S = at::linalg_svdvals(R);
  EXPECT_NEAR(S[0].item<double>(), 2.0, 1e-12);
  EXPECT_NEAR(S[1].item<double>(), 2.0, 1e-12);
  // iso_c_fast: same σ̄ on the range, null direction left at zero.
  at::Tensor F = merge("iso_c_fast", {D});
  at::Tensor range = at::zeros({3, 2}, at::kDouble);
  range[0][0] = 2.0;
  EXPECT_LT(rel_err(F, range), 1e-12);
  // The option restores the thresholded variant: mean over the kept σ, null space stays null.
  MergeOptions thr;
  thr.iso_rank_threshold = 1e-6;
  at::Tensor kept = at::zeros({3, 2}, at::kDouble);
  kept[0][0] = 4.0;
  for (const char* m : {"iso_c", "iso_c_fast"}) EXPECT_LT(rel_err(merge(m, {D}, {}, thr), kept), 1e-12) << m;
}

TEST(MergeIsoC, RankDeficientAndZeroMatricesStayFinite) {
  auto a = randn_list(2, {10, 2}, 7);
  auto b = randn_list(2, {2, 8}, 8);
  std::vector<at::Tensor> d{at::matmul(a[0], b[0]), at::matmul(a[0], b[1])};  // rank ≤ 2 mean, r = 8
  at::Tensor M = (d[0] + d[1]) / 2;
  auto [U, S, Vh] = at::linalg_svd(M.to(at::kDouble), false);
  const double sbar = S.sum().item<double>() / 8;  // the papers' mean over the full thin rank
  at::Tensor Uk = U.narrow(1, 0, 2), Vk = Vh.narrow(0, 0, 2).t();
  at::Tensor range = sbar * at::matmul(Uk, Vk.t());
  at::Tensor R = merge("iso_c", d);
  ASSERT_TRUE(at::isfinite(R).all().item<bool>());
  at::Tensor Rd = R.to(at::kDouble);
  EXPECT_LT(rel_err(at::matmul(Uk, at::matmul(Uk.t(), at::matmul(Rd, at::matmul(Vk, Vk.t())))), range), 1e-5);
  at::Tensor Sr = at::linalg_svdvals(Rd);
  EXPECT_LT((Sr - sbar).abs().max().item<double>(), 1e-5 * sbar);  // all 8 directions get σ̄
  at::Tensor F = merge("iso_c_fast", d);
  ASSERT_TRUE(at::isfinite(F).all().item<bool>());
  EXPECT_LT(rel_err(F, range), 1e-5);                                // range part of iso_c, null space null
  EXPECT_NEAR(rel_err(F, R), std::sqrt(6.0 / 8.0), 1e-4);           // documented gap to iso_c
  MergeOptions thr;
  thr.iso_rank_threshold = 1e-4;
  at::Tensor kept = S.narrow(0, 0, 2).mean() * at::matmul(Uk, Vk.t());  // mean over the 2 kept
  for (const char* m : {"iso_c", "iso_c_fast"}) EXPECT_LT(rel_err(merge(m, d, {}, thr), kept), 1e-5) << m;

  std::vector<at::Tensor> zeros{at::zeros({6, 5}), at::zeros({6, 5})};
  for (const MergeOptions& o : {MergeOptions(), thr}) {
    for (const auto& m : merger_names()) {
      at::Tensor Z = merge(m, zeros, {}, o);
      EXPECT_TRUE(at::isfinite(Z).all().item<bool>()) << m;
      EXPECT_EQ(Z.abs().max().item<float>(), 0.0f) << m;
    }
  }
}

TEST(MergeIsoCts, SingleContributionIsIsoC) {
  // T = 1: k = ⌊0.8·r⌋, s = r − k; the residual's top s directions complete M's basis, every σ is M's.
  for (std::vector<int64_t> shape : {std::vector<int64_t>{12, 7}, {5, 9}}) {
    auto d = randn_list(1, shape, 11, at::kDouble);
    EXPECT_LT(rel_err(merge("iso_cts", d), merge("iso_c", d)), 1e-10);
  }
}

TEST(MergeIsoCts, CommonRankMakesTheRestDivisibleByT) {
  // r = 10, T = 4, c = 0.8: admissible k (T | r − k, k ≥ 1) are 10, 6, 2; 6 and 10 are both 2 from ⌊8⌋ and the
  // tie goes to the larger common subspace, so k = r and the result is iso_c of the mean.
  auto d = randn_list(4, {10, 10}, 12, at::kDouble);
  EXPECT_LT(rel_err(merge("iso_cts", d), merge("iso_c", d)), 1e-10);
  // c = 0.6: ⌊6⌋ is admissible, s = 1, task-specific directions enter and the result differs from iso_c.
  MergeOptions o;
  o.iso_cts_common = 0.6;
  at::Tensor R = merge("iso_cts", d, {}, o);
  EXPECT_GT(rel_err(R, merge("iso_c", d)), 1e-2);
  // Whatever k, the spectrum is flat: r copies of σ̄.
  at::Tensor S = at::linalg_svdvals(R);
  EXPECT_LT((S - S.mean()).abs().max().item<double>(), 1e-10 * S.mean().item<double>());
}

// Found by review: iso_c_fast formed XᵀX and rda summed squares in fp32 on the raw values, so at |x| ~ 1e-25 the
// Gram matrix underflowed (iso_c_fast returned a skewed, non-orthogonal factor) and at |x| ~ 1e25 a norm overflowed
// (rda returned zeros; iso_c_fast threw). Both methods are homogeneous of degree 1: the result at scale s is s
// times the result at scale 1. Reference by hand: X = [[1, 1], [0, 1], [0, 0]] has polar factor
// [[2, 1], [−1, 2], [0, 0]] / √5 and mean singular value √5 / 2, so iso_c gives [[1, .5], [−.5, 1], [0, 0]].
TEST(MergeScale, IsoCFastAndRdaAreExactAtExtremeMagnitudes) {
  const at::Tensor X = at::tensor({1.f, 1.f, 0.f, 1.f, 0.f, 0.f}).reshape({3, 2});
  const at::Tensor want = at::tensor({1.f, .5f, -.5f, 1.f, 0.f, 0.f}).reshape({3, 2});
  for (const double s : {1.0, 1e-25, 1e25}) {
    const at::Tensor got = merge("iso_c_fast", {X * s});
    EXPECT_LT(rel_err(got, want * s), 1e-5) << "scale " << s;
    const at::Tensor r = merge("rda", {X * s});  // one contribution: itself
    EXPECT_LT(rel_err(r, X * s), 1e-6) << "scale " << s;
  }
  // Bit-identical at ordinary magnitudes whatever power of two they carry (the scaling is exact).
  const auto d = randn_list(2, {16, 8}, 9);
  EXPECT_TRUE(at::equal(merge("iso_c_fast", {d[0] * 4, d[1] * 4}), merge("iso_c_fast", d) * 4));
  EXPECT_TRUE(at::equal(merge("rda", {d[0] * 4, d[1] * 4}), merge("rda", d) * 4));
}

TEST(MergeRda, NormDoesNotDependOnTForOrthogonalInputs) {
  at::Tensor Q = std::get<0>(at::linalg_qr(at::randn({32, 8}, at::TensorOptions().dtype(at::kDouble))));
  MergeOptions o;
  o.compute_dtype = at::kDouble;
  for (int T : {1, 2, 4, 8}) {
    std::vector<at::Tensor> d;
    for (int i = 0; i < T; ++i) d.push_back(3.0 * Q.select(1, i));
    EXPECT_NEAR(merge("rda", d, {}, o).norm().item<double>(), 3.0, 1e-12) << T;
    EXPECT_NEAR(merge("mean", d, {}, o).norm().item<double>(), 3.0 / std::sqrt(T), 1e-12) << T;
  }
}

TEST(MergeTies, HandCheckedExample) {
  // keep 50 %: Δ1 → [3, 0, 0, 2], Δ2 → [-2, -4, 0, 0]; elected sign of the sum [1, -4, 0, 2] = [+, −, 0, +];
  // disjoint mean: [3, −4, 0, 2].
  MergeOptions o;
  o.ties_keep = 0.5;
  at::Tensor d1 = at::tensor({3.0f, -1.0f, 0.5f, 2.0f}), d2 = at::tensor({-2.0f, -4.0f, 1.0f, 0.1f});
  EXPECT_TRUE(at::allclose(merge("ties", {d1, d2}, {}, o), at::tensor({3.0f, -4.0f, 0.0f, 2.0f})));
  // Weighted: with weights 1 and 3 the elected signs are those of [-3, -12, 0, 2]; entry 0 follows Δ2.
  EXPECT_TRUE(at::allclose(merge("ties", {d1, d2}, {1, 3}, o), at::tensor({-2.0f, -4.0f, 0.0f, 2.0f})));
}

TEST(MergeDare, DropsRescalesAndIsDeterministicPerSeed) {
  MergeOptions o;
  o.dare_drop = 0.5;
  at::Tensor x = at::full({100, 100}, 3.0f);
  auto m = make_merger("dare", o);
  at::Tensor r = m->merge({"w", {x}, {}});
  // Every entry is dropped (0) or kept and doubled (6); about half of each.
  EXPECT_EQ(((r == 0).logical_or(r == 6)).all().item<bool>(), true);
  const double kept = (r == 6).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(kept, 0.5, 0.03);
  EXPECT_NEAR(r.mean().item<double>(), 3.0, 0.2);
  EXPECT_TRUE(at::equal(r, m->merge({"w", {x}, {}})));       // same seed and name: same masks
  EXPECT_FALSE(at::equal(r, m->merge({"w2", {x}, {}})));     // another tensor: another stream
  o.seed = 1;
  EXPECT_FALSE(at::equal(r, make_merger("dare", o)->merge({"w", {x}, {}})));  // another seed
}

TEST(MergeDare, FreshMasksEveryRound) {
  // Single contribution, p = 0.1: the syncer passes the outer step as MergeInput::round.
  at::Tensor x = at::full({64, 64}, 1.0f);
  auto m = make_merger("dare");
  auto at_round = [&](uint64_t round) {
    MergeInput in{"blocks.0.w", {x}, {}};
    in.round = round;
    return m->merge(in);
  };
  at::Tensor r1 = at_round(1), r2 = at_round(2);
  EXPECT_FALSE(at::equal(r1 == 0, r2 == 0));  // different masks
  EXPECT_TRUE(at::equal(r1, at_round(1)));    // same (seed, name, round): bit-identical
  EXPECT_TRUE(at::equal(at_round(0), m->merge({"blocks.0.w", {x}, {}})));  // round defaults to 0
  // Over 50 rounds every entry is kept at least once (P(an entry is never kept) = 0.1^50).
  at::Tensor ever = at::zeros({64, 64}, at::kBool);
  for (uint64_t round = 1; round <= 50; ++round) ever.logical_or_(at_round(round) != 0);
  EXPECT_TRUE(ever.all().item<bool>());
  // The kept fraction stays ≈ 0.9 per round (the round changes the stream, not the distribution).
  EXPECT_NEAR((r2 != 0).to(at::kDouble).mean().item<double>(), 0.9, 0.02);
}

TEST(MergeErrors, BadInputNamesTheProblem) {
  auto m = make_merger("mean");
  auto expect_error = [&](const MergeInput& in, const std::string& needle) {
    try {
      m->merge(in);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const MergeError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({"blocks.0.w", {}, {}}, "blocks.0.w");
  expect_error({"blocks.0.w", {}, {}}, "empty input list");
  expect_error({"w1", {at::zeros({2, 3}), at::zeros({3, 2})}, {}}, "contribution 1 has shape");
  expect_error({"w1", {at::zeros({2}), at::full({2}, NAN)}, {}}, "contribution 1 contains NaN");
  expect_error({"w1", {at::zeros({2}), at::full({2}, INFINITY)}, {}}, "NaN or Inf");
  expect_error({"w2", {at::zeros({2}), at::zeros({2})}, {1.0}}, "1 weights given for 2 contributions");
  expect_error({"w2", {at::zeros({2}), at::zeros({2})}, {1.0, -1.0}}, "weight 1");
  expect_error({"w2", {at::zeros({2}), at::zeros({2})}, {0.0, 0.0}}, "sum to zero");
  expect_error({"w3", {at::zeros({2}, at::kLong)}, {}}, "not a floating-point");
  try {
    make_merger("average");
    ADD_FAILURE();
  } catch (const MergeError& e) {
    EXPECT_NE(std::string(e.what()).find("'average'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("iso_c_fast"), std::string::npos);  // lists the known ones
  }
  MergeOptions bad;
  bad.dare_drop = 1.0;
  EXPECT_THROW(make_merger("dare", bad), MergeError);
  bad = MergeOptions();
  bad.compute_dtype = at::kHalf;
  EXPECT_THROW(make_merger("mean", bad), MergeError);
  for (double t : {-1e-3, 1.0, double(NAN), double(INFINITY)}) {
    bad = MergeOptions();
    bad.iso_rank_threshold = t;
    try {
      make_merger("iso_c", bad);
      ADD_FAILURE() << t;
    } catch (const MergeError& e) {
      EXPECT_NE(std::string(e.what()).find("iso_rank_threshold"), std::string::npos) << e.what();
    }
  }
}

TEST(MergePlan, GlobRulesAndVectorFallback) {
  EXPECT_TRUE(glob_match("*embed*", "model.embed_tokens.weight"));
  EXPECT_TRUE(glob_match("h.?.attn*", "h.3.attn.c_proj"));
  EXPECT_FALSE(glob_match("h.?.attn*", "h.13.attn.c_proj"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("a*b", "acbd"));
  auto rules = MergePlan::parse_rules("*wte*=mean, *.bias=ties");
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_EQ(rules[1].pattern, " *.bias");  // taken literally
  EXPECT_THROW(MergePlan::parse_rules("nomethod"), MergeError);
  EXPECT_THROW(MergePlan::parse_rules("*=") , MergeError);

  MergeSelector dec(MergePlan::preset("decoupled"));
  EXPECT_STREQ(dec.select("h.0.mlp.w", 2).name(), "rda");
  EXPECT_STREQ(dec.select("wte.weight", 2).name(), "mean");
  EXPECT_STREQ(dec.select("h.0.ln_1.bias", 1).name(), "mean");  // vectors: weighted mean by default
  MergeSelector iso(MergePlan::preset("isoloco"));
  EXPECT_STREQ(iso.select("wte.weight", 2).name(), "iso_c");
  EXPECT_STREQ(iso.select("ln_f.weight", 1).name(), "mean");  // 1-D falls back
  MergePlan p;
  p.method = "iso_c";
  p.vector_method = "rda";
  p.rules = {{"*.bias", "ties"}};
  MergeSelector sel(p);
  EXPECT_STREQ(sel.select("h.0.bias", 1).name(), "ties");  // element-wise method applies to vectors
  EXPECT_STREQ(sel.select("ln.weight", 1).name(), "rda");
  p.rules = {{"*", "median"}};
  EXPECT_THROW(MergeSelector{p}, MergeError);
  EXPECT_THROW(MergePlan::preset("nope"), MergeError);
  // The merger itself also falls back on 1-D input.
  auto d = randn_list(3, {5}, 9);
  EXPECT_LT(rel_err(merge("iso_c", d), merge("mean", d)), 1e-7);
}

TEST(MergeTensors, ThreadsDoNotChangeResultsAndErrorsPropagate) {
  std::map<std::string, std::vector<at::Tensor>> model;
  for (int i = 0; i < 12; ++i)
    model["p" + std::to_string(i)] = randn_list(3, {i % 3 == 0 ? 7 : 12, 9}, 100 + i);
  model["bias"] = randn_list(3, {9}, 99);
  std::vector<std::string> names;
  for (auto& kv : model) names.push_back(kv.first);
  MergePlan plan;
  plan.method = "iso_c_fast";
  plan.rules = {{"p1*", "dare"}};
  MergeSelector sel(plan);
  auto run = [&](int threads) {
    std::mutex mu;
    std::map<std::string, at::Tensor> out;
    auto used = merge_tensors(
        sel, names, [&](const std::string& n) { return MergeInput{n, model.at(n), {}}; },
        [&](const std::string& n, const at::Tensor& t) {
          std::lock_guard<std::mutex> l(mu);
          out[n] = t;
        },
        threads);
    EXPECT_EQ(used.at("bias"), "mean");
    EXPECT_EQ(used.at("p10"), "dare");
    EXPECT_EQ(used.at("p2"), "iso_c_fast");
    return out;
  };
  auto a = run(1), b = run(4);
  ASSERT_EQ(a.size(), names.size());
  for (auto& n : names) EXPECT_TRUE(at::equal(a.at(n), b.at(n))) << n;

  model["p5"][1] = at::zeros({5, 5});
  try {
    run(3);
    ADD_FAILURE();
  } catch (const MergeError& e) {
    EXPECT_NE(std::string(e.what()).find("'p5'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deloco
