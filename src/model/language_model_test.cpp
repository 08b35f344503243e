// TorchScript models (issue 12 item 1): a user's module is checked before anything trains it, and deloco's trainer
// takes the same inner steps as PyTorch on it. The modules and the reference steps come from Python
// (tests/python/scripted_fixtures.py, tests/python/scripted_steps.py under Debian's /usr/bin/python3), never from
// this code.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/data.h"
#include "deloco/fs.h"
#include "deloco/model.h"
#include "deloco/train.h"
#include "support/proc.h"

namespace deloco {
namespace {
namespace fs = std::filesystem;

// Runs a shell command; returns its exit status and output.
std::pair<int, std::string> shell(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  return {::pclose(p), out};
}

// The fixtures folder, made once per test process.
const fs::path& fixtures() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("deloco_scripted_" + std::to_string(::getpid()));
    fs::remove_all(d);
    auto [code, out] = shell("/usr/bin/python3 " + test::source_dir() + "/tests/python/scripted_fixtures.py " + d.string());
    if (code != 0) throw std::runtime_error("scripted_fixtures.py failed: " + out);
    return d;
  }();
  return dir;
}

// The ConfigError make_language_model throws for `file` (empty when it throws none).
std::string refusal(ModelConfig c, const std::string& file) {
  c.kind = "torchscript";
  c.path = (fixtures() / file).string();
  try {
    make_language_model(&c, 0, torch::kCPU);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ScriptedModel, ModulesThatDoNotFitAreRefusedSayingWhatWasExpected) {
  ModelConfig c;
  c.vocab_size = 300;
  c.block_size = 16;
  std::string e = refusal(c, "not_a_module.pt");
  EXPECT_NE(e.find("not_a_module.pt' is not a TorchScript module"), std::string::npos) << e;
  e = refusal(c, "absent.pt");
  EXPECT_NE(e.find("absent.pt' is not a TorchScript module"), std::string::npos) << e;
  e = refusal(c, "two_args.pt");
  EXPECT_NE(e.find("mask"), std::string::npos) << e;  // the signature found
  EXPECT_NE(e.find("forward(self, idx: Tensor) -> Tensor"), std::string::npos) << e;  // the one expected
  e = refusal(c, "flat_logits.pt");
  EXPECT_NE(e.find("returned [2, 16] float, expected [2, 16, 300] float"), std::string::npos) << e;
  e = refusal(c, "float64.pt");
  EXPECT_NE(e.find("parameter 'scale' is Double"), std::string::npos) << e;
  // Without attributes, V comes from model.vocab_size: a wrong one is refused naming where it came from.
  c.vocab_size = 256;
  e = refusal(c, "no_attrs.pt");
  EXPECT_NE(e.find("expected [2, 16, 256] float (V = 256 from model.vocab_size)"), std::string::npos) << e;
  c.vocab_size = 300;
  EXPECT_EQ(refusal(c, "no_attrs.pt"), "");
}

TEST(ScriptedModel, TheModuleSaysVAndTAndKeepsItsParameterNames) {
  ModelConfig c;
  c.kind = "torchscript";
  c.path = (fixtures() / "llama.pt").string();
  c.vocab_size = 999;  // the module's attributes win
  c.block_size = 3;
  auto m = make_language_model(&c, 0, torch::kCPU);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.block_size, 16);
  std::vector<std::string> names;
  for (const auto& [n, p] : m->parameters()) names.push_back(n);
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "tok_embeddings.weight");
  EXPECT_NE(std::find(names.begin(), names.end(), "layers.1.feed_forward.w3.weight"), names.end());
  // Handles: writing into a parameter changes what forward computes.
  auto x = torch::zeros({1, 4}, torch::kLong);
  torch::NoGradGuard g;
  auto before = m->forward(x).clone();
  m->parameters().back().second.add_(1.0);
  EXPECT_FALSE(torch::allclose(before, m->forward(x)));
}

// The test: deloco's first three inner steps on a scripted model give the same losses and parameters as
// the same steps in PyTorch (relative error <= 1e-5 in fp32): same batches, same learning rates, AdamW with weight
// decay on tensors of rank >= 2 only, gradient clipping.
TEST(ScriptedModel, ThreeInnerStepsMatchPyTorch) {
  torch::set_num_threads(1);
  std::vector<std::string> docs;
  for (int i = 0; i < 12; ++i)
    docs.push_back("Fellow citizens of the Senate and of the House of Representatives, document " + std::to_string(i) +
                   ": the state of the union is strong, and the work before us is great. ");
  auto corpus = std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.2));
  RunConfig cfg;
  cfg.model.kind = "torchscript";
  cfg.model.path = (fixtures() / "llama.pt").string();
  cfg.train.batch_size = 4;
  cfg.train.steps = 3;
  cfg.train.warmup_steps = 1;
  cfg.train.lr = 1e-2;
  cfg.train.grad_clip = 1.0;
  cfg.train.eval_tokens = 64;
  Trainer tr(cfg, corpus);
  const int64_t T = tr.config().model.block_size;
  ASSERT_EQ(T, 16);
  std::map<std::string, at::Tensor> initial;
  for (const auto& [n, p] : tr.parameters()) initial[n] = p.detach().clone();

  ShardSampler sampler(corpus->train(), 0, 1, T, static_cast<uint64_t>(cfg.train.seed));  // the trainer's batches
  nlohmann::json steps{{"grad_clip", cfg.train.grad_clip}, {"betas", {cfg.train.beta1, cfg.train.beta2}},
                       {"eps", 1e-8}, {"weight_decay", cfg.train.weight_decay}};
  std::vector<double> losses;
  for (int64_t s = 0; s < 3; ++s) {
    at::Tensor b = sampler.batch(s, cfg.train.batch_size);
    std::vector<std::vector<int64_t>> rows;
    for (int64_t r = 0; r < b.size(0); ++r) {
      auto row = b[r].contiguous();
      rows.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
    }
    steps["batches"].push_back(rows);
    steps["lrs"].push_back(tr.current_lr());
    losses.push_back(tr.train_step());
  }
  const fs::path dir = fixtures();
  write_file_atomic((dir / "steps.json").string(), steps.dump());
  auto [code, out] = shell("/usr/bin/python3 " + test::source_dir() + "/tests/python/scripted_steps.py " +
                           cfg.model.path + " " + (dir / "steps.json").string() + " " + (dir / "ref.json").string());
  ASSERT_EQ(code, 0) << out;
  const auto ref = nlohmann::json::parse(read_file((dir / "ref.json").string()));
  for (size_t s = 0; s < 3; ++s) {
    const double want = ref["losses"][s].get<double>();
    EXPECT_LE(std::abs(losses[s] - want) / std::abs(want), 1e-5) << "step " << s << ": " << losses[s] << " vs " << want;
  }
  size_t compared = 0;
  for (const auto& [n, p] : tr.parameters()) {
    const auto& values = ref["params"].at(n);
    auto want = torch::tensor(values.get<std::vector<float>>(), torch::kFloat).view(p.sizes());
    const double err = (p.detach() - want).norm().item<double>() / want.norm().item<double>();
    EXPECT_LE(err, 1e-5) << n;
    // ... and the steps moved it: the comparison is not of untouched parameters.
    EXPECT_GT((p.detach() - initial[n]).norm().item<double>() / initial[n].norm().item<double>(), 1e-4) << n;
    ++compared;
  }
  EXPECT_EQ(compared, ref["params"].size());
}

}  // namespace
}  // namespace deloco
