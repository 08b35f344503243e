// iso_cts: Iso-C with common and task-specific subspaces. The top ⌊c·r⌋ left/right singular vectors of the
// merged mean M span the common subspace (c = iso_cts_common, default 0.8). The remaining rank is shared among
// the T contributions: each contributes its top ⌊(r − k_c)/T⌋ singular directions after its component in the
// common subspace has been projected out. The concatenated left and right bases are orthogonalised (polar
// factor) and every direction gets the mean singular value of M, as in iso_c. Zero-weight contributions add no
// directions and take no share of the rank. An all-zero M merges to zeros.
#include <algorithm>

#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

class IsoCts final : public Merger {
 public:
  explicit IsoCts(double common) : common_(common) {}
  const char* name() const override { return "iso_cts"; }
  bool needs_matrix() const override { return true; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w, uint64_t) const override {
    at::Tensor M = weighted_sum(d, w);
    auto [U, S, Vh] = at::linalg_svd(M, false);
    const int64_t k = numerical_rank(S, M);
    if (k == 0) return at::zeros_like(M);
    const int64_t r = std::min(M.size(0), M.size(1));
    const int64_t kc = std::clamp<int64_t>(static_cast<int64_t>(common_ * static_cast<double>(r)), 1, k);
    const int64_t T = static_cast<int64_t>(d.size());
    const int64_t contributing = std::count_if(w.begin(), w.end(), [](double x) { return x > 0; });
    const int64_t per_task = (r - kc) / contributing;
    at::Tensor Uc = U.narrow(1, 0, kc);
    std::vector<at::Tensor> us{Uc}, vs{Vh.narrow(0, 0, kc).t()};
    if (per_task > 0) {
      for (int64_t i = 0; i < T; ++i) {
        if (w[i] <= 0) continue;
        at::Tensor rest = d[i] - at::matmul(Uc, at::matmul(Uc.t(), d[i]));
        auto [Ui, Si, Vhi] = at::linalg_svd(rest, false);
        const int64_t ki = std::min(per_task, numerical_rank(Si, rest));
        if (ki == 0) continue;
        us.push_back(Ui.narrow(1, 0, ki));
        vs.push_back(Vhi.narrow(0, 0, ki).t());
      }
    }
    at::Tensor Uo = orthogonalize_columns(at::cat(us, 1));
    at::Tensor Vo = orthogonalize_columns(at::cat(vs, 1));
    return at::matmul(Uo, Vo.t()).mul_(S.narrow(0, 0, k).mean());
  }

 private:
  double common_;
};

}  // namespace

std::unique_ptr<Merger> make_iso_cts(const MergeOptions& o) { return std::make_unique<IsoCts>(o.iso_cts_common); }

}  // namespace deloco::merge_detail
