// deloco/outer.h — outer optimizers applied by the syncer to the merged outer gradient (README: Algorithm options).
//
// Contract
//  * step(name, param, grad) updates `param` in place with the merged outer gradient `grad` (same shape; any
//    floating dtype/device; the arithmetic runs in param's dtype on param's device). Semantics are exactly
//    torch.optim.SGD(lr=η, momentum=μ, dampening=0, nesterov=…, weight_decay=0):
//        b ← g on the first step of `name`, else b ← μ·b + g;   u = g + μ·b (nesterov) or u = b;   Θ ← Θ − η·u
//    and with μ = 0 simply Θ ← Θ − η·g (no state).
//  * State is one momentum buffer per parameter name, exported by state() as a map
//    "<name>.momentum_buffer" → tensor (ready to be stored in a safetensors file) and restored by load_state().
//    load_state() checks every key and throws OuterError for an unknown key.
//  * Errors (shape mismatch, a non-finite gradient, bad options, unknown kind or preset) throw OuterError
//    naming the parameter or option; a failed step leaves param and state untouched.
//  * Thread safety: step() may run concurrently for different names; the same name must not be stepped from
//    two threads at once. state()/load_state() must not run concurrently with step().
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>

#include "deloco/error.h"

namespace deloco {

struct OuterOptions {
  std::string kind = "nesterov";  // "sgd" (plain or heavy-ball momentum) or "nesterov"
  double lr = 0.7;                // η
  double momentum = 0.9;          // μ (ignored by "sgd" when 0)
  void validate() const;          // throws OuterError
};

class OuterOptimizer {
 public:
  explicit OuterOptimizer(OuterOptions opts);
  virtual ~OuterOptimizer() = default;
  const OuterOptions& options() const { return opts_; }

  void step(const std::string& name, at::Tensor& param, const at::Tensor& grad);

  std::map<std::string, at::Tensor> state() const;
  void load_state(const std::map<std::string, at::Tensor>& state);
  // The momentum buffer of one parameter (undefined when it has none yet), without a copy: step() never changes a
  // buffer in place (it installs a new tensor), so the handle stays a snapshot and set_buffer(name, handle) puts
  // the state back exactly (undefined: removes it). For callers that roll back a failed step (deloco/sync.h).
  at::Tensor buffer(const std::string& name) const;
  void set_buffer(const std::string& name, const at::Tensor& buffer);

  // The rule as three numbers, for a caller that applies it element by element itself (the syncer's fused merge,
  // src/sync/fused_merge.cpp), with the semantics above: momentum == false: Θ ← Θ − η·g (no state); else
  // b ← μ·b + g (b = 0 before the first step, which gives b = g), u = g + μ·b when nesterov, else u = b, Θ ← Θ − η·u.
  struct Rule {
    bool momentum = false, nesterov = false;
    double lr = 0, mu = 0;
  };
  Rule rule() const;
  // For such a caller: the momentum buffer of `name` as a contiguous float32 tensor shaped like `like` on its
  // device, for updating in place — created as zeros on the first step. Unlike step(), such an update changes the
  // buffer in place: a handle from buffer() taken before it sees the change (the caller owns rollback; deloco/sync.h
  // only updates in place what it has proven cannot fail). Throws OuterError when the rule keeps no momentum or the
  // buffer held has another shape or dtype.
  at::Tensor buffer_for_update(const std::string& name, const at::Tensor& like);

 protected:
  // The rule proper: buffer is the momentum buffer (undefined on the first step; set it when momentum is used).
  virtual at::Tensor update(const at::Tensor& grad, at::Tensor& buffer) const = 0;
  OuterOptions opts_;

 private:
  mutable std::mutex mu_;
  std::map<std::string, at::Tensor> buffers_;
};

std::unique_ptr<OuterOptimizer> make_outer_optimizer(const OuterOptions& opts);

// Named recipes: "diloco" = mean merge + Nesterov(η 0.7, μ 0.9); "isoloco" = iso_c + Nesterov(η 1.8, μ 0.8).
struct OuterPreset {
  std::string merge_method;
  OuterOptions outer;
};
OuterPreset outer_preset(const std::string& name);  // throws OuterError for an unknown name

}  // namespace deloco
