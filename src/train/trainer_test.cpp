#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "train/adamw.h"

namespace deloco {
namespace trainer_cases {
namespace fs = std::filesystem;

std::shared_ptr<const Corpus> small_corpus() {
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) {
    std::string d;
    for (int k = 0; k < 60; ++k) d += "the quick brown fox " + std::to_string(i * k) + " jumps over the lazy dog. ";
    docs.push_back(d);
  }
  return std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.05));
}

RunConfig tiny_run() {
  RunConfig c;
  c.model.block_size = 16;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.train.batch_size = 4;
  c.train.steps = 12;
  c.train.warmup_steps = 3;
  c.train.lr = 3e-3;
  c.train.eval_tokens = 512;
  c.train.precision = "fp32";  // not auto: the references are float32 on every machine
  return c;
}

TEST(Train, LrScheduleWarmsUpThenDecaysToTheFloor) {
  EXPECT_DOUBLE_EQ(lr_at(0, 100, 10, 1.0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(9, 100, 10, 1.0, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(10, 100, 10, 1.0, 0.1), 1.0);
  EXPECT_NEAR(lr_at(55, 100, 10, 1.0, 0.1), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(100, 100, 10, 1.0, 0.1), 0.1, 1e-12);
  for (int s = 11; s < 100; ++s) EXPECT_LE(lr_at(s, 100, 10, 1.0, 0.1), lr_at(s - 1, 100, 10, 1.0, 0.1));
}

// libtorch's own AdamW (lr 0.01) over a matrix w and a bias b. torch applies decay to every tensor of a group, so
// the bias gets its own group without decay (deloco decays tensors of rank >= 2 only).
torch::optim::AdamW torch_adamw(const torch::Tensor& w, const torch::Tensor& b) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{w}, std::make_unique<torch::optim::AdamWOptions>(
      torch::optim::AdamWOptions(0.01).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{b}, std::make_unique<torch::optim::AdamWOptions>(
      torch::optim::AdamWOptions(0.01).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  return torch::optim::AdamW(groups, torch::optim::AdamWOptions(0.01));
}

TEST(Train, AdamWMatchesTorch) {
  torch::manual_seed(0);
  auto w = torch::randn({5, 4}), b = torch::randn({4});
  auto w2 = w.clone(), b2 = b.clone();
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  w2.set_requires_grad(true);
  b2.set_requires_grad(true);
  AdamWOptions o;
  AdamW mine({{"w", w}, {"b", b}}, o);
  torch::optim::AdamW ref = torch_adamw(w2, b2);
  auto x = torch::randn({3, 5});
  for (int i = 0; i < 5; ++i) {
    mine.zero_grad();
    ref.zero_grad();
    (x.matmul(w) + b).pow(2).sum().backward();
    (x.matmul(w2) + b2).pow(2).sum().backward();
    mine.step(0.01);
    ref.step();
  }
  EXPECT_TRUE(torch::allclose(w, w2, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(b, b2, 1e-6, 1e-7));
  EXPECT_EQ(mine.steps(), 5);
}

// The fused one-pass update with clipping folded in, on tensors large enough to be split across threads, against
// libtorch's own torch::optim::AdamW after torch::nn::utils::clip_grad_norm_ (gradients large enough to clip).
TEST(Train, FusedAdamWWithFoldedClippingMatchesTorch) {
  const int threads = torch::get_num_threads();
  torch::set_num_threads(2);
  torch::manual_seed(3);
  auto w = torch::randn({300, 400}), b = torch::randn({400});
  auto w2 = w.clone(), b2 = b.clone();
  for (auto* t : {&w, &b, &w2, &b2}) t->set_requires_grad(true);
  AdamW mine({{"w", w}, {"b", b}}, AdamWOptions{});
  torch::optim::AdamW ref = torch_adamw(w2, b2);
  auto x = torch::randn({8, 300});
  double smallest = 1;
  for (int i = 0; i < 10; ++i) {
    mine.zero_grad();
    ref.zero_grad();
    (x.matmul(w) + b).pow(2).sum().backward();
    (x.matmul(w2) + b2).pow(2).sum().backward();
    const double coef = clip_coefficient({{"w", w}, {"b", b}}, 1.0);
    smallest = std::min(smallest, coef);
    mine.step(0.01, coef);
    torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{w2, b2}, 1.0);
    ref.step();
  }
  EXPECT_LT(smallest, 0.01);  // clipping did act
  // Parameters are N(0, 1): 1e-5 absolute is float rounding of the two summation orders, amplified by Adam.
  EXPECT_TRUE(torch::allclose(w, w2, 1e-5, 1e-5)) << (w - w2).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(b, b2, 1e-5, 1e-5)) << (b - b2).abs().max().item<double>();
  // A non-contiguous parameter takes the ATen path and gives the same result as the fused one.
  auto big = torch::randn({64, 64});
  auto view = big.t(), dense = big.t().contiguous();
  view.set_requires_grad(true);
  dense.set_requires_grad(true);
  view.mutable_grad() = torch::randn({64, 64}).t();
  dense.mutable_grad() = view.grad().contiguous();
  AdamW a({{"v", view}}, AdamWOptions{}), c({{"d", dense}}, AdamWOptions{});
  for (int i = 0; i < 3; ++i) {
    a.step(0.01, 0.5);
    c.step(0.01, 0.5);
  }
  EXPECT_TRUE(torch::allclose(view, dense, 1e-6, 1e-7));
  torch::set_num_threads(threads);
}

TEST(Train, StepsLowerTheValidationLoss) {
  auto corpus = small_corpus();
  auto cfg = tiny_run();
  cfg.train.steps = 60;
  Trainer tr(cfg, corpus);
  auto before = tr.evaluate();
  EXPECT_NEAR(before.loss, std::log(256.0), 0.2);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(std::isfinite(tr.train_step()));
  auto after = tr.evaluate();
  EXPECT_LT(after.loss, before.loss - 1.0);
  EXPECT_NEAR(after.bpb, after.loss / std::log(2.0), 1e-12);
  EXPECT_EQ(tr.tokens_seen(), 60 * 4 * 16);
}

TEST(Train, ResumeFromCheckpointGivesIdenticalLosses) {
  torch::set_num_threads(1);
  auto corpus = small_corpus();
  auto cfg = tiny_run();
  Trainer straight(cfg, corpus);
  std::vector<double> want;
  for (int i = 0; i < 12; ++i) want.push_back(straight.train_step());

  auto dir = fs::temp_directory_path() / ("deloco_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    Trainer first(cfg, corpus);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(first.train_step(), want[i]);
    nlohmann::json m = first.position();
    auto opt = first.optimizer_file();
    write_checkpoint((dir / "ck").string(), m, parameters_to_file(first.parameters()), &opt);
  }
  Trainer second(cfg, corpus);  // fresh weights, then restored
  second.restore(read_checkpoint((dir / "ck").string(), true));
  EXPECT_EQ(second.step(), 6);
  for (int i = 6; i < 12; ++i) EXPECT_EQ(second.train_step(), want[i]) << "step " << i;
  auto pa = straight.parameters(), pb = second.parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].second.equal(pb[i].second)) << pa[i].first;
  fs::remove_all(dir);
}

TEST(Train, CheckpointRoundTripIsBitExactAndRefusesOverwrite) {
  auto corpus = small_corpus();
  auto cfg = tiny_run();
  Trainer tr(cfg, corpus);
  tr.train_step();
  auto dir = fs::temp_directory_path() / ("deloco_ck_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto opt = tr.optimizer_file();
  write_checkpoint((dir / "a").string(), tr.position(), parameters_to_file(tr.parameters()), &opt);
  auto ck = read_checkpoint((dir / "a").string(), true);
  for (auto& [name, p] : tr.parameters()) EXPECT_TRUE(ck.model.tensors.at(name).equal(p)) << name;
  for (auto& [name, t] : tr.optimizer().state()) EXPECT_TRUE(ck.optimizer.tensors.at(name).equal(t)) << name;
  EXPECT_THROW(write_checkpoint((dir / "a").string(), tr.position(), parameters_to_file(tr.parameters()), &opt),
               CheckpointError);
  // No temporary folder is left behind.
  int entries = 0;
  for (auto& e : fs::directory_iterator(dir)) { (void)e; ++entries; }
  EXPECT_EQ(entries, 1);
  fs::remove_all(dir);
}

TEST(Train, RestoreRejectsAnotherModelShape) {
  auto corpus = small_corpus();
  auto cfg = tiny_run();
  Trainer tr(cfg, corpus);
  auto dir = fs::temp_directory_path() / ("deloco_shape_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  write_checkpoint(dir.string(), tr.position(), parameters_to_file(tr.parameters()), nullptr);
  auto other = cfg;
  other.model.n_embd = 48;
  Trainer wrong(other, corpus);
  try {
    wrong.restore(read_checkpoint(dir.string(), true));
    FAIL() << "restored a checkpoint of another shape";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("wte.weight"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Train, ConfigRejectsBadValues) {
  RunConfig cfg;
  ConfigSchema s;
  cfg.bind(s);
  EXPECT_THROW(s.load_string("[train]\nstepz = 3\n", "x.toml"), ConfigError);
  EXPECT_THROW(s.load_string("[train]\nsteps = \"many\"\n", "x.toml"), ConfigError);
  s.apply_override("model.n_head=3");
  EXPECT_THROW(s.validate(), ConfigError);  // 3 does not divide 256
  s.apply_override("model.n_head=4");
  s.apply_override("train.device=tpu");
  EXPECT_THROW(s.validate(), ConfigError);
}

}  // namespace
}  // namespace deloco

namespace deloco {
namespace trainer_cases {

// Issue 12 item 5: train.precision = bf16 runs the training forward under bf16 autocast and keeps everything else
// float32: the parameters, the optimizer state, the loss and evaluation. It must really compute in bf16 (its
// parameters after one step differ from the fp32 run's), stay close to fp32 (the same first loss to 2%), learn,
// and leave autocast off afterwards.
TEST(Train, Bf16AutocastKeepsFloat32MastersAndLearns) {
  torch::set_num_threads(1);
  auto corpus = small_corpus();
  RunConfig a = tiny_run(), b = tiny_run();
  b.train.precision = "bf16";
  Trainer fp32(a, corpus), bf16(b, corpus);
  const double l32 = fp32.train_step(), l16 = bf16.train_step();
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_NEAR(l16, l32, 0.02 * l32);
  bool differs = false;
  for (size_t i = 0; i < fp32.parameters().size(); ++i) {
    const auto& p = bf16.parameters()[i].second;
    EXPECT_EQ(p.scalar_type(), torch::kFloat) << bf16.parameters()[i].first;
    differs = differs || !torch::equal(p, fp32.parameters()[i].second);
  }
  EXPECT_TRUE(differs) << "bf16 gave bit-identical parameters: autocast did not act";
  int moments = 0;
  for (const auto& [name, t] : bf16.optimizer_state())
    if (name.rfind("exp_avg", 0) == 0) {  // exp_avg/<name>, exp_avg_sq/<name> (and an int64 step counter)
      EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;
      ++moments;
    }
  EXPECT_EQ(moments, static_cast<int>(2 * bf16.parameters().size()));
  const EvalResult before = bf16.evaluate();
  for (int s = 1; s < b.train.steps; ++s) bf16.train_step();
  const EvalResult after = bf16.evaluate();
  EXPECT_TRUE(std::isfinite(after.loss));
  EXPECT_LT(after.loss, before.loss);
  // Evaluation itself is float32: it does not depend on train.precision.
  RunConfig b32 = b;
  b32.train.precision = "fp32";
  Trainer same(b32, corpus);
  for (size_t i = 0; i < same.parameters().size(); ++i) same.parameters()[i].second.detach().copy_(bf16.parameters()[i].second);
  EXPECT_EQ(same.evaluate().loss, after.loss);
}

TEST(Train, PrecisionMustBeFp32OrBf16) {
  RunConfig c;
  ConfigSchema s;
  c.bind(s);
  s.apply_override("train.precision=fp16");
  try {
    s.validate();
    FAIL() << "fp16 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.precision"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fp16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deloco
