// sgd: Θ ← Θ − η·g, or with momentum μ > 0 heavy-ball momentum as torch.optim.SGD(nesterov=False,
// dampening=0): b ← g on the first step, then b ← μ·b + g; Θ ← Θ − η·b.
#include <torch/torch.h>

#include "outer/rules.h"

namespace deloco::outer_detail {
namespace {

class Sgd final : public OuterOptimizer {
 public:
  using OuterOptimizer::OuterOptimizer;

 protected:
  at::Tensor update(const at::Tensor& g, Slot& slot) const override {
    if (opts_.momentum == 0) return g;
    at::Tensor& buf = slot.buffer;
    if (buf.defined())
      buf.mul_(opts_.momentum).add_(g);
    else
      buf = g.clone();
    return buf;
  }
};

}  // namespace

std::unique_ptr<OuterOptimizer> make_sgd(const OuterOptions& o) { return std::make_unique<Sgd>(o); }

}  // namespace deloco::outer_detail
