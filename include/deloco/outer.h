// deloco/outer.h — outer optimizers applied by the syncer to the merged outer gradient (README: Algorithm options).
//
// Contract
//  * step(name, param, grad) updates `param` in place with the merged outer gradient `grad` (same shape; any
//    floating dtype/device; the arithmetic runs in param's dtype on param's device). Semantics are exactly
//    torch.optim.SGD(lr=η, momentum=μ, dampening=0, nesterov=…, weight_decay=0):
//        b ← g on the first step of `name`, else b ← μ·b + g;   u = g + μ·b (nesterov) or u = b;   Θ ← Θ − η·u
//    and with μ = 0 simply Θ ← Θ − η·g (no state).
//  * delayed_nesterov (Delayed Nesterov, Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling",
//    their Algorithm "delayed Nesterov momentum update"): the momentum buffer changes only once every N = `delay`
//    steps of a name, from the mean of the outer gradients since its last change, and each step applies 1/N of its
//    outer gradient, so that a cycle of N steps moves Θ as one Nesterov step on the cycle's mean gradient would.
//    c = `delay_momentum` in [0, 1/N] spreads part of the momentum over the steps in between. With a = the sum of
//    the gradients since the last change and n their count (both 0 at the start and after each change), per step:
//        a ← a + g, n ← n + 1;
//        n = N:  b ← μ·b + a/N (b = 0 before the first),  u = g/N + (1 − c·N + c)·μ·b,  a ← 0, n ← 0;
//        n < N:  u = g/N + c·μ·b;
//        Θ ← Θ − η·u.
//    N = 1 is exactly "nesterov". Stale outer gradients (asynchronous merges) then feed the momentum N times less
//    often, which keeps the loop of docs/sim.md ("Stability of the global anchor") from compounding.
//  * delayed_nesterov_whole: deloco's earlier reading of the same paper, kept as a named variant: the buffer changes
//    as above, but every step applies its whole outer gradient, u = g + c·μ·b (n < N) or g + μ·b (n = N), with c in
//    [0, 1]. Over a cycle it moves N times as far along the gradients as delayed_nesterov at the same η.
//  * State is one momentum buffer per parameter name, exported by state() as a map
//    "<name>.momentum_buffer" → tensor (ready to be stored in a safetensors file) and restored by load_state();
//    the delayed kinds add "<name>.delay_sum" (a) and "<name>.delay_count" (n, a one-element float64 tensor).
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
  std::string kind = "nesterov";  // "sgd" (plain or heavy-ball momentum), "nesterov", "delayed_nesterov" or
                                  // "delayed_nesterov_whole"
  double lr = 0.7;                // η
  double momentum = 0.9;          // μ (ignored by "sgd" when 0)
  int64_t delay = 4;              // N of delayed_nesterov (≥ 1; other kinds ignore it)
  double delay_momentum = 0.0;    // c of the delayed kinds: the share of μ·b each step between changes applies
                                  // (delayed_nesterov: in [0, 1/N]; delayed_nesterov_whole: in [0, 1])
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
  // All the state of one name (the momentum buffer and delayed_nesterov's sum and count), as handles that step()
  // never changes in place: slot(name) before a step and set_slot(name, it) after restore it exactly.
  struct Slot {
    at::Tensor buffer, sum;  // undefined: none yet
    int64_t count = 0;
  };
  Slot slot(const std::string& name) const;
  void set_slot(const std::string& name, const Slot& slot);

  // The rule as three numbers, for a caller that applies it element by element itself (the syncer's fused merge,
  // src/sync/fused_merge.cpp), with the semantics above: momentum == false: Θ ← Θ − η·g (no state); else
  // b ← μ·b + g (b = 0 before the first step, which gives b = g), u = g + μ·b when nesterov, else u = b, Θ ← Θ − η·u.
  struct Rule {
    bool momentum = false, nesterov = false;
    bool delayed = false;  // delayed_nesterov: not three numbers; such a caller must use step()
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
  // The rule proper: slot.buffer is the momentum buffer (undefined on the first step; set it when momentum is
  // used), slot.sum and slot.count delayed_nesterov's. The slot is the rule's own copy: it may change it in place.
  virtual at::Tensor update(const at::Tensor& grad, Slot& slot) const = 0;
  OuterOptions opts_;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Slot> slots_;
};

std::unique_ptr<OuterOptimizer> make_outer_optimizer(const OuterOptions& opts);

// Named recipes: "diloco" = mean merge + Nesterov(η 0.7, μ 0.9); "isoloco" = iso_c + Nesterov(η 1.8, μ 0.8).
struct OuterPreset {
  std::string merge_method;
  OuterOptions outer;
};
OuterPreset outer_preset(const std::string& name);  // throws OuterError for an unknown name

}  // namespace deloco
