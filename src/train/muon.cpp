#include "train/muon.h"

#include <cmath>

#include <torch/torch.h>

#include "deloco/gpt/config.h"
#include "linalg/newton_schulz.h"

namespace deloco {
namespace {
NamedTensors pick(const NamedTensors& params, const std::vector<bool>& use, bool want) {
  NamedTensors out;
  for (size_t i = 0; i < params.size(); ++i)
    if (use[i] == want) out.push_back(params[i]);
  return out;
}
}  // namespace

bool muon_takes(const std::string& name, at::IntArrayRef sizes, int64_t vocab, bool builtin_gpt) {
  if (sizes.size() != 2) return false;
  if (builtin_gpt) {
    const std::string module = name.substr(0, name.find('.'));
    return module != "wte" && module != "wpe" && module != "lm_head";
  }
  for (const char* s : {"wte", "wpe", "emb", "head"})
    if (name.find(s) != std::string::npos) return false;
  return sizes[0] != vocab && sizes[1] != vocab;
}

Muon::Muon(NamedTensors params, const std::vector<bool>& use_muon, AdamWOptions adam, MuonOptions opts)
    : muon_(pick(params, use_muon, true)), adam_(pick(params, use_muon, false), adam), opts_(opts) {
  for (const auto& [name, p] : muon_)
    if (p.dim() != 2) throw std::invalid_argument("Muon: parameter '" + name + "' is not a matrix");
}

void Muon::allocate() const {
  if (!momentum_.empty() || muon_.empty()) return;
  for (const auto& [name, p] : muon_) momentum_.push_back(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
}

void Muon::step(double lr, double grad_scale) {
  torch::NoGradGuard no_grad;
  adam_.step(lr, grad_scale);
  allocate();
  const double eta = lr * opts_.lr_ratio;
  // The momentum update per matrix, then the orthogonalisation per shape (one batched pass each).
  std::map<std::vector<int64_t>, std::vector<size_t>> by_shape;
  std::vector<torch::Tensor> update(muon_.size());
  for (size_t i = 0; i < muon_.size(); ++i) {
    const auto& g = muon_[i].second.grad();
    if (!g.defined()) continue;
    const torch::Tensor gs = grad_scale == 1.0 ? g : g * grad_scale;
    momentum_[i].mul_(opts_.momentum).add_(gs);
    update[i] = opts_.nesterov ? gs.add(momentum_[i], opts_.momentum) : momentum_[i];
    by_shape[muon_[i].second.sizes().vec()].push_back(i);
  }
  for (const auto& [shape, idx] : by_shape) {
    std::vector<torch::Tensor> batch;
    for (size_t i : idx) batch.push_back(update[i]);
    const torch::Tensor O = linalg::orthogonalise(torch::stack(batch), opts_.ns_steps, opts_.ns_dtype);
    const double m = static_cast<double>(shape[0]), n = static_cast<double>(shape[1]);
    const double scale = opts_.rms_scale ? 0.2 * std::sqrt(std::max(m, n)) : std::sqrt(std::max(1.0, m / n));
    for (size_t k = 0; k < idx.size(); ++k) {
      torch::Tensor& p = muon_[idx[k]].second;
      if (opts_.weight_decay != 0) p.mul_(1.0 - eta * opts_.weight_decay);
      p.add_(O[static_cast<int64_t>(k)], -eta * scale);
    }
  }
}

void Muon::zero_grad() {
  adam_.zero_grad();
  for (auto& [name, p] : muon_) {
    auto& g = p.mutable_grad();
    if (g.defined()) g.zero_();
  }
}

std::map<std::string, torch::Tensor> Muon::state() const {
  allocate();
  std::map<std::string, torch::Tensor> out = adam_.state();
  for (size_t i = 0; i < muon_.size(); ++i) out["muon_momentum/" + muon_[i].first] = momentum_[i];
  return out;
}

void Muon::load_state(const std::map<std::string, torch::Tensor>& state) {
  std::vector<torch::Tensor> mom;
  for (const auto& [name, p] : muon_) {
    const std::string key = "muon_momentum/" + name;
    auto it = state.find(key);
    if (it == state.end())
      throw CheckpointError("optimizer state lacks '" + key + "' (was it written by AdamW? train.optimizer must match)");
    if (it->second.sizes() != p.sizes())
      throw CheckpointError("optimizer state '" + key + "' has shape " + c10::str(it->second.sizes()) +
                            " but the parameter has " + c10::str(p.sizes()));
    mom.push_back(it->second.to(p.device(), p.scalar_type()).contiguous().clone());
  }
  adam_.load_state(state);  // throws before anything of Muon's changes
  momentum_ = std::move(mom);
}

std::vector<std::string> Muon::muon_names() const {
  std::vector<std::string> out;
  for (const auto& [name, p] : muon_) out.push_back(name);
  return out;
}

std::unique_ptr<InnerOptimizer> make_inner_optimizer(const TrainConfig& t, const ModelConfig& model, NamedTensors params) {
  AdamWOptions a;
  a.beta1 = t.beta1;
  a.beta2 = t.beta2;
  a.weight_decay = t.weight_decay;
  if (t.optimizer != "muon") return std::make_unique<AdamW>(std::move(params), a);
  MuonOptions o;
  o.lr_ratio = t.muon_lr > 0 ? t.muon_lr / t.lr : 1.0;
  o.momentum = t.muon_momentum;
  o.nesterov = t.muon_nesterov;
  o.ns_steps = static_cast<int>(t.muon_ns_steps);
  o.ns_dtype = t.muon_ns_precision == "bf16" ? at::kBFloat16 : at::kFloat;
  o.rms_scale = t.muon_scale != "shape";
  o.weight_decay = t.weight_decay;
  std::vector<bool> use;
  for (const auto& [name, p] : params) use.push_back(muon_takes(name, p.sizes(), model.vocab_size, model.kind == "gpt"));
  return std::make_unique<Muon>(std::move(params), use, a, o);
}

}  // namespace deloco
