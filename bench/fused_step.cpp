// fused_step: one learner's training step (forward, backward, clipping, AdamW) with the GPT's fused kernels
// (train.fused = true, src/model/kernels.h) against the ATen operations they replace (train.fused = false, the code
// before them), in one process, alternating blocks of steps (ABAB), per precision. Reports medians of the wall time
// and of the process CPU time per step: on a shared machine the CPU time (user + system, all threads) is the
// steadier measure of the work a step does, since it does not count time spent waiting for a core.
//
//   ./build/fused_step [--model small|science] [--precision fp32,bf16] [--threads 2] [--rounds 5] [--steps 6]
//                      [--kernels REPS]
//
// --kernels REPS adds a table of each fused kernel against its ATen composition alone (forward + backward at the
// small model's shapes, REPS alternating repetitions); --precision none skips the whole steps.
// small: configs/small.toml's model and batch (GPT 4 x 192, T = 128, V = 256, batch 16). science: the science
// suite's full-scale learner (scripts/science.py: GPT 4 x 256, T = 128, V = 4096, batch 8, bf16, one thread).
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "deloco/gpt/train.h"
#include "model/kernels.h"
#include "util/malloc_tuning.h"

using namespace deloco;
using Clock = std::chrono::steady_clock;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string p; std::getline(in, p, ',');)
    if (!p.empty()) out.push_back(p);
  return out;
}

struct Times {
  std::vector<double> wall, cpu;
};

// Each fused kernel against the ATen composition it replaces, forward + backward, at the shapes of the small
// model's step (B = 16, T = 128, C = 192, nh = 4, V = 256), alternating; median milliseconds of each.
void kernel_table(int reps) {
  const int64_t B = 16, T = 128, C = 192, nh = 4, V = 256;
  using Fn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;
  struct Case {
    std::string name;
    std::vector<torch::Tensor> inputs;  // leaves that need gradients, then others
    size_t n_grad;
    Fn fused, aten;
  };
  const double scale = 1.0 / std::sqrt(48.0);
  auto targets = torch::randint(0, V, {B * T}, torch::kLong);
  std::printf("\nkernels, forward + backward, median ms of %d (alternating):\n| kernel | dtype | fused | ATen | speed-up |\n"
              "|---|---|---|---|---|\n", reps);
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    std::vector<Case> cases;
    cases.push_back({"causal softmax [B,nh,T,T]", {torch::randn({B, nh, T, T}).to(dt)}, 1,
                     [&](const auto& in) { return kernels::causal_softmax(in[0], scale); },
                     [&](const auto& in) { return kernels::causal_softmax_reference(in[0], scale); }});
    cases.push_back({"GELU [B,T,4C]", {torch::randn({B, T, 4 * C}).to(dt)}, 1,
                     [](const auto& in) { return kernels::gelu(in[0]); }, [](const auto& in) { return torch::gelu(in[0]); }});
    cases.push_back({"cross-entropy [B*T,V]", {torch::randn({B * T, V}).to(dt)}, 1,
                     [&](const auto& in) { return kernels::cross_entropy(in[0], targets); },
                     [&](const auto& in) { return kernels::cross_entropy_reference(in[0], targets); }});
    // The residual add and ln_2: x float32, the branch in dt, the output in dt (what the next linear reads).
    cases.push_back({"add + layer norm [B,T,C]",
                     {torch::randn({B, T, C}), torch::randn({B, T, C}).to(dt), torch::ones({C}), torch::zeros({C})}, 4,
                     [dt](const auto& in) {
                       auto [h, y] = kernels::add_layer_norm(in[0], in[1], in[2], in[3], 1e-5, dt);
                       return h.sum() + y.to(torch::kFloat).sum();
                     },
                     [dt](const auto& in) {
                       auto h = in[0] + in[1];
                       auto y = torch::layer_norm(h, {C}, in[2], in[3], 1e-5).to(dt);
                       return h.sum() + y.to(torch::kFloat).sum();
                     }});
    for (auto& c : cases) {
      for (size_t i = 0; i < c.n_grad; ++i) c.inputs[i].set_requires_grad(true);
      auto up = [&](const Fn& f) {
        auto y = f(c.inputs);
        y.backward(torch::ones_like(y));
        for (size_t i = 0; i < c.n_grad; ++i) c.inputs[i].mutable_grad().reset();
      };
      std::vector<double> tf, ta;
      for (int r = 0; r < reps + 2; ++r) {
        auto t0 = Clock::now();
        up(c.fused);
        const double a = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        t0 = Clock::now();
        up(c.aten);
        const double b = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (r >= 2) tf.push_back(a), ta.push_back(b);
      }
      std::printf("| %s | %s | %.3f | %.3f | %.2fx |\n", c.name.c_str(), dt == torch::kFloat ? "fp32" : "bf16", median(tf),
                  median(ta), median(ta) / median(tf));
    }
  }
}
}  // namespace

int main(int argc, char** argv) {
  std::string model = "small", precisions = "fp32,bf16";
  int threads = 2, rounds = 5, steps = 6, kernel_reps = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    if (!std::strcmp(argv[i], "--precision")) precisions = argv[i + 1];
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--kernels")) kernel_reps = std::atoi(argv[i + 1]);
  }
  tune_malloc_for_training();  // as `deloco train` does at start-up (util/malloc_tuning.h)
  torch::set_num_threads(threads);
  RunConfig cfg;
  cfg.model.block_size = 128;
  cfg.model.n_layer = 4;
  if (model == "science") {
    cfg.model.n_head = 4;
    cfg.model.n_embd = 256;
    cfg.model.vocab_size = 4096;
    cfg.train.batch_size = 8;
  } else {
    cfg.model.n_head = 4;
    cfg.model.n_embd = 192;
    cfg.train.batch_size = 16;
  }
  cfg.train.steps = 100000;
  cfg.train.warmup_steps = 10;
  cfg.train.lr = 2e-3;
  cfg.train.eval_tokens = 1024;
  cfg.train.threads = threads;
  // Random bytes: the step's cost does not depend on the text.
  std::mt19937 rng(1);
  std::vector<std::string> docs(8);
  for (auto& d : docs)
    for (int i = 0; i < 200000; ++i) d.push_back(static_cast<char>('a' + rng() % 26));
  auto corpus = std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.05));
  const double tokens = static_cast<double>(cfg.train.batch_size * cfg.model.block_size);
  std::printf("model %s (C = %lld, V = %lld, batch %lld x T %lld), %d threads, %d rounds x %d steps per variant (ABAB)\n",
              model.c_str(), static_cast<long long>(cfg.model.n_embd), static_cast<long long>(cfg.model.vocab_size),
              static_cast<long long>(cfg.train.batch_size), static_cast<long long>(cfg.model.block_size), threads, rounds,
              steps);
  std::printf("| precision | kernels | ms/step wall | tokens/s wall | ms/step CPU | tokens per CPU-s |\n|---|---|---|---|---|---|\n");
  for (const std::string& p : split(precisions)) {
    if (p == "none") continue;
    RunConfig a = cfg, b = cfg;
    a.train.precision = b.train.precision = p;
    a.train.fused = true;
    b.train.fused = false;
    Trainer on(a, corpus), off(b, corpus);
    for (int i = 0; i < 3; ++i) on.train_step(), off.train_step();  // warm-up (allocations, oneDNN kernels)
    Times t_on, t_off;
    for (int r = 0; r < rounds; ++r)
      for (auto [tr, times] : {std::pair<Trainer*, Times*>{&on, &t_on}, {&off, &t_off}})
        for (int s = 0; s < steps; ++s) {
          const double c0 = cpu_seconds();
          const auto w0 = Clock::now();
          tr->train_step();
          times->wall.push_back(std::chrono::duration<double>(Clock::now() - w0).count());
          times->cpu.push_back(cpu_seconds() - c0);
        }
    for (auto [name, t] : {std::pair<const char*, Times*>{"fused", &t_on}, {"unfused (ATen)", &t_off}})
      std::printf("| %s | %s | %.1f | %.0f | %.1f | %.0f |\n", p.c_str(), name, 1e3 * median(t->wall),
                  tokens / median(t->wall), 1e3 * median(t->cpu), tokens / median(t->cpu));
    std::printf("| %s | fused / unfused speed | %.3fx wall | | %.3fx CPU | |\n", p.c_str(),
                median(t_off.wall) / median(t_on.wall), median(t_off.cpu) / median(t_on.cpu));
  }
  if (kernel_reps > 0) kernel_table(kernel_reps);
  return 0;
}
