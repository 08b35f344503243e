// What the Syncer's parts (sync.cpp, sync_admission.cpp, sync_merge.cpp) share and nobody else uses.
#pragma once

#include <torch/torch.h>

namespace deloco::sync_detail {

// Σ x² over a tensor in double: finite for every finite float input (3.4e38² ≈ 1.2e77), NaN/Inf for a NaN/Inf.
inline double squared_norm(const at::Tensor& t) { return t.to(torch::kDouble).pow(2).sum().item<double>(); }

}  // namespace deloco::sync_detail
