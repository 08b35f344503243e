// deloco/model.h — the decoder-only transformer (GPT) every learner trains.
//
// Shapes, written once: B = batch, T = sequence length (<= block_size), C = n_embd, V = vocab_size (256 bytes),
// nh = n_head, hs = C / nh.
//   idx [B,T] int64 -> wte [B,T,C] + wpe [T,C] -> n_layer x Block -> ln_f -> head -> logits [B,T,V]
//   Block: x += attn(ln_1(x)); x += mlp(ln_2(x)); attn is causal multi-head self-attention, mlp is C->4C->C, GELU.
//
// Contract
//  * Parameter names are stable and GPT-2 style ("wte.weight", "h.0.attn.c_attn.weight", "ln_f.bias", ...);
//    they are the keys of checkpoints and of fragments. named_parameters() lists them in a fixed order.
//  * With tie_embeddings the head reuses wte.weight and no "lm_head.weight" exists.
//  * Initialisation is GPT-2's (N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer), zero biases) and
//    is fully determined by `seed`.
//  * Not thread-safe: one thread trains a model at a time. Works on any torch::Device.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

namespace deloco {

class ConfigSchema;

struct ModelConfig {
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

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t n_head_;
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

 private:
  ModelConfig cfg_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::ModuleList h_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};
TORCH_MODULE(GPT);

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// The parameters in their stable order.
NamedTensors named_parameters(torch::nn::Module& model);
// Hash of parameter names, shapes and dtypes: two models can exchange parameters iff fingerprints match.
std::string model_fingerprint(const NamedTensors& params);

}  // namespace deloco
