// delayed_nesterov: the momentum buffer changes once every N steps of a name, from the mean of the outer gradients
// since its previous change; in between, plain steps plus a share c of the buffered momentum (deloco/outer.h).
//   a ← a + g, n ← n + 1;   n = N: b ← μ·b + a/N, u = g + μ·b, a ← 0, n ← 0;   n < N: u = g + c·μ·b;   Θ ← Θ − η·u.
#include <torch/torch.h>

#include "outer/rules.h"

namespace deloco::outer_detail {
namespace {

class DelayedNesterov final : public OuterOptimizer {
 public:
  using OuterOptimizer::OuterOptimizer;

 protected:
  at::Tensor update(const at::Tensor& g, Slot& s) const override {
    const double mu = opts_.momentum;
    const int64_t N = opts_.delay;
    s.sum = s.sum.defined() ? s.sum.add(g) : g.clone();
    s.count += 1;
    if (s.count >= N) {
      at::Tensor mean = s.sum.div(static_cast<double>(N));
      s.buffer = s.buffer.defined() ? s.buffer.mul(mu).add_(mean) : mean;
      s.sum = at::zeros_like(g);
      s.count = 0;
      return g.add(s.buffer, mu);
    }
    if (!s.buffer.defined() || opts_.delay_momentum == 0) return g;
    return g.add(s.buffer, opts_.delay_momentum * mu);
  }
};

}  // namespace

std::unique_ptr<OuterOptimizer> make_delayed_nesterov(const OuterOptions& o) {
  return std::make_unique<DelayedNesterov>(o);
}

}  // namespace deloco::outer_detail
