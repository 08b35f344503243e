// Muon (train/muon.h) against a Muon step written in PyTorch from the papers' description (tests/python/muon_steps.py
// under Debian's /usr/bin/python3), never from this C++: the same parameters and gradients through three steps give
// the same parameters, within float32 round-off with the Newton–Schulz iteration in fp32 and within bf16's with it in
// bf16. Plus which parameters Muon takes, its state across a checkpoint, and a clear refusal of AdamW's state.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/error.h"
#include "deloco/gpt/train.h"
#include "deloco/gpt/config.h"
#include "deloco/gpt/model.h"
#include "support/proc.h"
#include "support/shell.h"
#include "train/muon.h"
#include "util/fs.h"

namespace deloco {
namespace muon_cases {
namespace fs = std::filesystem;

using test::shell;

constexpr int64_t kVocab = 40, kC = 8;

// A GPT-shaped set of parameters: embeddings and head (AdamW), hidden matrices of four shapes, two of one shape (one
// batched pass), a wide one, and vectors.
NamedTensors gpt_like(uint64_t seed) {
  torch::manual_seed(seed);
  NamedTensors p;
  for (const auto& [name, sizes] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"wte.weight", {kVocab, kC}},
           {"wpe.weight", {16, kC}},
           {"h.0.attn.c_attn.weight", {3 * kC, kC}},
           {"h.0.attn.c_attn.bias", {3 * kC}},
           {"h.0.attn.c_proj.weight", {kC, kC}},
           {"h.1.attn.c_proj.weight", {kC, kC}},
           {"h.0.mlp.c_fc.weight", {4 * kC, kC}},
           {"h.0.mlp.c_proj.weight", {kC, 4 * kC}},
           {"h.0.ln_1.weight", {kC}},
           {"lm_head.weight", {kVocab, kC}}})
    p.emplace_back(name, torch::randn(sizes).mul_(0.1).requires_grad_(true));
  return p;
}

std::vector<float> flat(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

// Three steps of deloco's Muon and of the PyTorch reference; the largest relative error of a parameter's change.
double reference_gap(const std::string& ns_dtype, bool nesterov) {
  NamedTensors params = gpt_like(3);
  std::vector<torch::Tensor> initial;
  nlohmann::json in;
  for (const auto& [n, p] : params) {
    in["params"][n] = {{"shape", p.sizes().vec()}, {"values", flat(p)}};
    initial.push_back(p.detach().clone());
  }
  MuonOptions o;
  o.ns_dtype = ns_dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  o.nesterov = nesterov;
  std::vector<bool> use;
  for (const auto& [n, p] : params) use.push_back(muon_takes(n, p.sizes(), kVocab, true));
  Muon muon(params, use, AdamWOptions{}, o);
  const std::vector<double> lrs = {0.01, 0.02, 0.015};
  const std::vector<double> scales = {1.0, 0.5, 1.0};  // the clipping coefficient of step 2
  torch::manual_seed(11);
  for (size_t s = 0; s < lrs.size(); ++s) {
    nlohmann::json step{{"lr", lrs[s]}};
    for (auto& [n, p] : params) {
      p.mutable_grad() = torch::randn(p.sizes());
      step["grads"][n] = flat(p.grad() * scales[s]);
    }
    muon.step(lrs[s], scales[s]);
    in["steps"].push_back(step);
  }
  in["momentum"] = o.momentum;
  in["nesterov"] = nesterov;
  in["ns_steps"] = o.ns_steps;
  in["ns_dtype"] = ns_dtype;
  in["weight_decay"] = o.weight_decay;
  in["betas"] = {0.9, 0.95};
  in["eps"] = 1e-8;
  const fs::path dir = fs::temp_directory_path() / ("deloco_muon_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  write_file_atomic((dir / "in.json").string(), in.dump());
  auto [code, out] = shell("/usr/bin/python3 " + test::source_dir() + "/tests/python/muon_steps.py " +
                           (dir / "in.json").string() + " " + (dir / "out.json").string());
  EXPECT_EQ(code, 0) << out;
  if (code != 0) return 1e9;
  const auto ref = nlohmann::json::parse(read_file((dir / "out.json").string()));
  fs::remove_all(dir);
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [n, p] = params[i];
    const torch::Tensor want = torch::tensor(ref.at(n).get<std::vector<float>>()).view(p.sizes());
    const torch::Tensor moved = want - initial[i];
    EXPECT_GT(moved.norm().item<double>(), 1e-3 * initial[i].norm().item<double>()) << n << " did not move";
    const double err = (p.detach() - want).norm().item<double>() / moved.norm().item<double>();
    worst = std::max(worst, err);
    EXPECT_TRUE(std::isfinite(err)) << n;
  }
  return worst;
}

TEST(MuonReference, ThreeStepsMatchPyTorchInFp32) {
  torch::set_num_threads(1);
  EXPECT_LT(reference_gap("fp32", true), 1e-4);
  EXPECT_LT(reference_gap("fp32", false), 1e-4);
}

TEST(MuonReference, ThreeStepsMatchPyTorchWithinBf16RoundOff) {
  torch::set_num_threads(1);
  // bf16 keeps 8 significant bits: each iterate is rounded to ~0.4 %, and the two implementations round at
  // different places (normalising before or after the cast, (aI + bA + cA²)X against aX + (bA + cA²)X).
  EXPECT_LT(reference_gap("bf16", true), 5e-2);
}

TEST(Muon, TakesTheHiddenMatricesOnly) {
  // The built-in GPT: by name.
  EXPECT_TRUE(muon_takes("h.0.attn.c_attn.weight", {3 * kC, kC}, kVocab, true));
  EXPECT_TRUE(muon_takes("h.0.mlp.c_proj.weight", {kC, 4 * kC}, kVocab, true));
  EXPECT_TRUE(muon_takes("h.0.mlp.c_fc.weight", {4 * kC, kC}, 4 * kC, true));  // as wide as the vocabulary
  EXPECT_FALSE(muon_takes("wte.weight", {kVocab, kC}, kVocab, true));
  EXPECT_FALSE(muon_takes("wpe.weight", {16, kC}, kVocab, true));
  EXPECT_FALSE(muon_takes("lm_head.weight", {kVocab, kC}, kVocab, true));
  EXPECT_FALSE(muon_takes("h.0.attn.c_attn.bias", {3 * kC}, kVocab, true));
  // A TorchScript model: by name, else by a dimension equal to the vocabulary.
  EXPECT_TRUE(muon_takes("layers.0.w1.weight", {4 * kC, kC}, kVocab, false));
  EXPECT_FALSE(muon_takes("output.weight", {kVocab, kC}, kVocab, false));  // a head by its vocabulary dimension
  EXPECT_FALSE(muon_takes("tok_embeddings.weight", {kVocab, kC}, kVocab, false));
  EXPECT_FALSE(muon_takes("h.0.attn.c_attn.bias", {3 * kC}, kVocab, false));
  EXPECT_FALSE(muon_takes("conv.weight", {4, 4, 3, 3}, kVocab, false));
}

// The built-in GPT whose MLP is as wide as its vocabulary (4 · 64 = 256 bytes: experiment 12's 0.125M model): Muon
// takes every hidden matrix, c_fc and c_proj included (a dimension equal to the vocabulary once sent them to AdamW).
TEST(Muon, TakesEveryHiddenMatrixOfTheBuiltInGptWhateverItsVocabulary) {
  torch::set_num_threads(1);
  for (const int64_t C : {int64_t{64}, int64_t{256}}) {  // 4C = V, and C = V (the defaults)
    ModelConfig m;
    m.n_layer = 2;
    m.n_head = 2;
    m.n_embd = C;
    m.vocab_size = 256;
    m.block_size = 16;
    auto model = make_language_model(&m, 1, torch::kCPU);
    TrainConfig t;
    t.optimizer = "muon";
    auto opt = make_inner_optimizer(t, m, model->parameters());
    const auto names = dynamic_cast<Muon&>(*opt).muon_names();
    std::vector<std::string> want;
    for (const auto& [n, p] : model->parameters())
      if (p.dim() == 2 && n.rfind("h.", 0) == 0) want.push_back(n);
    EXPECT_EQ(want.size(), 8u) << "C = " << C;
    EXPECT_EQ(names, want) << "C = " << C;
  }
}

TEST(Muon, StateRoundTripsAndAnAdamWStateIsRefusedByName) {
  torch::set_num_threads(1);
  NamedTensors a = gpt_like(5), b = gpt_like(5);
  std::vector<bool> use;
  for (const auto& [n, p] : a) use.push_back(muon_takes(n, p.sizes(), kVocab, true));
  Muon ma(a, use, AdamWOptions{}, MuonOptions{});
  torch::manual_seed(2);
  for (auto& [n, p] : a) p.mutable_grad() = torch::randn(p.sizes());
  ma.step(0.01);
  // b takes a's parameters and state; then both take the same step and stay equal.
  Muon mb(b, use, AdamWOptions{}, MuonOptions{});
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < a.size(); ++i) b[i].second.copy_(a[i].second);
  }
  std::map<std::string, torch::Tensor> st;
  for (const auto& [k, v] : ma.state()) st[k] = v.clone();
  ASSERT_TRUE(st.count("muon_momentum/h.0.attn.c_attn.weight"));
  ASSERT_TRUE(st.count("exp_avg/wte.weight"));
  ASSERT_FALSE(st.count("exp_avg/h.0.attn.c_attn.weight"));  // AdamW holds no moments for Muon's matrices
  mb.load_state(st);
  EXPECT_EQ(mb.steps(), 1);
  for (size_t i = 0; i < a.size(); ++i) b[i].second.mutable_grad() = a[i].second.grad().clone();
  ma.step(0.02);
  mb.step(0.02);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;

  // An AdamW state (a checkpoint of train.optimizer = adamw) names the first Muon entry it lacks.
  AdamW adam(gpt_like(5), AdamWOptions{});
  try {
    mb.load_state(adam.state());
    FAIL() << "an AdamW state was taken";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("muon_momentum/"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.optimizer"), std::string::npos) << e.what();
  }
}

TEST(Muon, BadOptimizerKeysAreRefusedByName) {
  for (const auto& [set, word] : std::vector<std::pair<std::string, std::string>>{
           {"train.optimizer=sgd", "must be auto, adamw or muon, not 'sgd'"},
           {"train.muon_ns_precision=fp16", "must be auto, fp32 or bf16, not 'fp16'"},
           {"train.muon_scale=spectral", "must be rms or shape, not 'spectral'"},
           {"train.muon_momentum=1", "must be in [0, 1)"},
           {"train.muon_ns_steps=0", "must be in [1, 20]"}}) {
    RunConfig cfg;
    ConfigSchema schema;
    cfg.bind(schema);
    schema.apply_override(set);
    try {
      schema.validate();
      ADD_FAILURE() << set << " was taken";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(set.substr(0, set.find('='))), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace deloco
