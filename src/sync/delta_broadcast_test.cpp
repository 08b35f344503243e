// Tests of the delta broadcast (Syncer::set_delta_broadcast, LearnerCore::receive_delta, add_delta): every version
// is the previous one plus the decoded delta, bit for bit, as a learner computes it; the residual carries what the
// codec left out, so version + residual follows the merges of a syncer without compression; the residual travels in
// replica images and a restore clears it; a learner applies a delta only to the version it was taken against.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>

#include "deloco/algorithm.h"
#include "deloco/learner.h"
#include "deloco/merge.h"
#include "deloco/sync.h"
#include "wire/quantize.h"

namespace deloco {
namespace delta_broadcast_cases {

std::vector<std::pair<std::string, at::Tensor>> model(uint64_t seed) {
  torch::manual_seed(seed);
  return {{"w", torch::randn({24, 16})}, {"b", torch::randn({16})}};
}

std::vector<Fragment> whole(const std::vector<std::pair<std::string, at::Tensor>>& g) {
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const auto& [n, t] : g) sizes.emplace_back(n, t.numel() * 4);
  return plan_fragments(sizes, 1, 10);
}

SyncOptions two_learners() {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 2;
  o.max_delta_outlier = 0;  // random outer gradients of varying size
  return o;
}

Contribution push(int64_t m, int64_t base, uint64_t seed) {
  torch::manual_seed(seed);
  Contribution c;
  c.learner = m;
  c.fragment = 0;
  c.deltas = {0.01f * torch::randn({24, 16}), 0.01f * torch::randn({16})};
  c.base_version = base;
  c.c_steps = 10;
  c.c_tokens = 100;
  c.step_time = 1.0;
  return c;
}

at::Tensor flat_of(const Syncer& s) {
  std::vector<at::Tensor> ts;
  for (const auto& t : s.fragment_tensors(0)) ts.push_back(t.flatten());
  return torch::cat(ts);
}

Codec topk(double density, Encoding e = Encoding::kTopk2) {
  TopkOptions o;
  o.density = density;
  return Codec(e, o);
}

TEST(DeltaBroadcast, EachVersionIsThePreviousPlusTheDecodedDelta) {
  const auto g = model(1);
  Syncer s(two_learners(), whole(g), g, MergePlan::preset("diloco"), OuterOptions{"nesterov", 0.7, 0.9});
  s.set_delta_broadcast(topk(0.05));
  const int64_t n = flat_of(s).numel();
  for (int64_t round = 0; round < 12; ++round) {
    const at::Tensor before = flat_of(s).clone();
    for (int64_t m = 0; m < 2; ++m) ASSERT_EQ(s.receive(0.0, push(m, round, 100 * round + m)), SyncReject::kNone);
    const RoundResult r = s.on_round(0.0, 0);
    ASSERT_TRUE(r.merged());
    ASSERT_TRUE(r.delta) << "round " << round;
    // What a learner holding the previous version computes is exactly the new version.
    const std::vector<float> d = decode_floats(r.delta->data(), r.delta->size(), Encoding::kTopk2, n);
    int64_t kept = 0;
    for (float v : d) kept += v != 0.f;
    EXPECT_LE(kept, static_cast<int64_t>(std::lround(0.05 * n)));
    const at::Tensor applied = add_delta(before, torch::from_blob(const_cast<float*>(d.data()), {n}).clone());
    EXPECT_TRUE(torch::equal(applied, flat_of(s))) << "round " << round;
    EXPECT_TRUE(torch::equal(r.flat, flat_of(s)));
  }
  // The codec left most of each step out at 5%: the residual is not zero, the learners are behind.
  EXPECT_GT(s.broadcast_residual()[0].abs().max().item<float>(), 0.f);
}

// Outer SGD with η = 1 is model averaging: the merged model is the mean of the learners' models θ_m = Θ^v − Δ̂_m.
// With the delta broadcast the learners hold Θ^v (the lagging version) and the merge is anchored at Θ^v + e, so
// version + residual is exactly that mean after every round, however little the codec delivered: nothing is lost
// and nothing is counted twice.
TEST(DeltaBroadcast, VersionPlusResidualIsTheLearnersMeanUnderModelAveraging) {
  const auto g = model(5);
  Syncer s(two_learners(), whole(g), g, MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  s.set_delta_broadcast(topk(0.03));
  for (int64_t round = 0; round < 10; ++round) {
    const at::Tensor held = flat_of(s).clone();
    at::Tensor mean = torch::zeros_like(held);
    for (int64_t m = 0; m < 2; ++m) {
      const Contribution c = push(m, round, 10 * round + m);
      std::vector<at::Tensor> parts;
      for (const auto& t : c.deltas) parts.push_back(t.flatten());
      mean += 0.5 * (held - torch::cat(parts));
      ASSERT_EQ(s.receive(0.0, c), SyncReject::kNone);
    }
    ASSERT_TRUE(s.on_round(0.0, 0).merged());
    EXPECT_TRUE(torch::allclose(flat_of(s) + s.broadcast_residual()[0], mean, 1e-5, 1e-5)) << "round " << round;
  }
}

TEST(DeltaBroadcast, TheResidualTravelsInAnImageAndARestoreClearsIt) {
  const auto g = model(2);
  const OuterOptions nesterov{"nesterov", 0.7, 0.9};
  Syncer leader(two_learners(), whole(g), g, MergePlan::preset("diloco"), nesterov);
  Syncer standby(two_learners(), whole(g), g, MergePlan::preset("diloco"), nesterov);
  leader.set_delta_broadcast(topk(0.1, Encoding::kTopk4));
  standby.set_delta_broadcast(topk(0.1, Encoding::kTopk4));
  for (int64_t round = 0; round < 3; ++round) {
    for (int64_t m = 0; m < 2; ++m) ASSERT_EQ(leader.receive(0.0, push(m, round, 7 * round + m)), SyncReject::kNone);
    ASSERT_TRUE(leader.on_round(0.0, 0).merged());
  }
  standby.resync(leader.image());
  EXPECT_TRUE(torch::equal(standby.broadcast_residual()[0], leader.broadcast_residual()[0]));
  for (int64_t m = 0; m < 2; ++m) {
    ASSERT_EQ(leader.receive(0.0, push(m, 3, 50 + m)), SyncReject::kNone);
    ASSERT_EQ(standby.receive(0.0, push(m, 3, 50 + m)), SyncReject::kNone);
  }
  const RoundResult a = leader.on_round(0.0, 0), b = standby.on_round(0.0, 0);
  ASSERT_TRUE(a.delta && b.delta);
  EXPECT_EQ(*a.delta, *b.delta);
  EXPECT_TRUE(torch::equal(flat_of(leader), flat_of(standby)));
  // A checkpoint holds no residual: a restore starts it at zero.
  std::map<std::string, at::Tensor> theta;
  for (const auto& [n, t] : leader.global()) theta.emplace(n, t.clone());
  leader.restore(theta, leader.outer_state(), leader.versions(), leader.merged_contributions());
  EXPECT_EQ(leader.broadcast_residual()[0].abs().max().item<float>(), 0.f);
  // An image from a syncer without the delta broadcast carries none; one with the wrong size is refused.
  Syncer::Image im = leader.image();
  im.broadcast_residual = {torch::zeros({3})};
  EXPECT_THROW(standby.resync(im), SyncError);
}

TEST(DeltaBroadcast, RefusesWhatItCannotDo) {
  const auto g = model(3);
  Syncer s(two_learners(), whole(g), g, MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  EXPECT_THROW(s.set_delta_broadcast(Codec(Encoding::kRaw)), SyncError);
  EXPECT_THROW(s.set_delta_broadcast(topk(0.0)), SyncError);
  // A fragment not held flat in fp32 (here bf16 parameters) cannot be broadcast as fp32 deltas.
  std::vector<std::pair<std::string, at::Tensor>> half = {{"w", torch::zeros({4, 4}, torch::kBFloat16)}};
  Syncer h(two_learners(), whole(half), half, MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  EXPECT_THROW(h.set_delta_broadcast(topk(0.1)), SyncError);
  EXPECT_FALSE(h.delta_broadcast());
}

// A top-k push merges as its decoded dense outer gradient, by every merge method (the fused path for mean and rda,
// the general one for the rest): a syncer given the wire payload and one given the decoded tensors agree.
TEST(TopkPush, EveryMergeMethodMergesTheDecodedPush) {
  const auto g = model(4);
  const ModelPlan plan = plan_model(g, 1, 10);
  const FlatLayout& layout = plan.fragment_layouts[0];
  for (const AlgorithmPreset& preset : algorithm_presets()) {
    Syncer wire(two_learners(), plan.fragments, g, preset.plan, preset.outer);
    Syncer dense(two_learners(), plan.fragments, g, preset.plan, preset.outer);
    for (int64_t round = 0; round < 3; ++round) {
      for (int64_t m = 0; m < 2; ++m) {
        const Contribution c = push(m, round, 31 * round + m);
        std::vector<float> flat(static_cast<size_t>(layout.elements));
        flatten_into(c.deltas, flat.data());
        const std::string payload = encode_floats(flat.data(), flat.size(), topk(0.03, Encoding::kTopk4));
        Contribution e = decode_push(m, 0, layout, Encoding::kTopk4, payload.data(), payload.size(), round, 10, 100, 1.0);
        ASSERT_EQ(wire.receive(0.0, e), SyncReject::kNone) << preset.name;
        const std::vector<float> d = decode_floats(payload.data(), payload.size(), Encoding::kTopk4, flat.size());
        at::Tensor t = torch::from_blob(const_cast<float*>(d.data()), {layout.elements}).clone();
        Contribution c2 = c;
        c2.deltas = unflatten(t, layout);
        ASSERT_EQ(dense.receive(0.0, c2), SyncReject::kNone) << preset.name;
      }
      ASSERT_TRUE(wire.on_round(0.0, 0).merged()) << preset.name;
      ASSERT_TRUE(dense.on_round(0.0, 0).merged()) << preset.name;
    }
    EXPECT_TRUE(torch::allclose(flat_of(wire), flat_of(dense), 1e-5, 1e-6)) << preset.name;
    EXPECT_FALSE(torch::equal(flat_of(wire), flat_of(Syncer(two_learners(), plan.fragments, g, preset.plan, preset.outer))))
        << preset.name;
  }
}

TEST(DeltaBroadcast, ALearnerAppliesADeltaOnlyToTheVersionItWasTakenAgainst) {
  std::vector<std::pair<std::string, at::Tensor>> params{{"w", torch::zeros({2, 3})}, {"b", torch::zeros({4})}};
  const ModelPlan plan = plan_model(params, 1, 2);
  SyncOptions o;
  o.learners = 1;
  o.quorum = 1;
  o.sync_every = 2;
  o.wait_for_answer = false;
  LearnerCore core(o, plan, params, 100);
  const int64_t n = plan.fragment_layouts[0].elements;
  // Version 1 arrives whole; version 2 as a delta on it (pending, not yet applied); version 4 cannot apply.
  core.receive(0, 1, torch::full({n}, 1.0f));
  EXPECT_TRUE(core.receive_delta(0, 2, torch::full({n}, 0.25f)));
  EXPECT_EQ(core.newest_version(0), 2);
  EXPECT_FALSE(core.receive_delta(0, 4, torch::full({n}, 5.0f)));
  EXPECT_TRUE(core.receive_delta(0, 2, torch::full({n}, 9.0f)));  // has it: ignored
  core.apply_due(0);
  EXPECT_EQ(core.version(0), 2);
  for (const auto& [name, t] : params) EXPECT_TRUE(torch::equal(t, torch::full_like(t, 1.25f))) << name;
  // On the applied version: version 3 = 1.25 + 0.5.
  EXPECT_TRUE(core.receive_delta(0, 3, torch::full({n}, 0.5f)));
  core.apply_due(0);
  for (const auto& [name, t] : params) EXPECT_TRUE(torch::equal(t, torch::full_like(t, 1.75f))) << name;
  EXPECT_THROW(core.receive_delta(0, 4, torch::full({n + 1}, 0.5f)), SyncError);
  EXPECT_THROW(add_delta(torch::zeros({3}), torch::zeros({4})), SyncError);
}

}  // namespace
}  // namespace deloco
