// Delayed Nesterov in its two forms (deloco/outer.h). Both change the momentum buffer once every N steps of a name,
// from the mean of the outer gradients since its previous change (a ← a + g, n ← n + 1; at n = N: b ← μ·b + a/N,
// a ← 0, n ← 0). What a step applies:
//   delayed_nesterov (Liu et al. 2024):  u = g/N + c·μ·b for n < N,  u = g/N + (1 − c·N + c)·μ·b at n = N;
//     c in [0, 1/N]: over a cycle of N steps the gradients add to their mean and the momentum to one μ·b.
//   delayed_nesterov_whole (deloco's earlier reading): u = g + c·μ·b for n < N,  u = g + μ·b at n = N;  c in [0, 1].
// Then Θ ← Θ − η·u. With N = 1 both are exactly "nesterov".
#include <torch/torch.h>

#include "outer/rules.h"

namespace deloco::outer_detail {
namespace {

class DelayedNesterov final : public OuterOptimizer {
 public:
  DelayedNesterov(const OuterOptions& o, bool whole) : OuterOptimizer(o), whole_(whole) {}

 protected:
  at::Tensor update(const at::Tensor& g, Slot& s) const override {
    const double mu = opts_.momentum, c = opts_.delay_momentum;
    const int64_t N = opts_.delay;
    const double share = whole_ ? 1.0 : 1.0 / static_cast<double>(N);  // of g applied by each step
    s.sum = s.sum.defined() ? s.sum.add(g) : g.clone();
    s.count += 1;
    if (s.count >= N) {
      // The mean of the gradients summed (count is N, or more after a resume with a smaller outer.delay).
      at::Tensor mean = s.sum.div(static_cast<double>(s.count));
      s.buffer = s.buffer.defined() ? s.buffer.mul(mu).add_(mean) : mean;
      s.sum = at::zeros_like(g);
      s.count = 0;
      const double rest = whole_ ? 1.0 : 1.0 - c * static_cast<double>(N) + c;  // the cycle's momentum not yet applied
      return g.mul(share).add_(s.buffer, rest * mu);
    }
    at::Tensor u = g.mul(share);
    if (!s.buffer.defined() || c == 0) return u;
    return u.add_(s.buffer, c * mu);
  }

 private:
  bool whole_;
};

}  // namespace

std::unique_ptr<OuterOptimizer> make_delayed_nesterov(const OuterOptions& o) {
  return std::make_unique<DelayedNesterov>(o, o.kind == "delayed_nesterov_whole");
}

}  // namespace deloco::outer_detail
