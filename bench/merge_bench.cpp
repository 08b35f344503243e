// merge_bench: (1) iso_c (SVD) vs iso_c_fast (Gram eigendecomposition) on square and tall matrices, time and
// relative Frobenius error; (2) a whole-model Iso-C merge of T = 8 task vectors in C++ vs the same computation
// in Python PyTorch (bench/merge_reference.py, torch.linalg.svd per tensor), in one run.
//
//   ./build-merge/merge_bench [--quick] [--python /usr/bin/python3] [--source-dir .]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>

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

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string python = "/usr/bin/python3", source_dir = ".";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--python" && i + 1 < argc) python = argv[++i];
    else if (a == "--source-dir" && i + 1 < argc) source_dir = argv[++i];
  }
  std::printf("# deloco merge benchmark (libtorch %s, %d intra-op threads)\n", TORCH_VERSION,
              at::get_num_threads());
  matrices(quick);
  whole_model(quick, python, source_dir);
  return 0;
}
