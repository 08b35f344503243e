// deloco/gpt/train.h — one learner's inner loop: sample a batch from its shard, forward, backward, clip, the inner
// optimizer (train.optimizer: AdamW or Muon); and the
// run configuration (model, data, train) it is made from.
//
// The Trainer owns a model replica and its optimizer and knows nothing of clocks or terminals, and of files only
// the TorchScript module it loads when built (model.kind = "torchscript", make_language_model of deloco/gpt/model.h):
// drivers decide when to evaluate and checkpoint. `deloco train` calls train_step()/evaluate(); the simulator and
// the learner nodes drive it as a Workload (deloco/workload.h), one per learner from gpt_workloads(). Everything it
// computes is a function of the config and the step counter, so a Trainer restored from a checkpoint continues
// bit-exactly where the saved one stopped (same device and thread count). Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "deloco/checkpoint.h"
#include "deloco/gpt/config.h"
#include "deloco/gpt/data.h"
#include "deloco/gpt/model.h"
#include "deloco/gpt/precision.h"
#include "deloco/workload.h"

namespace deloco {

class InnerOptimizer;  // AdamW or Muon (src/train/inner_optimizer.h)
class GradientSync;

// The GPT workload factory (deloco/workload.h) of a run config over one corpus.
WorkloadFactory gpt_workloads(const RunConfig& cfg, std::shared_ptr<const Corpus> corpus);

// The built-in GPT as a Workload (deloco/workload.h).
class Trainer : public Workload {
 public:
  Trainer(const RunConfig& cfg, std::shared_ptr<const Corpus> corpus);
  // Learner `learner` of `learners` of the run `run` (gpt_workloads): trains on run.for_learner(learner, learners)
  // and knows the run's per-learner batch sizes (step_tokens).
  Trainer(const RunConfig& run, int64_t learner, int64_t learners, std::shared_ptr<const Corpus> corpus);
  ~Trainer() override;

  // One inner step on this learner's batch for the current step; returns its training loss. A TorchScript model
  // (model.kind = "torchscript") whose forward throws, or returns non-finite logits, ends it with a ModelError
  // (deloco/gpt/model.h) naming model.path and the step (1-based: the step being trained), before any gradient is
  // applied; the built-in GPT's non-finite loss is returned as it is (the caller judges it). evaluate() reports a
  // failing forward the same way ("in evaluation after step N").
  double train_step();
  EvalResult evaluate() override;

  // Workload
  std::vector<std::pair<std::string, at::Tensor>>& parameters() override { return params_; }
  StepResult inner_step() override;
  int64_t step() const override { return step_; }
  void set_step(int64_t step) override { step_ = step; }
  std::map<std::string, at::Tensor> optimizer_state() const override;
  void load_optimizer_state(const std::map<std::string, at::Tensor>& state) override;
  std::string fingerprint() const override { return fingerprint_; }
  // Learner m's batch of the run (RunConfig::for_learner) × the model's context length, for one rank.
  int64_t step_tokens(int64_t learner, int64_t learners) const override {
    return run_.for_learner(learner, learners).train.batch_size * cfg_.model.block_size;
  }
  // One rank of a learner group: this rank's batch_size rows of the group's batch of batch_size × ranks, gradients
  // averaged over the group (bucketed, during backward), tokens counted for the whole group. A collective: every
  // rank calls it, and all take rank 0's parameters.
  void join_group(std::shared_ptr<LearnerGroup> group) override;

  // Tokens the learner (the whole group) trained on.
  int64_t tokens_seen() const { return step_ * tokens_per_step(); }
  int64_t tokens_per_step() const { return cfg_.train.batch_size * cfg_.model.block_size * group_size(); }
  int64_t group_size() const;
  double current_lr() const;
  LanguageModel& model() { return *model_; }
  InnerOptimizer& optimizer() { return *opt_; }
  const RunConfig& config() const { return cfg_; }
  // The compute precision of the training forward: train.precision, or with "auto" what the probe chose (measured
  // once, here or at the first step; deloco/gpt/precision.h). After it, config().train.precision names the choice.
  const PrecisionChoice& resolve_precision();
  ComputePrecision compute_precision() const override {
    return {precision_.setting, precision_.chosen, precision_.fp32_gflops, precision_.bf16_gflops};
  }

  // Manifest fields describing this trainer's position (step, tokens, data position, seed, fingerprint).
  nlohmann::json position() const;
  TensorFile optimizer_file() const;
  // Restores parameters, optimizer state and step from a checkpoint written for the same model shape.
  void restore(const Checkpoint& ck);

 private:
  // Mean cross-entropy of the model on (idx, targets), in float32; under bf16 autocast when train.precision = bf16.
  torch::Tensor loss_of(const torch::Tensor& idx, const torch::Tensor& targets);
  // Throws ModelError when a TorchScript model's logits hold NaN or infinities (see train_step).
  void check_scripted_logits(const torch::Tensor& logits) const;

  RunConfig cfg_;
  RunConfig run_;  // the run cfg_ was made from (for_learner): every learner's batch size, for step_tokens()
  std::shared_ptr<const Corpus> corpus_;
  torch::Device device_;
  std::unique_ptr<LanguageModel> model_;
  NamedTensors params_;
  std::unique_ptr<InnerOptimizer> opt_;
  ShardSampler sampler_;
  torch::Tensor val_windows_;
  std::string fingerprint_;
  PrecisionChoice precision_;  // empty chosen: not resolved yet
  int64_t step_ = 0;
  std::shared_ptr<LearnerGroup> group_;
  std::unique_ptr<GradientSync> grad_sync_;
};

}  // namespace deloco
