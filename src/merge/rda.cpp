// rda: radial-directional averaging. Radius = weighted mean of the contributions' norms; direction = the
// normalised weighted mean of their unit directions φ(Δ) = Δ/‖Δ‖. Unlike the plain mean, the result's norm does
// not shrink as T grows when the contributions point in different directions. A zero contribution has no
// direction (it still counts in the radius); if the directions cancel exactly the result is zero.
#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

class Rda final : public Merger {
 public:
  const char* name() const override { return "rda"; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w, uint64_t) const override {
    double radius = 0;
    at::Tensor dir = at::zeros_like(d[0]);
    for (size_t i = 0; i < d.size(); ++i) {
      const double k = pow2_scale(d[i]);  // exact: no fp32 sum of squares over- or underflows
      const double n = d[i].div(k).norm().item<double>() * k;
      radius += w[i] * n;
      if (n > 0) dir.add_(d[i], w[i] / n);
    }
    const double dk = pow2_scale(dir);
    const double dn = dir.div(dk).norm().item<double>() * dk;
    if (!(dn > 0) || !(radius > 0)) return at::zeros_like(d[0]);
    return dir.mul_(radius / dn);
  }
};

}  // namespace

std::unique_ptr<Merger> make_rda(const MergeOptions&) { return std::make_unique<Rda>(); }

}  // namespace deloco::merge_detail
