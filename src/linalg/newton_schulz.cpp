#include "linalg/newton_schulz.h"

#include <stdexcept>

namespace deloco::linalg {

at::Tensor odd_quintic_steps(const at::Tensor& X, const std::vector<OddQuintic>& schedule, const at::Tensor& first_gram,
                             const at::Tensor& first_gram_sq) {
  if (X.dim() < 2) throw std::invalid_argument("odd_quintic_steps: X must be a matrix or a batch of matrices");
  if (first_gram.defined() != first_gram_sq.defined())
    throw std::invalid_argument("odd_quintic_steps: give both first_gram and first_gram_sq, or neither");
  const bool wide = X.size(-2) <= X.size(-1);
  at::Tensor Y = X;
  for (size_t s = 0; s < schedule.size(); ++s) {
    at::Tensor G, G2;
    if (s == 0 && first_gram.defined()) {
      G = first_gram;
      G2 = first_gram_sq;
    } else {
      G = wide ? at::matmul(Y, Y.transpose(-2, -1)) : at::matmul(Y.transpose(-2, -1), Y);
      G2 = at::matmul(G, G);
    }
    const OddQuintic& q = schedule[s];
    at::Tensor P = G2.mul(q.c).add_(G, q.b);  // aI + bG + cG²: a on every matrix's diagonal
    P.diagonal(0, -2, -1).add_(q.a);
    Y = wide ? at::matmul(P, Y) : at::matmul(Y, P);
  }
  return schedule.empty() ? X.clone() : Y;
}

std::vector<OddQuintic> muon_schedule(int steps) {
  if (steps < 1) throw std::invalid_argument("muon_schedule: steps must be ≥ 1");
  return std::vector<OddQuintic>(static_cast<size_t>(steps), OddQuintic{3.4445, -4.7750, 2.0315});
}

at::Tensor orthogonalise(const at::Tensor& X, int steps, at::ScalarType dtype) {
  const at::Tensor Xf = X.to(at::kFloat);  // the scaling in float32 whatever the iteration's dtype
  const at::Tensor norm = at::linalg_vector_norm(Xf, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true);
  const at::Tensor Y = Xf.div(norm.add(1e-7)).to(dtype);
  return odd_quintic_steps(Y, muon_schedule(steps)).to(X.scalar_type());
}

double odd_quintic_flops(int64_t m, int64_t n, int steps) {
  const double k = static_cast<double>(std::min(m, n)), l = static_cast<double>(std::max(m, n));
  return steps * (4 * k * k * l + 2 * k * k * k);
}

}  // namespace deloco::linalg
