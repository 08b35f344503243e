// train.precision = auto (deloco/gpt/precision.h): the probe's choice follows its own measurement, named settings
// pass through unmeasured, and a Trainer resolves auto before its first step.
#include "deloco/gpt/precision.h"

#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/error.h"
#include "deloco/gpt/train.h"

namespace deloco {
namespace precision_cases {

const std::vector<MatmulShape> kShapes = {{256, 64, 192}, {256, 64, 64}, {256, 64, 192}, {256, 256, 64}};

TEST(Precision, NamedSettingsPassThroughUnmeasured) {
  for (const char* s : {"fp32", "bf16"}) {
    const PrecisionChoice c = resolve_precision(s, kShapes, torch::kCPU);
    EXPECT_EQ(c.chosen, s);
    EXPECT_EQ(c.setting, s);
    EXPECT_FALSE(c.measured);
    EXPECT_EQ(c.fp32_gflops, 0);
    EXPECT_EQ(c.describe(), s);
  }
}

TEST(Precision, UnknownSettingIsAConfigErrorNamingTheKey) {
  try {
    resolve_precision("fp16", kShapes, torch::kCPU);
    FAIL() << "fp16 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.precision"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fp16"), std::string::npos) << e.what();
  }
}

TEST(Precision, AutoMeasuresBothAndChoosesByTheMargin) {
  const PrecisionChoice c = resolve_precision("auto", kShapes, torch::kCPU);
  EXPECT_TRUE(c.measured);
  EXPECT_EQ(c.setting, "auto");
  EXPECT_GT(c.fp32_gflops, 0);
  EXPECT_GT(c.bf16_gflops, 0);
  EXPECT_EQ(c.chosen, c.bf16_gflops >= kBf16Margin * c.fp32_gflops ? "bf16" : "fp32");
  EXPECT_NE(c.describe().find("GFLOP/s"), std::string::npos) << c.describe();
  // The measurement is cached for the same shapes, device and threads; the margin applies to it per call.
  const PrecisionChoice always = resolve_precision("auto", kShapes, torch::kCPU, /*margin=*/0.0);
  const PrecisionChoice never = resolve_precision("auto", kShapes, torch::kCPU, /*margin=*/1e12);
  EXPECT_EQ(always.chosen, "bf16");
  EXPECT_EQ(never.chosen, "fp32");
  EXPECT_EQ(always.fp32_gflops, c.fp32_gflops);
  EXPECT_EQ(never.bf16_gflops, c.bf16_gflops);
}

TEST(Precision, ForwardMatmulsAreRowsTimesInTimesOut) {
  const auto m = forward_matmuls({{192, 64}, {64, 256}}, 512);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], (MatmulShape{512, 64, 192}));
  EXPECT_EQ(m[1], (MatmulShape{512, 256, 64}));
}

TEST(Precision, ConfigAcceptsAutoAndItIsTheDefault) {
  RunConfig cfg;
  EXPECT_EQ(cfg.train.precision, "auto");
  ConfigSchema s;
  cfg.bind(s);
  s.apply_override("train.precision=auto");
  EXPECT_NO_THROW(s.validate());
  s.apply_override("train.precision=half");
  try {
    s.validate();
    FAIL() << "half accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("auto, fp32 or bf16"), std::string::npos) << e.what();
  }
}

TEST(Precision, TrainerResolvesAutoBeforeItsFirstStep) {
  RunConfig cfg;
  cfg.model.block_size = 16;
  cfg.model.n_layer = 1;
  cfg.model.n_head = 2;
  cfg.model.n_embd = 32;
  cfg.train.batch_size = 4;
  cfg.train.steps = 3;
  cfg.train.eval_tokens = 256;
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) docs.push_back(std::string(400, static_cast<char>('a' + i % 26)) + " the quick brown fox");
  auto corpus = std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.1));
  Trainer tr(cfg, corpus);
  EXPECT_TRUE(tr.compute_precision().chosen.empty());  // not measured until needed
  const double loss = tr.train_step();
  EXPECT_TRUE(std::isfinite(loss));
  const ComputePrecision cp = tr.compute_precision();
  EXPECT_EQ(cp.setting, "auto");
  EXPECT_TRUE(cp.chosen == "fp32" || cp.chosen == "bf16") << cp.chosen;
  EXPECT_EQ(tr.config().train.precision, cp.chosen);
  EXPECT_GT(cp.fp32_gflops, 0);
  EXPECT_EQ(cp.chosen, cp.bf16_gflops >= kBf16Margin * cp.fp32_gflops ? "bf16" : "fp32");
}

}  // namespace
}  // namespace deloco
