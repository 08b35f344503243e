// iso_c: isotropic merging (Marczak et al. 2025, "No Task Left Behind", Iso-C; IsoLoCo). M = Σ w_i Δ_i = U S Vᵀ
// (thin SVD, r = min(m,n)); the result keeps the singular vectors and flattens the spectrum to its mean:
//     σ̄ = (1/r)·Σ_{i=1..r} σ_i,   result = σ̄ · U Vᵀ   (all r thin directions, as in the papers).
// Rank-deficient M: its zero singular values count in the mean and its null directions get σ̄ along the
// orthonormal completion returned by the SVD routine (not unique; deterministic for one build). All-zero M:
// σ̄ = 0, so the result is exactly zero.
// Option iso_rank_threshold = τ > 0: singular values σ_i ≤ τ·σ_max are dropped with their directions and the
// mean is taken over the k kept ones (nuclear norm preserved, null space stays null; zero matrix → zeros).
#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

class IsoC final : public Merger {
 public:
  explicit IsoC(double threshold) : threshold_(threshold) {}
  const char* name() const override { return "iso_c"; }
  bool needs_matrix() const override { return true; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w, uint64_t) const override {
    at::Tensor M = weighted_sum(d, w);
    auto [U, S, Vh] = at::linalg_svd(M, /*full_matrices=*/false);
    if (threshold_ <= 0) return at::matmul(U, Vh).mul_(S.mean());
    const double smax = S[0].item<double>();
    const int64_t k = smax > 0 ? (S > threshold_ * smax).sum().item<int64_t>() : 0;
    if (k == 0) return at::zeros_like(M);
    return at::matmul(U.narrow(1, 0, k), Vh.narrow(0, 0, k)).mul_(S.narrow(0, 0, k).mean());
  }

 private:
  double threshold_;
};

}  // namespace

std::unique_ptr<Merger> make_iso_c(const MergeOptions& o) { return std::make_unique<IsoC>(o.iso_rank_threshold); }

}  // namespace deloco::merge_detail
