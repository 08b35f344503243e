// iso_c_fast: the iso_c target σ̄·U Vᵀ, σ̄ = (1/r)·Σ_{i≤r} σ_i (r = min(m,n)), without an SVD.
//
// For a tall view X (m ≥ n; a wide matrix is transposed) the polar factor is O = X (XᵀX)^{-1/2}. We take the
// eigendecomposition of the small Gram matrix XᵀX = V Λ Vᵀ, form B = X V (whose columns are u_i σ_i) and use
// the column norms of B as the singular values — they are accurate where √λ_i is not (λ_i below eps·λ_max).
// Then O = B diag(1/σ_i) Vᵀ, with 1/σ_i := 0 for σ_i ≤ max(m,n)·eps·σ_max (below that the Gram method cannot
// resolve a direction). A few cubic Newton–Schulz steps O ← O(3I − OᵀO)/2 clean up the remaining loss of
// orthogonality; they keep zero directions at zero. Finally the scale is the exact identity
// σ̄ = ⟨O, X⟩_F / r (for the exact polar factor ⟨U Vᵀ, U S Vᵀ⟩_F = Σ σ_i).
//
// Rank-deficient X: the polar factor is not unique there. iso_c fills the null directions with σ̄ along the
// SVD routine's orthonormal completion; this method leaves them at zero and returns σ̄·U_k V_kᵀ on the k
// resolved directions — the same σ̄ (the dropped σ_i are ≤ the resolution limit) and the same component on
// M's range, so its relative error against iso_c is √((r − k)/r) plus round-off. A full-rank matrix whose
// smallest singular values fall below the resolution limit loses those directions the same way.
// With iso_rank_threshold = τ > 0 the cut-off is τ·σ_max and the scale is ⟨O, X⟩_F / ‖O‖²_F (the mean over
// the kept directions), i.e. iso_c's thresholded variant, which it then matches.
//
// Cost: one Gram product, one symmetric eigendecomposition of size min(m,n), two (plus two per polish step)
// matrix products — against a full SVD for iso_c. Accuracy is limited by the squared condition number of the
// Gram matrix: in fp32, directions with σ_i ≲ 3e-4·σ_max are resolved only approximately; each contributes at
// most O(1/√rank) to the relative error. Use fp64 for badly conditioned tensors (see docs/merge.md).
#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

class IsoCFast final : public Merger {
 public:
  IsoCFast(int polish, double threshold) : polish_(polish), threshold_(threshold) {}
  const char* name() const override { return "iso_c_fast"; }
  bool needs_matrix() const override { return true; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w, uint64_t) const override {
    at::Tensor M = weighted_sum(d, w);
    const bool wide = M.size(0) < M.size(1);
    // Scaled to max|x| ≈ 1 first (exact: a power of two), so XᵀX neither underflows nor overflows; the method is
    // homogeneous of degree 1, so the result is scaled back.
    const double scale = pow2_scale(M);
    at::Tensor X = (wide ? M.t() : M).div(scale);
    at::Tensor A = at::matmul(X.t(), X);
    // libtorch ≤ 1.13 sizes the fp32 eigh workspace through a float and under-allocates it once 2n² exceeds
    // 2^24 ("linalg.eigh: Argument 8 has illegal value"); solve those sizes in fp64.
    const bool widen = A.scalar_type() == at::kFloat && A.size(0) > 2800;
    at::Tensor V = std::get<1>(at::linalg_eigh(widen ? A.to(at::kDouble) : A));
    if (widen) V = V.to(at::kFloat);
    at::Tensor B = at::matmul(X, V);
    at::Tensor s = at::linalg_vector_norm(B, 2, {0}, false, c10::nullopt);
    const double smax = s.max().item<double>();
    if (!(smax > 0)) return at::zeros_like(M);
    const double cut = threshold_ > 0 ? threshold_ : rank_tolerance(X);
    at::Tensor keep = s > smax * cut;
    at::Tensor inv = at::where(keep, s.reciprocal(), at::zeros_like(s));
    at::Tensor O = at::matmul(B.mul_(inv), V.t());
    for (int i = 0; i < polish_; ++i) {
      at::Tensor G = at::matmul(O.t(), O).mul_(-0.5);
      G.diagonal().add_(1.5);
      O = at::matmul(O, G);
    }
    // The paper's mean over all r singular values, or (threshold on) the mean over the kept ones.
    const double denom = threshold_ > 0 ? O.square().sum().item<double>() : static_cast<double>(X.size(1));
    if (!(denom > 0)) return at::zeros_like(M);
    O.mul_(O.mul(X).sum().item<double>() / denom * scale);
    return wide ? O.t().contiguous() : O;
  }

 private:
  int polish_;
  double threshold_;
};

}  // namespace

std::unique_ptr<Merger> make_iso_c_fast(const MergeOptions& o) {
  return std::make_unique<IsoCFast>(o.iso_fast_polish, o.iso_rank_threshold);
}

}  // namespace deloco::merge_detail
