// ties: TIES merging. (1) Trim: each contribution keeps the entries whose magnitude is among its top
// `ties_keep` fraction (all entries tied with the threshold are kept); the rest become 0. (2) Elect: the sign
// of each entry is the sign of the weighted sum of the trimmed values. (3) Disjoint mean: each entry is the
// weighted mean over the contributions whose trimmed value is non-zero and has the elected sign; 0 if none.
#include <cmath>

#include <torch/torch.h>

#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

class Ties final : public Merger {
 public:
  explicit Ties(double keep) : keep_(keep) {}
  const char* name() const override { return "ties"; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w, uint64_t) const override {
    std::vector<at::Tensor> trimmed;
    trimmed.reserve(d.size());
    for (const auto& x : d) trimmed.push_back(trim(x));
    at::Tensor sign = weighted_sum(trimmed, w).sign();
    at::Tensor num = at::zeros_like(d[0]);
    at::Tensor den = at::zeros_like(d[0]);
    for (size_t i = 0; i < d.size(); ++i) {
      at::Tensor agree = (trimmed[i].sign() == sign).logical_and_(trimmed[i] != 0).to(d[0].scalar_type());
      num.add_(trimmed[i] * agree, w[i]);
      den.add_(agree, w[i]);
    }
    return at::where(den > 0, num / den.clamp_min(1e-300), at::zeros_like(num));
  }

 private:
  at::Tensor trim(const at::Tensor& x) const {
    const int64_t n = x.numel();
    if (n == 0 || keep_ >= 1.0) return x;
    const int64_t keep = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(keep_ * static_cast<double>(n))));
    at::Tensor mag = x.abs().reshape({-1});
    at::Tensor thr = std::get<0>(mag.kthvalue(n - keep + 1));
    return x * (x.abs() >= thr).to(x.scalar_type());
  }
  double keep_;
};

}  // namespace

std::unique_ptr<Merger> make_ties(const MergeOptions& o) { return std::make_unique<Ties>(o.ties_keep); }

}  // namespace deloco::merge_detail
