// The fused kernels (model/kernels.h) against the ATen compositions they replace, evaluated in float64 on the same
// inputs; then the GPT and a whole training step with train.fused on against off.
#include <cmath>
#include <string>

#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "deloco/gpt/model.h"
#include "deloco/gpt/train.h"
#include "model/kernels.h"

namespace deloco {
namespace kernels_cases {

// Runs the body with the AVX-512 loops (where the CPU has them) and with the portable ones.
template <typename F>
void both_paths(F body) {
  for (bool avx : {true, false}) {
    kernels::set_avx512(avx);
    SCOPED_TRACE(kernels::avx512_active() ? "avx512" : "portable");
    body();
  }
  kernels::set_avx512(true);
}

torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

double max_abs(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// The fused function of `in` (float32 or bf16) and its input gradient for upstream `up`, against the reference
// composition run in float64 on the same values.
struct Compared {
  double value_err, grad_err, grad_scale;
};
template <typename Fused, typename Ref>
Compared compare(Fused fused, Ref ref, const torch::Tensor& in, const torch::Tensor& up) {
  auto x = leaf(in);
  auto y = fused(x);
  EXPECT_EQ(y.scalar_type(), in.scalar_type());
  y.backward(up.to(y.scalar_type()));
  EXPECT_EQ(x.grad().scalar_type(), in.scalar_type());
  auto xd = leaf(in.to(torch::kDouble));
  auto yd = ref(xd);
  yd.backward(up.to(torch::kDouble));
  return {max_abs(y, yd), max_abs(x.grad(), xd.grad()), xd.grad().abs().max().item<double>()};
}

TEST(Kernels, CausalSoftmaxMatchesTheMaskedSoftmaxInFloat64) {
  torch::manual_seed(1);
  both_paths([] {
    for (int64_t T : {1, 5, 16, 17, 40}) {
      SCOPED_TRACE("T = " + std::to_string(T));
      const double scale = 0.37;
      auto s = torch::randn({2, 3, T, T}) * 3;
      auto up = torch::randn({2, 3, T, T});
      auto fused = [&](const torch::Tensor& x) { return kernels::causal_softmax(x, scale); };
      auto ref = [&](const torch::Tensor& x) { return kernels::causal_softmax_reference(x, scale); };
      // float32: probabilities to 1e-6 absolute (they are <= 1), gradients relative to their largest.
      Compared c = compare(fused, ref, s, up);
      EXPECT_LT(c.value_err, 1e-6);
      EXPECT_LT(c.grad_err, 2e-6 * std::max(1.0, c.grad_scale));
      // bf16 inputs: the float64 reference sees the same bf16 values; the outputs differ by bf16's rounding of the
      // result (2^-8 relative) and the gradients by that of the saved output and the incoming gradient.
      Compared h = compare(fused, ref, s.to(torch::kBFloat16), up.to(torch::kBFloat16));
      EXPECT_LT(h.value_err, 4e-3);
      EXPECT_LT(h.grad_err, 2e-2 * std::max(1.0, h.grad_scale));
      // The masked entries are exactly zero, forward and backward.
      auto x = s.clone().set_requires_grad(true);
      auto y = kernels::causal_softmax(x, scale);
      y.backward(up);
      auto future = torch::ones({T, T}, torch::kBool).triu(1);
      EXPECT_EQ(y.masked_select(future).abs().sum().item<double>(), 0.0);
      EXPECT_EQ(x.grad().masked_select(future).abs().sum().item<double>(), 0.0);
    }
  });
}

// Every element within rtol·|want| + atol of the float64 reference.
bool close(const torch::Tensor& got, const torch::Tensor& want, double rtol, double atol) {
  return torch::allclose(got.to(torch::kDouble), want.to(torch::kDouble), rtol, atol);
}

TEST(Kernels, GeluMatchesExactGeluInFloat64) {
  torch::manual_seed(3);
  both_paths([] {
    for (int64_t n : {1, 15, 16, 1000, 5000}) {
      SCOPED_TRACE("n = " + std::to_string(n));
      auto x0 = torch::randn({n}) * 3, up = torch::randn({n});
      for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
        const bool bf16 = dtype == torch::kBFloat16;
        auto x = leaf(x0.to(dtype));
        auto y = kernels::gelu(x);
        y.backward(up.to(dtype));
        EXPECT_EQ(y.scalar_type(), dtype);
        EXPECT_EQ(x.grad().scalar_type(), dtype);
        auto xd = leaf(x0.to(dtype).to(torch::kDouble));
        auto yd = torch::gelu(xd);
        yd.backward(up.to(dtype).to(torch::kDouble));
        // float32: a few float roundings; bf16: the rounding of the result to 8 bits.
        EXPECT_TRUE(close(y, yd, bf16 ? 8e-3 : 1e-6, bf16 ? 1e-3 : 1e-7)) << dtype << " " << max_abs(y, yd);
        EXPECT_TRUE(close(x.grad(), xd.grad(), bf16 ? 8e-3 : 1e-6, bf16 ? 2e-2 : 1e-6))
            << dtype << " " << max_abs(x.grad(), xd.grad());
      }
    }
    // The far negative tail, where GELU is tiny: accurate relative to its value, to the conditioning of float32
    // there (rounding x/√2 moves erfc by 2z²·2^-24 relative: 9e-6 at x = -12, the same for std::erfc).
    auto x = torch::linspace(-12, -3, 301).set_requires_grad(true);
    auto y = kernels::gelu(x);
    y.sum().backward();
    auto xd = leaf(x.detach().to(torch::kDouble));
    auto yd = xd * 0.5 * torch::erfc(-xd / std::sqrt(2.0));  // ATen's 1 + erf(x/√2) cancels to 0 out here
    yd.sum().backward();
    EXPECT_LT(((y.to(torch::kDouble) - yd) / yd).abs().max().item<double>(), 2e-5);
    EXPECT_LT(((x.grad().to(torch::kDouble) - xd.grad()) / xd.grad()).abs().max().item<double>(), 2e-5);
  });
}

// layer_norm and add_layer_norm against ATen's layer_norm (and the add) in float64: values of h and y, gradients of
// x, r, w and b for upstream gradients on both outputs (h feeds the next residual add in the GPT).
TEST(Kernels, AddLayerNormMatchesLayerNormInFloat64) {
  torch::manual_seed(4);
  both_paths([] {
    for (int64_t C : {5, 16, 48, 192}) {
      SCOPED_TRACE("C = " + std::to_string(C));
      const int64_t N = 70;  // more than one block of rows in the backward's partial sums
      auto x0 = torch::randn({2, N / 2, C}) * 2 + 0.5, r0 = torch::randn({2, N / 2, C});
      auto w0 = torch::randn({C}), b0 = torch::randn({C});
      auto uh = torch::randn({2, N / 2, C}), uy = torch::randn({2, N / 2, C});
      for (auto rt : {torch::kFloat, torch::kBFloat16})
        for (auto out : {torch::kFloat, torch::kBFloat16}) {
          SCOPED_TRACE(std::string("residual ") + c10::toString(c10::ScalarType(rt)) + ", out " + c10::toString(c10::ScalarType(out)));
          const bool bf16_out = out == torch::kBFloat16;
          auto x = leaf(x0), r = leaf(r0.to(rt)), w = leaf(w0), b = leaf(b0);
          auto [h, y] = kernels::add_layer_norm(x, r, w, b, 1e-5, out);
          EXPECT_EQ(h.scalar_type(), torch::kFloat);
          EXPECT_EQ(y.scalar_type(), out);
          torch::autograd::backward({h, y}, {uh, uy.to(out)});
          auto xd = leaf(x0.to(torch::kDouble)), rd = leaf(r0.to(rt).to(torch::kDouble));
          auto wd = leaf(w0.to(torch::kDouble)), bd = leaf(b0.to(torch::kDouble));
          auto hd = xd + rd;
          auto yd = torch::layer_norm(hd, {C}, wd, bd, 1e-5);
          torch::autograd::backward({hd, yd}, {uh.to(torch::kDouble), uy.to(out).to(torch::kDouble)});
          EXPECT_TRUE(close(h, hd, 1e-7, 1e-7));
          EXPECT_TRUE(close(y, yd, bf16_out ? 8e-3 : 1e-5, bf16_out ? 1e-2 : 1e-5)) << max_abs(y, yd);
          EXPECT_EQ(r.grad().scalar_type(), rt);
          // Gradients: float32 rounding over sums of C and of N rows; a bf16 residual gets its gradient in bf16.
          EXPECT_TRUE(close(x.grad(), xd.grad(), 1e-4, 1e-4)) << max_abs(x.grad(), xd.grad());
          EXPECT_TRUE(close(r.grad(), rd.grad(), rt == torch::kBFloat16 ? 8e-3 : 1e-4, rt == torch::kBFloat16 ? 2e-2 : 1e-4))
              << max_abs(r.grad(), rd.grad());
          EXPECT_TRUE(close(w.grad(), wd.grad(), 1e-4, 1e-4)) << max_abs(w.grad(), wd.grad());
          EXPECT_TRUE(close(b.grad(), bd.grad(), 1e-4, 1e-4)) << max_abs(b.grad(), bd.grad());
        }
      // Without the residual.
      auto x = leaf(x0), w = leaf(w0), b = leaf(b0);
      auto y = kernels::layer_norm(x, w, b, 1e-5, torch::kFloat);
      y.backward(uy);
      auto xd = leaf(x0.to(torch::kDouble)), wd = leaf(w0.to(torch::kDouble)), bd = leaf(b0.to(torch::kDouble));
      torch::layer_norm(xd, {C}, wd, bd, 1e-5).backward(uy.to(torch::kDouble));
      EXPECT_TRUE(close(y, torch::layer_norm(xd, {C}, wd, bd, 1e-5), 1e-5, 1e-5));
      EXPECT_TRUE(close(x.grad(), xd.grad(), 1e-4, 1e-4)) << max_abs(x.grad(), xd.grad());
      EXPECT_TRUE(close(w.grad(), wd.grad(), 1e-4, 1e-4));
      EXPECT_TRUE(close(b.grad(), bd.grad(), 1e-4, 1e-4));
    }
  });
}

TEST(Kernels, CrossEntropyMatchesLogSoftmaxNllInFloat64) {
  torch::manual_seed(2);
  both_paths([] {
    for (int64_t V : {2, 7, 256, 1000}) {
      SCOPED_TRACE("V = " + std::to_string(V));
      const int64_t N = 37;
      auto logits = torch::randn({N, V}) * 4;
      auto t = torch::randint(0, V, {N}, torch::kLong);
      for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
        auto x = leaf(logits.to(dtype));
        auto loss = kernels::cross_entropy(x, t);
        EXPECT_EQ(loss.scalar_type(), torch::kFloat);
        EXPECT_EQ(loss.dim(), 0);
        (loss * 2.5).backward();
        auto xd = leaf(logits.to(dtype).to(torch::kDouble));
        auto ref = torch::nn::functional::cross_entropy(xd, t);
        (ref * 2.5).backward();
        const bool bf16 = dtype == torch::kBFloat16;
        // The loss is computed in float32 from the (bf16) logits either way: float32 accuracy.
        EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 2e-6 * ref.item<double>()) << dtype;
        EXPECT_EQ(x.grad().scalar_type(), dtype);
        // Gradients are (softmax - onehot) * 2.5 / N <= 0.07: float32 to 2e-7 (3e-6 of the largest), bf16 to its
        // rounding of them.
        EXPECT_LT(max_abs(x.grad(), xd.grad()), bf16 ? 4e-4 : 2e-7) << dtype;
      }
    }
  });
}

TEST(Kernels, OffTheFusedPathTheReferenceRuns) {
  auto s = torch::randn({3, 8, 8}, torch::kDouble);  // float64: not fused
  EXPECT_TRUE(torch::allclose(kernels::causal_softmax(s, 0.5), kernels::causal_softmax_reference(s, 0.5)));
  auto nc = torch::randn({8, 3, 8}).transpose(0, 1);  // not contiguous
  EXPECT_TRUE(torch::allclose(kernels::causal_softmax(nc, 0.5), kernels::causal_softmax_reference(nc, 0.5)));
  auto logits = torch::randn({5, 9}).t().contiguous().t();  // strided rows
  auto t = torch::randint(0, 9, {5}, torch::kLong);
  EXPECT_TRUE(torch::allclose(kernels::cross_entropy(logits, t), kernels::cross_entropy_reference(logits, t)));
  // The fused path is really taken for contiguous float32 CPU tensors.
  auto x = torch::randn({2, 4, 4}).set_requires_grad(true);
  EXPECT_NE(kernels::causal_softmax(x, 1.0).grad_fn()->name().find("CausalSoftmax"), std::string::npos);
  auto l = torch::randn({4, 6}).set_requires_grad(true);
  EXPECT_NE(kernels::cross_entropy(l, torch::randint(0, 6, {4}, torch::kLong)).grad_fn()->name().find("CrossEntropy"),
            std::string::npos);
  EXPECT_THROW(kernels::cross_entropy(l, torch::full({4}, 6, torch::kLong)), c10::Error);
  auto v = torch::randn({5, 3}).set_requires_grad(true);
  EXPECT_NE(kernels::gelu(v).grad_fn()->name().find("Gelu"), std::string::npos);
  auto lw = torch::ones({6}).set_requires_grad(true), lb = torch::zeros({6}).set_requires_grad(true);
  EXPECT_NE(kernels::layer_norm(l, lw, lb, 1e-5, torch::kFloat).grad_fn()->name().find("LayerNorm"), std::string::npos);
  auto strided = torch::randn({4, 6}).t();
  EXPECT_TRUE(torch::allclose(kernels::gelu(strided), torch::gelu(strided)));
}

ModelConfig tiny_model() {
  ModelConfig c;
  c.block_size = 24;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return c;
}

// The GPT's loss and every parameter gradient, fused against unfused on the same parameters and batch.
TEST(Kernels, GptLossAndGradientsFusedMatchUnfused) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "fp32");
    GPT fused(tiny_model(), 4), plain(tiny_model(), 4);
    plain->set_fused(false);
    auto idx = torch::randint(0, 256, {3, 24}, torch::kLong), tgt = torch::randint(0, 256, {3, 24}, torch::kLong);
    auto run = [&](GPT& m) {
      if (bf16) {
        at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
        at::autocast::set_cpu_enabled(true);
      }
      auto logits = m->forward(idx);
      at::autocast::set_cpu_enabled(false);
      at::autocast::clear_cache();
      auto loss = m->fused() ? kernels::cross_entropy(logits.view({-1, 256}), tgt.reshape({-1}))
                             : torch::nn::functional::cross_entropy(logits.view({-1, 256}).to(torch::kFloat), tgt.reshape({-1}));
      loss.backward();
      return loss.item<double>();
    };
    const double lf = run(fused), lp = run(plain);
    EXPECT_NEAR(lf, lp, (bf16 ? 1e-3 : 1e-6) * lp);
    auto pf = named_parameters(*fused), pp = named_parameters(*plain);
    for (size_t i = 0; i < pf.size(); ++i) {
      const auto& gf = pf[i].second.grad();
      const auto& gp = pp[i].second.grad();
      const double rel = (gf - gp).norm().item<double>() / gp.norm().item<double>();
      // fp32: float rounding of two summation orders; bf16: both sides round activations to bf16, at other places.
      EXPECT_LT(rel, bf16 ? 3e-2 : 1e-5) << pf[i].first;
    }
  }
}

std::shared_ptr<const Corpus> corpus() {
  std::vector<std::string> docs;
  for (int i = 0; i < 30; ++i) {
    std::string d;
    for (int k = 0; k < 50; ++k) d += "a fused kernel " + std::to_string(i * k) + " runs in one pass. ";
    docs.push_back(d);
  }
  return std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.05));
}

// Whole training steps (forward, backward, clipping, AdamW) with train.fused on and off: float32 losses agree to
// float rounding, bf16 to bf16's, and evaluation (float32) agrees too.
TEST(Kernels, TrainingStepsFusedMatchUnfused) {
  torch::set_num_threads(1);
  auto data = corpus();
  for (std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    RunConfig a;
    a.model = tiny_model();
    a.train.batch_size = 4;
    a.train.steps = 8;
    a.train.warmup_steps = 2;
    a.train.lr = 3e-3;
    a.train.eval_tokens = 512;
    a.train.precision = precision;
    RunConfig b = a;
    b.train.fused = false;
    Trainer on(a, data), off(b, data);
    for (int s = 0; s < a.train.steps; ++s) {
      const double l1 = on.train_step(), l0 = off.train_step();
      EXPECT_NEAR(l1, l0, (precision == "fp32" ? 2e-5 : 1e-2) * l0) << "step " << s;
    }
    const double e1 = on.evaluate().loss, e0 = off.evaluate().loss;
    EXPECT_NEAR(e1, e0, (precision == "fp32" ? 2e-5 : 1e-2) * e0);
  }
}

}  // namespace
}  // namespace deloco
