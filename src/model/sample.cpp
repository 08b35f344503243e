// Text generation from a GPT (contract in include/deloco/gpt/model.h).
#include <limits>
#include <stdexcept>
#include <vector>

#include <torch/torch.h>

#include "deloco/gpt/model.h"

namespace deloco {

std::vector<int64_t> sample_tokens(LanguageModel& model, std::vector<int64_t> ctx, int64_t num_ids, const SampleOptions& opts) {
  if (ctx.empty()) throw std::invalid_argument("sample_tokens: empty prompt");
  model.train(false);
  torch::NoGradGuard no_grad;
  torch::manual_seed(static_cast<uint64_t>(opts.seed));
  const auto dev = model.parameters().front().second.device();
  const int64_t block_size = model.block_size();
  std::vector<int64_t> out;
  for (int64_t i = 0; i < opts.tokens; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(ctx.size()), block_size);
    auto idx = torch::tensor(std::vector<int64_t>(ctx.end() - T, ctx.end()), torch::kLong).view({1, T}).to(dev);
    auto logits = model.forward(idx).select(1, T - 1).squeeze(0).to(torch::kFloat);
    if (logits.size(0) > num_ids) logits = logits.narrow(0, 0, num_ids);  // ids the data never holds are never drawn
    int64_t next;
    if (opts.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / opts.temperature;
      if (opts.top_k > 0 && opts.top_k < logits.size(0)) {
        auto kth = std::get<0>(logits.topk(opts.top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      next = torch::multinomial(torch::softmax(logits, 0), 1).item<int64_t>();
    }
    ctx.push_back(next);
    out.push_back(next);
  }
  return out;
}

std::string sample_text(LanguageModel& model, const std::string& prompt, const SampleOptions& opts) {
  std::vector<int64_t> ctx;
  for (unsigned char c : prompt) ctx.push_back(c);
  if (ctx.empty()) ctx.push_back('\n');
  std::string out;
  for (int64_t id : sample_tokens(model, std::move(ctx), 256, opts)) out.push_back(static_cast<char>(id));
  return out;
}

}  // namespace deloco
