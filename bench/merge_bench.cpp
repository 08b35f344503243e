// merge_bench: (1) iso_c (SVD) vs iso_c_fast (Gram eigendecomposition) on square and tall matrices, time and
// relative Frobenius error; (2) a whole-model Iso-C merge of T = 8 task vectors in C++ vs the same computation
// in Python PyTorch (bench/merge_reference.py, torch.linalg.svd per tensor), in one run; (3) with --ns, iso_c_ns
// (Newton–Schulz Iso-C): the machine's fp32 and bf16 matmul peaks, its speed and share of the peak at 1 and 2
// threads against iso_c and iso_c_fast, and its accuracy per step count against exact Iso-C (SVD), on random
// and (--real BEFORE AFTER: two checkpoints or .safetensors files) real pseudo-gradients.
//
//   ./build/merge_bench [--quick] [--python /usr/bin/python3] [--source-dir .]
//   ./build/merge_bench --ns speed|accuracy|all [--n 1024] [--reps 5] [--steps 6,8,10] [--real ckpt_a ckpt_b]
//                                                                                        (only section 3)
#include <algorithm>
#include <chrono>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "deloco/merge.h"
#include "deloco/safetensors.h"

using namespace deloco;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>() / b.to(at::kDouble).norm().item<double>();
}

// Best of `reps` wall times of f().
template <class F>
double best_time(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t = Clock::now();
    f();
    best = std::min(best, seconds_since(t));
  }
  return best;
}

void matrices(bool quick) {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{256, 256},   {512, 512},   {1024, 1024}, {2048, 2048},
                                                     {4096, 4096}, {1024, 256},  {2048, 512},  {4096, 1024},
                                                     {4096, 2048}};
  if (quick) shapes = {{256, 256}, {512, 512}, {1024, 1024}, {2048, 2048}, {1024, 256}, {4096, 1024}};
  auto exact = make_merger("iso_c");
  MergeOptions p0;
  p0.iso_fast_polish = 0;
  auto fast0 = make_merger("iso_c_fast", p0);
  auto fast1 = make_merger("iso_c_fast");
  std::printf("\n## iso_c vs iso_c_fast (fp32, Gaussian matrices, one contribution; best of 3 below 2048)\n\n");
  std::printf("| shape | iso_c s | fast(polish 0) s | speed-up | rel err | fast(polish 1) s | speed-up | rel err |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (auto [m, n] : shapes) {
    auto gen = at::detail::createCPUGenerator(m * 31 + n);
    at::Tensor M = at::randn({m, n}, gen, at::TensorOptions().dtype(at::kFloat));
    MergeInput in{"m", {M}, {}};
    const int reps = std::max(m, n) >= 2048 ? 1 : 3;
    at::Tensor re, r0, r1;
    const double te = best_time(reps, [&] { re = exact->merge(in); });
    const double t0 = best_time(reps, [&] { r0 = fast0->merge(in); });
    const double t1 = best_time(reps, [&] { r1 = fast1->merge(in); });
    std::printf("| %ldx%ld | %.3f | %.3f | %.1fx | %.1e | %.3f | %.1fx | %.1e |\n", (long)m, (long)n, te, t0, te / t0,
                rel(r0, re), t1, te / t1, rel(r1, re));
    std::fflush(stdout);
  }
  // A badly conditioned case: singular values spread over 4 decades.
  const int64_t n = quick ? 512 : 1024;
  at::Tensor U = std::get<0>(at::linalg_qr(at::randn({n, n})));
  at::Tensor V = std::get<0>(at::linalg_qr(at::randn({n, n})));
  at::Tensor M = at::matmul(U * at::logspace(0, -4, n), V.t());
  std::printf("\nIll-conditioned %ldx%ld (singular values 1 .. 1e-4):", (long)n, (long)n);
  for (auto dt : {at::kFloat, at::kDouble}) {
    MergeOptions o;
    o.compute_dtype = dt;
    at::Tensor Md = M.to(dt);
    at::Tensor re = make_merger("iso_c", o)->merge({"m", {Md}, {}});
    at::Tensor rf = make_merger("iso_c_fast", o)->merge({"m", {Md}, {}});
    std::printf(" %s rel err %.1e;", dt == at::kFloat ? "fp32" : "fp64", rel(rf, re));
  }
  std::printf("\n");
}

void whole_model(bool quick, const std::string& python, const std::string& source_dir) {
  const int T = 8;
  const int64_t d = quick ? 256 : 512, layers = 4, vocab = 4096, ctx = 256;
  std::map<std::string, std::vector<int64_t>> shapes{{"wte.weight", {vocab, d}}, {"wpe.weight", {ctx, d}},
                                                     {"ln_f.weight", {d}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    shapes[p + "attn.qkv.weight"] = {3 * d, d};
    shapes[p + "attn.proj.weight"] = {d, d};
    shapes[p + "mlp.fc.weight"] = {4 * d, d};
    shapes[p + "mlp.proj.weight"] = {d, 4 * d};
    shapes[p + "ln1.weight"] = {d};
    shapes[p + "ln2.weight"] = {d};
  }
  const auto dir = std::filesystem::temp_directory_path() / ("deloco_merge_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto gen = at::detail::createCPUGenerator(7);
  TensorFile base;
  int64_t params = 0;
  for (auto& [name, s] : shapes) {
    base.tensors[name] = at::randn(s, gen, at::TensorOptions().dtype(at::kFloat));
    params += base.tensors[name].numel();
  }
  save_safetensors((dir / "base.safetensors").string(), base);
  std::vector<TensorFile> inputs(T);
  for (int i = 0; i < T; ++i) {
    for (auto& [name, t] : base.tensors)
      inputs[i].tensors[name] = t + 0.01f * at::randn(t.sizes(), gen, at::TensorOptions().dtype(at::kFloat));
    save_safetensors((dir / ("input" + std::to_string(i) + ".safetensors")).string(), inputs[i]);
  }
  std::vector<std::string> names;
  for (auto& kv : shapes) names.push_back(kv.first);

  std::printf("\n## Whole-model merge, T = %d, %.1f M parameters (%zu tensors), fp32, compute time only\n\n", T,
              params / 1e6, names.size());
  std::printf("| implementation | method | threads | seconds | rel err vs Python |\n|---|---|---|---|---|\n");
  std::map<std::string, at::Tensor> cpp_iso;
  std::vector<std::tuple<std::string, int, double, std::map<std::string, at::Tensor>>> rows;
  for (const char* method : {"iso_c", "iso_c_fast"}) {
    for (int threads : {1, 2}) {
      MergePlan plan;
      plan.method = method;
      MergeSelector sel(plan);
      std::mutex mu;
      std::map<std::string, at::Tensor> out;
      auto t = Clock::now();
      merge_tensors(
          sel, names,
          [&](const std::string& n) {
            MergeInput in{n, {}, {}};
            for (auto& f : inputs) in.deltas.push_back(f.tensors.at(n) - base.tensors.at(n));
            return in;
          },
          [&](const std::string& n, const at::Tensor& m) {
            at::Tensor r = base.tensors.at(n) + m;
            std::lock_guard<std::mutex> l(mu);
            out[n] = r;
          },
          threads);
      rows.emplace_back(method, threads, seconds_since(t), std::move(out));
    }
  }
  const std::string cmd = python + " " + source_dir + "/bench/merge_reference.py " + dir.string() + " " +
                          std::to_string(T) + " > " + (dir / "python.json").string();
  double py_seconds = -1;
  std::map<std::string, at::Tensor> py;
  if (std::system(cmd.c_str()) == 0) {
    std::ifstream f(dir / "python.json");
    std::string line;
    std::getline(f, line);
    py_seconds = std::stod(line.substr(line.find(':') + 1));
    py = load_safetensors((dir / "python_merged.safetensors").string()).tensors;
  } else {
    std::printf("(Python reference failed: %s)\n", cmd.c_str());
  }
  auto err = [&](const std::map<std::string, at::Tensor>& out) {
    if (py.empty()) return -1.0;
    double num = 0, den = 0;
    for (auto& n : names) {
      at::Tensor a = out.at(n) - base.tensors.at(n), b = py.at(n) - base.tensors.at(n);
      num += (a - b).to(at::kDouble).square().sum().item<double>();
      den += b.to(at::kDouble).square().sum().item<double>();
    }
    return std::sqrt(num / den);
  };
  for (auto& [method, threads, secs, out] : rows)
    std::printf("| C++ deloco | %s | %d | %.3f | %.1e |\n", method.c_str(), threads, secs, err(out));
  std::printf("| Python PyTorch (torch.linalg.svd) | iso_c | %d | %.3f | - |\n", at::get_num_threads(), py_seconds);
  std::filesystem::remove_all(dir);
}


// ---- (3) iso_c_ns ---------------------------------------------------------------------------------------

template <class F>
double median_time(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto c = Clock::now();
    f();
    t.push_back(seconds_since(c));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// GFLOP/s of one large square matmul (median of `reps`) in `dt` at the current thread count.
double cosine(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x * y).sum().item<double>() / (x.norm() * y.norm()).item<double>();
}

std::unique_ptr<Merger> ns_merger(int steps, at::ScalarType dt) {
  MergeOptions o;
  o.iso_ns_steps = steps;
  o.iso_ns_dtype = dt;
  return make_merger("iso_c_ns", o);
}

// Matmul FLOPs of K steps on an m×n matrix (tall view m ≥ n): YᵀY (2mn²), A·A (2n³), Y·P (2mn²) per step.
double ns_flops(int64_t m, int64_t n, int steps) {
  if (m < n) std::swap(m, n);
  return steps * (4.0 * m * n * n + 2.0 * n * n * n);
}

// libtorch's fp32 matmul runs in OpenBLAS here (Debian's build), whose pool follows OPENBLAS_NUM_THREADS, not
// at::set_num_threads (that one sets OpenMP, used by oneDNN's bf16 matmul and by the element-wise ops). Set both,
// so "threads" means the same for every row. Returns false where no OpenBLAS is loaded.
bool set_threads(int threads) {
  at::set_num_threads(threads);
  using Fn = void (*)(int);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (fn) fn(threads);
  return fn != nullptr;
}

// Speed at n×n. Every row interleaves its runs with those of one n×n and one 2048² matmul in the row's precision
// (same threads), so the peak it is compared with was measured under the same load (the machine is shared).
void ns_speed(int64_t n, int reps, const std::vector<int>& steps_list) {
  const int64_t big = 2048;
  std::printf("\n## iso_c_ns speed, %ldx%ld fp32 Gaussian matrix, one contribution (medians of %d)\n\n", (long)n,
              (long)n, reps);
  std::printf("Peak = one square matmul in the row's precision (fp32 for iso_c/iso_c_fast), same threads, timed "
              "alternately with the row's merges; share = the iteration's matmul GFLOP/s / the %ld² peak.\n\n",
              (long)big);
  std::printf("Threads: OpenMP and %s.\n\n", set_threads(at::get_num_threads()) ? "OpenBLAS (fp32 matmul) alike"
                                                                                  : "no OpenBLAS found");
  std::printf("| threads | method | precision | steps | ms | M params/s | matmul GFLOP/s | peak %ld² GFLOP/s | "
              "peak %ld² GFLOP/s | share of %ld² peak |\n|---|---|---|---|---|---|---|---|---|---|\n",
              (long)n, (long)big, (long)big);
  auto gen = at::detail::createCPUGenerator(1234);
  at::Tensor M = at::randn({n, n}, gen, at::TensorOptions().dtype(at::kFloat));
  MergeInput in{"w", {M}, {}};
  const double params = static_cast<double>(n) * n;
  const int saved = at::get_num_threads();
  for (int threads : {1, 2}) {
    set_threads(threads);
    auto measure = [&](const char* method, at::ScalarType dt, int steps, const Merger& m, int r) {
      at::Tensor a = at::randn({n, n}).to(dt), b = at::randn({n, n}).to(dt);
      at::Tensor A = at::randn({big, big}).to(dt), B = at::randn({big, big}).to(dt);
      at::matmul(a, b);
      at::matmul(A, B);
      m.merge(in);  // warm-up
      std::vector<double> tm, ts, tb;
      for (int i = 0; i < r; ++i) {
        tm.push_back(best_time(1, [&] { m.merge(in); }));
        ts.push_back(best_time(1, [&] { at::matmul(a, b); }));
        tb.push_back(best_time(1, [&] { at::matmul(A, B); }));
      }
      for (auto* v : {&tm, &ts, &tb}) std::sort(v->begin(), v->end());
      const double t = tm[r / 2], small = 2.0 * n * n * n / ts[r / 2] / 1e9;
      const double peak = 2.0 * big * big * big / tb[r / 2] / 1e9;
      const double flops = steps > 0 ? ns_flops(n, n, steps) : 0;
      std::printf("| %d | %s | %s | %s | %.1f | %.2f | %s | %.0f | %.0f | %s |\n", threads, method,
                  dt == at::kFloat ? "fp32" : "bf16", steps > 0 ? std::to_string(steps).c_str() : "-", t * 1e3,
                  params / t / 1e6, steps > 0 ? std::to_string(static_cast<int>(flops / t / 1e9)).c_str() : "-",
                  small, peak,
                  steps > 0 ? (std::to_string(static_cast<int>(100 * flops / t / 1e9 / peak + 0.5)) + " %").c_str()
                            : "-");
      std::fflush(stdout);
    };
    measure("iso_c (SVD)", at::kFloat, 0, *make_merger("iso_c"), 3);
    measure("iso_c_fast (eigh)", at::kFloat, 0, *make_merger("iso_c_fast"), 3);
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
      for (int k : steps_list) measure("iso_c_ns", dt, k, *ns_merger(k, dt), reps);
  }
  set_threads(saved);
}

struct NamedMatrix {
  std::string name;
  at::Tensor m;
};

void ns_accuracy(const std::vector<NamedMatrix>& mats, const std::vector<int>& steps_list) {
  std::printf("\n## iso_c_ns accuracy against exact Iso-C (torch SVD in fp64): relative Frobenius error / cosine\n\n");
  std::printf("| matrix | shape | σ_min/σ_max | precision |");
  for (int k : steps_list) std::printf(" %d steps |", k);
  std::printf("\n|---|---|---|---|");
  for (size_t i = 0; i < steps_list.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (const auto& nm : mats) {
    at::Tensor M = nm.m.reshape({nm.m.size(0), -1}).to(at::kFloat);
    auto [U, S, Vh] = at::linalg_svd(M.to(at::kDouble), false);
    at::Tensor want = at::matmul(U, Vh) * S.mean();
    const double cond = (S[-1] / S[0]).item<double>();
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
      std::printf("| %s | %ldx%ld | %.1e | %s |", nm.name.c_str(), (long)M.size(0), (long)M.size(1), cond,
                  dt == at::kFloat ? "fp32" : "bf16");
      for (int k : steps_list) {
        at::Tensor got = ns_merger(k, dt)->merge({nm.name, {M}, {}});
        std::printf(" %.1e / %.6f |", rel(got, want), cosine(got, want));
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
}

std::vector<NamedMatrix> ns_inputs(int64_t n, const std::string& real_a, const std::string& real_b) {
  std::vector<NamedMatrix> v;
  auto gen = at::detail::createCPUGenerator(99);
  auto opt = at::TensorOptions().dtype(at::kFloat);
  v.push_back({"Gaussian", at::randn({n, n}, gen, opt)});
  v.push_back({"rank 32 + 1e-2 noise", at::matmul(at::randn({n, 32}, gen, opt), at::randn({32, n}, gen, opt)) /
                                           std::sqrt(32.0f) +
                                       0.01f * at::randn({n, n}, gen, opt)});
  v.push_back({"rank 32 + 1e-3 noise", at::matmul(at::randn({n, 32}, gen, opt), at::randn({32, n}, gen, opt)) /
                                           std::sqrt(32.0f) +
                                       0.001f * at::randn({n, n}, gen, opt)});
  if (!real_a.empty()) {
    const std::string fa = std::filesystem::is_directory(real_a) ? real_a + "/model.safetensors" : real_a;
    const std::string fb = std::filesystem::is_directory(real_b) ? real_b + "/model.safetensors" : real_b;
    TensorFile a = load_safetensors(fa), b = load_safetensors(fb);
    for (auto& [name, ta] : a.tensors) {
      if (ta.dim() < 2 || !b.tensors.count(name)) continue;
      if (std::min(ta.size(0), ta.numel() / ta.size(0)) < 256) continue;
      v.push_back({"Δ " + name, (b.tensors.at(name).to(at::kFloat) - ta.to(at::kFloat))});
    }
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string ns;
  std::vector<int> steps = {6, 8, 10};
  int64_t n = 1024;
  int reps = 5;
  std::string python = "/usr/bin/python3", source_dir = ".", real_a, real_b;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--ns" && i + 1 < argc) ns = argv[++i];
    else if (a == "--steps" && i + 1 < argc) {
      steps.clear();
      std::stringstream ss(argv[++i]);
      for (std::string item; std::getline(ss, item, ',');) steps.push_back(std::stoi(item));
    }
    else if (a == "--n" && i + 1 < argc) n = std::stol(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--real" && i + 2 < argc) {
      real_a = argv[++i];
      real_b = argv[++i];
    }
    else if (a == "--python" && i + 1 < argc) python = argv[++i];
    else if (a == "--source-dir" && i + 1 < argc) source_dir = argv[++i];
  }
  std::printf("# deloco merge benchmark (libtorch %s, %d intra-op threads)\n", TORCH_VERSION,
              at::get_num_threads());
  if (!ns.empty()) {
    if (ns == "speed" || ns == "all") ns_speed(n, reps, steps);
    if (ns == "accuracy" || ns == "all") ns_accuracy(ns_inputs(n, real_a, real_b), {4, 6, 8, 10, 12, 14});
    return 0;
  }
  matrices(quick);
  whole_model(quick, python, source_dir);
  return 0;
}
