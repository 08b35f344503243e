#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/gpt/model.h"

namespace deloco {
namespace gpt_cases {

ModelConfig tiny() {
  ModelConfig c;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return c;
}

TEST(Model, ShapesAndParameterCount) {
  GPT m(tiny(), 1);
  auto idx = torch::randint(0, 256, {3, 16}, torch::kLong);
  auto logits = m->forward(idx);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 16, 256}));
  int64_t n = 0;
  for (auto& [name, p] : named_parameters(*m)) n += p.numel();
  EXPECT_EQ(n, tiny().num_params());
  auto shorter = m->forward(idx.narrow(1, 0, 5));
  EXPECT_EQ(shorter.size(1), 5);
  EXPECT_THROW(m->forward(torch::zeros({1, 17}, torch::kLong)), c10::Error);
}

TEST(Model, StableGpt2Names) {
  auto cfg = tiny();
  GPT tied(cfg, 1);
  auto params = named_parameters(*tied);
  EXPECT_EQ(params.front().first, "wte.weight");
  bool has_attn = false, has_head = false;
  for (auto& [name, p] : params) {
    has_attn |= name == "h.1.attn.c_attn.weight";
    has_head |= name == "lm_head.weight";
  }
  EXPECT_TRUE(has_attn);
  EXPECT_FALSE(has_head);
  cfg.tie_embeddings = false;
  GPT untied(cfg, 1);
  bool untied_head = false;
  for (auto& [name, p] : named_parameters(*untied)) untied_head |= name == "lm_head.weight";
  EXPECT_TRUE(untied_head);
  EXPECT_NE(model_fingerprint(params), model_fingerprint(named_parameters(*untied)));
}

TEST(Model, SameSeedSameInitialisation) {
  GPT a(tiny(), 7), b(tiny(), 7), c(tiny(), 8);
  auto pa = named_parameters(*a), pb = named_parameters(*b), pc = named_parameters(*c);
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].second.equal(pb[i].second)) << pa[i].first;
  EXPECT_FALSE(pa[0].second.equal(pc[0].second));
}

TEST(Model, CausalityFutureTokensNeverChangeEarlierLogits) {
  GPT m(tiny(), 3);
  torch::NoGradGuard g;
  auto idx = torch::randint(0, 256, {2, 16}, torch::kLong);
  auto base = m->forward(idx);
  for (int64_t t : {0, 5, 15}) {
    auto changed = idx.clone();
    changed.select(1, t).fill_(0);
    changed.select(1, t).add_(idx.select(1, t).add(1).remainder(256));
    auto out = m->forward(changed);
    if (t > 0) EXPECT_TRUE(torch::allclose(out.narrow(1, 0, t), base.narrow(1, 0, t), 0, 0)) << "position " << t;
    EXPECT_FALSE(torch::allclose(out.narrow(1, t, 1), base.narrow(1, t, 1))) << "position " << t;
  }
}

TEST(Model, InitialLossIsNearLn256) {
  auto cfg = tiny();
  GPT m(cfg, 5);
  torch::NoGradGuard g;
  auto idx = torch::randint(0, 256, {8, 16}, torch::kLong);
  auto tgt = torch::randint(0, 256, {8, 16}, torch::kLong);
  double loss = m->loss(idx, tgt).item<double>();
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
}

TEST(Model, FewStepsOnAFixedBatchLowerTheLoss) {
  GPT m(tiny(), 5);
  auto idx = torch::randint(0, 256, {4, 16}, torch::kLong);
  auto tgt = torch::randint(0, 256, {4, 16}, torch::kLong);
  std::vector<torch::Tensor> ps;
  for (auto& [n, p] : named_parameters(*m)) ps.push_back(p);
  torch::optim::Adam opt(ps, torch::optim::AdamOptions(3e-3));
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    opt.zero_grad();
    auto loss = m->loss(idx, tgt);
    loss.backward();
    opt.step();
    if (i == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  EXPECT_LT(last, first - 1.0);
}

}  // namespace
}  // namespace deloco
