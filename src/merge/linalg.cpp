// Shared helpers for the merge methods: weighted sums, numerical rank, column orthogonalisation.
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {

at::Tensor weighted_sum(const std::vector<at::Tensor>& xs, const std::vector<double>& w) {
  at::Tensor acc = xs[0] * w[0];
  for (size_t i = 1; i < xs.size(); ++i) acc.add_(xs[i], w[i]);
  return acc;
}

double pow2_scale(const at::Tensor& x) {
  if (x.numel() == 0) return 1.0;
  const double amax = x.abs().max().item<double>();
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0;
  return std::ldexp(1.0, std::ilogb(amax));
}

double rank_tolerance(const at::Tensor& matrix) {
  const double eps = matrix.scalar_type() == at::kDouble ? std::numeric_limits<double>::epsilon()
                                                         : std::numeric_limits<float>::epsilon();
  return static_cast<double>(std::max(matrix.size(0), matrix.size(1))) * eps;
}

int64_t numerical_rank(const at::Tensor& S, const at::Tensor& matrix) {
  if (S.numel() == 0) return 0;
  const double smax = S[0].item<double>();
  if (!(smax > 0)) return 0;
  return (S > smax * rank_tolerance(matrix)).sum().item<int64_t>();
}

at::Tensor orthogonalize_columns(const at::Tensor& A) {
  auto [P, D, Qh] = at::linalg_svd(A, /*full_matrices=*/false);
  const int64_t k = numerical_rank(D, A);
  if (k == 0) return at::zeros_like(A);
  return at::matmul(P.narrow(1, 0, k), Qh.narrow(0, 0, k));
}

}  // namespace deloco::merge_detail
