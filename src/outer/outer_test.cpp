// Outer optimizers against torch.optim.SGD itself (fixture from tests/python/make_merge_fixtures.py), state
// round trips through a safetensors file, presets and bad input.
#include <cstdio>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/outer.h"
#include "deloco/safetensors.h"
#include "merge/test_util.h"

namespace deloco {
namespace outer_cases {

TEST(OuterSgd, MatchesTorchOptimSgdOverSeveralSteps) {
  TensorFile f = load_safetensors(test::merge_fixture("outer_sgd.safetensors"));
  const int steps = std::stoi(f.metadata.at("steps"));
  for (const std::string c : {"diloco", "isoloco", "heavyball"}) {
    OuterOptions o;
    o.kind = f.metadata.at(c + ".nesterov") == "1" ? "nesterov" : "sgd";
    o.lr = std::stod(f.metadata.at(c + ".lr"));
    o.momentum = std::stod(f.metadata.at(c + ".momentum"));
    auto opt = make_outer_optimizer(o);
    at::Tensor p = f.tensors.at(c + ".param0").clone();
    for (int s = 0; s < steps; ++s) {
      opt->step("w", p, f.tensors.at(c + ".grad" + std::to_string(s)));
      EXPECT_TRUE(at::allclose(p, f.tensors.at(c + ".param" + std::to_string(s + 1)), 1e-12, 1e-12))
          << c << " step " << s;
    }
    EXPECT_TRUE(at::allclose(opt->state().at("w.momentum_buffer"), f.tensors.at(c + ".buffer"), 1e-12, 1e-12));
  }
}

TEST(OuterSgd, PresetsAndPlainSgd) {
  OuterPreset d = outer_preset("diloco"), i = outer_preset("isoloco");
  EXPECT_EQ(d.merge_method, "mean");
  EXPECT_EQ(d.outer.kind, "nesterov");
  EXPECT_DOUBLE_EQ(d.outer.lr, 0.7);
  EXPECT_DOUBLE_EQ(d.outer.momentum, 0.9);
  EXPECT_EQ(i.merge_method, "iso_c");
  EXPECT_DOUBLE_EQ(i.outer.lr, 1.8);
  EXPECT_DOUBLE_EQ(i.outer.momentum, 0.8);
  EXPECT_THROW(outer_preset("adam"), OuterError);

  auto sgd = make_outer_optimizer({"sgd", 0.5, 0.0});
  at::Tensor p = at::ones({3}), g = at::tensor({2.0f, -2.0f, 0.0f});
  sgd->step("b", p, g);
  sgd->step("b", p, g);
  EXPECT_TRUE(at::allclose(p, at::tensor({-1.0f, 3.0f, 1.0f})));
  EXPECT_TRUE(sgd->state().empty());  // no momentum, no state
}

TEST(OuterSgd, StateRoundTripsThroughSafetensors) {
  OuterOptions o;  // nesterov 0.7 / 0.9
  auto a = make_outer_optimizer(o);
  at::Tensor pa = at::randn({4, 3}), pb = at::randn({5});
  for (int s = 0; s < 3; ++s) {
    a->step("w", pa, at::randn({4, 3}));
    a->step("b", pb, at::randn({5}));
  }
  TensorFile file;
  file.tensors = a->state();
  ASSERT_EQ(file.tensors.size(), 2u);
  const std::string path = ::testing::TempDir() + "outer_state_test.safetensors";
  save_safetensors(path, file);
  auto b = make_outer_optimizer(o);
  b->load_state(load_safetensors(path).tensors);
  std::remove(path.c_str());
  at::Tensor g = at::randn({4, 3});
  at::Tensor qa = pa.clone(), qb = pa.clone();
  a->step("w", qa, g);
  b->step("w", qb, g);
  EXPECT_TRUE(at::equal(qa, qb));  // resumed optimizer continues exactly
  auto fresh = make_outer_optimizer(o);
  at::Tensor qc = pa.clone();
  fresh->step("w", qc, g);
  EXPECT_FALSE(at::allclose(qa, qc));  // and the state mattered
}

TEST(OuterSgd, BadInputIsRejectedWithoutSideEffects) {
  auto opt = make_outer_optimizer({});
  at::Tensor p = at::zeros({2, 2});
  opt->step("w", p, at::ones({2, 2}));
  at::Tensor before = p.clone();
  auto state_before = opt->state().at("w.momentum_buffer");
  try {
    opt->step("w", p, at::ones({3}));
    ADD_FAILURE();
  } catch (const OuterError& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos);
  }
  EXPECT_THROW(opt->step("w", p, at::full({2, 2}, NAN)), OuterError);
  EXPECT_TRUE(at::equal(p, before));
  EXPECT_TRUE(at::equal(opt->state().at("w.momentum_buffer"), state_before));
  EXPECT_THROW(opt->load_state({{"w.velocity", at::zeros({2, 2})}}), OuterError);
  EXPECT_THROW(make_outer_optimizer({"adam", 0.1, 0.9}), OuterError);
  EXPECT_THROW(make_outer_optimizer({"nesterov", 0.1, 1.0}), OuterError);
  EXPECT_THROW(make_outer_optimizer({"nesterov", -1, 0.9}), OuterError);
}


// Delayed Nesterov as Liu et al. 2024 write it (their algorithm, transcribed from the paper in plain doubles, not
// from our header): with momentum m and buffer Δ both 0 at first, on the t-th outer gradient g_t (t = 1, 2, ...):
//   Δ ← Δ + g_t;  if t mod N = 0:  m ← β·m + Δ/N,  θ ← θ − ε·((1 − c·N + c)·β·m + g_t/N),  Δ ← 0;
//                 else:            θ ← θ − ε·(c·β·m + g_t/N).
TEST(OuterDelayedNesterov, MatchesLiuEtAlsAlgorithmStepByStep) {
  const double eps = 0.7, beta = 0.9, c = 0.2;
  const int64_t N = 3;
  auto opt = make_outer_optimizer({"delayed_nesterov", eps, beta, N, c});
  at::manual_seed(7);
  at::Tensor p = at::randn({5}, at::kDouble);
  std::vector<double> theta(5), m(5, 0.0), delta(5, 0.0);
  for (int i = 0; i < 5; ++i) theta[i] = p[i].item<double>();
  for (int t = 1; t <= 10; ++t) {
    at::Tensor g = at::randn({5}, at::kDouble);
    opt->step("w", p, g);
    for (int i = 0; i < 5; ++i) {
      const double gi = g[i].item<double>();
      delta[i] += gi;
      if (t % N == 0) {
        m[i] = beta * m[i] + delta[i] / N;
        theta[i] -= eps * ((1 - c * N + c) * beta * m[i] + gi / N);
        delta[i] = 0;
      } else {
        theta[i] -= eps * (c * beta * m[i] + gi / N);
      }
    }
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(p[i].item<double>(), theta[i], 1e-12) << "step " << t << " element " << i;
  }
  // A cycle with c = 0 moves Θ as one Nesterov step on the cycle's mean gradient: ε·(mean + β·m).
  auto cyc = make_outer_optimizer({"delayed_nesterov", eps, beta, 4, 0.0});
  at::Tensor q = at::zeros({3}, at::kDouble), sum = at::zeros({3}, at::kDouble);
  for (int t = 0; t < 4; ++t) {
    at::Tensor g = at::randn({3}, at::kDouble);
    sum += g;
    cyc->step("w", q, g);
  }
  const at::Tensor mean = sum / 4;
  EXPECT_TRUE(at::allclose(q, -eps * (mean + beta * mean), 1e-12, 1e-12));
}

// delayed_nesterov_whole, deloco's earlier reading kept as a variant: the buffer as above, but each step applies its
// whole gradient: a ← a + g, n ← n + 1; at n = N: b ← μ·b + a/N, u = g + μ·b, a ← 0, n ← 0; else u = g + c·μ·b;
// Θ ← Θ − η·u.
TEST(OuterDelayedNesterov, TheWholeVariantMatchesItsFormulasStepByStep) {
  const double eta = 0.7, mu = 0.9, c = 0.5;
  const int64_t N = 3;
  OuterOptions o{"delayed_nesterov_whole", eta, mu, N, c};
  auto opt = make_outer_optimizer(o);
  at::manual_seed(7);
  at::Tensor p = at::randn({5}, at::kDouble);
  std::vector<double> theta(5), b(5, 0.0), a(5, 0.0);
  for (int i = 0; i < 5; ++i) theta[i] = p[i].item<double>();
  int64_t n = 0;
  bool have_b = false;
  for (int step = 0; step < 10; ++step) {
    at::Tensor g = at::randn({5}, at::kDouble);
    opt->step("w", p, g);
    ++n;
    for (int i = 0; i < 5; ++i) {
      const double gi = g[i].item<double>();
      a[i] += gi;
      double u;
      if (n == N) {
        b[i] = (have_b ? mu * b[i] : 0.0) + a[i] / N;
        u = gi + mu * b[i];
        a[i] = 0;
      } else {
        u = gi + c * mu * (have_b ? b[i] : 0.0);
      }
      theta[i] -= eta * u;
    }
    if (n == N) n = 0, have_b = true;
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(p[i].item<double>(), theta[i], 1e-12) << "step " << step << " element " << i;
  }
  // Its c may reach 1; Liu et al.'s only 1/N.
  EXPECT_NO_THROW(make_outer_optimizer({"delayed_nesterov_whole", 0.5, 0.8, 4, 0.3}));
  try {
    make_outer_optimizer({"delayed_nesterov", 0.5, 0.8, 4, 0.3});
    ADD_FAILURE() << "c = 0.3 > 1/N accepted";
  } catch (const OuterError& e) {
    EXPECT_NE(std::string(e.what()).find("[0, 1/N]"), std::string::npos) << e.what();
  }
}

TEST(OuterDelayedNesterov, DelayOneIsNesterovAndTheStateResumesMidCycle) {
  for (const char* kind : {"delayed_nesterov", "delayed_nesterov_whole"}) {
    auto dn = make_outer_optimizer({kind, 0.7, 0.9, 1, 0.0});
    auto nv = make_outer_optimizer({"nesterov", 0.7, 0.9});
    at::Tensor p = at::randn({3, 4}), q = p.clone();
    for (int s = 0; s < 5; ++s) {
      at::Tensor g = at::randn({3, 4});
      dn->step("w", p, g);
      nv->step("w", q, g);
    }
    EXPECT_TRUE(at::allclose(p, q, 1e-6, 1e-6)) << kind;
  }

  // N = 4, stopped after 6 steps (two into a cycle): the state (buffer, sum, count) goes through a safetensors file
  // and the resumed optimizer continues bit for bit.
  OuterOptions o{"delayed_nesterov", 0.5, 0.8, 4, 0.25};
  auto a = make_outer_optimizer(o);
  at::Tensor pa = at::randn({6});
  for (int s = 0; s < 6; ++s) a->step("w", pa, at::randn({6}));
  TensorFile file;
  file.tensors = a->state();
  EXPECT_EQ(file.tensors.size(), 3u);
  EXPECT_EQ(file.tensors.at("w.delay_count").item<double>(), 2.0);
  const std::string path = ::testing::TempDir() + "outer_dn_state_test.safetensors";
  save_safetensors(path, file);
  auto b = make_outer_optimizer(o);
  b->load_state(load_safetensors(path).tensors);
  std::remove(path.c_str());
  at::Tensor pb = pa.clone();
  for (int s = 0; s < 3; ++s) {
    at::Tensor g = at::randn({6});
    a->step("w", pa, g);
    b->step("w", pb, g);
  }
  EXPECT_TRUE(at::equal(pa, pb));
  EXPECT_THROW(make_outer_optimizer({"delayed_nesterov", 0.5, 0.8, 0, 0.0}), OuterError);
  EXPECT_THROW(make_outer_optimizer({"delayed_nesterov", 0.5, 0.8, 2, 1.5}), OuterError);
  EXPECT_THROW(make_outer_optimizer({"delayed_nesterov", 0.5, 0.0, 2, 0.0}), OuterError);
  EXPECT_THROW(b->load_state({{"w.delay_count", at::full({1}, 2.5, at::kDouble)}, {"w.delay_sum", at::zeros({6})}}),
               OuterError);
  EXPECT_THROW(b->load_state({{"w.delay_count", at::full({1}, 2.0, at::kDouble)}}), OuterError);

  // Found by review: a state saved with N = 8 six steps into a cycle, resumed with N = 4, fired with seven
  // gradients summed and divided by 4 (7/4 of a mean into the momentum). It is the mean of what was summed.
  auto c = make_outer_optimizer({"delayed_nesterov", 1.0, 0.8, 4, 0.0});
  const at::Tensor g = at::full({2}, 1.0f);
  c->load_state({{"w.delay_count", at::full({1}, 6.0, at::kDouble)}, {"w.delay_sum", g * 6}});
  at::Tensor pc = at::zeros({2});
  c->step("w", pc, g);  // the seventh: fires. u = g / N + μ · mean = 0.25 + 0.8 · 1
  EXPECT_TRUE(at::allclose(pc, at::full({2}, -1.05f), 1e-6, 1e-6)) << pc;
}

}  // namespace
}  // namespace deloco
