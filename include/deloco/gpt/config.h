// deloco/gpt/config.h — the configuration of the built-in GPT workload: its model ([model]), data ([data]) and
// inner training loop ([train]), gathered in RunConfig. Plain structs, no libtorch: deloco/runtime.h and
// deloco/sim.h carry a RunConfig to build the learners' workloads (gpt_workloads, deloco/gpt/train.h) and to read
// the run's length, batch sizes and evaluation settings.
//
// Contract
//  * bind() registers every key with its check on a ConfigSchema (deloco/config.h); the object must outlive the
//    schema. Values are checked by ConfigSchema::validate(), which names the key (ConfigError).
//  * RunConfig::for_learner is pure. Not thread-safe while being bound or loaded; immutable copies after.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deloco {

class ConfigSchema;

struct ModelConfig {
  // "gpt": the built-in GPT below, from the sizes here. "torchscript": a module saved by torch.jit.save (`path`),
  // whose forward(idx: int64 [B, T]) returns logits [B, T, V]; V and T come from its integer attributes
  // vocab_size / block_size when it has them, else from the keys here (make_language_model checks both).
  std::string kind = "gpt";
  std::string path;
  int64_t vocab_size = 256;
  int64_t block_size = 256;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 256;
  bool tie_embeddings = true;

  void bind(ConfigSchema& schema);
  // Number of parameters this config produces (without building the model).
  int64_t num_params() const;
  // Forward+backward FLOPs per token: 6 * (non-embedding params + head) + attention (12 * n_layer * C * T).
  double flops_per_token() const;
};

struct DataConfig {
  std::string path = "data/sotu";
  std::string format = "text";       // "text" (UTF-8, byte tokens) or "tokens" (token files)
  std::string dtype = "auto";        // tokens: "auto" (llm.c header required), "uint16" or "uint32" (raw files)
  std::string val_pattern = "*val*"; // tokens: file names (glob) that form the validation set
  double val_fraction = 0.05;
  // Which held-out tokens evaluations see: "all"; "dev", the first half of them, to tune hyper-parameters on;
  // "test", the second half, to report (scripts/science.py tunes on dev and reports test, so no reported number
  // was chosen on the data it is measured on).
  std::string holdout = "all";
  std::string tokenizer;             // SentencePiece model for `deloco sample` ("": <data.path>/tokenizer.model)
  void bind(ConfigSchema& schema);
};

struct TrainConfig {
  int64_t steps = 3000;           // total inner steps (sets the LR schedule)
  int64_t batch_size = 16;
  double lr = 2e-3;               // peak learning rate
  double min_lr_ratio = 0.1;      // cosine decays to min_lr_ratio * lr
  int64_t warmup_steps = 100;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95;
  // The inner optimizer (src/train/muon.h): "adamw", "muon" (Muon on the hidden matrices, AdamW on embeddings, head
  // and vectors), or "auto": the merge preset's (muon for merge.preset = muloco, else adamw; deloco/algorithm.h).
  std::string optimizer = "auto";
  double muon_lr = 0;             // Muon's peak learning rate (0: train.lr; the same warm-up and cosine)
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int64_t muon_ns_steps = 5;      // Newton–Schulz quintic steps per update
  std::string muon_ns_precision = "auto";  // fp32 | bf16 | auto (bf16 when train.precision trains in bf16)
  std::string muon_scale = "rms"; // rms: 0.2·√max(m,n) (AdamW's step RMS: lr and weight decay carry over) | shape
  double grad_clip = 1.0;         // max global gradient norm (0 disables)
  int64_t eval_every = 250;       // steps between validation evaluations (0: only at the end)
  int64_t eval_tokens = 131072;   // validation tokens per evaluation
  int64_t log_every = 10;         // steps between progress records
  int64_t checkpoint_every = 1000;  // steps between checkpoints (0: only at the end)
  int64_t keep_checkpoints = 3;   // newest checkpoints kept in a run folder (0: keep all)
  int64_t seed = 1337;
  int64_t threads = 0;            // intra-op threads (0: one per core)
  bool fused = false;             // the built-in GPT's fused CPU kernels (src/model/kernels.h: layer norm with the
                                  // residual add, the attention's scaled causal softmax, the loss); false: the ATen
                                  // operations they replace. Off by default: a learner diverged with them on in 2 of
                                  // 3 runs of testbed.net_slow (and in none of 2 with them off), not yet explained
  int64_t learner_id = 0;         // which data shard this learner reads
  int64_t num_learners = 1;       // how many shards the training stream is cut into
  std::vector<int64_t> learner_batch_sizes;  // per learner m: its batch size (missing or 0: batch_size); learners
                                  // then differ in tokens per step, which token weighting rewards
  std::string out_dir;            // run folder ("" : runs/<config name>-<time>)
  std::string device = "cpu";     // torch device string: cpu, cuda, cuda:1, ...
  std::string precision = "auto"; // "bf16": the training forward in bfloat16 (CPU and CUDA); parameters, gradients,
                                  // optimizer state, the loss and every evaluation stay float32. "auto": bf16 where
                                  // the device's bf16 matmuls measure faster (deloco/gpt/precision.h), else fp32
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

}  // namespace deloco
