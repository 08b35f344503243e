// The odd-polynomial iteration against its definition: U p(S) Vᵀ from torch's SVD (an independent routine), for
// wide, tall and square matrices and for a batch; and Muon's orthogonalisation leaving every singular value in the
// band its quintic is known for.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "linalg/newton_schulz.h"

namespace deloco::linalg {
namespace newton_schulz_cases {

// U p_K(...p_1(S)) Vᵀ by SVD.
at::Tensor by_svd(const at::Tensor& X, const std::vector<OddQuintic>& schedule) {
  auto [U, S, Vh] = torch::linalg::svd(X.to(torch::kDouble), /*full_matrices=*/false, c10::nullopt);
  at::Tensor s = S;
  for (const auto& q : schedule) s = s * q.a + s.pow(3) * q.b + s.pow(5) * q.c;
  return at::matmul(U * s.unsqueeze(-2), Vh);
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).norm().item<double>() / b.to(torch::kDouble).norm().item<double>();
}

TEST(NewtonSchulz, EachStepAppliesItsPolynomialToEverySingularValue) {
  torch::manual_seed(1);
  const std::vector<OddQuintic> schedule = {{1.5, -0.5, 0.0}, {3.4445, -4.7750, 2.0315}, {1.875, -1.25, 0.375}};
  for (const auto& shape : std::vector<std::vector<int64_t>>{{6, 10}, {10, 6}, {7, 7}, {3, 5, 9}}) {
    at::Tensor X = torch::randn(shape, torch::kDouble);
    X = X / torch::linalg::matrix_norm(X, 2, {-2, -1}, true, c10::nullopt);  // σ_max = 1
    const at::Tensor got = odd_quintic_steps(X, schedule);
    EXPECT_EQ(got.sizes(), X.sizes());
    EXPECT_LT(rel(got, by_svd(X, schedule)), 1e-10) << c10::str(X.sizes());
  }
}

TEST(NewtonSchulz, TheCallersFirstGramIsUsedForTheFirstStep) {
  torch::manual_seed(2);
  at::Tensor X = torch::randn({5, 8}, torch::kDouble) / 10;
  const at::Tensor G = at::matmul(X, X.t());
  const std::vector<OddQuintic> two = {{1.5, -0.5, 0.0}, {1.5, -0.5, 0.0}};
  EXPECT_LT(rel(odd_quintic_steps(X, two, G, at::matmul(G, G)), odd_quintic_steps(X, two)), 1e-14);
  // A wrong Gram changes the result: the argument is really read.
  EXPECT_GT(rel(odd_quintic_steps(X, two, G * 2, at::matmul(G, G) * 4), odd_quintic_steps(X, two)), 1e-3);
  EXPECT_THROW(odd_quintic_steps(X, two, G, {}), std::invalid_argument);
}

TEST(NewtonSchulz, MuonsOrthogonalisationBringsEverySingularValueNearOne) {
  torch::manual_seed(3);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    // A batch of badly scaled matrices whose singular values span a decade (below that, 5 steps of slope ≈ 3.4 at 0
    // lift a σ only ≈ 3.4⁵ ≈ 480-fold from its share of the Frobenius norm: Muon leaves such directions short).
    at::Tensor U = std::get<0>(torch::linalg::qr(torch::randn({4, 32, 32}), "reduced"));
    at::Tensor V = std::get<0>(torch::linalg::qr(torch::randn({4, 64, 32}), "reduced"));
    at::Tensor s = torch::logspace(0, -1, 32).mul(37.0);
    at::Tensor X = at::matmul(U * s, V.transpose(-2, -1));  // [4, 32, 64]
    const at::Tensor O = orthogonalise(X, 5, dtype);
    EXPECT_EQ(O.scalar_type(), X.scalar_type());
    const at::Tensor sv = torch::linalg::svdvals(O.to(torch::kDouble), c10::nullopt);
    // Jordan's quintic ends every σ of that decade in roughly [0.7, 1.2] after 5 steps (bf16 adds its round-off).
    EXPECT_GT(sv.min().item<double>(), 0.6) << dtype;
    EXPECT_LT(sv.max().item<double>(), 1.25) << dtype;
    // ... with the singular vectors of X: O's projection on them is diagonal-dominant.
    const at::Tensor proj = at::matmul(at::matmul(U.transpose(-2, -1), O.to(torch::kFloat)), V);
    const double diag = proj.diagonal(0, -2, -1).abs().sum().item<double>(), all = proj.abs().sum().item<double>();
    EXPECT_GT(diag / all, dtype == at::kFloat ? 0.999 : 0.9) << dtype;
  }
}

TEST(NewtonSchulz, FlopsCountTheThreeProductsOfEachStep) {
  EXPECT_DOUBLE_EQ(odd_quintic_flops(4, 10, 1), 4.0 * 16 * 10 + 2.0 * 64);
  EXPECT_DOUBLE_EQ(odd_quintic_flops(10, 4, 5), odd_quintic_flops(4, 10, 5));
}

}  // namespace
}  // namespace deloco::linalg
