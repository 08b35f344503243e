#include "deloco/gpt/model.h"

#include <cmath>
#include <sstream>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "deloco/config.h"
#include "model/kernels.h"
#include "util/fs.h"

namespace deloco {

void ModelConfig::bind(ConfigSchema& s) {
  s.bind("model.kind", &kind, "gpt (the built-in GPT) or torchscript (a module saved by torch.jit.save, model.path)",
         [this] { return kind == "gpt" || kind == "torchscript" ? "" : "must be gpt or torchscript, not '" + kind + "'"; });
  s.bind("model.path", &path, "the TorchScript file (.pt) when model.kind = torchscript", [this] {
    if (kind == "torchscript" && path.empty()) return std::string("must name the module's file when model.kind = torchscript");
    if (kind == "gpt" && !path.empty()) return std::string("is only for model.kind = torchscript");
    return std::string();
  });
  s.bind("model.vocab_size", &vocab_size, "vocabulary size (256 for byte-level tokens)",
         [this] { return vocab_size >= 2 ? "" : "must be at least 2"; });
  s.bind("model.block_size", &block_size, "context length in tokens",
         [this] { return block_size >= 1 ? "" : "must be positive"; });
  s.bind("model.n_layer", &n_layer, "transformer blocks", [this] { return n_layer >= 1 ? "" : "must be positive"; });
  s.bind("model.n_head", &n_head, "attention heads per block", [this] {
    if (n_head < 1) return std::string("must be positive");
    if (n_embd % n_head != 0) return "must divide model.n_embd (" + std::to_string(n_embd) + ")";
    return std::string();
  });
  s.bind("model.n_embd", &n_embd, "embedding width C", [this] { return n_embd >= 1 ? "" : "must be positive"; });
  s.bind("model.tie_embeddings", &tie_embeddings, "share the token embedding with the output head");
}

int64_t ModelConfig::num_params() const {
  const int64_t C = n_embd;
  int64_t per_block = 2 * (2 * C) + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C);
  int64_t total = vocab_size * C + block_size * C + n_layer * per_block + 2 * C;
  if (!tie_embeddings) total += vocab_size * C;
  return total;
}

double ModelConfig::flops_per_token() const {
  const double C = static_cast<double>(n_embd);
  double matmul_params = n_layer * 12.0 * C * C + vocab_size * C;  // block matrices + output head
  double attention = 12.0 * n_layer * C * block_size;             // QK^T and AV, forward+backward
  return 6.0 * matmul_params + attention;
}

BlockImpl::BlockImpl(const ModelConfig& cfg) : n_head_(cfg.n_head) {
  const int64_t C = cfg.n_embd;
  ln_1_ = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({C})));
  auto attn = register_module("attn", std::make_shared<torch::nn::Module>());
  c_attn_ = attn->register_module("c_attn", torch::nn::Linear(C, 3 * C));
  attn_proj_ = attn->register_module("c_proj", torch::nn::Linear(C, C));
  ln_2_ = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({C})));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  c_fc_ = mlp->register_module("c_fc", torch::nn::Linear(C, 4 * C));
  mlp_proj_ = mlp->register_module("c_proj", torch::nn::Linear(4 * C, C));
}

namespace {
// The dtype a fused layer norm writes: bf16 under CPU bf16 autocast (the copy the next linear would make), else x's.
at::ScalarType norm_output_dtype(const torch::Tensor& x) {
  if (x.device().is_cpu() && at::autocast::is_cpu_enabled() && at::autocast::get_autocast_cpu_dtype() == at::kBFloat16)
    return at::kBFloat16;
  return x.scalar_type();
}
torch::Tensor norm(torch::nn::LayerNorm& ln, const torch::Tensor& x) {
  return kernels::layer_norm(x, ln->weight, ln->bias, ln->options.eps(), norm_output_dtype(x));
}
}  // namespace

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hs = C / n_head_;
  // Causal self-attention.
  auto qkv = c_attn_->forward(fused_ ? norm(ln_1_, x) : ln_1_->forward(x)).split(C, /*dim=*/2);
  auto q = qkv[0].view({B, T, n_head_, hs}).transpose(1, 2);  // [B,nh,T,hs]
  auto k = qkv[1].view({B, T, n_head_, hs}).transpose(1, 2);
  auto v = qkv[2].view({B, T, n_head_, hs}).transpose(1, 2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  torch::Tensor att;  // [B,nh,T,T]
  if (fused_) {
    att = kernels::causal_softmax(torch::matmul(q, k.transpose(-2, -1)), scale);
  } else {
    att = torch::matmul(q, k.transpose(-2, -1)) * scale;
    auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
  }
  auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
  if (!fused_) {
    auto h = x + attn_proj_->forward(y);
    return h + mlp_proj_->forward(torch::gelu(c_fc_->forward(ln_2_->forward(h))));  // MLP
  }
  auto [h, normed] = kernels::add_layer_norm(x, attn_proj_->forward(y), ln_2_->weight, ln_2_->bias, ln_2_->options.eps(),
                                             norm_output_dtype(x));
  // MLP. ATen's GELU stays: kernels::gelu measured slower than it (bench/fused_step.cpp --kernels).
  return h + mlp_proj_->forward(torch::gelu(c_fc_->forward(normed)));
}

GPTImpl::GPTImpl(const ModelConfig& cfg, uint64_t seed) : cfg_(cfg) {
  torch::manual_seed(seed);
  const int64_t C = cfg.n_embd;
  wte_ = register_module("wte", torch::nn::Embedding(cfg.vocab_size, C));
  wpe_ = register_module("wpe", torch::nn::Embedding(cfg.block_size, C));
  h_ = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.n_layer; ++i) h_->push_back(Block(cfg));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({C})));
  if (!cfg.tie_embeddings) lm_head_ = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(C, cfg.vocab_size).bias(false)));

  // GPT-2 initialisation, in the stable parameter order so that it depends on the seed alone.
  torch::NoGradGuard no_grad;
  const double proj_std = 0.02 / std::sqrt(2.0 * cfg.n_layer);
  for (auto& [name, p] : deloco::named_parameters(*this)) {
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (name.rfind("ln_", 0) == 0 || name.find(".ln_") != std::string::npos) {
      if (is_bias) p.zero_(); else p.fill_(1.0);
    } else if (is_bias) {
      p.zero_();
    } else if (name.find("c_proj.weight") != std::string::npos) {
      p.normal_(0.0, proj_std);
    } else {
      p.normal_(0.0, 0.02);
    }
  }
}

void GPTImpl::set_fused(bool on) {
  fused_ = on;
  for (const auto& m : *h_) m->as<BlockImpl>()->set_fused(on);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= cfg_.block_size, "sequence length ", T, " exceeds model.block_size ", cfg_.block_size);
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto x = wte_->forward(idx) + wpe_->forward(pos);
  for (const auto& m : *h_) x = m->as<BlockImpl>()->forward(x);
  x = fused_ ? norm(ln_f_, x) : ln_f_->forward(x);
  return cfg_.tie_embeddings ? torch::linear(x, wte_->weight) : lm_head_->forward(x);
}

torch::Tensor GPTImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto logits = forward(idx);
  if (fused_) return kernels::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
}

NamedTensors named_parameters(torch::nn::Module& model) {
  NamedTensors out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

namespace {
std::string fingerprint_text(const NamedTensors& params) {
  std::ostringstream s;
  for (const auto& [name, t] : params) {
    s << name << ':' << c10::toString(t.scalar_type()) << ':';
    for (auto d : t.sizes()) s << d << ',';
    s << ';';
  }
  return s.str();
}
}  // namespace

std::string model_fingerprint(const NamedTensors& params) {
  const std::string text = fingerprint_text(params);
  return fnv1a64_hex(text.data(), text.size());
}

std::string model_fingerprint_short_basis(const NamedTensors& params) {
  const std::string text = fingerprint_text(params);
  return fnv1a64_short_basis_hex(text.data(), text.size());
}

}  // namespace deloco
