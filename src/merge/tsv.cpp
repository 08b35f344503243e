// tsv: task-singular-vector merging. Each contribution with a positive weight keeps its top ⌊r/T⌋ (at least 1;
// T counts the contributions with positive weight) singular triplets, its
// singular values scaled by its weight; the concatenated left and right singular vectors are orthogonalised
// (polar factor, removing the interference between tasks) and recombined with the scaled singular values:
// result = U⊥ diag(w·S) V⊥ᵀ. With T = 1 and full rank this is the identity.
#include <algorithm>

#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

class Tsv final : public Merger {
 public:
  const char* name() const override { return "tsv"; }
  bool needs_matrix() const override { return true; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w, uint64_t) const override {
    const int64_t T = static_cast<int64_t>(d.size());
    const int64_t contributing = std::count_if(w.begin(), w.end(), [](double x) { return x > 0; });
    const int64_t r = std::min(d[0].size(0), d[0].size(1));
    const int64_t per_task = std::max<int64_t>(1, r / contributing);
    std::vector<at::Tensor> us, ss, vs;
    for (int64_t i = 0; i < T; ++i) {
      if (w[i] <= 0) continue;
      auto [U, S, Vh] = at::linalg_svd(d[i], false);
      const int64_t k = std::min(per_task, numerical_rank(S, d[i]));
      if (k == 0) continue;
      us.push_back(U.narrow(1, 0, k));
      ss.push_back(S.narrow(0, 0, k) * w[i]);
      vs.push_back(Vh.narrow(0, 0, k).t());
    }
    if (us.empty()) return at::zeros_like(d[0]);
    at::Tensor Uo = orthogonalize_columns(at::cat(us, 1));
    at::Tensor Vo = orthogonalize_columns(at::cat(vs, 1));
    return at::matmul(Uo * at::cat(ss, 0), Vo.t());
  }
};

}  // namespace

std::unique_ptr<Merger> make_tsv(const MergeOptions&) { return std::make_unique<Tsv>(); }

}  // namespace deloco::merge_detail
