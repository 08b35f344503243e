// OuterOptimizer: the state bookkeeping shared by every outer rule (one momentum buffer per parameter name),
// the checks, and the factory / presets.
#include <cmath>
#include <sstream>

#include <torch/torch.h>

#include "deloco/outer.h"
#include "outer/rules.h"

namespace deloco {
namespace {
const std::string kSuffix = ".momentum_buffer", kSumSuffix = ".delay_sum", kCountSuffix = ".delay_count";
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

void OuterOptions::validate() const {
  const bool delayed = kind == "delayed_nesterov" || kind == "delayed_nesterov_whole";
  if (kind != "sgd" && kind != "nesterov" && !delayed)
    throw OuterError("unknown outer optimizer '" + kind +
                     "' (known: sgd, nesterov, delayed_nesterov, delayed_nesterov_whole)");
  if (!std::isfinite(lr) || lr < 0) throw OuterError("outer lr must be finite and >= 0");
  if (!std::isfinite(momentum) || momentum < 0 || momentum >= 1)
    throw OuterError("outer momentum must be in [0, 1)");
  if ((kind == "nesterov" || delayed) && momentum <= 0) throw OuterError(kind + " needs momentum > 0");
  if (delay < 1) throw OuterError("outer delay (N of delayed_nesterov) must be >= 1 (got " + std::to_string(delay) + ")");
  if (!std::isfinite(delay_momentum) || delay_momentum < 0 || delay_momentum > 1)
    throw OuterError("outer delay_momentum (c of delayed_nesterov) must be in [0, 1]");
  // Liu et al.'s c: the momentum the steps between changes apply, c·μ·b each, must leave the change's own share
  // (1 − c·N + c) ≥ 0, so c ≤ 1/N.
  if (kind == "delayed_nesterov" && delay_momentum * static_cast<double>(delay) > 1.0 + 1e-12)
    throw OuterError("outer delay_momentum (c of delayed_nesterov) must be in [0, 1/N] = [0, " +
                     std::to_string(1.0 / static_cast<double>(delay)) + "] for outer.delay = " + std::to_string(delay) +
                     " (delayed_nesterov_whole takes c up to 1)");
}

OuterOptimizer::OuterOptimizer(OuterOptions opts) : opts_(std::move(opts)) { opts_.validate(); }

void OuterOptimizer::step(const std::string& name, at::Tensor& param, const at::Tensor& grad) {
  if (!param.defined() || !grad.defined()) throw OuterError("outer step for '" + name + "': undefined tensor");
  if (param.sizes() != grad.sizes()) {
    std::ostringstream os;
    os << "outer step for '" << name << "': gradient shape " << grad.sizes() << " != parameter shape "
       << param.sizes();
    throw OuterError(os.str());
  }
  if (!at::isfinite(grad).all().item<bool>())
    throw OuterError("outer step for '" + name + "': gradient contains NaN or Inf");
  at::Tensor g = grad.detach().to(param.options());
  Slot cur = slot(name);
  if ((cur.buffer.defined() && cur.buffer.sizes() != param.sizes()) || (cur.sum.defined() && cur.sum.sizes() != param.sizes()))
    throw OuterError("outer step for '" + name + "': momentum buffer shape does not match the parameter");
  Slot next;
  if (cur.buffer.defined()) next.buffer = cur.buffer.clone();
  if (cur.sum.defined()) next.sum = cur.sum.clone();
  next.count = cur.count;
  at::Tensor u = update(g, next);
  {
    at::NoGradGuard no_grad;
    param.sub_(u, opts_.lr);
  }
  if (next.buffer.defined() || next.sum.defined()) set_slot(name, next);
}

OuterOptimizer::Slot OuterOptimizer::slot(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(name);
  return it == slots_.end() ? Slot() : it->second;
}

void OuterOptimizer::set_slot(const std::string& name, const Slot& slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slot.buffer.defined() || slot.sum.defined())
    slots_[name] = slot;
  else
    slots_.erase(name);
}

std::map<std::string, at::Tensor> OuterOptimizer::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, s] : slots_) {
    if (s.buffer.defined()) out[name + kSuffix] = s.buffer.clone();
    if (s.sum.defined()) {
      out[name + kSumSuffix] = s.sum.clone();
      out[name + kCountSuffix] = at::full({1}, static_cast<double>(s.count), at::kDouble);
    }
  }
  return out;
}

void OuterOptimizer::load_state(const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, Slot> next;
  for (const auto& [key, t] : state) {
    if (!t.defined() || !at::isFloatingType(t.scalar_type()))
      throw OuterError("outer optimizer state: '" + key + "' is not a floating-point tensor");
    if (ends_with(key, kSuffix)) {
      next[key.substr(0, key.size() - kSuffix.size())].buffer = t.clone();
    } else if (ends_with(key, kSumSuffix)) {
      next[key.substr(0, key.size() - kSumSuffix.size())].sum = t.clone();
    } else if (ends_with(key, kCountSuffix)) {
      const double c = t.numel() == 1 ? t.to(at::kDouble).item<double>() : -1.0;
      if (!(c >= 0 && c < 1e15) || c != std::floor(c))
        throw OuterError("outer optimizer state: '" + key + "' must hold one whole count >= 0");
      next[key.substr(0, key.size() - kCountSuffix.size())].count = static_cast<int64_t>(c);
    } else {
      throw OuterError("outer optimizer state: unexpected key '" + key + "'");
    }
  }
  for (const auto& [name, s] : next)
    if (s.count > 0 && !s.sum.defined())
      throw OuterError("outer optimizer state: '" + name + kCountSuffix + "' without '" + name + kSumSuffix + "'");
  std::lock_guard<std::mutex> lock(mu_);
  slots_ = std::move(next);
}

at::Tensor OuterOptimizer::buffer(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(name);
  return it == slots_.end() ? at::Tensor() : it->second.buffer;
}

void OuterOptimizer::set_buffer(const std::string& name, const at::Tensor& buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[name];
  s.buffer = buffer;
  if (!s.buffer.defined() && !s.sum.defined()) slots_.erase(name);
}

OuterOptimizer::Rule OuterOptimizer::rule() const {
  Rule r;
  r.delayed = opts_.kind == "delayed_nesterov" || opts_.kind == "delayed_nesterov_whole";
  r.nesterov = opts_.kind == "nesterov" || r.delayed;
  r.momentum = r.nesterov || opts_.momentum > 0;
  r.lr = opts_.lr;
  r.mu = r.momentum ? opts_.momentum : 0.0;
  return r;
}

at::Tensor OuterOptimizer::buffer_for_update(const std::string& name, const at::Tensor& like) {
  if (!rule().momentum) throw OuterError("outer step for '" + name + "': this rule keeps no momentum buffer");
  if (rule().delayed) throw OuterError("outer step for '" + name + "': delayed_nesterov is applied by step() only");
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[name];
  if (!s.buffer.defined()) {
    s.buffer = at::zeros(like.sizes(), like.options().dtype(at::kFloat));
    return s.buffer;
  }
  at::Tensor& b = s.buffer;
  if (b.sizes() != like.sizes() || b.scalar_type() != at::kFloat)
    throw OuterError("outer step for '" + name + "': momentum buffer shape or dtype does not match the parameter");
  if (!b.is_contiguous() || b.device() != like.device()) b = b.to(like.device()).contiguous();
  return b;
}

std::unique_ptr<OuterOptimizer> make_outer_optimizer(const OuterOptions& opts) {
  opts.validate();
  if (opts.kind == "nesterov") return outer_detail::make_nesterov(opts);
  if (opts.kind == "delayed_nesterov" || opts.kind == "delayed_nesterov_whole")
    return outer_detail::make_delayed_nesterov(opts);
  return outer_detail::make_sgd(opts);
}

OuterPreset outer_preset(const std::string& name) {
  OuterPreset p;
  if (name == "diloco") {
    p.merge_method = "mean";
    p.outer = {"nesterov", 0.7, 0.9};
  } else if (name == "isoloco") {
    p.merge_method = "iso_c";
    p.outer = {"nesterov", 1.8, 0.8};
  } else {
    throw OuterError("unknown outer preset '" + name + "' (known: diloco, isoloco)");
  }
  return p;
}

}  // namespace deloco
