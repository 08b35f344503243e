// train/inner_optimizer.h — what a learner's inner optimizer offers the trainer: a step, its state by name (for
// checkpoints and a learner's rejoin), and the choice between them (train.optimizer).
//
// Contract
//  * step(lr, grad_scale): one update of every parameter that has a gradient, with the schedule's learning rate `lr`
//    (train.lr's warm-up and cosine at this step) and the gradient taken as grad * grad_scale (the clipping
//    coefficient). Not thread-safe; tensors may live on any device.
//  * state(): named tensors, every name prefixed by what it is ("exp_avg/<param>", "muon_momentum/<param>", ...) plus
//    "step"; load_state() restores exactly that and throws CheckpointError naming the first missing or misshapen
//    entry (an AdamW state given to Muon names the first "muon_momentum/" it lacks).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "deloco/gpt/model.h"

namespace deloco {

struct TrainConfig;
struct ModelConfig;

class InnerOptimizer {
 public:
  virtual ~InnerOptimizer() = default;
  virtual void step(double lr, double grad_scale = 1.0) = 0;
  virtual void zero_grad() = 0;
  virtual int64_t steps() const = 0;
  virtual std::map<std::string, torch::Tensor> state() const = 0;
  virtual void load_state(const std::map<std::string, torch::Tensor>& state) = 0;
  virtual const char* name() const = 0;
};

// train.optimizer ("adamw" or "muon"; "auto" is AdamW here: the merge preset resolves it before, deloco/algorithm.h)
// over `params`, with the train.* keys of `t`; `model` tells Muon which matrices are embeddings or the head.
std::unique_ptr<InnerOptimizer> make_inner_optimizer(const TrainConfig& t, const ModelConfig& model, NamedTensors params);

}  // namespace deloco
