// dare: drop and rescale. Every entry of every contribution is dropped independently with probability p
// (dare_drop) and the survivors are scaled by 1/(1−p), so each contribution is unchanged in expectation; then
// the weighted mean. The masks come from one CPU generator per tensor seeded by (seed, tensor name, round) —
// MergeInput::round is the outer step, so every outer step draws fresh masks and no entry is starved of updates
// — and are drawn contribution by contribution, so results do not depend on the device or on the thread count.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

class Dare final : public Merger {
 public:
  explicit Dare(double p) : p_(p) {}
  const char* name() const override { return "dare"; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w,
                     uint64_t seed) const override {
    if (p_ <= 0) return weighted_sum(d, w);
    at::Generator gen = at::detail::createCPUGenerator(seed);
    at::Tensor acc = at::zeros_like(d[0]);
    for (size_t i = 0; i < d.size(); ++i) {
      at::Tensor keep = at::empty(d[i].sizes(), at::TensorOptions().dtype(at::kFloat));
      keep.bernoulli_(1.0 - p_, gen);
      acc.add_(d[i] * keep.to(d[i].options()), w[i] / (1.0 - p_));
    }
    return acc;
  }

 private:
  double p_;
};

}  // namespace

std::unique_ptr<Merger> make_dare(const MergeOptions& o) { return std::make_unique<Dare>(o.dare_drop); }

}  // namespace deloco::merge_detail
