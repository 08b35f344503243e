// deloco/workload.h — the seam between the algorithm's drivers and a model: what the simulator and the learner and
// syncer processes need of "something that trains", and nothing more. The built-in byte-level GPT (deloco/gpt/train.h,
// Trainer) is one implementation; other models plug in by implementing this interface.
//
// Contract
//  * parameters(): named float32 tensors in a fixed order; the names and shapes never change over the workload's
//    life. The drivers bind these handles (deloco/learner.h) and update them in place between inner steps; a
//    workload must therefore never reallocate or re-create its parameter tensors.
//  * inner_step(): one optimizer step on the workload's next batch (its own data shard: which one is the
//    implementation's business, deterministically by seed and step), returns the training loss and the tokens it
//    consumed. step() counts inner steps; set_step() repositions it (schedule and data) after a restart.
//  * evaluate(): the held-out loss of the current parameters; must not change them or the training position.
//  * optimizer_state()/load_optimizer_state(): the inner optimizer's state as named CPU tensors (for learner-local
//    checkpoints); load throws CheckpointError naming the tensor on a mismatch and then changes nothing.
//  * fingerprint(): 16 hex chars identifying the parameter names, shapes and dtypes: nodes with different models
//    refuse each other.
//  * join_group(): train as one rank of a data-parallel learner group (deloco/group.h): read this rank's part of
//    each batch, average gradients across the group every step, count the group's tokens. Optional: the default
//    throws GroupError saying the workload cannot.
//  * Not thread-safe: one driver thread calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deloco {

// A model's parameters by their stable names, in a fixed order (the keys of checkpoints and fragments).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct StepResult {
  double loss = 0;      // training loss of the step (nats per token for the GPT)
  int64_t tokens = 0;   // tokens the step consumed (weights contributions: deloco/sync.h)
};

struct EvalResult {
  double loss = 0;       // mean cross-entropy, nats per token (per byte for byte-level text)
  double bpb = 0;        // bits per byte = loss / (bytes per token) / ln 2: comparable across tokenizers (NaN if the
                         // bytes behind the tokens are unknown)
  int64_t tokens = 0;    // validation tokens scored
  std::string loss_unit = "nats/token";  // how `loss` reads: "nats/byte" for byte-level text, where a token is a byte
};

// What a workload's training computes in, for records (all empty/0 when it does not say).
struct ComputePrecision {
  std::string setting;      // as configured (the GPT: train.precision, auto | fp32 | bf16)
  std::string chosen;       // what it trains in (fp32 | bf16); empty before it was decided
  double fp32_gflops = 0;   // the matmul rates it measured to decide (0: not measured)
  double bf16_gflops = 0;
};

class LearnerGroup;

class Workload {
 public:
  virtual ~Workload() = default;
  virtual std::vector<std::pair<std::string, at::Tensor>>& parameters() = 0;
  virtual StepResult inner_step() = 0;
  virtual EvalResult evaluate() = 0;
  virtual int64_t step() const = 0;
  virtual void set_step(int64_t step) = 0;
  virtual std::map<std::string, at::Tensor> optimizer_state() const = 0;
  virtual void load_optimizer_state(const std::map<std::string, at::Tensor>& state) = 0;
  virtual std::string fingerprint() const = 0;
  virtual void join_group(std::shared_ptr<LearnerGroup> group);
  // Tokens one inner step of learner `learner` of `learners` consumes on one rank (its StepResult::tokens), for the
  // workloads of the factory that made this one: a syncer bounds each learner's counters by it (learner_budget,
  // deloco/algorithm.h). 0: not known, and that check stays off (the default).
  virtual int64_t step_tokens(int64_t /*learner*/, int64_t /*learners*/) const { return 0; }
  // The training compute precision, for records (the learner's learner_done); the default says nothing.
  virtual ComputePrecision compute_precision() const { return {}; }
};

// Makes the workload of learner `learner` of `learners` (learner = 0, learners = 1: an evaluator or a single
// trainer). Every call must give the same initial parameters (the syncer and all learners start from one Θ).
using WorkloadFactory = std::function<std::unique_ptr<Workload>(int64_t learner, int64_t learners)>;

}  // namespace deloco
