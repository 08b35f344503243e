// nesterov: exactly torch.optim.SGD(momentum=μ, nesterov=True, dampening=0):
//   b ← g on the first step, then b ← μ·b + g;   u = g + μ·b;   Θ ← Θ − η·u.
#include <torch/torch.h>

#include "outer/rules.h"

namespace deloco::outer_detail {
namespace {

class Nesterov final : public OuterOptimizer {
 public:
  using OuterOptimizer::OuterOptimizer;

 protected:
  at::Tensor update(const at::Tensor& g, Slot& slot) const override {
    at::Tensor& buf = slot.buffer;
    if (buf.defined())
      buf.mul_(opts_.momentum).add_(g);
    else
      buf = g.clone();
    return g.add(buf, opts_.momentum);
  }
};

}  // namespace

std::unique_ptr<OuterOptimizer> make_nesterov(const OuterOptions& o) { return std::make_unique<Nesterov>(o); }

}  // namespace deloco::outer_detail
