// deloco/train.h — one learner's inner loop: sample a batch from its shard, forward, backward, clip, AdamW; and the
// run configuration (model, data, train) it is made from.
//
// The Trainer owns a model replica and its optimizer and knows nothing of clocks or terminals, and of files only
// the TorchScript module it loads when built (model.kind = "torchscript", make_language_model of deloco/model.h):
// drivers decide when to evaluate and checkpoint. `deloco train` calls train_step()/evaluate(); the simulator and
// the learner nodes drive it as a Workload (deloco/workload.h), one per learner from gpt_workloads(). Everything it
// computes is a function of the config and the step counter, so a Trainer restored from a checkpoint continues
// bit-exactly where the saved one stopped (same device and thread count). Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "deloco/adamw.h"
#include "deloco/checkpoint.h"
#include "deloco/data.h"
#include "deloco/model.h"
#include "deloco/workload.h"

namespace deloco {

class ConfigSchema;
class GradientSync;

struct TrainConfig {
  int64_t steps = 3000;           // total inner steps (sets the LR schedule)
  int64_t batch_size = 16;
  double lr = 2e-3;               // peak learning rate
  double min_lr_ratio = 0.1;      // cosine decays to min_lr_ratio * lr
  int64_t warmup_steps = 100;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95;
  double grad_clip = 1.0;         // max global gradient norm (0 disables)
  int64_t eval_every = 250;       // steps between validation evaluations (0: only at the end)
  int64_t eval_tokens = 131072;   // validation tokens per evaluation
  int64_t log_every = 10;         // steps between progress records
  int64_t checkpoint_every = 1000;  // steps between checkpoints (0: only at the end)
  int64_t keep_checkpoints = 3;   // newest checkpoints kept in a run folder (0: keep all)
  int64_t seed = 1337;
  int64_t threads = 0;            // intra-op threads (0: one per core)
  int64_t learner_id = 0;         // which data shard this learner reads
  int64_t num_learners = 1;       // how many shards the training stream is cut into
  std::vector<int64_t> learner_batch_sizes;  // per learner m: its batch size (missing or 0: batch_size); learners
                                  // then differ in tokens per step, which token weighting rewards
  std::string out_dir;            // run folder ("" : runs/<config name>-<time>)
  std::string device = "cpu";     // torch device string: cpu, cuda, cuda:1, ...
  std::string precision = "fp32"; // "bf16": the training forward under bf16 autocast (CPU and CUDA); parameters,
                                  // gradients, optimizer state, the loss and every evaluation stay float32
};

struct RunConfig {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  // Binds every key of the model, data and train sections.
  void bind(ConfigSchema& schema);
  // This config for learner m of M: train.learner_id = m, train.num_learners = M, train.batch_size from
  // train.learner_batch_sizes[m] when set.
  RunConfig for_learner(int64_t m, int64_t M) const;
};

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
  // (deloco/model.h) naming model.path and the step (1-based: the step being trained), before any gradient is
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
  AdamW& optimizer() { return *opt_; }
  const RunConfig& config() const { return cfg_; }

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
  std::unique_ptr<AdamW> opt_;
  ShardSampler sampler_;
  torch::Tensor val_windows_;
  std::string fingerprint_;
  int64_t step_ = 0;
  std::shared_ptr<LearnerGroup> group_;
  std::unique_ptr<GradientSync> grad_sync_;
};

}  // namespace deloco
