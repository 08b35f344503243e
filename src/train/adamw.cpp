#include "deloco/adamw.h"

#include <cmath>

#include <torch/torch.h>

namespace deloco {

AdamW::AdamW(NamedTensors params, AdamWOptions opts) : params_(std::move(params)), opts_(opts) {
  for (const auto& [name, p] : params_) {
    m_.push_back(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    v_.push_back(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    decay_.push_back(p.dim() >= 2);
  }
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++t_;
  const double bc1 = 1.0 - std::pow(opts_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(opts_.beta2, static_cast<double>(t_));
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    const auto& g = p.grad();
    if (!g.defined()) continue;
    if (decay_[i] && opts_.weight_decay != 0) p.mul_(1.0 - lr * opts_.weight_decay);
    m_[i].mul_(opts_.beta1).add_(g, 1.0 - opts_.beta1);
    v_[i].mul_(opts_.beta2).addcmul_(g, g, 1.0 - opts_.beta2);
    auto denom = (v_[i].sqrt() / bc2_sqrt).add_(opts_.eps);
    p.addcdiv_(m_[i], denom, -step_size);
  }
}

void AdamW::zero_grad() {
  for (auto& [name, p] : params_) {
    auto& g = p.mutable_grad();
    if (g.defined()) g.zero_();
  }
}

std::map<std::string, torch::Tensor> AdamW::state() const {
  std::map<std::string, torch::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out["exp_avg/" + params_[i].first] = m_[i];
    out["exp_avg_sq/" + params_[i].first] = v_[i];
  }
  out["step"] = torch::tensor(t_, torch::kLong);
  return out;
}

void AdamW::load_state(const std::map<std::string, torch::Tensor>& state) {
  auto get = [&](const std::string& key, const torch::Tensor& like) {
    auto it = state.find(key);
    if (it == state.end()) throw std::runtime_error("optimizer state lacks '" + key + "'");
    if (it->second.sizes() != like.sizes())
      throw std::runtime_error("optimizer state '" + key + "' has shape " + c10::str(it->second.sizes()) +
                               " but the parameter has " + c10::str(like.sizes()));
    return it->second.to(like.device(), like.scalar_type()).contiguous();
  };
  std::vector<torch::Tensor> m, v;
  for (size_t i = 0; i < params_.size(); ++i) {
    m.push_back(get("exp_avg/" + params_[i].first, params_[i].second).clone());
    v.push_back(get("exp_avg_sq/" + params_[i].first, params_[i].second).clone());
  }
  auto it = state.find("step");
  if (it == state.end() || it->second.numel() != 1) throw std::runtime_error("optimizer state lacks 'step'");
  m_ = std::move(m);
  v_ = std::move(v);
  t_ = it->second.item<int64_t>();
}

double lr_at(int64_t step, int64_t total, int64_t warmup, double peak, double min_ratio) {
  if (warmup > 0 && step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t decay_steps = std::max<int64_t>(1, total - warmup);
  double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak * (min_ratio + (1.0 - min_ratio) * cosine);
}

}  // namespace deloco
