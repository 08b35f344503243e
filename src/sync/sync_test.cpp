// Tests of the pure algorithm core: fragments, weights, grace window, quorum decisions, the syncer's merge.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>
#include <set>

#include "deloco/sync.h"
#include "sync/policy.h"

namespace deloco {
namespace sync_cases {

TEST(SyncFragments, CoverEveryTensorOnceAndBalance) {
  std::vector<std::pair<std::string, int64_t>> t = {{"a", 100}, {"b", 60}, {"c", 50}, {"d", 40}, {"e", 10}, {"f", 10}};
  auto frags = plan_fragments(t, 3, 30);
  ASSERT_EQ(frags.size(), 3u);
  std::multiset<std::string> seen;
  int64_t total = 0, mx = 0, mn = 1 << 30;
  for (const auto& f : frags) {
    for (const auto& n : f.names) seen.insert(n);
    total += f.bytes;
    mx = std::max(mx, f.bytes);
    mn = std::min(mn, f.bytes);
  }
  EXPECT_EQ(seen.size(), t.size());
  for (const auto& [n, b] : t) EXPECT_EQ(seen.count(n), 1u) << n;
  EXPECT_EQ(total, 270);
  // Greedy LPT: a=100 | b=60,e,f? -> {a},{b,d? ...}; the spread is at most the largest tensor.
  EXPECT_LE(mx - mn, 100);
  EXPECT_EQ(frags[0].bytes, 100);  // the largest tensor alone
  EXPECT_EQ(frags[1].bytes + frags[2].bytes, 170);
  EXPECT_LE(std::abs(frags[1].bytes - frags[2].bytes), 10);
  // Staggered offsets over H.
  EXPECT_EQ(frags[0].offset, 0);
  EXPECT_EQ(frags[1].offset, 10);
  EXPECT_EQ(frags[2].offset, 20);
  EXPECT_TRUE(fragment_due(frags[1], 40, 30));
  EXPECT_FALSE(fragment_due(frags[1], 41, 30));
  EXPECT_FALSE(fragment_due(frags[0], 0, 30));
}

TEST(SyncFragments, BalancedOnEqualTensorsAndErrors) {
  std::vector<std::pair<std::string, int64_t>> t;
  for (int i = 0; i < 8; ++i) t.push_back({"w" + std::to_string(i), 64});
  auto frags = plan_fragments(t, 4, 8);
  for (const auto& f : frags) EXPECT_EQ(f.bytes, 128);
  EXPECT_THROW(plan_fragments(t, 9, 8), SyncError);
  EXPECT_THROW(plan_fragments(t, 0, 8), SyncError);
  EXPECT_THROW(plan_fragments(t, 2, 0), SyncError);
}

// A sharded syncer: fragments go to shards by bytes, largest first to the lightest shard — written from the rule,
// on fragments of known sizes.
TEST(SyncShards, FragmentsAreBalancedOverShardsByBytes) {
  std::vector<Fragment> f(5);
  const int64_t bytes[] = {100, 70, 60, 40, 30};
  for (int i = 0; i < 5; ++i) f[i].id = i, f[i].bytes = bytes[i];
  // 100 → s0; 70 → s1; 60 → s1 (70 < 100); 40 → s0 (100 < 130); 30 → s0 (140 > 130? no: s1 130 < s0 140) → s1.
  EXPECT_EQ(assign_shards(f, 2), (std::vector<int64_t>{0, 1, 1, 0, 1}));
  EXPECT_EQ(shard_fragments(assign_shards(f, 2), 1), (std::vector<int64_t>{1, 2, 4}));
  // As many shards as fragments: one each. One shard: all.
  EXPECT_EQ(assign_shards(f, 5), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(assign_shards(f, 1), (std::vector<int64_t>(5, 0)));
  // Every shard gets a fragment even when some are empty (a fragment of zero bytes).
  std::vector<Fragment> z(3);
  for (int i = 0; i < 3; ++i) z[i].id = i;
  z[0].bytes = 8;
  const auto a = assign_shards(z, 3);
  EXPECT_EQ(std::set<int64_t>(a.begin(), a.end()).size(), 3u);
  try {
    assign_shards(f, 6);
    FAIL() << "6 shards of 5 fragments";
  } catch (const SyncError& e) {
    EXPECT_NE(std::string(e.what()).find("syncer.shards=6"), std::string::npos) << e.what();
  }
  EXPECT_THROW(assign_shards(f, 0), SyncError);
}

TEST(SyncWeights, TokenAndUniform) {
  EXPECT_DOUBLE_EQ(contribution_weight("uniform", 100, 3), 1.0);
  EXPECT_DOUBLE_EQ(contribution_weight("token", 1000, 10), 1000.0 * 100.0);
  // Twice the steps at the same batch: twice the weight; same tokens in more steps (smaller batches): less.
  EXPECT_DOUBLE_EQ(contribution_weight("token", 2000, 20) / contribution_weight("token", 1000, 10), 2.0);
  EXPECT_LT(contribution_weight("token", 1000, 20), contribution_weight("token", 1000, 10));
  EXPECT_DOUBLE_EQ(contribution_weight("token", 0, 0), 0.0);
  EXPECT_THROW(contribution_weight("bogus", 1, 1), SyncError);
}

TEST(SyncOptionsCheck, RejectsInconsistentValues) {
  SyncOptions o;
  o.learners = 4;
  o.quorum = 5;
  EXPECT_THROW(o.validate(), SyncError);
  o.quorum = 2;
  o.sync_every = 10;
  o.overlap = 10;
  EXPECT_THROW(o.validate(), SyncError);
  o.overlap = 3;
  o.grace_cap = -1;
  EXPECT_THROW(o.validate(), SyncError);
  o.grace_cap = 5;
  EXPECT_NO_THROW(o.validate());
}

TEST(SyncGrace, ARebasingLearnerLeavesTheWindowOpenForItsPeriod) {
  // Overwriting, the answer is due τ steps after the push; rebasing, only before the next push, H steps after it.
  SyncOptions o;
  o.grace = true;
  o.overlap = 5;
  o.sync_every = 40;
  o.grace_gamma = 0.8;
  o.grace_cap = 100;
  GraceStats s;
  s.step.add(0.03, 0.0);  // ξ_step = 30 ms
  s.quorum.add(0.0, 0.0);
  s.sync.add(0.6, 0.0);   // a slow link: one synchronisation takes 20 steps
  EXPECT_DOUBLE_EQ(grace_window(s, o), 0.0);  // τ·ξ_step = 0.15 s < 0.6 s: no window
  o.apply = "rebase";
  EXPECT_NEAR(grace_window(s, o), 0.8 * (40 * 0.03 - 0.6), 1e-12);
  s.sync.add(2.0, 0.0);  // slower than a period: closed again
  EXPECT_DOUBLE_EQ(grace_window(s, o), 0.0);
  // A fitted codec stretched a learner's period to 160 steps (net.encoding = auto): the window spans the whole
  // period, whatever a synchronisation takes (every live learner's push is due within it; γ and ξ_sync set no
  // bound: the learners never wait for the answers).
  s.period = 160;
  EXPECT_NEAR(grace_window(s, o), 160 * 0.03, 1e-12);
  s.sync.add(10.0, 0.0);  // slower than the period itself
  EXPECT_NEAR(grace_window(s, o), 160 * 0.03, 1e-12);
  s.sync.add(2.0, 0.0);
  o.grace_cap = 0.25;  // the cap of one period of H, stretched 4x with it: 1 s, under the period's 4.8 s
  EXPECT_NEAR(grace_window(s, o), 1.0, 1e-12);
  o.grace_cap = 100;
  s.period = 20;  // never shorter than H
  EXPECT_DOUBLE_EQ(grace_window(s, o), 0.0);
  s.period = 160;
  o.apply = "overwrite";  // an overwriting learner's answer is still due τ steps after its push
  EXPECT_DOUBLE_EQ(grace_window(s, o), 0.0);
}

TEST(SyncGrace, WindowFromMovingAverages) {
  SyncOptions o;
  o.grace = true;
  o.overlap = 10;
  o.grace_gamma = 0.8;
  o.grace_cap = 100;
  GraceStats s;
  s.step.add(1.0, 0.9);    // ξ_step = 1
  s.quorum.add(2.0, 0.9);  // ξ_quorum = 2
  s.sync.add(3.0, 0.9);    // ξ_sync = 3
  EXPECT_DOUBLE_EQ(grace_window(s, o), 0.8 * (10 - 5));
  o.grace_cap = 1.5;
  EXPECT_DOUBLE_EQ(grace_window(s, o), 1.5);
  s.sync.add(30.0, 0.0);  // slack negative -> no grace
  EXPECT_DOUBLE_EQ(grace_window(s, o), 0.0);
  o.grace = false;
  s.sync.add(0.0, 0.0);
  EXPECT_DOUBLE_EQ(grace_window(s, o), 0.0);
  Ema e;
  e.add(10, 0.5);
  e.add(20, 0.5);
  EXPECT_DOUBLE_EQ(e.value, 15.0);
}

TEST(SyncQuorum, DecisionsOnHandMadeSequences) {
  SyncOptions o;
  o.learners = 4;
  o.quorum = 2;
  RoundState s;
  s.connected = 4;
  // One arrival, K = 2: wait.
  s.arrivals = s.connected_arrived = 1;
  EXPECT_EQ(decide_round(5.0, s, o, 0.0).kind, RoundDecision::kWait);
  // Quorum reached, no grace: merge now.
  s.arrivals = s.connected_arrived = 2;
  s.quorum_time = 6.0;
  EXPECT_EQ(decide_round(6.0, s, o, 0.0).kind, RoundDecision::kMerge);
  // With grace 3 s: wait until 9, then merge.
  o.grace = true;
  auto d = decide_round(6.0, s, o, 3.0);
  EXPECT_EQ(d.kind, RoundDecision::kWaitUntil);
  EXPECT_DOUBLE_EQ(d.until, 9.0);
  EXPECT_EQ(decide_round(8.999, s, o, 3.0).kind, RoundDecision::kWaitUntil);
  EXPECT_EQ(decide_round(9.0, s, o, 3.0).kind, RoundDecision::kMerge);
  // Everyone connected already arrived: no reason to wait out the grace.
  s.arrivals = s.connected_arrived = 4;
  EXPECT_EQ(decide_round(7.0, s, o, 3.0).kind, RoundDecision::kMerge);
  // K = M with a learner disconnected: the three connected arrived, but the quorum of 4 is not met -> stall.
  o.quorum = 4;
  s.connected = 3;
  s.arrivals = s.connected_arrived = 3;
  EXPECT_EQ(decide_round(100.0, s, o, 0.0).kind, RoundDecision::kWait);
  // ... unless the missing learner retired (finished training): the quorum shrinks to min(K, M − retired).
  s.retired = 1;
  EXPECT_EQ(effective_quorum(s, o), 3);
  EXPECT_EQ(decide_round(100.0, s, o, 0.0).kind, RoundDecision::kMerge);
  s.retired = 4;
  s.arrivals = s.connected_arrived = 0;
  EXPECT_EQ(decide_round(100.0, s, o, 0.0).kind, RoundDecision::kWait);  // nothing to merge
  // K = 1: a single arrival merges at once without grace.
  o.quorum = 1;
  o.grace = false;
  s = RoundState{};
  s.connected = 4;
  s.arrivals = s.connected_arrived = 1;
  s.quorum_time = 1.0;
  EXPECT_EQ(decide_round(1.0, s, o, 0.0).kind, RoundDecision::kMerge);
}

std::vector<std::pair<std::string, at::Tensor>> toy_global() {
  return {{"w", torch::zeros({2, 2})}, {"b", torch::zeros({2})}};
}

// A contribution whose outer gradient is `delta` everywhere, taken against version `base` of Θ.
Contribution contrib(int64_t m, float delta, int64_t steps, int64_t tokens, int64_t base = 0) {
  Contribution c;
  c.learner = m;
  c.fragment = 0;
  c.deltas = {torch::full({2, 2}, delta), torch::full({2}, delta)};
  c.base_version = base;
  c.c_steps = steps;
  c.c_tokens = tokens;
  c.step_time = 1.0;
  return c;
}

std::vector<Fragment> one_fragment() {
  std::vector<std::pair<std::string, int64_t>> sizes = {{"w", 16}, {"b", 8}};
  return plan_fragments(sizes, 1, 10);
}

TEST(SyncSyncer, TokenWeightedMeanWithSgdOne) {
  SyncOptions o;
  o.learners = 3;
  o.quorum = 2;
  OuterOptions outer{"sgd", 1.0, 0.0};
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), outer);
  // Learners at θ = 1 and θ = 4 from Θ = 0: outer gradients −1 and −4.
  EXPECT_EQ(s.receive(0.0, contrib(0, -1.0f, 10, 100)), SyncReject::kNone);
  EXPECT_EQ(s.decide(0.0, 0).kind, RoundDecision::kWait);
  EXPECT_EQ(s.receive(1.0, contrib(2, -4.0f, 20, 200)), SyncReject::kNone);  // twice the tokens at the same rate: weight ×2
  EXPECT_EQ(s.decide(1.0, 0).kind, RoundDecision::kMerge);
  auto out = s.merge(0);
  ASSERT_EQ(out.learners, (std::vector<int64_t>{0, 2}));
  EXPECT_NEAR(out.weights[0], 1.0 / 3, 1e-12);
  EXPECT_NEAR(out.weights[1], 2.0 / 3, 1e-12);
  // Θ ← Θ − Σ w Δ = 1/3 + 8/3 = 3.
  EXPECT_NEAR(s.global()[0].second[0][0].item<float>(), 3.0f, 1e-6);
  EXPECT_NEAR(s.global()[1].second[1].item<float>(), 3.0f, 1e-6);
  EXPECT_EQ(s.version(0), 1);
  EXPECT_EQ(s.pending(0), 0);
  EXPECT_EQ(s.merged_contributions(), 2);
  EXPECT_THROW(s.merge(0), SyncError);
}

// A step time that is not finite (a learner's clock gone wrong) feeds neither ξ_step nor the learner's own
// estimate: one +Inf once pinned the grace window at its cap for the rest of the run.
TEST(SyncSyncer, ANonFiniteStepTimeIsNotAveraged) {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 2;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  Contribution c = contrib(0, -1.0f, 10, 100);
  c.step_time = std::numeric_limits<double>::infinity();
  EXPECT_EQ(s.receive(0.0, c), SyncReject::kNone);
  EXPECT_FALSE(s.stats().step.seeded);
  EXPECT_EQ(s.receive(0.5, contrib(1, -1.0f, 10, 100)), SyncReject::kNone);  // step_time 1.0
  EXPECT_DOUBLE_EQ(s.stats().step.value, 1.0);
}

TEST(SyncSyncer, RejectsBadContributions) {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 1;
  o.max_delta_norm = 10.0;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  auto nan = contrib(0, 1.0f, 1, 1);
  nan.deltas[0][0][1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(s.receive(0, nan), SyncReject::kNonFinite);
  auto shape = contrib(0, 1.0f, 1, 1);
  shape.deltas[1] = torch::zeros({3});
  EXPECT_EQ(s.receive(0, shape), SyncReject::kWrongShape);
  auto big = contrib(1, 100.0f, 1, 1);
  EXPECT_EQ(s.receive(0, big), SyncReject::kNormBound);
  auto few = contrib(1, 1.0f, 1, 1);
  few.deltas.pop_back();
  EXPECT_EQ(s.receive(0, few), SyncReject::kWrongTensorCount);
  EXPECT_EQ(s.receive(0, contrib(1, 1.0f, 1, 1, /*base=*/3)), SyncReject::kFutureBase);  // a version never produced
  EXPECT_EQ(s.rejected_contributions(), 5);
  EXPECT_EQ(s.pending(0), 0);
  EXPECT_EQ(s.decide(0, 0).kind, RoundDecision::kWait);
  // Θ untouched.
  EXPECT_EQ(s.global()[0].second.abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(s.receive(0, contrib(1, 1.0f, 1, 1)), SyncReject::kNone);
  EXPECT_EQ(s.pending(0), 1);
}

// Two learners that both joined version 0, quorum 1, the mean with outer SGD at learning rate 1 (Θ moves by the
// merged Δ exactly), under sync.delta_anchor = `anchor`.
std::unique_ptr<Syncer> two_learners(const std::string& anchor = "global") {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 1;
  o.delta_anchor = anchor;
  auto s = std::make_unique<Syncer>(o, one_fragment(), toy_global(), MergePlan::preset("diloco"),
                                    OuterOptions{"sgd", 1.0, 0.0});
  s->note_joined(0);
  s->note_joined(1);
  return s;
}

// Learner 1 moves Θ from 0 to 2 (version 1). Learner 0 still holds version 0 and trained to θ = 1, so it pushes
// Δ̂ = Θ^0 − θ = −1 against version 0. Anchor base: Δ = Δ̂ = −1 → Θ = 3. Anchor global: Δ = Θ − θ = 2 − 1 = 1 → Θ = 1.
float anchored(const std::string& anchor) {
  auto owned = two_learners(anchor);
  Syncer& s = *owned;
  EXPECT_EQ(s.receive(0, contrib(1, -2.0f, 1, 1, 0)), SyncReject::kNone);
  s.merge(0);  // Θ = 2
  EXPECT_EQ(s.receive(1, contrib(0, -1.0f, 1, 1, 0)), SyncReject::kNone);
  s.merge(0);
  EXPECT_EQ(s.stale_bases(), 0);
  return s.global()[0].second[1][1].item<float>();
}

TEST(SyncSyncer, BaseAnchorUsesTheVersionTheLearnerHeld) {
  EXPECT_NEAR(anchored("base"), 3.0f, 1e-6);
  EXPECT_NEAR(anchored("global"), 1.0f, 1e-6);
}

TEST(SyncSyncer, OldVersionsAreKeptOnlyWhileALearnerMayHoldThem) {
  auto owned = two_learners();
  Syncer& s = *owned;
  for (int v = 0; v < 3; ++v) {  // learner 1 pushes against each new version; learner 0 stays at version 0
    ASSERT_EQ(s.receive(0, contrib(1, -1.0f, 1, 1, v)), SyncReject::kNone);
    s.merge(0);
  }
  // Θ = 3. Learner 0 (θ = 1 from version 0: Δ̂ = −1) is anchored correctly at the current Θ: Δ = 3 − 1 = 2 → Θ = 1.
  ASSERT_EQ(s.receive(0, contrib(0, -1.0f, 1, 1, 0)), SyncReject::kNone);
  s.merge(0);
  EXPECT_NEAR(s.global()[0].second[0][0].item<float>(), 1.0f, 1e-6);
  EXPECT_EQ(s.stale_bases(), 0);
  // Both push against version 4: no learner can hold an older version any more, so versions 0..3 are dropped and
  // a (confused or hostile) push against version 0 is anchored at the current Θ and counted.
  ASSERT_EQ(s.receive(0, contrib(0, 0.0f, 1, 1, 4)), SyncReject::kNone);
  ASSERT_EQ(s.receive(0, contrib(1, 0.0f, 1, 1, 4)), SyncReject::kNone);
  s.merge(0);
  ASSERT_EQ(s.receive(0, contrib(0, -1.0f, 1, 1, 0)), SyncReject::kNone);
  s.merge(0);
  EXPECT_EQ(s.stale_bases(), 1);
}

// A learner retires (its goodbye) with a push still waiting in a round, and no learner left holds the version that
// push was made from: the version stays kept until the round merges the push, so the push is anchored exactly (as in
// BaseAnchorUsesTheVersionTheLearnerHeld: θ = 1 from version 0, Θ = 2 → Θ = 1), not rebased onto the current Θ (3).
TEST(SyncSyncer, AWaitingPushOfARetiredLearnerKeepsItsVersion) {
  auto owned = two_learners();
  Syncer& s = *owned;
  ASSERT_EQ(s.receive(0, contrib(1, -2.0f, 1, 1, 0)), SyncReject::kNone);
  s.merge(0);        // Θ = 2, version 1
  s.note_joined(1);  // learner 1 holds version 1
  ASSERT_EQ(s.receive(1, contrib(0, -1.0f, 1, 1, 0)), SyncReject::kNone);
  s.retire(2, 0);    // learner 0's goodbye comes before its push merges
  s.merge(0);
  EXPECT_NEAR(s.global()[0].second[1][1].item<float>(), 1.0f, 1e-6);
  EXPECT_EQ(s.stale_bases(), 0);
}

TEST(SyncSyncer, AQuorumLoweredByARetirementStillGetsItsGraceWindow) {
  SyncOptions o;
  o.learners = 3;
  o.quorum = 3;
  o.overlap = 5;
  o.sync_every = 10;
  o.grace = true;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  ASSERT_EQ(s.receive(0.0, contrib(0, -1.0f, 1, 1)), SyncReject::kNone);
  ASSERT_EQ(s.receive(0.0, contrib(2, -1.0f, 1, 1)), SyncReject::kNone);
  EXPECT_EQ(s.decide(0.5, 0).kind, RoundDecision::kWait);  // 2 of 3
  s.retire(1.0, 2);  // learner 2 finished: the quorum is now 2, reached at t = 1; learner 1 may still come
  // ξ_step = 1, ξ_quorum = 1 (first arrival 0 → quorum 1), ξ_sync = 0: grace = 0.8 · (5·1 − 1) = 3.2.
  EXPECT_NEAR(s.grace(), 3.2, 1e-12);
  auto d = s.decide(1.0, 0);
  ASSERT_EQ(d.kind, RoundDecision::kWaitUntil);
  EXPECT_NEAR(d.until, 4.2, 1e-12);
  EXPECT_EQ(s.decide(4.2, 0).kind, RoundDecision::kMerge);
}

TEST(SyncSyncer, SyncTimeIncludesTheUpload) {
  SyncOptions o;
  o.learners = 1;
  o.quorum = 1;
  o.ema = 0.5;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  s.observe_sync(1.0, 0.5, 2.0);
  EXPECT_DOUBLE_EQ(s.stats().sync.value, 3.5);
  s.observe_sync(0.0, 0.5, 0.0);
  EXPECT_DOUBLE_EQ(s.stats().sync.value, 0.5 * 3.5 + 0.5 * 0.5);
}

// With single-contribution merges, a DARE mask that depended only on the tensor name left the same ~10% of every
// tensor without any outer update, forever. Each outer step now draws its own mask.
TEST(SyncSyncer, DareDrawsANewMaskEveryOuterStep) {
  SyncOptions o;
  o.learners = 1;
  o.quorum = 1;
  std::vector<std::pair<std::string, at::Tensor>> g = {{"w", torch::zeros({64, 64})}};
  MergePlan plan;
  plan.method = "dare";
  Syncer s(o, plan_fragments({{"w", 64 * 64 * 4}}, 1, 10), g, plan, OuterOptions{"sgd", 1.0, 0.0});
  at::Tensor never = torch::ones({64, 64}, torch::kBool);
  for (int v = 0; v < 30; ++v) {
    Contribution c;
    c.learner = 0;
    c.deltas = {torch::full({64, 64}, -1.0f)};
    c.base_version = v;
    c.c_steps = c.c_tokens = 1;
    ASSERT_EQ(s.receive(0, std::move(c)), SyncReject::kNone);
    const at::Tensor before = s.global()[0].second.clone();
    s.merge(0);
    never &= s.global()[0].second.eq(before);
  }
  // p = 0.1: an element is dropped in all 30 steps with probability 1e-30.
  EXPECT_EQ(never.sum().item<int64_t>(), 0);
}

// ---- Issue 11: what a learner's contribution can do to the merge --------------------------------------------

TEST(SyncOptionsCheck, ContributionBoundOptions) {
  SyncOptions o;
  EXPECT_GT(o.max_delta_ratio, 0);  // on by default
  EXPECT_GT(o.max_delta_outlier, 0);
  EXPECT_EQ(o.max_share, 1.0);      // off by default: token weights of honest learners are unchanged
  EXPECT_NO_THROW(o.validate());
  o.max_share = 0;
  EXPECT_THROW(o.validate(), SyncError);
  o.max_share = 1.5;
  EXPECT_THROW(o.validate(), SyncError);
  o.max_share = 0.5;
  o.delta_warmup = o.delta_window + 1;
  EXPECT_THROW(o.validate(), SyncError);
  o.delta_warmup = 1;
  o.max_delta_ratio = std::numeric_limits<double>::infinity();
  EXPECT_THROW(o.validate(), SyncError);
  o.max_delta_ratio = -1;
  EXPECT_THROW(o.validate(), SyncError);
  o.max_delta_ratio = 0;  // off
  EXPECT_NO_THROW(o.validate());
}

TEST(SyncShares, CapRedistributesInProportion) {
  auto near = [](const std::vector<double>& a, const std::vector<double>& b) {
    ASSERT_EQ(a.size(), b.size());
    double sum = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(a[i], b[i], 1e-12) << i;
      sum += a[i];
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
  };
  near(cap_shares({0.9, 0.1}, 0.5), {0.5, 0.5});
  near(cap_shares({0.7, 0.2, 0.1}, 0.5), {0.5, 0.2 + 0.2 * 2 / 3, 0.1 + 0.2 / 3});
  // The redistribution pushes another weight over the cap: it is capped in turn.
  near(cap_shares({0.6, 0.35, 0.05}, 0.4), {0.4, 0.4, 0.2});
  // A cap below 1/n cannot hold: every weight becomes 1/n. One contribution keeps its whole weight.
  near(cap_shares({0.97, 0.02, 0.01}, 0.1), {1.0 / 3, 1.0 / 3, 1.0 / 3});
  near(cap_shares({1.0}, 0.25), {1.0});
  // cap 1 (the default) leaves the weights bit-identical; weights under the cap are untouched.
  const std::vector<double> w = {2.5e-33, 1.0 - 2.5e-33};
  EXPECT_EQ(cap_shares(w, 1.0), w);
  EXPECT_EQ(cap_shares({0.3, 0.3, 0.4}, 0.5), (std::vector<double>{0.3, 0.3, 0.4}));
  EXPECT_TRUE(cap_shares({}, 0.5).empty());
}

// The 2^62 attack of issue 11 item 7: c_tokens = 2^62, c_steps = 1 would take the whole merge (weights
// [2.5e-33, 1.0]). With the learners' budgets set (as both drivers do) it is refused; the honest learner merges.
TEST(SyncCounters, SelfAssignedWeightIsRefused) {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 2;
  o.sync_every = 10;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  const int64_t T = 512;  // tokens per step (batch 8 × context 64)
  s.set_budget(0, {T, 100});
  s.set_budget(1, {T, 100});
  auto honest = contrib(0, -1.0f, 10, 10 * T);
  honest.step = 10;
  EXPECT_EQ(s.receive(0, honest), SyncReject::kNone);
  auto greedy = contrib(1, -4.0f, 1, int64_t{1} << 62);
  greedy.step = 10;
  EXPECT_EQ(s.receive(0, greedy), SyncReject::kCounterOutOfRange);
  // 2^63 + 1 on the wire reads as a negative int64: refused too, even without a budget.
  auto wrapped = contrib(1, -4.0f, -5, 10);
  EXPECT_EQ(s.receive(0, wrapped), SyncReject::kCounterOutOfRange);
  // Tokens exactly c_steps · T are fine; one more is not.
  auto exact = contrib(1, -4.0f, 10, 10 * T + 1);
  exact.step = 10;
  EXPECT_EQ(s.receive(0, exact), SyncReject::kCounterOutOfRange);
  exact.c_tokens = 10 * T;
  EXPECT_EQ(s.receive(0, exact), SyncReject::kNone);
  auto out = s.merge(0);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out.weights[0], 0.5, 1e-12);
  EXPECT_NEAR(out.weights[1], 0.5, 1e-12);
  EXPECT_EQ(s.rejected().at("counter_out_of_range"), 3);
}

// c_steps against the steps the syncer heard of: since the last accepted contribution of that learner to that
// fragment, plus the carried counter when it applied nothing since, plus H of slack.
TEST(SyncCounters, StepsAreBoundedByTheReportedProgress) {
  SyncOptions o;
  o.learners = 1;
  o.quorum = 1;
  o.sync_every = 10;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  s.set_budget(0, {0, 1000});  // tokens unchecked, 1000 steps in all
  auto push = [&](int64_t step, int64_t c_steps, int64_t base) {
    auto c = contrib(0, -0.1f, c_steps, c_steps, base);
    c.step = step;
    return s.receive(0, c);
  };
  // First push at step 10: anything up to 10 + H is possible (it may have been heard late).
  EXPECT_EQ(push(10, 21, 0), SyncReject::kCounterOutOfRange);
  EXPECT_EQ(push(10, 20, 0), SyncReject::kNone);
  // A learner claiming the whole run in one push, or more than the run: refused.
  EXPECT_EQ(push(10, 1000, 0), SyncReject::kCounterOutOfRange);
  EXPECT_EQ(push(10, 1001, 0), SyncReject::kCounterOutOfRange);
  // Nothing applied since (same base 0): its counter ran on since the start. At step 20: 20 − 0 + H = 30.
  EXPECT_EQ(push(20, 31, 0), SyncReject::kCounterOutOfRange);
  EXPECT_EQ(push(20, 30, 0), SyncReject::kNone);
  // Running on does not accumulate the slack: at step 30 still 30 − 0 + H.
  EXPECT_EQ(push(30, 41, 0), SyncReject::kCounterOutOfRange);
  EXPECT_EQ(push(30, 40, 0), SyncReject::kNone);
  s.merge(0);  // version 1
  // It applied version 1 after that push, which reset its counter: at step 40, at most 40 − 30 + H.
  EXPECT_EQ(push(40, 21, 1), SyncReject::kCounterOutOfRange);
  EXPECT_EQ(push(40, 10, 1), SyncReject::kNone);
  EXPECT_EQ(push(50, 30, 1), SyncReject::kNone);  // ran on (base 1 again): 50 − 30 + H
  EXPECT_EQ(push(50, 31, 1), SyncReject::kCounterOutOfRange);
  s.merge(0);  // version 2
  // A step report beyond train.steps is credited as train.steps, no more: the liar's one big claim ...
  EXPECT_EQ(push(1 << 30, 960, 2), SyncReject::kNone);  // 1000 − 50 + H
  s.merge(0);  // version 3
  // ... after which nothing is left but the slack.
  EXPECT_EQ(push(1 << 30, 11, 3), SyncReject::kCounterOutOfRange);
  EXPECT_EQ(push(1 << 30, 10, 3), SyncReject::kNone);
  EXPECT_EQ(s.rejected().at("counter_out_of_range"), 8);
}

// Issue 11 item 3: a push of finite but enormous values (all 3e38). Its norm is computed in double (finite), so
// it is refused for its size, not as non-finite, and never reaches the outer step.
TEST(SyncBounds, EnormousFiniteDeltaIsRefusedByTheRatioBound) {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 1;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"nesterov", 0.7, 0.9});
  EXPECT_EQ(s.receive(0, contrib(1, 3e38f, 1, 1)), SyncReject::kNormRatio);
  EXPECT_EQ(s.receive(0, contrib(1, -3e38f, 1, 1)), SyncReject::kNormRatio);
  // ‖Θ_p‖ = 0 here: the floor (RMS kDeltaRmsFloor) gives the scale, so ordinary contributions pass.
  const double limit = o.max_delta_ratio * std::sqrt(6.0) * kDeltaRmsFloor;  // 6 elements
  const float just_under = static_cast<float>(0.99 * limit / std::sqrt(6.0));
  EXPECT_EQ(s.receive(0, contrib(1, just_under, 1, 1)), SyncReject::kNone);
  EXPECT_EQ(s.receive(0, contrib(0, 1.02f * just_under / 0.99f, 1, 1)), SyncReject::kNormRatio);
  EXPECT_EQ(s.global()[0].second.abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(s.rejected().at("norm_ratio"), 3);
}

TEST(SyncBounds, OutlierBoundAfterWarmUp) {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 2;
  o.max_delta_ratio = 0;  // only the robust bound
  o.max_delta_outlier = 100;
  o.delta_warmup = 4;
  o.delta_window = 8;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  // During the warm-up nothing is an outlier.
  EXPECT_EQ(s.receive(0, contrib(0, 1.0f, 1, 1)), SyncReject::kNone);
  EXPECT_EQ(s.receive(0, contrib(1, 500.0f, 1, 1)), SyncReject::kNone);  // median of 2 norms: no bound yet
  EXPECT_EQ(s.receive(0, contrib(0, 1.0f, 1, 1)), SyncReject::kNone);
  EXPECT_EQ(s.receive(0, contrib(0, 1.0f, 1, 1)), SyncReject::kNone);
  // Norms seen: [√6, 500√6, √6, √6]: the median is √6 → the bound is 100·√6.
  EXPECT_EQ(s.receive(0, contrib(1, 101.0f, 1, 1)), SyncReject::kNormOutlier);
  EXPECT_EQ(s.receive(0, contrib(1, 99.0f, 1, 1)), SyncReject::kNone);
  EXPECT_EQ(s.rejected().at("norm_outlier"), 1);
}

// The outlier bound is per inner step: a learner back from a long partition pushes every step since its last
// accepted push at once (c_steps); its larger Δ is judged by its drift per step.
TEST(SyncBounds, OutlierBoundIsPerInnerStep) {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 2;
  o.max_delta_ratio = 0;
  o.max_delta_outlier = 100;
  o.delta_warmup = 4;
  o.delta_window = 8;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  for (int i = 0; i < 4; ++i) ASSERT_EQ(s.receive(0, contrib(0, 1.0f, 10, 10)), SyncReject::kNone);  // √6/10 per step
  // 80 times the steps and 150 times the norm: under 100 × the median per step.
  EXPECT_EQ(s.receive(0, contrib(1, 150.0f, 800, 800)), SyncReject::kNone);
  // The same norm over the usual 10 steps: an outlier.
  EXPECT_EQ(s.receive(0, contrib(1, 150.0f, 10, 10)), SyncReject::kNormOutlier);
  // 110 times the usual norm per step, over 800 steps, is still one.
  EXPECT_EQ(s.receive(0, contrib(1, 8800.0f, 800, 800)), SyncReject::kNormOutlier);
}

// A merge whose outer step overflows (Nesterov: u = g + μ·b ≈ 1.9 · 2.7e38 = inf) is rolled back exactly and its
// contributions rejected as merge_non_finite; afterwards the syncer merges as if the poisoned round never happened.
TEST(SyncMerge, NonFiniteResultIsRolledBackExactly) {
  SyncOptions o;
  o.learners = 3;
  o.quorum = 1;
  o.max_delta_ratio = 0;  // let the poison through the bounds to reach the merge
  o.max_delta_outlier = 0;
  const OuterOptions nesterov{"nesterov", 0.7, 0.9};
  Syncer a(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), nesterov);
  Syncer b(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), nesterov);
  for (Syncer* s : {&a, &b}) {
    for (int64_t m = 0; m < 3; ++m) s->note_joined(m);
    ASSERT_EQ(s->receive(0, contrib(0, -1.0f, 10, 100)), SyncReject::kNone);
    ASSERT_TRUE(s->merge(0).ok());  // version 1, momentum set, version 0 kept in the history (learner 1 holds it)
  }
  const at::Tensor theta = a.global()[0].second.clone();
  const auto outer = a.outer_state();
  // Learner 2's b is enormous (its w is ordinary) and it claims 3× the tokens: weights 0.1 / 0.9, so the merged
  // outer gradient of b is finite (2.7e38) but the outer step overflows — after w was already stepped.
  auto poison = contrib(2, -1.0f, 10, 300, 1);
  poison.deltas[1] = torch::full({2}, 3e38f);
  ASSERT_EQ(a.receive(0, poison), SyncReject::kNone);
  ASSERT_EQ(a.receive(0, contrib(0, -1.0f, 10, 100, 1)), SyncReject::kNone);
  auto bad = a.merge(0);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.rejected, SyncReject::kMergeNonFinite);
  EXPECT_EQ(bad.learners, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(bad.version, 1);
  EXPECT_EQ(a.version(0), 1);
  EXPECT_EQ(a.pending(0), 0);
  EXPECT_EQ(a.merged_contributions(), 1);
  EXPECT_EQ(a.rejected().at("merge_non_finite"), 2);
  EXPECT_TRUE(torch::equal(a.global()[0].second, theta));
  for (const auto& [k, t] : outer) EXPECT_TRUE(torch::equal(a.outer_state().at(k), t)) << k;
  EXPECT_EQ(a.outer_state().size(), outer.size());
  // Learner 1 still holds version 0 (kept in the history): both syncers anchor it identically.
  for (Syncer* s : {&a, &b}) {
    ASSERT_EQ(s->receive(0, contrib(1, -2.0f, 10, 100, 0)), SyncReject::kNone);
    ASSERT_TRUE(s->merge(0).ok());
  }
  EXPECT_EQ(a.stale_bases(), 0);
  for (size_t i = 0; i < a.global().size(); ++i)
    EXPECT_TRUE(torch::equal(a.global()[i].second, b.global()[i].second)) << a.global()[i].first;
  EXPECT_EQ(a.versions(), b.versions());
}

// A checkpoint holding NaN/Inf is refused on restore, naming the tensor, and nothing changes.
TEST(SyncRestore, RefusesNonFiniteState) {
  SyncOptions o;
  o.learners = 1;
  o.quorum = 1;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"nesterov", 0.7, 0.9});
  ASSERT_EQ(s.receive(0, contrib(0, -1.0f, 1, 1)), SyncReject::kNone);
  ASSERT_TRUE(s.merge(0).ok());
  std::map<std::string, at::Tensor> g;
  for (const auto& [n, t] : s.global()) g[n] = t.clone();
  const auto outer = s.outer_state();
  const at::Tensor before = s.global()[1].second.clone();
  auto poisoned = g;
  poisoned["b"] = torch::full({2}, std::numeric_limits<float>::infinity());
  try {
    s.restore(poisoned, outer, {1}, 1);
    FAIL() << "restored a non-finite model";
  } catch (const SyncError& e) {
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NaN or Inf"), std::string::npos) << e.what();
  }
  auto bad_outer = outer;
  bad_outer.begin()->second = torch::full_like(bad_outer.begin()->second, std::nanf(""));
  try {
    s.restore(g, bad_outer, {1}, 1);
    FAIL() << "restored a non-finite outer state";
  } catch (const SyncError& e) {
    EXPECT_NE(std::string(e.what()).find(bad_outer.begin()->first), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(s.global()[1].second, before));
  // Negative versions or counts (a damaged or edited manifest) are refused too: accepted, every welcome a learner
  // parsed failed ("holds a non-integer") and the learners said hello forever (found by review).
  EXPECT_THROW(s.restore(g, outer, {-1}, 1), SyncError);
  EXPECT_THROW(s.restore(g, outer, {1}, -1), SyncError);
  EXPECT_TRUE(torch::equal(s.global()[1].second, before));
  EXPECT_NO_THROW(s.restore(g, outer, {1}, 1));
}

TEST(SyncShares, MaxShareCapsAMergeAndLeavesSingleMergesAlone) {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 2;
  o.max_share = 0.6;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  ASSERT_EQ(s.receive(0, contrib(0, -1.0f, 10, 100)), SyncReject::kNone);
  ASSERT_EQ(s.receive(0, contrib(1, -4.0f, 10, 300)), SyncReject::kNone);  // token weights 1 : 9 → 0.1, 0.9 → capped 0.4, 0.6
  auto out = s.merge(0);
  EXPECT_NEAR(out.weights[0], 0.4, 1e-12);
  EXPECT_NEAR(out.weights[1], 0.6, 1e-12);
  EXPECT_NEAR(s.global()[0].second[0][0].item<float>(), 0.4f * 1 + 0.6f * 4, 1e-5);
  o.quorum = 1;
  Syncer one(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  ASSERT_EQ(one.receive(0, contrib(1, -4.0f, 10, 300)), SyncReject::kNone);
  EXPECT_EQ(one.merge(0).weights, std::vector<double>{1.0});
}

TEST(SyncApply, OverwriteAndMix) {
  auto local = torch::full({3}, 2.0f);
  apply_global(local, torch::full({3}, 4.0f), 0.25);
  EXPECT_NEAR(local[0].item<float>(), 0.25f * 2 + 0.75f * 4, 1e-6);
  apply_global(local, torch::full({3}, 7.0f), 0.0);
  EXPECT_EQ(local[2].item<float>(), 7.0f);
}

// The merge round as every driver runs it: on_round decides, merges and flattens; it says when to call again inside
// the grace window; a rolled-back round carries no fragment; drain merges what waits below the quorum at the end.
TEST(SyncRound, OnRoundDecidesMergesAndFlattens) {
  SyncOptions o;
  o.learners = 3;
  o.quorum = 1;
  o.overlap = 5;
  o.grace = true;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  EXPECT_EQ(s.on_round(0.0, 0).decision.kind, RoundDecision::kWait);  // nothing waits
  ASSERT_EQ(s.receive(0.0, contrib(0, -1.0f, 10, 100)), SyncReject::kNone);
  // ξ_step = 1 (the contribution's step time), τ = 5: a grace window of 0.8 · 5 = 4 s after the quorum at t = 0.
  RoundResult wait = s.on_round(1.0, 0);
  ASSERT_EQ(wait.decision.kind, RoundDecision::kWaitUntil);
  EXPECT_DOUBLE_EQ(wait.decision.until, 4.0);
  EXPECT_FALSE(wait.merged());
  EXPECT_FALSE(wait.flat.defined());
  EXPECT_EQ(s.pending(0), 1);
  RoundResult r = s.on_round(4.0, 0);
  ASSERT_TRUE(r.merged());
  EXPECT_EQ(r.outcome.version, 1);
  EXPECT_EQ(r.outcome.learners, (std::vector<int64_t>{0}));
  EXPECT_DOUBLE_EQ(r.grace, 4.0);
  EXPECT_DOUBLE_EQ(r.grace_wait, 4.0);
  EXPECT_TRUE(torch::equal(r.flat, torch::cat({s.global()[0].second.flatten(), s.global()[1].second.flatten()})));
  EXPECT_EQ(s.pending(0), 0);
}

TEST(SyncRound, ARolledBackRoundCarriesNoFragmentAndDrainIgnoresTheQuorum) {
  SyncOptions o;
  o.learners = 3;
  o.quorum = 3;
  o.max_delta_ratio = 0;
  o.max_delta_outlier = 0;
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 2.0, 0.0});
  EXPECT_TRUE(s.drain(0.0).empty());  // nothing waits
  ASSERT_EQ(s.receive(0.0, contrib(0, -1.0f, 10, 100)), SyncReject::kNone);
  EXPECT_EQ(s.on_round(0.0, 0).decision.kind, RoundDecision::kWait);  // 1 of K = 3
  auto rounds = s.drain(1.0);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].decision.kind, RoundDecision::kMerge);
  ASSERT_TRUE(rounds[0].merged());
  EXPECT_EQ(rounds[0].outcome.fragment, 0);
  EXPECT_EQ(rounds[0].grace_wait, 0.0);  // it never held its quorum
  EXPECT_EQ(s.version(0), 1);
  // A poisoned round: Θ − 2 · (−3e38) overflows, the round is rolled back and its contributors are named.
  auto poison = contrib(1, -3e38f, 10, 100, 1);
  ASSERT_EQ(s.receive(2.0, poison), SyncReject::kNone);
  ASSERT_EQ(s.receive(2.0, contrib(2, -3e38f, 10, 100, 1)), SyncReject::kNone);
  ASSERT_EQ(s.receive(2.0, contrib(0, -3e38f, 10, 100, 1)), SyncReject::kNone);
  RoundResult bad = s.on_round(2.0, 0);
  ASSERT_TRUE(bad.rolled_back());
  EXPECT_FALSE(bad.merged());
  EXPECT_EQ(bad.outcome.rejected, SyncReject::kMergeNonFinite);
  EXPECT_EQ(bad.outcome.learners, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_FALSE(bad.flat.defined());
  EXPECT_EQ(s.version(0), 1);
}

TEST(SyncReject, EveryReasonHasItsOwnNameAndOnlyTheNormBoundsDropTheDrift) {
  std::set<std::string> seen;
  for (int i = 0; i <= static_cast<int>(kLastSyncReject); ++i) {
    const auto r = static_cast<SyncReject>(i);
    const std::string name = sync_reject_name(r);
    EXPECT_EQ(name.empty(), r == SyncReject::kNone);
    EXPECT_TRUE(seen.insert(name).second) << name;
    const bool norm = name == "norm_bound" || name == "norm_ratio" || name == "norm_outlier";
    EXPECT_EQ(refusal_drops_drift(r), norm) << name;
  }
}


// Staleness-aware weights against FedAsync's staleness functions (Xie et al. 2019): the merged outer gradient is
// Σ_m w_m·s(k_m)·Δ_m with s(k) = (1 + k)^−a (poly) or e^(−a·k) (exp), k = merges since the contribution's base.
// Anchor base and outer SGD at η = 1, so Θ moves by exactly that sum; the fused and the general path alike.
TEST(SyncStaleness, EachContributionIsScaledByItsStaleness) {
  for (const bool fused : {true, false})
    for (const std::string mode : {"poly", "exp"}) {
      SyncOptions o;
      o.learners = 2;
      o.quorum = 1;
      o.delta_anchor = "base";
      o.weighting = "uniform";
      o.staleness = mode;
      o.staleness_exponent = 0.5;
      o.fused_merge = fused;
      const auto s_of = [&](double k) { return mode == "poly" ? std::pow(1.0 + k, -0.5) : std::exp(-0.5 * k); };
      Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
      s.note_joined(0);
      s.note_joined(1);
      for (int v = 0; v < 3; ++v) {  // fresh pushes (k = 0) move Θ by 1 each: Θ = 3 at version 3
        ASSERT_EQ(s.receive(0, contrib(1, -1.0f, 1, 1, v)), SyncReject::kNone);
        auto out = s.merge(0);
        EXPECT_EQ(out.staleness, std::vector<int64_t>{0});
      }
      double theta = 3.0;
      EXPECT_NEAR(s.global()[0].second[0][0].item<float>(), theta, 1e-6);
      // Learner 0 pushes Δ̂ = −2 against version 0: 3 merges stale.
      ASSERT_EQ(s.receive(0, contrib(0, -2.0f, 1, 1, 0)), SyncReject::kNone);
      auto out = s.merge(0);
      EXPECT_EQ(out.staleness, std::vector<int64_t>{3});
      theta += 2.0 * s_of(3);
      EXPECT_NEAR(s.global()[0].second[0][0].item<float>(), theta, 1e-5) << mode << (fused ? " fused" : "");
      EXPECT_NEAR(out.weights[0], s_of(3), 1e-12);
      // Two in one merge (uniform weights ½): learner 0 fresh (k = 0), learner 1 against version 3 (k = 1).
      ASSERT_EQ(s.receive(0, contrib(0, -1.0f, 1, 1, 4)), SyncReject::kNone);
      ASSERT_EQ(s.receive(0, contrib(1, -3.0f, 1, 1, 3)), SyncReject::kNone);
      s.merge(0);
      theta += 0.5 * 1.0 + 0.5 * 3.0 * s_of(1);
      EXPECT_NEAR(s.global()[1].second[0].item<float>(), theta, 1e-5) << mode << (fused ? " fused" : "");
      EXPECT_EQ(s.fused_merges() > 0, fused);
    }
  EXPECT_DOUBLE_EQ(staleness_scale("none", 0.5, 7), 1.0);
  EXPECT_DOUBLE_EQ(staleness_scale("poly", 1.0, -2), 1.0);  // never above 1
  EXPECT_THROW(staleness_scale("linear", 0.5, 1), SyncError);
  SyncOptions bad;
  bad.staleness = "linear";
  EXPECT_THROW(bad.validate(), SyncError);
  bad.staleness = "poly";
  bad.staleness_exponent = 0;
  EXPECT_THROW(bad.validate(), SyncError);
}

// Delayed Nesterov in the syncer: the general path runs it (the fused pass keeps only a momentum buffer), and a
// rolled-back merge puts its whole state back (buffer, sum, count).
TEST(SyncSyncer, DelayedNesterovTakesTheGeneralPathAndRollsBackItsWholeState) {
  SyncOptions o;
  o.learners = 1;
  o.quorum = 1;
  o.max_delta_ratio = 0;  // the overflowing push below must reach the merge
  o.max_delta_outlier = 0;
  // η = 5: Liu et al.'s step applies g/N, so the push below overflows only with a large η.
  OuterOptions dn{"delayed_nesterov", 5.0, 0.9, 3, 0.0};
  Syncer s(o, one_fragment(), toy_global(), MergePlan::preset("diloco"), dn);
  s.note_joined(0);
  auto ref = make_outer_optimizer(dn);
  at::Tensor theta = torch::zeros({2, 2});
  for (int v = 0; v < 2; ++v) {
    ASSERT_EQ(s.receive(0, contrib(0, -1.0f - v, 1, 1, v)), SyncReject::kNone);
    ASSERT_TRUE(s.merge(0).ok());
    ref->step("x", theta, torch::full({2, 2}, -1.0f - v));
  }
  EXPECT_EQ(s.fused_merges(), 0);
  EXPECT_TRUE(at::allclose(s.global()[0].second, theta));
  const auto before = s.outer_state();
  ASSERT_EQ(before.at("w.delay_count").item<double>(), 2.0);
  // A push so large the step overflows: rolled back, the delayed state exactly as before.
  ASSERT_EQ(s.receive(0, contrib(0, -3e38f, 1, 1, 2)), SyncReject::kNone);
  auto out = s.merge(0);
  EXPECT_FALSE(out.ok());
  const auto after = s.outer_state();
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [k, t] : before) EXPECT_TRUE(at::equal(t, after.at(k))) << k;
}

}  // namespace
}  // namespace deloco
