#include "train/adamw.h"

#include <cmath>

#include <ATen/Parallel.h>
#include <torch/torch.h>

namespace deloco {
namespace {
constexpr int64_t kGrain = 1 << 15;  // elements per parallel chunk

bool fusable(const torch::Tensor& p, const torch::Tensor& g, const torch::Tensor& m, const torch::Tensor& v) {
  for (const auto* t : {&p, &g, &m, &v})
    if (!t->device().is_cpu() || t->scalar_type() != torch::kFloat || !t->is_contiguous()) return false;
  return true;
}

// The AdamW update of one contiguous float32 parameter in one pass (the arithmetic of torch.optim.AdamW, in float).
void fused_update(float* p, const float* g, float* m, float* v, int64_t n, float decay, float b1, float b2, float scale,
                  float step_size, float inv_bc2_sqrt, float eps) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    for (int64_t i = begin; i < end; ++i) {
      const float gi = g[i] * scale;
      const float mi = b1 * m[i] + c1 * gi;
      const float vi = b2 * v[i] + c2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float denom = std::sqrt(vi) * inv_bc2_sqrt + eps;
      p[i] = p[i] * decay - step_size * mi / denom;
    }
  });
}

double sum_of_squares(const float* x, int64_t n) {
  return at::parallel_reduce(
      0, n, kGrain, 0.0,
      [&](int64_t begin, int64_t end, double acc) {
        float part = 0;  // float lanes vectorise; chunks of kGrain keep the float sum accurate enough for a clip
        for (int64_t i = begin; i < end; ++i) part += x[i] * x[i];
        return acc + static_cast<double>(part);
      },
      [](double a, double b) { return a + b; });
}
}  // namespace

AdamW::AdamW(NamedTensors params, AdamWOptions opts) : params_(std::move(params)), opts_(opts) {
  for (const auto& [name, p] : params_) decay_.push_back(p.dim() >= 2);
}

void AdamW::allocate_moments() const {
  if (!m_.empty() || params_.empty()) return;
  for (const auto& [name, p] : params_) {
    m_.push_back(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    v_.push_back(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
  }
}

void AdamW::step(double lr, double grad_scale) {
  torch::NoGradGuard no_grad;
  allocate_moments();
  ++t_;
  const double bc1 = 1.0 - std::pow(opts_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(opts_.beta2, static_cast<double>(t_));
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    const auto& g = p.grad();
    if (!g.defined()) continue;
    const double decay = (decay_[i] && opts_.weight_decay != 0) ? 1.0 - lr * opts_.weight_decay : 1.0;
    if (fused_ && fusable(p, g, m_[i], v_[i])) {
      fused_update(p.data_ptr<float>(), g.data_ptr<float>(), m_[i].data_ptr<float>(), v_[i].data_ptr<float>(), p.numel(),
                   static_cast<float>(decay), static_cast<float>(opts_.beta1), static_cast<float>(opts_.beta2),
                   static_cast<float>(grad_scale), static_cast<float>(step_size), static_cast<float>(1.0 / bc2_sqrt),
                   static_cast<float>(opts_.eps));
      continue;
    }
    const torch::Tensor gs = grad_scale == 1.0 ? g : g * grad_scale;
    if (decay != 1.0) p.mul_(decay);
    m_[i].mul_(opts_.beta1).add_(gs, 1.0 - opts_.beta1);
    v_[i].mul_(opts_.beta2).addcmul_(gs, gs, 1.0 - opts_.beta2);
    auto denom = (v_[i].sqrt() / bc2_sqrt).add_(opts_.eps);
    p.addcdiv_(m_[i], denom, -step_size);
  }
}

double clip_coefficient(const NamedTensors& params, double max_norm) {
  torch::NoGradGuard no_grad;
  double total = 0;
  for (const auto& [name, p] : params) {
    const auto& g = p.grad();
    if (!g.defined()) continue;
    if (g.device().is_cpu() && g.scalar_type() == torch::kFloat && g.is_contiguous())
      total += sum_of_squares(g.data_ptr<float>(), g.numel());
    else
      total += g.to(torch::kDouble).pow(2).sum().item<double>();
  }
  return std::min(1.0, max_norm / (std::sqrt(total) + 1e-6));
}

void AdamW::zero_grad() {
  for (auto& [name, p] : params_) {
    auto& g = p.mutable_grad();
    if (g.defined()) g.zero_();
  }
}

std::map<std::string, torch::Tensor> AdamW::state() const {
  allocate_moments();
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
    if (it == state.end()) throw CheckpointError("optimizer state lacks '" + key + "'");
    if (it->second.sizes() != like.sizes())
      throw CheckpointError("optimizer state '" + key + "' has shape " + c10::str(it->second.sizes()) +
                            " but the parameter has " + c10::str(like.sizes()));
    return it->second.to(like.device(), like.scalar_type()).contiguous();
  };
  std::vector<torch::Tensor> m, v;
  for (size_t i = 0; i < params_.size(); ++i) {
    m.push_back(get("exp_avg/" + params_[i].first, params_[i].second).clone());
    v.push_back(get("exp_avg_sq/" + params_[i].first, params_[i].second).clone());
  }
  auto it = state.find("step");
  if (it == state.end() || it->second.numel() != 1) throw CheckpointError("optimizer state lacks 'step'");
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
