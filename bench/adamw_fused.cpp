// adamw_fused: the inner optimizer step of the default model (configs/small.toml's GPT, 1.85M parameters) with
// deloco's fused CPU AdamW + folded clipping against the same update as ATen tensor operations (the eager
// torch.optim.AdamW + clip_grad_norm_ recipe), alternating ABAB in one run; medians, and the largest difference of
// the parameters after the same updates.
//
//   ./build/adamw_fused [--reps 200] [--threads 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <torch/torch.h>

#include "deloco/gpt/model.h"
#include "train/adamw.h"

using namespace deloco;
using Clock = std::chrono::steady_clock;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

NamedTensors clone_with_grads(const NamedTensors& src, uint64_t seed) {
  torch::manual_seed(seed);
  NamedTensors out;
  for (const auto& [n, p] : src) {
    auto q = p.detach().clone().set_requires_grad(true);
    q.mutable_grad() = torch::randn_like(q) * 0.05;
    out.emplace_back(n, q);
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  int reps = 200, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  }
  torch::set_num_threads(threads);
  ModelConfig cfg;  // configs/small.toml
  cfg.block_size = 128;
  cfg.n_layer = 4;
  cfg.n_head = 4;
  cfg.n_embd = 192;
  GPT model(cfg, 1);
  const NamedTensors base = named_parameters(*model);
  NamedTensors a = clone_with_grads(base, 7), b = clone_with_grads(base, 7);
  AdamWOptions o;
  AdamW fused(a, o), aten(b, o);
  aten.set_fused(false);
  std::vector<torch::Tensor> b_list;
  for (auto& [n, p] : b) b_list.push_back(p);
  int64_t n_params = 0;
  for (auto& [n, p] : a) n_params += p.numel();

  std::vector<double> t_fused, t_aten;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fused.step(1e-3, clip_coefficient(a, 1.0));
    t_fused.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    t0 = Clock::now();
    torch::nn::utils::clip_grad_norm_(b_list, 1.0);
    aten.step(1e-3);
    t_aten.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    // The same fresh gradients for both (clipping scaled b's in place).
    for (size_t i = 0; i < a.size(); ++i) b[i].second.mutable_grad().copy_(a[i].second.grad());
  }
  double max_rel = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = (a[i].second - b[i].second).abs().max().item<double>();
    const double s = b[i].second.abs().max().item<double>();
    max_rel = std::max(max_rel, d / std::max(s, 1e-12));
  }
  const double mf = median(t_fused), ma = median(t_aten);
  std::printf("AdamW + clip over %lld parameters, %d threads, %d steps each (ABAB), medians:\n", static_cast<long long>(n_params),
              threads, reps);
  std::printf("  fused (deloco)            %8.3f ms/step\n", mf);
  std::printf("  ATen ops (eager recipe)   %8.3f ms/step\n", ma);
  std::printf("  speed-up %.2fx; largest parameter difference after %d steps: %.2e (relative to the tensor's max)\n",
              ma / mf, reps, max_rel);
  return 0;
}
