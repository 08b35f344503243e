// muon_step: what Muon (train/muon.h) costs on this machine, measured side by side in one run.
//  1. The machine's matmul peak per precision: a square product (--peak-n, default 1024), median GFLOP/s.
//  2. The batched Newton–Schulz pass (linalg::orthogonalise, 5 steps) over a model's hidden matrices, grouped by
//     shape as Muon runs it, per precision: GFLOP/s (linalg::odd_quintic_flops) and its share of that peak. Models:
//     the science suite's (n_embd 256, 4 layers) and a wider one (n_embd 512, 4 layers).
//  3. One inner step of the science suite's model (V 4096, T 128, train.precision bf16 as the suite trains it; Muon's
//     Newton–Schulz then in bf16 too) with AdamW and with Muon, interleaved ABAB: the optimizer's update alone and
//     the whole training step, at the science suite's batch (8 × 128 = 1k tokens) and at 16k tokens per step
//     (128 × 128). --precision fp32 for float32 training (and Newton–Schulz).
// Medians of --reps runs after one warm-up each; --json FILE writes every figure.
//
//   ./build/muon_step [--reps 7] [--threads 2] [--peak-n 1024] [--precision bf16] [--json out.json] [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/gpt/data.h"
#include "deloco/gpt/train.h"
#include "linalg/newton_schulz.h"
#include "train/inner_optimizer.h"
#include "util/blas.h"

using namespace deloco;
using Clock = std::chrono::steady_clock;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double timed(int reps, const std::function<void()>& f) {
  f();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(seconds(f));
  return median(t);
}

const char* dtype_name(at::ScalarType t) { return t == at::kBFloat16 ? "bf16" : "fp32"; }

// The hidden matrices of a GPT block stack, grouped by shape: [layers, rows, cols] per nn.Linear weight.
std::vector<std::vector<int64_t>> hidden_groups(int64_t C, int64_t L) {
  return {{L, 3 * C, C}, {L, C, C}, {L, 4 * C, C}, {L, C, 4 * C}};
}

std::shared_ptr<const Corpus> corpus() {
  std::vector<std::string> docs;
  for (int i = 0; i < 200; ++i) {
    std::string d;
    for (int k = 0; k < 400; ++k) d += "the state of the union " + std::to_string(i * 7919 + k) + " is strong; ";
    docs.push_back(d);
  }
  return std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.02));
}
}  // namespace

int main(int argc, char** argv) {
  reexec_with_tuned_environment(argv);  // as the deloco CLI runs: passive OpenMP, OpenBLAS's own kernels for the CPU
  int reps = 7, threads = 2;
  int64_t peak_n = 1024;
  bool quick = false;
  std::string json_path, precision = "bf16";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (i + 1 < argc && a == "--reps") reps = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--threads") threads = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--peak-n") peak_n = std::atoll(argv[++i]);
    else if (i + 1 < argc && a == "--json") json_path = argv[++i];
    else if (i + 1 < argc && a == "--precision") precision = argv[++i];
    else {
      std::fprintf(stderr, "usage: muon_step [--reps N] [--threads N] [--peak-n N] [--precision bf16|fp32] [--json FILE] "
                           "[--quick]\n");
      return 2;
    }
  }
  if (quick) reps = std::min(reps, 2), peak_n = std::min<int64_t>(peak_n, 256);
  torch::set_num_threads(threads);
  nlohmann::json out{{"threads", threads}, {"reps", reps}, {"blas", blas_description()}};
  std::printf("BLAS: %s\n", blas_description().c_str());

  // 1. Peak.
  std::map<at::ScalarType, double> peak;
  for (const auto dt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor a = torch::randn({peak_n, peak_n}).to(dt), b = torch::randn({peak_n, peak_n}).to(dt);
    const double t = timed(reps, [&] { at::matmul(a, b); });
    peak[dt] = 2.0 * static_cast<double>(peak_n * peak_n * peak_n) / t / 1e9;
    out["peak_gflops"][dtype_name(dt)] = peak[dt];
    std::printf("matmul %lld^3 %s: %.1f GFLOP/s\n", static_cast<long long>(peak_n), dtype_name(dt), peak[dt]);
  }

  // 2. The batched Newton–Schulz pass.
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> models = {{"science (C 256, L 4)", {256, 4}}};
  if (!quick) models.push_back({"wide (C 512, L 4)", {512, 4}});
  for (const auto& [label, dims] : models) {
    const auto groups = hidden_groups(dims.first, dims.second);
    std::vector<at::Tensor> U;
    double flops = 0;
    for (const auto& g : groups) {
      U.push_back(torch::randn(g));
      flops += static_cast<double>(g[0]) * linalg::odd_quintic_flops(g[1], g[2], 5);
    }
    for (const auto dt : {at::kFloat, at::kBFloat16}) {
      const double t = timed(reps, [&] {
        for (const auto& u : U) linalg::orthogonalise(u, 5, dt);
      });
      const double gf = flops / t / 1e9;
      out["newton_schulz"][label][dtype_name(dt)] = {{"seconds", t}, {"gflops", gf}, {"of_peak", gf / peak[dt]}};
      std::printf("newton-schulz x5 %s %s: %.2f ms, %.1f GFLOP/s = %.0f%% of the %s matmul peak\n", label.c_str(),
                  dtype_name(dt), t * 1e3, gf, 100 * gf / peak[dt], dtype_name(dt));
    }
  }

  // 3. AdamW against Muon on the science suite's model.
  const auto data = corpus();
  for (const int64_t batch : quick ? std::vector<int64_t>{8} : std::vector<int64_t>{8, 128}) {
    RunConfig cfg;
    cfg.model.block_size = 128;
    cfg.model.n_layer = 4;
    cfg.model.n_head = 4;
    cfg.model.n_embd = 256;
    cfg.model.vocab_size = 4096;
    cfg.train.batch_size = batch;
    cfg.train.steps = 1000;
    cfg.train.precision = precision;
    cfg.train.eval_tokens = 1024;
    cfg.train.threads = threads;
    RunConfig mc = cfg;
    cfg.train.optimizer = "adamw";
    mc.train.optimizer = "muon";
    mc.train.muon_ns_precision = "auto";  // the training precision's
    Trainer adam(cfg, data), muon(mc, data);
    std::vector<double> ta, tm, oa, om;
    adam.train_step();
    muon.train_step();
    for (int i = 0; i < reps; ++i) {
      ta.push_back(seconds([&] { adam.train_step(); }));
      tm.push_back(seconds([&] { muon.train_step(); }));
      oa.push_back(seconds([&] { adam.optimizer().step(1e-4); }));  // the update alone, on the last gradients
      om.push_back(seconds([&] { muon.optimizer().step(1e-4); }));
    }
    const int64_t tokens = batch * cfg.model.block_size;
    const std::string key = std::to_string(tokens) + " tokens";
    out["step"]["precision"] = precision;
    out["step"][key] = {{"adamw_step_s", median(ta)}, {"muon_step_s", median(tm)}, {"adamw_update_s", median(oa)},
                        {"muon_update_s", median(om)}, {"step_ratio", median(tm) / median(ta)}};
    std::printf("science model (%s), %lld tokens/step: train step AdamW %.1f ms, Muon %.1f ms (x%.2f); update alone AdamW "
                "%.2f ms, Muon %.2f ms (x%.1f)\n",
                precision.c_str(), static_cast<long long>(tokens), median(ta) * 1e3, median(tm) * 1e3, median(tm) / median(ta),
                median(oa) * 1e3, median(om) * 1e3, median(om) / median(oa));
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
