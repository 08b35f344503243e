// Merge methods against float64 references computed independently by PyTorch
// (tests/python/make_merge_fixtures.py → tests/fixtures/merge/merge_methods.safetensors).
#include <cmath>
#include <sstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/merge.h"
#include "merge/test_util.h"

namespace deloco {
namespace fixture_cases {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

MergeInput fixture_input(const TensorFile& f, const std::string& c) {
  const int T = std::stoi(f.metadata.at(c + ".T"));
  MergeInput in;
  in.name = c;
  for (int i = 0; i < T; ++i) in.deltas.push_back(f.tensors.at(c + ".delta" + std::to_string(i)));
  for (const auto& w : split(f.metadata.at(c + ".weights"))) in.weights.push_back(std::stod(w));
  return in;
}

// Every method with a unique reference on a case (<case>.methods) must match it; iso_c_fast targets iso_c.
TEST(MergeFixture, MatchesPyTorchReferences) {
  TensorFile f = load_safetensors(test::merge_fixture("merge_methods.safetensors"));
  MergeOptions opts;
  opts.compute_dtype = at::kDouble;
  int checked = 0;
  for (const auto& c : split(f.metadata.at("cases"))) {
    const MergeInput in = fixture_input(f, c);
    for (const auto& m : split(f.metadata.at(c + ".methods"))) {
      at::Tensor got = make_merger(m, opts)->merge(in);
      const at::Tensor& want = f.tensors.at(c + "." + m);
      EXPECT_LT(test::rel_err(got, want), 1e-10) << m << " on " << c;
      ++checked;
      if (m == "iso_c") {
        // The Gram route loses ~κ²·eps; 'spread' has κ = 1e5.
        EXPECT_LT(test::rel_err(make_merger("iso_c_fast", opts)->merge(in), want), c == "spread" ? 1e-5 : 1e-9)
            << "iso_c_fast on " << c;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 6 * 7 + 3);  // 6 full-rank cases × (6 methods + iso_c_fast), lowrank × 3
}

// The iso_rank_threshold option path (drop σ ≤ τ·σ_max, mean over the rest) for iso_c and iso_c_fast.
TEST(MergeFixture, IsoRankThresholdMatchesPyTorch) {
  TensorFile f = load_safetensors(test::merge_fixture("merge_methods.safetensors"));
  MergeOptions opts;
  opts.compute_dtype = at::kDouble;
  opts.iso_rank_threshold = std::stod(f.metadata.at("iso_rank_threshold"));
  for (const auto& c : split(f.metadata.at("cases"))) {
    const MergeInput in = fixture_input(f, c);
    const at::Tensor& want = f.tensors.at(c + ".iso_c@threshold");
    EXPECT_LT(test::rel_err(make_merger("iso_c", opts)->merge(in), want), 1e-10) << "iso_c on " << c;
    EXPECT_LT(test::rel_err(make_merger("iso_c_fast", opts)->merge(in), want), 1e-9) << "iso_c_fast on " << c;
  }
  // On 'spread' the option changes the result (σ over 5 decades, τ = 1e-3), so the path is really exercised.
  const MergeInput spread = fixture_input(f, "spread");
  EXPECT_GT(test::rel_err(f.tensors.at("spread.iso_c@threshold"), f.tensors.at("spread.iso_c")), 1e-2);
  EXPECT_LT(test::rel_err(make_merger("iso_c", opts)->merge(spread), f.tensors.at("spread.iso_c@threshold")),
            1e-10);
}

// A rank-deficient mean: iso_c's result is unique only on M's range (P_U R P_V = σ̄·U_k V_kᵀ with σ̄ the mean
// over all r singular values) and in its spectrum (r copies of σ̄); iso_c_fast returns exactly that range part.
TEST(MergeFixture, IsoCRankDeficientMatchesPyTorch) {
  TensorFile f = load_safetensors(test::merge_fixture("merge_methods.safetensors"));
  MergeOptions opts;
  opts.compute_dtype = at::kDouble;
  const std::string c = "lowrank";
  const MergeInput in = fixture_input(f, c);
  const at::Tensor& range = f.tensors.at(c + ".iso_c.range");
  const double sigma_bar = f.tensors.at(c + ".iso_c.sigma_bar").item<double>();
  const at::Tensor &Pu = f.tensors.at(c + ".Pu"), &Pv = f.tensors.at(c + ".Pv");
  at::Tensor R = make_merger("iso_c", opts)->merge(in);
  EXPECT_LT(test::rel_err(at::matmul(Pu, at::matmul(R, Pv)), range), 1e-10);
  at::Tensor S = at::linalg_svdvals(R);
  EXPECT_EQ(S.size(0), 20);
  EXPECT_LT((S - sigma_bar).abs().max().item<double>(), 1e-10 * sigma_bar);  // the null directions get σ̄ too
  at::Tensor F = make_merger("iso_c_fast", opts)->merge(in);
  EXPECT_LT(test::rel_err(F, range), 1e-9);  // null space left null
  EXPECT_NEAR(test::rel_err(F, R), std::sqrt(16.0 / 20.0), 1e-6);  // the documented gap: √((r − k)/r)
}
}  // namespace
}  // namespace deloco
