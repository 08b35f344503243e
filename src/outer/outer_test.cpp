// Outer optimizers against torch.optim.SGD itself (fixture from tests/python/make_merge_fixtures.py), state
// round trips through a safetensors file, presets and bad input.
#include <cstdio>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/outer.h"
#include "deloco/safetensors.h"
#include "merge/test_util.h"

namespace deloco {
namespace {

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

}  // namespace
}  // namespace deloco
