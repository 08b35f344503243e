// deloco/gpt/model.h — the models a learner trains: the built-in decoder-only transformer (GPT), the LanguageModel the
// trainer sees (the GPT or a user's TorchScript module, make_language_model), and text generation from either.
//
// Shapes of the GPT, written once: B = batch, T = sequence length (<= block_size), C = n_embd, V = vocab_size
// (256 for byte-level text; a tokenizer's vocabulary for tokenized data), nh = n_head, hs = C / nh.
//   idx [B,T] int64 -> wte [B,T,C] + wpe [T,C] -> n_layer x Block -> ln_f -> head -> logits [B,T,V]
//   Block: x += attn(ln_1(x)); x += mlp(ln_2(x)); attn is causal multi-head self-attention, mlp is C->4C->C, GELU.
//
// Contract (the GPT)
//  * Parameter names are stable and GPT-2 style ("wte.weight", "h.0.attn.c_attn.weight", "ln_f.bias", ...);
//    they are the keys of checkpoints and of fragments. named_parameters() lists them in a fixed order.
//  * With tie_embeddings the head reuses wte.weight and no "lm_head.weight" exists.
//  * Initialisation is GPT-2's (N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer), zero biases) and
//    is fully determined by `seed`.
//  * Not thread-safe: one thread trains a model at a time. Works on any torch::Device.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "deloco/error.h"
#include "deloco/gpt/config.h"
#include "deloco/workload.h"  // NamedTensors

namespace deloco {

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);
  void set_fused(bool on) { fused_ = on; }

 private:
  int64_t n_head_;
  bool fused_ = true;
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  torch::nn::Linear c_attn_{nullptr}, attn_proj_{nullptr}, c_fc_{nullptr}, mlp_proj_{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  GPTImpl(const ModelConfig& cfg, uint64_t seed);
  // idx [B,T] int64 on the model's device -> logits [B,T,V].
  torch::Tensor forward(const torch::Tensor& idx);
  // Mean cross-entropy (nats per token) of next-token prediction.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  const ModelConfig& config() const { return cfg_; }
  // true (the default): the layer norms (with the residual add before ln_2), the attention's scaled causal
  // softmax and the loss run as fused kernels
  // (src/model/kernels.h); false: as the ATen compositions they replace (train.fused).
  void set_fused(bool on);
  bool fused() const { return fused_; }

 private:
  ModelConfig cfg_;
  bool fused_ = true;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::ModuleList h_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};
TORCH_MODULE(GPT);


// The parameters in their stable order.
NamedTensors named_parameters(torch::nn::Module& model);
// Hash of parameter names, shapes and dtypes: two models can exchange parameters iff fingerprints match.
std::string model_fingerprint(const NamedTensors& params);
// The same over FNV-1a's short basis (util/hash.h): the fingerprints deloco recorded before commit c2749d1, only
// to recognise checkpoints of that time (fingerprint_matches of deloco/checkpoint.h).
std::string model_fingerprint_short_basis(const NamedTensors& params);

// ---- Any causal language model (src/model/language_model.cpp) ---------------------------------------------
// What the trainer (deloco/gpt/train.h) trains: the built-in GPT or a user's TorchScript module.
//  * parameters(): named float32 tensors, fixed order and names (the module's own for TorchScript), handles that
//    stay valid for the model's life (updated in place by the optimizer and the drivers).
//  * forward(idx [B,T] int64 on the model's device) -> logits [B,T,V]; loss(): mean cross-entropy in float32.
//  * train(false) switches dropout-like behaviour off for evaluation and sampling.
class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual torch::Tensor forward(const torch::Tensor& idx) = 0;
  virtual torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  virtual std::vector<std::pair<std::string, torch::Tensor>>& parameters() = 0;
  virtual void train(bool on) = 0;
  virtual bool training() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t block_size() const = 0;
  // The built-in GPT's fused kernels on or off (train.fused; GPT::set_fused); other models ignore it.
  virtual void set_fused(bool /*on*/) {}
  // Mean cross-entropy of logits [B,T,V] from forward() against targets [B,T], in float32: next_token_loss, or
  // the GPT's fused kernel when it is on.
  virtual torch::Tensor loss_of_logits(const torch::Tensor& logits, const torch::Tensor& targets);
};
// Mean next-token cross-entropy of logits [B,T,V] (any float dtype) against targets [B,T], computed in float32.
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets);
// Builds the model `cfg` describes on `device` (GPT: initialised from `seed`; TorchScript: loaded from cfg.path,
// the same parameters every time). For TorchScript it first checks the module and refuses, with a ConfigError
// saying what was expected and what was found: a file that is not a TorchScript module, a forward that does not
// take one tensor and return one, logits not [B, T, V] for int64 ids [B, T], parameters that are not float32, no
// parameters. It then writes the V and T it uses into *cfg.
std::unique_ptr<LanguageModel> make_language_model(ModelConfig* cfg, uint64_t seed, const torch::Device& device);

// The message of an exception a TorchScript module threw, for a person: the error's own lines (e.g. "RuntimeError:
// shape '[2, 16, 300]' is invalid for input of size 19200"), then where in the module's source it happened when the
// TorchScript traceback says so ("(File "model.py", line 7, in forward: <that line>)"); no C++ stack frames (a
// c10::Error's backtrace, TORCH_SHOW_CPP_STACKTRACES output) and no serialized-code listing. At most 5 lines.
std::string script_error_text(const std::exception& e);

// ---- Text generation (src/model/sample.cpp) ----------------------------------------------------------------
struct SampleOptions {
  int64_t tokens = 300;       // tokens to generate (bytes for byte-level models)
  double temperature = 0.8;   // softmax temperature; 0: greedy (argmax)
  int64_t top_k = 40;         // sample among the k most likely tokens (0 or >= vocab: all)
  int64_t seed = 0;           // torch::manual_seed before the first draw
};
// Continues the token ids `prompt` (not empty) with opts.tokens ids drawn from [0, num_ids) (a model's vocabulary
// may be padded beyond its tokenizer's), feeding the model at most block_size ids of context, and returns the
// generated ids only. Puts the model in eval mode, runs without gradients on the device of its parameters, and
// reseeds libtorch's global generator with opts.seed, so a given model, prompt and options always give the same
// ids on one device.
std::vector<int64_t> sample_tokens(LanguageModel& model, std::vector<int64_t> prompt, int64_t num_ids, const SampleOptions& opts);
// Byte-level: continues `prompt` (bytes; an empty prompt counts as "\n") with opts.tokens bytes (ids 0..255).
std::string sample_text(LanguageModel& model, const std::string& prompt, const SampleOptions& opts);

}  // namespace deloco
