#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/gpt/model.h"

namespace deloco {
namespace sample_cases {

ModelConfig tiny() {
  ModelConfig c;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return c;
}

TEST(Sample, SameSeedSameTextAndTheRequestedLength) {
  ModelConfig c = tiny();
  auto model = make_language_model(&c, 3, torch::kCPU);
  LanguageModel& m = *model;
  SampleOptions o;
  o.tokens = 40;
  o.seed = 5;
  const std::string a = sample_text(m, "The ", o), b = sample_text(m, "The ", o);
  EXPECT_EQ(a.size(), 40u);
  EXPECT_EQ(a, b);
  o.seed = 6;
  EXPECT_NE(sample_text(m, "The ", o), a);  // 40 bytes from an untrained model: a collision is (256^-40)-unlikely
  EXPECT_FALSE(m.training());
}

TEST(Sample, GreedyAndTopOneAreTheArgmaxAndLongPromptsAreCut) {
  ModelConfig c = tiny();
  auto model = make_language_model(&c, 3, torch::kCPU);
  LanguageModel& m = *model;
  const std::string prompt(40, 'x');  // longer than block_size: only the last 16 bytes are seen
  SampleOptions greedy;
  greedy.tokens = 5;
  greedy.temperature = 0;
  const std::string g = sample_text(m, prompt, greedy);
  torch::NoGradGuard no_grad;
  auto idx = torch::full({1, 16}, static_cast<int64_t>('x'), torch::kLong);
  EXPECT_EQ(static_cast<unsigned char>(g[0]), m.forward(idx).select(1, 15).squeeze(0).argmax().item<int64_t>());
  SampleOptions top1 = greedy;
  top1.temperature = 0.7;
  top1.top_k = 1;
  EXPECT_EQ(sample_text(m, prompt, top1), g);
  EXPECT_EQ(sample_text(m, "", greedy), sample_text(m, "\n", greedy));
}

}  // namespace
}  // namespace deloco
