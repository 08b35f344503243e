// mean: the weighted mean Σ w_i Δ_i (DiLoCo's outer gradient).
#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

class Mean final : public Merger {
 public:
  const char* name() const override { return "mean"; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w, uint64_t) const override {
    return weighted_sum(d, w);
  }
};

}  // namespace

std::unique_ptr<Merger> make_mean(const MergeOptions&) { return std::make_unique<Mean>(); }

}  // namespace deloco::merge_detail
