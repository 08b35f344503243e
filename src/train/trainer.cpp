#include "deloco/gpt/train.h"

#include <cmath>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/group.h"
#include "train/adamw.h"
#include "train/muon.h"

namespace deloco {
namespace {
std::string positive(int64_t v) { return v > 0 ? "" : "must be positive"; }
std::string non_negative(int64_t v) { return v >= 0 ? "" : "must not be negative"; }
// "" when `v` is one of `allowed`, else "must be a, b or c, not 'v'".
std::string one_of(const std::string& v, const std::vector<std::string>& allowed) {
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (v == allowed[i]) return "";
    list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
  }
  return "must be " + list + ", not '" + v + "'";
}
}  // namespace

void RunConfig::bind(ConfigSchema& s) {
  model.bind(s);
  data.bind(s);
  TrainConfig& t = train;
  s.bind("train.steps", &t.steps, "total inner steps", [&t] { return positive(t.steps); });
  s.bind("train.batch_size", &t.batch_size, "sequences per step", [&t] { return positive(t.batch_size); });
  s.bind("train.lr", &t.lr, "peak learning rate", [&t] { return t.lr > 0 ? "" : "must be positive"; });
  s.bind("train.min_lr_ratio", &t.min_lr_ratio, "final LR as a fraction of the peak",
         [&t] { return (t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1) ? "" : "must be in [0, 1]"; });
  s.bind("train.warmup_steps", &t.warmup_steps, "linear warm-up steps", [&t] { return non_negative(t.warmup_steps); });
  s.bind("train.weight_decay", &t.weight_decay, "AdamW weight decay (matrices and embeddings)",
         [&t] { return t.weight_decay >= 0 ? "" : "must not be negative"; });
  s.bind("train.beta1", &t.beta1, "AdamW beta1", [&t] { return (t.beta1 >= 0 && t.beta1 < 1) ? "" : "must be in [0, 1)"; });
  s.bind("train.beta2", &t.beta2, "AdamW beta2", [&t] { return (t.beta2 >= 0 && t.beta2 < 1) ? "" : "must be in [0, 1)"; });
  s.bind("train.optimizer", &t.optimizer,
         "inner optimizer: adamw | muon (Muon on hidden matrices, AdamW on embeddings, head and vectors) | auto (the "
         "merge preset's: muon for merge.preset=muloco, else adamw)",
         [&t] { return one_of(t.optimizer, {"auto", "adamw", "muon"}); });
  s.bind("train.muon_lr", &t.muon_lr, "Muon's peak learning rate (0: train.lr; same warm-up and cosine)",
         [&t] { return t.muon_lr >= 0 ? "" : "must not be negative"; });
  s.bind("train.muon_momentum", &t.muon_momentum, "Muon's momentum mu",
         [&t] { return (t.muon_momentum >= 0 && t.muon_momentum < 1) ? "" : "must be in [0, 1)"; });
  s.bind("train.muon_nesterov", &t.muon_nesterov, "Muon's Nesterov form (update = g + mu*B)");
  s.bind("train.muon_ns_steps", &t.muon_ns_steps, "Newton-Schulz quintic steps per Muon update",
         [&t] { return (t.muon_ns_steps >= 1 && t.muon_ns_steps <= 20) ? "" : "must be in [1, 20]"; });
  s.bind("train.muon_ns_precision", &t.muon_ns_precision,
         "dtype of the Newton-Schulz iteration: fp32 | bf16 | auto (bf16 when train.precision trains in bf16)",
         [&t] { return one_of(t.muon_ns_precision, {"auto", "fp32", "bf16"}); });
  s.bind("train.muon_scale", &t.muon_scale,
         "Muon's step scale: rms (0.2*sqrt(max(m,n)): AdamW's step RMS, so train.lr and weight decay carry over) | "
         "shape (sqrt(max(1, m/n)), Jordan's; use with train.muon_lr ~ 0.02)",
         [&t] { return one_of(t.muon_scale, {"rms", "shape"}); });
  s.bind("train.grad_clip", &t.grad_clip, "max gradient norm (0 disables)",
         [&t] { return t.grad_clip >= 0 ? "" : "must not be negative"; });
  s.bind("train.eval_every", &t.eval_every, "steps between evaluations (0: at the end only)",
         [&t] { return non_negative(t.eval_every); });
  s.bind("train.eval_tokens", &t.eval_tokens, "validation tokens per evaluation", [&t] { return positive(t.eval_tokens); });
  s.bind("train.log_every", &t.log_every, "steps between progress records", [&t] { return positive(t.log_every); });
  s.bind("train.checkpoint_every", &t.checkpoint_every, "steps between checkpoints (0: at the end only)",
         [&t] { return non_negative(t.checkpoint_every); });
  s.bind("train.keep_checkpoints", &t.keep_checkpoints, "checkpoints kept per run (0: all)",
         [&t] { return non_negative(t.keep_checkpoints); });
  s.bind("train.seed", &t.seed, "seed for initialisation and data order");
  s.bind("train.fused", &t.fused, "the built-in GPT's fused CPU kernels (layer norm, attention softmax, loss; opt-in, see include/deloco/gpt/config.h); false (the default): ATen's operations");
  s.bind("train.threads", &t.threads, "intra-op threads (0: one per core)", [&t] { return non_negative(t.threads); });
  s.bind("train.learner_id", &t.learner_id, "data shard of this learner", [&t] {
    return (t.learner_id >= 0 && t.learner_id < t.num_learners) ? "" : "must be in [0, train.num_learners)";
  });
  s.bind("train.num_learners", &t.num_learners, "number of data shards", [&t] { return positive(t.num_learners); });
  s.bind("train.learner_batch_sizes", &t.learner_batch_sizes, "per-learner batch sizes (0 or missing: batch_size)", [&t] {
    for (auto b : t.learner_batch_sizes)
      if (b < 0) return std::string("entries must be >= 0");
    return std::string();
  });
  s.bind("train.precision", &t.precision,
         "auto (measure fp32 and bf16 matmuls at the model's shapes at the first step, take bf16 only where faster), "
         "fp32, or bf16 (bf16 forward; float32 weights, optimizer and loss)",
         [&t] { return one_of(t.precision, {"auto", "fp32", "bf16"}); });
  s.bind("train.out_dir", &t.out_dir, "run folder (empty: runs/<config>-<time>)");
  s.bind("train.device", &t.device, "torch device: cpu, cuda, cuda:N", [&t] {
    try {
      torch::Device d(t.device);
      (void)d;
      return std::string();
    } catch (const std::exception&) {
      return "'" + t.device + "' is not a device (try cpu or cuda)";
    }
  });
}

RunConfig RunConfig::for_learner(int64_t m, int64_t M) const {
  RunConfig rc = *this;
  rc.train.learner_id = m;
  rc.train.num_learners = M;
  if (m >= 0 && m < static_cast<int64_t>(train.learner_batch_sizes.size()) && train.learner_batch_sizes[m] > 0)
    rc.train.batch_size = train.learner_batch_sizes[m];
  return rc;
}

WorkloadFactory gpt_workloads(const RunConfig& cfg, std::shared_ptr<const Corpus> corpus) {
  return [cfg, corpus](int64_t m, int64_t M) -> std::unique_ptr<Workload> {
    return std::make_unique<Trainer>(cfg, m, M, corpus);
  };
}

namespace {
// The data must fit the model's vocabulary (bytes: 256; token files: every id below V).
const RunConfig& checked_vocab(const RunConfig& cfg, const Corpus& corpus) {
  corpus.check_vocabulary(cfg.model.vocab_size);
  return cfg;
}
}  // namespace

Trainer::Trainer(const RunConfig& run, int64_t learner, int64_t learners, std::shared_ptr<const Corpus> corpus)
    : Trainer(run.for_learner(learner, learners), std::move(corpus)) {
  run_ = run;
}

// The model comes first: a TorchScript module fixes V and T (written into cfg_.model) before the data is cut.
Trainer::Trainer(const RunConfig& cfg, std::shared_ptr<const Corpus> corpus)
    : cfg_(cfg),
      run_(cfg),
      corpus_(std::move(corpus)),
      device_(cfg.train.device),
      model_(make_language_model(&cfg_.model, static_cast<uint64_t>(cfg.train.seed), device_)),
      sampler_(corpus_->train_tokens(), cfg.train.learner_id, cfg.train.num_learners,
               checked_vocab(cfg_, *corpus_).model.block_size,
               static_cast<uint64_t>(cfg.train.seed)) {
  params_ = model_->parameters();
  model_->set_fused(cfg.train.fused);
  fingerprint_ = model_fingerprint(params_);
  opt_ = make_inner_optimizer(cfg_.train, cfg_.model, params_);
  val_windows_ = evaluation_windows(corpus_->val_tokens(), cfg_.model.block_size, cfg.train.eval_tokens).to(device_);
}

double Trainer::current_lr() const {
  const auto& t = cfg_.train;
  return lr_at(step_, t.steps, t.warmup_steps, t.lr, t.min_lr_ratio);
}

namespace {
// bf16 autocast over one forward pass on `device` (CPU or CUDA), as torch.autocast does it: the previous state comes
// back afterwards and the cast cache is cleared when the outermost region ends.
class Autocast {
 public:
  Autocast(bool on, const torch::Device& device) : on_(on), cuda_(device.is_cuda()) {
    if (!on_) return;
    was_enabled_ = cuda_ ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
    was_dtype_ = cuda_ ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
    if (cuda_) {
      at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
      at::autocast::set_enabled(true);
    } else {
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
      at::autocast::set_cpu_enabled(true);
    }
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    if (cuda_) {
      at::autocast::set_enabled(was_enabled_);
      at::autocast::set_autocast_gpu_dtype(was_dtype_);
    } else {
      at::autocast::set_cpu_enabled(was_enabled_);
      at::autocast::set_autocast_cpu_dtype(was_dtype_);
    }
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_, cuda_, was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};
}  // namespace

torch::Tensor Trainer::loss_of(const torch::Tensor& idx, const torch::Tensor& targets) {
  const bool scripted = cfg_.model.kind == "torchscript";
  if (cfg_.train.precision != "bf16" && !scripted) return model_->loss(idx, targets);
  torch::Tensor logits;
  {
    Autocast bf16(cfg_.train.precision == "bf16", device_);
    try {
      logits = model_->forward(idx);
    } catch (const ModelError& e) {
      throw ModelError(e.path(), e.detail(), "at step " + std::to_string(step_ + 1));
    }
  }
  if (scripted) check_scripted_logits(logits);
  return model_->loss_of_logits(logits, targets);  // in float32, outside the autocast region (PyTorch's recipe)
}

// A user's module: non-finite logits from finite parameters are the module's doing, whatever the learning rate;
// only with parameters already non-finite is divergence (train.lr) the likely cause. Costs one reduction over the
// logits and a device sync per step, only for TorchScript models.
void Trainer::check_scripted_logits(const torch::Tensor& logits) const {
  if (torch::isfinite(logits).all().item<bool>()) return;
  const int64_t nans = torch::isnan(logits).sum().item<int64_t>(), infs = torch::isinf(logits).sum().item<int64_t>();
  const std::string what = "model.path=" + cfg_.model.path + ": the module's forward returned non-finite logits at step " +
                           std::to_string(step_ + 1) + " (" + std::to_string(nans) + " NaN and " + std::to_string(infs) +
                           " infinite of " + std::to_string(logits.numel()) + " values)";
  for (const auto& [name, p] : params_)
    if (!torch::isfinite(p).all().item<bool>())
      throw ModelError(what + "; its parameter '" + name +
                       "' is non-finite too: training diverged before this step (lower train.lr, or check what was "
                       "loaded or merged into the parameters)");
  throw ModelError(what + " although every parameter is finite: the module's own computation made them (look for "
                   "a division by zero, a log or sqrt of a negative number, an overflow); it is not the learning rate");
}

Trainer::~Trainer() = default;

int64_t Trainer::group_size() const { return group_ ? group_->size() : 1; }

void Trainer::join_group(std::shared_ptr<LearnerGroup> group) {
  grad_sync_.reset();
  group_ = std::move(group);
  if (!group_ || group_->size() == 1) return;
  std::vector<at::Tensor> tensors;  // every rank starts from rank 0's parameters, as DistributedDataParallel does
  for (auto& [name, p] : params_) tensors.push_back(p);
  group_->broadcast(tensors);
  grad_sync_ = group_->gradient_sync(params_);
}

// train.precision = auto: measured once, before the first step trained (an evaluator never pays for it).
const PrecisionChoice& Trainer::resolve_precision() {
  if (!precision_.chosen.empty()) return precision_;
  std::vector<MatmulShape> shapes;
  const int64_t rows = cfg_.train.batch_size * cfg_.model.block_size;
  if (cfg_.model.kind == "gpt") {  // the built-in GPT's products: per block qkv, projection, MLP in and out; the head
    const int64_t C = cfg_.model.n_embd;
    for (int64_t l = 0; l < cfg_.model.n_layer; ++l)
      for (const MatmulShape& s : {MatmulShape{rows, C, 3 * C}, MatmulShape{rows, C, C}, MatmulShape{rows, C, 4 * C},
                                   MatmulShape{rows, 4 * C, C}})
        shapes.push_back(s);
    shapes.push_back({rows, C, cfg_.model.vocab_size});
  } else {  // a user's module: every matrix parameter as a linear layer
    std::vector<std::array<int64_t, 2>> w;
    for (const auto& [name, p] : params_)
      if (p.dim() == 2) w.push_back({p.size(0), p.size(1)});
    shapes = forward_matmuls(w, rows);
  }
  precision_ = deloco::resolve_precision(cfg_.train.precision, shapes, device_);
  cfg_.train.precision = precision_.chosen;
  // Muon's Newton-Schulz iteration in bf16 where the forward trains in bf16 (the same measurement chose it).
  if (auto* muon = dynamic_cast<Muon*>(opt_.get()); muon && cfg_.train.muon_ns_precision == "auto")
    muon->set_ns_dtype(precision_.chosen == "bf16" ? at::kBFloat16 : at::kFloat);
  return precision_;
}

double Trainer::train_step() {
  resolve_precision();
  model_->train(true);
  const int64_t b = cfg_.train.batch_size, R = group_size();
  // A group draws the learner's batch of b × R windows and rank r trains on rows [r·b, (r + 1)·b): one rank with
  // batch b × R sees the same windows.
  auto batch = (R > 1 ? sampler_.batch(step_, b * R).narrow(0, group_->rank() * b, b) : sampler_.batch(step_, b)).to(device_);
  const int64_t T = cfg_.model.block_size;
  auto loss = loss_of(batch.narrow(1, 0, T), batch.narrow(1, 1, T));
  opt_->zero_grad();
  if (grad_sync_) grad_sync_->prepare();
  loss.backward();
  if (grad_sync_) grad_sync_->finish();
  // Clipping as torch.nn.utils.clip_grad_norm_, its coefficient folded into the optimizer's single pass.
  opt_->step(current_lr(), cfg_.train.grad_clip > 0 ? clip_coefficient(params_, cfg_.train.grad_clip) : 1.0);
  ++step_;
  return loss.item<double>();
}

StepResult Trainer::inner_step() {
  StepResult r;
  r.tokens = tokens_per_step();
  r.loss = train_step();
  return r;
}

std::map<std::string, at::Tensor> Trainer::optimizer_state() const {
  std::map<std::string, at::Tensor> out;
  for (auto& [k, v] : opt_->state()) out[k] = v.detach().to(torch::kCPU).clone();
  return out;
}

void Trainer::load_optimizer_state(const std::map<std::string, at::Tensor>& state) { opt_->load_state(state); }

EvalResult Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->train(false);
  const int64_t T = cfg_.model.block_size, N = val_windows_.size(0), B = cfg_.train.batch_size;
  double total = 0;
  for (int64_t i = 0; i < N; i += B) {
    auto w = val_windows_.narrow(0, i, std::min(B, N - i));
    // Always in float32, whatever train.precision: validation losses stay comparable across precisions.
    try {
      total += model_->loss(w.narrow(1, 0, T), w.narrow(1, 1, T)).item<double>() * static_cast<double>(w.size(0));
    } catch (const ModelError& e) {
      model_->train(true);
      throw ModelError(e.path(), e.detail(), "in evaluation after step " + std::to_string(step_));
    }
  }
  model_->train(true);
  EvalResult r;
  r.loss = total / static_cast<double>(N);
  r.bpb = r.loss / corpus_->val_bytes_per_token() / std::log(2.0);  // NaN when bytes per token is unknown
  r.tokens = N * T;
  r.loss_unit = corpus_->is_text() ? "nats/byte" : "nats/token";
  return r;
}

nlohmann::json Trainer::position() const {
  return {{"step", step_},
          {"tokens_seen", tokens_seen()},
          {"data_position", {{"step", step_}, {"learner_id", cfg_.train.learner_id}, {"num_learners", cfg_.train.num_learners}}},
          {"rng", {{"seed", cfg_.train.seed}, {"sampler", "splitmix64(seed, learner, step)"}}},
          {"model_fingerprint", fingerprint_}};
}

TensorFile Trainer::optimizer_file() const {
  TensorFile f;
  for (auto& [k, v] : opt_->state()) f.tensors[k] = v.detach().to(torch::kCPU).clone();
  return f;
}

void Trainer::restore(const Checkpoint& ck) {
  const std::string fp = ck.manifest.value("model_fingerprint", "");
  load_parameters(params_, ck.model, ck.dir + "/model.safetensors");
  if (!fp.empty() && !fingerprint_matches(ck, fp, fingerprint_, params_))
    throw CheckpointError("checkpoint '" + ck.dir + "' was written for another model (fingerprint " + fp + ", this model " + fingerprint_ + ")");
  if (!ck.optimizer.tensors.empty()) {
    try {
      opt_->load_state(ck.optimizer.tensors);
    } catch (const std::runtime_error& e) {
      throw CheckpointError("'" + ck.dir + "/optimizer.safetensors': " + e.what());
    }
  }
  step_ = ck.manifest.value("step", int64_t{0});
}

}  // namespace deloco
