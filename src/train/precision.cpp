#include "deloco/gpt/precision.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "deloco/error.h"

namespace deloco {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Distinct {
  MatmulShape shape;
  int64_t count;
};

// The distinct products, each with how often the forward runs it.
std::vector<Distinct> distinct(const std::vector<MatmulShape>& shapes) {
  std::map<MatmulShape, int64_t> n;
  for (const auto& s : shapes)
    if (s[0] > 0 && s[1] > 0 && s[2] > 0) ++n[s];
  std::vector<Distinct> out;
  for (const auto& [s, c] : n) out.push_back({s, c});
  return out;
}

// One timed pass over the distinct products in `dtype`: the weighted seconds and FLOPs of one forward's products.
struct Pass {
  double seconds = 0, flops = 0;
};

class Probe {
 public:
  Probe(const std::vector<Distinct>& products, const c10::Device& device) : products_(products), device_(device) {
    for (const auto& p : products_) {
      const auto opts = at::TensorOptions().device(device).dtype(at::kFloat);
      x32_.push_back(at::randn({p.shape[0], p.shape[1]}, opts));
      w32_.push_back(at::randn({p.shape[2], p.shape[1]}, opts) * 0.02);
      x16_.push_back(x32_.back().to(at::kBFloat16));
      w16_.push_back(w32_.back().to(at::kBFloat16));
    }
  }

  // Times each distinct product `reps` times; returns the per-forward weighted figures.
  Pass run(bool bf16, int reps) {
    Pass p;
    for (size_t i = 0; i < products_.size(); ++i) {
      const auto& x = bf16 ? x16_[i] : x32_[i];
      const auto& w = bf16 ? w16_[i] : w32_[i];
      const auto t0 = std::chrono::steady_clock::now();
      at::Tensor y;
      for (int r = 0; r < reps; ++r) y = at::linear(x, w);
      if (!device_.is_cpu()) (void)y.sum().item<float>();  // wait for the device
      const double t = seconds_since(t0) / reps;
      const auto& s = products_[i].shape;
      p.seconds += t * static_cast<double>(products_[i].count);
      p.flops += 2.0 * static_cast<double>(s[0]) * static_cast<double>(s[1]) * static_cast<double>(s[2]) *
                 static_cast<double>(products_[i].count);
    }
    return p;
  }

 private:
  const std::vector<Distinct>& products_;
  c10::Device device_;
  std::vector<at::Tensor> x32_, w32_, x16_, w16_;
};

std::string cache_key(const std::vector<Distinct>& products, const c10::Device& device) {
  std::ostringstream k;
  k << device.str() << '|' << at::get_num_threads();
  for (const auto& p : products) k << '|' << p.shape[0] << 'x' << p.shape[1] << 'x' << p.shape[2] << '*' << p.count;
  return k.str();
}

std::string gflops_text(double g) {
  char b[32];
  std::snprintf(b, sizeof b, g >= 100 ? "%.0f" : "%.1f", g);
  return b;
}

}  // namespace

std::string PrecisionChoice::describe() const {
  if (!measured) return chosen;
  return chosen + " (auto: bf16 matmul " + gflops_text(bf16_gflops) + " GFLOP/s, fp32 " + gflops_text(fp32_gflops) +
         " GFLOP/s at the model's shapes; bf16 is chosen at " + gflops_text(kBf16Margin) + "x fp32 or more)";
}

std::vector<MatmulShape> forward_matmuls(const std::vector<std::array<int64_t, 2>>& weight_shapes, int64_t rows) {
  std::vector<MatmulShape> out;
  for (const auto& w : weight_shapes) out.push_back({rows, w[1], w[0]});
  return out;
}

PrecisionChoice resolve_precision(const std::string& setting, const std::vector<MatmulShape>& shapes,
                                  const c10::Device& device, double margin) {
  PrecisionChoice c;
  c.setting = setting;
  if (setting == "fp32" || setting == "bf16") {
    c.chosen = setting;
    return c;
  }
  if (setting != "auto") throw ConfigError("train.precision must be auto, fp32 or bf16, not '" + setting + "'");

  std::vector<Distinct> products = distinct(shapes);
  if (products.empty()) {  // nothing to measure (no matrices): float32
    c.chosen = "fp32";
    c.measured = true;
    return c;
  }
  // Cap the rows so one pass over the distinct products stays cheap: about 1 GFLOP on a CPU, 50 on an accelerator.
  double per_row = 0;
  for (const auto& p : products) per_row += 2.0 * static_cast<double>(p.shape[1]) * static_cast<double>(p.shape[2]);
  const double budget = device.is_cpu() ? 1e9 : 5e10;
  const int64_t row_cap = std::max<int64_t>(64, static_cast<int64_t>(budget / per_row));
  for (auto& p : products) p.shape[0] = std::min(p.shape[0], row_cap);
  // The capped rows may merge shapes that differed only in rows.
  std::vector<MatmulShape> capped;
  for (const auto& p : products)
    for (int64_t i = 0; i < p.count; ++i) capped.push_back(p.shape);
  products = distinct(capped);

  static std::mutex mu;
  static std::map<std::string, PrecisionChoice> cache;  // the measurement; the margin is applied per call
  const std::string key = cache_key(products, device);
  std::lock_guard<std::mutex> lock(mu);
  const auto choose = [&](PrecisionChoice m) {
    m.setting = setting;
    m.chosen = m.bf16_gflops >= margin * m.fp32_gflops ? "bf16" : "fp32";
    return m;
  };
  if (auto it = cache.find(key); it != cache.end()) return choose(it->second);

  const auto t0 = std::chrono::steady_clock::now();
  at::NoGradGuard no_grad;
  Probe probe(products, device);
  // Warm-up (kernels chosen, caches filled), then enough repetitions for ~15 ms per pass, three rounds alternating
  // the order of the two precisions; each precision's rate is its median round.
  const Pass w32 = probe.run(false, 1), w16 = probe.run(true, 1);
  const double slowest = std::max(w32.seconds, w16.seconds);
  const int reps = std::clamp(static_cast<int>(0.015 / std::max(slowest, 1e-6)), 1, 50);
  std::vector<double> r32, r16;
  for (int round = 0; round < 3; ++round) {
    const bool bf16_first = round % 2 == 1;
    for (int k = 0; k < 2; ++k) {
      const bool bf16 = (k == 0) == bf16_first;
      const Pass p = probe.run(bf16, reps);
      (bf16 ? r16 : r32).push_back(p.flops / std::max(p.seconds, 1e-12) / 1e9);
    }
  }
  std::sort(r32.begin(), r32.end());
  std::sort(r16.begin(), r16.end());
  c.measured = true;
  c.fp32_gflops = r32[1];
  c.bf16_gflops = r16[1];
  c.probe_seconds = seconds_since(t0);
  cache[key] = c;
  return choose(c);
}

}  // namespace deloco
