// TorchScript models (issue 12 item 1): a user's module is checked before anything trains it, and deloco's trainer
// takes the same inner steps as PyTorch on it. The modules and the reference steps come from Python
// (tests/python/scripted_fixtures.py, tests/python/scripted_steps.py under Debian's /usr/bin/python3), never from
// this code.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/gpt/data.h"
#include "deloco/gpt/model.h"
#include "deloco/gpt/train.h"
#include "support/proc.h"
#include "support/shell.h"
#include "util/fs.h"

namespace deloco {
namespace language_model_cases {
namespace fs = std::filesystem;

using test::shell;

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

// The issue's test: deloco's first three inner steps on a scripted model give the same losses and parameters as
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
  cfg.train.precision = "fp32";  // the reference is float32 (not "auto", which may pick bf16 on a busy machine)
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

// ---- Issue 29 item 11: a module that fails while training says which module, where, and what -----------------

std::shared_ptr<const Corpus> small_corpus() {
  std::vector<std::string> docs;
  for (int i = 0; i < 12; ++i) docs.push_back("Fellow citizens, document " + std::to_string(i) + ": the work before us is great. ");
  return std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.2));
}

// A run config for a fixture without vocab_size / block_size attributes (V 300, T 16), batch 4.
RunConfig scripted_config(const std::string& file) {
  RunConfig cfg;
  cfg.model.kind = "torchscript";
  cfg.model.path = (fixtures() / file).string();
  cfg.model.vocab_size = 300;
  cfg.model.block_size = 16;
  cfg.train.batch_size = 4;
  cfg.train.steps = 3;
  cfg.train.eval_tokens = 64;
  cfg.train.precision = "fp32";  // not auto: the references are float32 on every machine
  return cfg;
}

// What train_step throws, as ModelError (empty when it throws none or something else).
std::string model_error_of_step(Trainer& tr) {
  try {
    tr.train_step();
  } catch (const ModelError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a ModelError: " << e.what();
    return "";
  }
  return "";
}

void expect_no_cpp_frames(const std::string& m) {
  for (const char* cpp : {"frame #", "Exception raised from", "Traceback of TorchScript", "code/__torch__"})
    EXPECT_EQ(m.find(cpp), std::string::npos) << cpp << " in: " << m;
}

TEST(ScriptedModel, ForwardFailingWhileTrainingNamesTheModuleTheStepAndTheError) {
  torch::set_num_threads(1);
  const RunConfig cfg = scripted_config("fixed_batch.pt");
  Trainer tr(cfg, small_corpus());  // its trial forward on [2, 16] passes
  const std::string m = model_error_of_step(tr);
  EXPECT_EQ(m.rfind("model.path=" + cfg.model.path + ": forward failed at step 1: RuntimeError: shape '[2, 16, 300]' is "
                    "invalid for input of size 19200", 0),
            0u)
      << m;
  // Where in the user's source: the fixture's own file and line of code.
  EXPECT_NE(m.find("scripted_fixtures.py\", line "), std::string::npos) << m;
  EXPECT_NE(m.find(".view(2, idx.size(1), 300)"), std::string::npos) << m;
  expect_no_cpp_frames(m);
  EXPECT_EQ(tr.step(), 0);
  // Evaluation (batches of 4 windows) says so too.
  try {
    tr.evaluate();
    ADD_FAILURE() << "evaluate() of fixed_batch.pt did not throw";
  } catch (const ModelError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("model.path=" + cfg.model.path + ": forward failed in evaluation after step 0: ", 0), 0u)
        << e.what();
  }
}

TEST(ScriptedModel, NonFiniteLogitsOfTheModuleAreBlamedOnTheModuleNotTheLearningRate) {
  torch::set_num_threads(1);
  const RunConfig cfg = scripted_config("nan_on_data.pt");
  Trainer tr(cfg, small_corpus());
  std::map<std::string, at::Tensor> before;
  for (const auto& [n, p] : tr.parameters()) before[n] = p.detach().clone();
  const std::string m = model_error_of_step(tr);
  EXPECT_EQ(m.rfind("model.path=" + cfg.model.path + ": the module's forward returned non-finite logits at step 1 (19200 NaN", 0),
            0u)
      << m;
  EXPECT_NE(m.find("although every parameter is finite"), std::string::npos) << m;
  EXPECT_EQ(m.find("lower train.lr"), std::string::npos) << m;
  // Nothing was applied: the parameters are as they were.
  for (const auto& [n, p] : tr.parameters()) EXPECT_TRUE(torch::equal(p, before[n])) << n;
  // A module whose logits are never finite is refused before training.
  ModelConfig c;
  c.vocab_size = 300;
  c.block_size = 16;
  const std::string e = refusal(c, "nan_always.pt");
  EXPECT_NE(e.find("nan_always.pt': forward on int64 ids [2, 16] (all zeros) returned non-finite logits"), std::string::npos) << e;
}

// The text of an error with C++ frames (what TORCH_SHOW_CPP_STACKTRACES=1 appends, and c10::Error's what()) keeps
// only the error's own lines; without a TorchScript traceback, the message as it is.
TEST(ScriptedModel, ScriptErrorTextDropsCppFramesAndTheSerializedCode) {
  const std::runtime_error traced(
      "The following operation failed in the TorchScript interpreter.\n"
      "Traceback of TorchScript, serialized code (most recent call last):\n"
      "  File \"code/__torch__.py\", line 13, in forward\n"
      "    _1 = torch.view(_0, [2, torch.size(idx, 1), 300])\n"
      "         ~~~~~~~~~~ <--- HERE\n"
      "    return _1\n"
      "\n"
      "Traceback of TorchScript, original code (most recent call last):\n"
      "  File \"/src/model.py\", line 7, in forward\n"
      "    def forward(self, idx):\n"
      "        return self.head(idx).view(2, -1)\n"
      "               ~~~~~~~~~~~~~~~~~~ <--- HERE\n"
      "RuntimeError: shape '[2, -1]' is invalid\n"
      "shape '[2, -1]' is invalid\n"
      "Exception raised from infer_size_impl at ../aten/src/ATen/InferSize.h:71 (most recent call first):\n"
      "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f in /usr/lib/libc10.so)\n");
  EXPECT_EQ(script_error_text(traced),
            "RuntimeError: shape '[2, -1]' is invalid\nshape '[2, -1]' is invalid (File \"/src/model.py\", line 7, in "
            "forward: return self.head(idx).view(2, -1))");
  EXPECT_EQ(script_error_text(std::runtime_error("index out of range in self\nException raised from x at y.cpp:1\nframe #0: z")),
            "index out of range in self");
}

}  // namespace
}  // namespace deloco
