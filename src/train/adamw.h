// train/adamw.h — the inner optimizer: AdamW with state addressable by parameter name.
//
// Update per parameter (identical to torch.optim.AdamW with amsgrad=False):
//   p *= 1 - lr*wd (matrices and embeddings only; biases and norm gains are not decayed)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// State (m, v per parameter, and the step count t) is exported as name -> tensor so checkpoints can store it in
// safetensors and a learner can reset it per fragment. Parameters without a gradient are skipped.
// Speed: on the CPU, for contiguous float32 tensors, the whole update of one parameter (decay, both moments,
// the step, and the gradient scale of clipping) is one pass over its memory, split across intra-op threads, where
// PyTorch's eager AdamW makes about eight passes and allocates the denominator; elsewhere (CUDA, other layouts)
// the same arithmetic runs as ATen tensor operations. bench/adamw_fused.cpp measures the two side by side.
// Not thread-safe; tensors may live on any device.
#pragma once

#include <map>
#include <string>

#include "deloco/gpt/model.h"
#include "train/inner_optimizer.h"

namespace deloco {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW final : public InnerOptimizer {
 public:
  AdamW(NamedTensors params, AdamWOptions opts);
  // One update with learning rate `lr`, using grad * grad_scale as the gradient (grad_scale < 1: the clipping
  // coefficient of clip_coefficient(), applied here instead of in a separate pass over the gradients).
  void step(double lr, double grad_scale = 1.0) override;
  // Forces the ATen path even where the fused loop applies (the benchmark's and the tests' reference).
  void set_fused(bool on) { fused_ = on; }
  void zero_grad() override;
  int64_t steps() const override { return t_; }
  const char* name() const override { return "adamw"; }
  // "exp_avg/<name>", "exp_avg_sq/<name>" and "step" (a 0-d int64 tensor).
  std::map<std::string, torch::Tensor> state() const override;
  // Restores state(); throws CheckpointError naming the tensor on a missing entry or a shape mismatch.
  void load_state(const std::map<std::string, torch::Tensor>& state) override;

 private:
  NamedTensors params_;
  AdamWOptions opts_;
  // The moments are allocated by the first step() or state(), not by the constructor: a replica that only
  // evaluates (a syncer's, `deloco eval`'s) never holds them (2 × 4 bytes per parameter).
  void allocate_moments() const;
  mutable std::vector<torch::Tensor> m_, v_;
  std::vector<bool> decay_;
  int64_t t_ = 0;
  bool fused_ = true;
};

// torch.nn.utils.clip_grad_norm_'s coefficient without touching the gradients: min(1, max_norm / (‖g‖₂ + 1e-6)),
// where ‖g‖₂ is the norm over every defined gradient of `params` (one fused pass per CPU float32 tensor).
double clip_coefficient(const NamedTensors& params, double max_norm);

// Learning rate at `step` (0-based): linear warm-up over `warmup` steps to `peak`, then cosine decay to
// `min_ratio * peak` at `total` steps.
double lr_at(int64_t step, int64_t total, int64_t warmup, double peak, double min_ratio);

}  // namespace deloco
