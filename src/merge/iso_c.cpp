// iso_c: isotropic merging. M = Σ w_i Δ_i = U S Vᵀ (thin SVD); the result keeps the singular vectors and gives
// every direction the mean singular value: mean(S)·U Vᵀ. Directions whose singular value is numerically zero
// (≤ max(m,n)·eps·σ_max) are dropped and the mean is taken over the k kept ones, so the nuclear norm of M is
// preserved and rank-deficient or all-zero matrices give finite results (zero for all-zero).
#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

class IsoC final : public Merger {
 public:
  const char* name() const override { return "iso_c"; }
  bool needs_matrix() const override { return true; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w, uint64_t) const override {
    at::Tensor M = weighted_sum(d, w);
    auto [U, S, Vh] = at::linalg_svd(M, /*full_matrices=*/false);
    const int64_t k = numerical_rank(S, M);
    if (k == 0) return at::zeros_like(M);
    at::Tensor mean_s = S.narrow(0, 0, k).mean();
    return at::matmul(U.narrow(1, 0, k), Vh.narrow(0, 0, k)).mul_(mean_s);
  }
};

}  // namespace

std::unique_ptr<Merger> make_iso_c(const MergeOptions&) { return std::make_unique<IsoC>(); }

}  // namespace deloco::merge_detail
