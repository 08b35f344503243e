// iso_cts: isotropic merging in common and task-specific subspaces (Marczak et al. 2025, "No Task Left Behind",
// Iso-CTS). With M = Σ w_i Δ_i, r = min(m,n), T = the number of contributions with a positive weight and
// c = iso_cts_common:
//   1. Common rank k: the k with 1 ≤ k ≤ r and (r − k) divisible by T that is closest to ⌊c·r⌋ (ties: the
//      larger k); s = (r − k)/T directions per contribution. (The paper asks for T | (r − k) so every task gets
//      the same share; the authors' code rounds (r − ⌊c·r⌋)/T to the nearest integer, which is the same rule
//      except that Python rounds exact halves to even. k ≥ 1 keeps a common subspace when T·s would use all r.)
//   2. Common subspace: M = U S Vᵀ, the top-k triplets (U_k, S_k, V_k).
//   3. Task-specific subspaces: each contribution's residual off the common left subspace,
//      R_i = w_i·(I − U_k U_kᵀ) Δ_i, contributes its top-s triplets (U_i, S_i, V_i). The residual is weighted by
//      w_i so that its singular values are on the scale of M (the paper sums unweighted task matrices:
//      M = Σ Δ_t, R_t = (I − U_k U_kᵀ) Δ_t; with uniform weights ours are exactly those divided by T).
//   4. Orthogonalise the concatenations [U_k, U_1..U_T] and [V_k, V_1..V_T] (m×r and n×r) by their polar
//      factors (P Qᵀ of a thin SVD P D Qᵀ, all r columns, as in the paper).
//   5. Scale: σ̄ = mean of the r concatenated singular values [S_k, S_1..S_T] (the paper's Iso-CTS spectrum;
//      note it is not the mean of S). Result: σ̄ · U⊥ V⊥ᵀ.
// Zero-weight contributions add no directions and take no share of the rank. With T = 1 (or s = 0) the result
// is iso_c of M. Inputs that are all zero give zeros (every singular value is 0). Degenerate inputs (a residual
// of rank < s, or concatenated bases that are linearly dependent) make the directions non-unique, as in the
// paper; the SVD routine's choice is used (deterministic for one build). iso_rank_threshold does not apply.
#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

// Step 1 above: the common rank k for rank r, T contributions and common fraction c.
int64_t common_rank(int64_t r, int64_t T, double c) {
  const int64_t target = static_cast<int64_t>(std::floor(c * static_cast<double>(r)));
  int64_t best = r;  // s = 0 is always admissible
  for (int64_t s = 1; r - s * T >= 1; ++s) {
    const int64_t k = r - s * T;
    if (std::llabs(k - target) < std::llabs(best - target)) best = k;  // strict: ties keep the larger k
  }
  return best;
}

// Polar factor P Qᵀ of A = P D Qᵀ (thin SVD), every column kept.
at::Tensor polar(const at::Tensor& A) {
  auto [P, D, Qh] = at::linalg_svd(A, /*full_matrices=*/false);
  return at::matmul(P, Qh);
}

class IsoCts final : public Merger {
 public:
  explicit IsoCts(double common) : common_(common) {}
  const char* name() const override { return "iso_cts"; }
  bool needs_matrix() const override { return true; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w, uint64_t) const override {
    at::Tensor M = weighted_sum(d, w);
    const int64_t r = std::min(M.size(0), M.size(1));
    const int64_t T = std::count_if(w.begin(), w.end(), [](double x) { return x > 0; });
    const int64_t k = common_rank(r, T, common_);
    const int64_t s = (r - k) / T;
    auto [U, S, Vh] = at::linalg_svd(M, /*full_matrices=*/false);
    at::Tensor Uk = U.narrow(1, 0, k);
    std::vector<at::Tensor> us{Uk}, ss{S.narrow(0, 0, k)}, vs{Vh.narrow(0, 0, k).t()};
    if (s > 0) {
      for (size_t i = 0; i < d.size(); ++i) {
        if (w[i] <= 0) continue;
        at::Tensor R = (d[i] - at::matmul(Uk, at::matmul(Uk.t(), d[i]))).mul_(w[i]);
        auto [Ui, Si, Vhi] = at::linalg_svd(R, /*full_matrices=*/false);
        us.push_back(Ui.narrow(1, 0, s));
        ss.push_back(Si.narrow(0, 0, s));
        vs.push_back(Vhi.narrow(0, 0, s).t());
      }
    }
    const at::Tensor sigma_bar = at::cat(ss, 0).mean();
    return at::matmul(polar(at::cat(us, 1)), polar(at::cat(vs, 1)).t()).mul_(sigma_bar);
  }

 private:
  double common_;
};

}  // namespace

std::unique_ptr<Merger> make_iso_cts(const MergeOptions& o) { return std::make_unique<IsoCts>(o.iso_cts_common); }

}  // namespace deloco::merge_detail
