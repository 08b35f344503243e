// OuterOptimizer: the state bookkeeping shared by every outer rule (one momentum buffer per parameter name),
// the checks, and the factory / presets.
#include <cmath>
#include <sstream>

#include <torch/torch.h>

#include "deloco/outer.h"
#include "outer/rules.h"

namespace deloco {
namespace {
const char kSuffix[] = ".momentum_buffer";
}

void OuterOptions::validate() const {
  if (kind != "sgd" && kind != "nesterov")
    throw OuterError("unknown outer optimizer '" + kind + "' (known: sgd, nesterov)");
  if (!std::isfinite(lr) || lr < 0) throw OuterError("outer lr must be finite and >= 0");
  if (!std::isfinite(momentum) || momentum < 0 || momentum >= 1)
    throw OuterError("outer momentum must be in [0, 1)");
  if (kind == "nesterov" && momentum <= 0) throw OuterError("nesterov needs momentum > 0");
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
  at::Tensor buf;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buffers_.find(name);
    if (it != buffers_.end()) buf = it->second;
  }
  if (buf.defined() && buf.sizes() != param.sizes())
    throw OuterError("outer step for '" + name + "': momentum buffer shape does not match the parameter");
  at::Tensor next = buf.defined() ? buf.clone() : at::Tensor();
  at::Tensor u = update(g, next);
  {
    at::NoGradGuard no_grad;
    param.sub_(u, opts_.lr);
  }
  if (next.defined()) {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_[name] = next;
  }
}

std::map<std::string, at::Tensor> OuterOptimizer::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, b] : buffers_) out[name + kSuffix] = b.clone();
  return out;
}

void OuterOptimizer::load_state(const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, at::Tensor> next;
  const size_t n = sizeof(kSuffix) - 1;
  for (const auto& [key, t] : state) {
    if (key.size() <= n || key.compare(key.size() - n, n, kSuffix) != 0)
      throw OuterError("outer optimizer state: unexpected key '" + key + "'");
    if (!t.defined() || !at::isFloatingType(t.scalar_type()))
      throw OuterError("outer optimizer state: '" + key + "' is not a floating-point tensor");
    next[key.substr(0, key.size() - n)] = t.clone();
  }
  std::lock_guard<std::mutex> lock(mu_);
  buffers_ = std::move(next);
}

at::Tensor OuterOptimizer::buffer(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = buffers_.find(name);
  return it == buffers_.end() ? at::Tensor() : it->second;
}

void OuterOptimizer::set_buffer(const std::string& name, const at::Tensor& buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (buffer.defined())
    buffers_[name] = buffer;
  else
    buffers_.erase(name);
}

OuterOptimizer::Rule OuterOptimizer::rule() const {
  Rule r;
  r.nesterov = opts_.kind == "nesterov";
  r.momentum = r.nesterov || opts_.momentum > 0;
  r.lr = opts_.lr;
  r.mu = r.momentum ? opts_.momentum : 0.0;
  return r;
}

at::Tensor OuterOptimizer::buffer_for_update(const std::string& name, const at::Tensor& like) {
  if (!rule().momentum) throw OuterError("outer step for '" + name + "': this rule keeps no momentum buffer");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = buffers_.find(name);
  if (it == buffers_.end()) {
    at::Tensor b = at::zeros(like.sizes(), like.options().dtype(at::kFloat));
    buffers_[name] = b;
    return b;
  }
  at::Tensor& b = it->second;
  if (b.sizes() != like.sizes() || b.scalar_type() != at::kFloat)
    throw OuterError("outer step for '" + name + "': momentum buffer shape or dtype does not match the parameter");
  if (!b.is_contiguous() || b.device() != like.device()) b = b.to(like.device()).contiguous();
  return b;
}

std::unique_ptr<OuterOptimizer> make_outer_optimizer(const OuterOptions& opts) {
  opts.validate();
  if (opts.kind == "nesterov") return outer_detail::make_nesterov(opts);
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
