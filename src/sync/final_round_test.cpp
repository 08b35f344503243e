// The final round (sync.final_round): the learners' final states become the final model as their weighted mean.
// Worked by hand on a one-fragment model whose every element moves alike.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>

#include "deloco/learner.h"
#include "deloco/sync.h"
#include "wire/quantize.h"

namespace deloco {
namespace final_round_cases {

std::vector<std::pair<std::string, at::Tensor>> global0() {
  return {{"w", torch::zeros({2, 2})}, {"b", torch::zeros({2})}};
}

std::vector<Fragment> one_fragment() {
  std::vector<std::pair<std::string, int64_t>> sizes = {{"w", 16}, {"b", 8}};
  return plan_fragments(sizes, 1, 10);
}

// Learner m's outer gradient Δ = `delta` everywhere against version `base`.
Contribution state(int64_t m, float delta, int64_t base) {
  Contribution c;
  c.learner = m;
  c.fragment = 0;
  c.deltas = {torch::full({2, 2}, delta), torch::full({2}, delta)};
  c.base_version = base;
  c.c_steps = 1;
  c.c_tokens = 100;
  c.step_time = 1.0;
  return c;
}

float value(const Syncer& s) { return s.global()[0].second[0][0].item<float>(); }

// Θ = 0 (version 0). Learner 2 pushes Δ = −2 (it trained to θ = 2) and the merge (outer SGD, lr 1) makes Θ = 2,
// version 1. Final states: learner 0 still holds version 0 and trained to θ = 1 (Δ = 0 − 1 = −1, base 0); learner
// 1 holds version 1 and trained to θ = 5 (Δ = 2 − 5 = −3); learner 2 holds version 1 and trained no further (Δ = 0).
// One step of learners 0 and 1 trains 100 tokens, of learner 2 200: weights 1/4, 1/4, 1/2.
struct Case {
  Syncer s;
  explicit Case(const std::string& anchor, const std::string& weighting = "token")
      : s(options(anchor, weighting), one_fragment(), global0(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0}) {
    s.set_budget(0, {100, 0});
    s.set_budget(1, {100, 0});
    s.set_budget(2, {200, 0});
    EXPECT_EQ(s.receive(0.0, state(2, -2.0f, 0)), SyncReject::kNone);
    EXPECT_TRUE(s.on_round(0.0, 0).merged());
    EXPECT_FLOAT_EQ(value(s), 2.0f);
  }
  static SyncOptions options(const std::string& anchor, const std::string& weighting) {
    SyncOptions o;
    o.learners = 3;
    o.quorum = 1;
    o.grace = false;
    o.final_round = true;
    o.delta_anchor = anchor;
    o.weighting = weighting;
    return o;
  }
  void finals() {
    EXPECT_EQ(s.receive_final(state(0, -1.0f, 0)), SyncReject::kNone);
    EXPECT_EQ(s.receive_final(state(1, -3.0f, 1)), SyncReject::kNone);
    EXPECT_EQ(s.receive_final(state(2, 0.0f, 1)), SyncReject::kNone);
  }
};

TEST(SyncFinalRound, TheFinalModelIsTheWeightedMeanOfTheLearnersStates) {
  Case c("global");
  c.finals();
  // Held, not merged by the rounds: the drain at the end of the run leaves them alone.
  EXPECT_EQ(c.s.finals_held(), 3);
  EXPECT_EQ(c.s.final_learners(0), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(c.s.drain(1.0).empty());
  EXPECT_EQ(c.s.version(0), 1);
  EXPECT_FLOAT_EQ(value(c.s), 2.0f);
  const std::vector<RoundResult> r = c.s.final_round();
  ASSERT_EQ(r.size(), 1u);
  ASSERT_TRUE(r[0].merged());
  EXPECT_EQ(r[0].outcome.version, 2);
  EXPECT_EQ(r[0].outcome.learners, (std::vector<int64_t>{0, 1, 2}));
  ASSERT_EQ(r[0].outcome.weights.size(), 3u);
  EXPECT_DOUBLE_EQ(r[0].outcome.weights[0], 0.25);
  EXPECT_DOUBLE_EQ(r[0].outcome.weights[1], 0.25);
  EXPECT_DOUBLE_EQ(r[0].outcome.weights[2], 0.5);
  EXPECT_EQ(r[0].outcome.staleness, (std::vector<int64_t>{1, 0, 0}));
  // The states exactly (learner 0's from the version it held): ¼·1 + ¼·5 + ½·2 = 2.5, every element.
  for (const auto& [n, t] : c.s.global()) EXPECT_TRUE(torch::allclose(t, torch::full_like(t, 2.5f))) << n;
  EXPECT_TRUE(torch::allclose(r[0].flat, torch::full({6}, 2.5f)));
  EXPECT_NEAR(r[0].outcome.delta_norm, 0.5 * std::sqrt(6.0), 1e-6);
  EXPECT_EQ(c.s.version(0), 2);
  EXPECT_EQ(c.s.finals_merged(), 3);
  EXPECT_EQ(c.s.finals_held(), 0);
  EXPECT_EQ(c.s.merged_contributions(), 1);  // the final round is not a merge of pushes
  EXPECT_TRUE(c.s.final_round().empty());    // nothing held any more
}

// A learner retires (its goodbye) after its final states: the version its state was made from stays kept although no
// learner left holds it, so the state is still rebuilt exactly. Here learners 1 and 2 hold version 1 (they joined it)
// and learner 0, which held version 0, retires: without the final state version 0 would go, and learner 0's state
// would be rebased onto Θ = 2 (θ = 3, the mean ¼·3 + ¼·5 + ½·2 = 3).
TEST(SyncFinalRound, AStateKeepsItsVersionAfterItsLearnerRetires) {
  Case c("global");
  c.finals();
  c.s.note_joined(1);
  c.s.note_joined(2);
  c.s.retire(1.0, 0);
  c.s.retire(1.0, 1);
  c.s.retire(1.0, 2);
  ASSERT_EQ(c.s.final_round().size(), 1u);
  EXPECT_FLOAT_EQ(value(c.s), 2.5f);
  EXPECT_EQ(c.s.stale_bases(), 0);
}

// A learner past its last step (set_finished) pushes nothing more: no round waits for it, a round merges at once when
// every learner is finished or retired, the quorum is lowered, and the versions it holds stay kept for its final
// states. Without sync.final_round the call is refused (a last step pushes then).
TEST(SyncFinalRound, AFinishedLearnerHoldsNoRoundBackAndKeepsItsVersions) {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 1;
  o.grace = true;
  o.overlap = 5;
  o.sync_every = 10;
  o.final_round = true;
  Syncer s(o, one_fragment(), global0(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  // Learner 0 pushes; learner 1 is connected and may still push: the round waits for it in the window
  // (ξ_step = 1, no quorum wait, no sync time: 0.8 · 5 · 1 = 4 s).
  ASSERT_EQ(s.receive(0.0, state(0, -1.0f, 0)), SyncReject::kNone);
  ASSERT_EQ(s.decide(0.5, 0).kind, RoundDecision::kWaitUntil);
  EXPECT_NEAR(s.decide(0.5, 0).until, 4.0, 1e-12);
  // Learner 1 took its last step, holding version 0: nobody else can come.
  s.set_finished(0.5, 1, true);
  EXPECT_TRUE(s.finished(1));
  ASSERT_EQ(s.decide(0.5, 0).kind, RoundDecision::kMerge);
  ASSERT_TRUE(s.on_round(0.5, 0).merged());  // Θ = 1, version 1
  // Learner 0 pushes against version 1 and takes its last step too: every learner is finished, so its round merges
  // at once although nobody is connected to wait for.
  ASSERT_EQ(s.receive(1.0, state(0, -1.0f, 1)), SyncReject::kNone);
  s.set_finished(1.0, 0, true);
  ASSERT_EQ(s.decide(1.0, 0).kind, RoundDecision::kMerge);
  ASSERT_TRUE(s.on_round(1.0, 0).merged());  // Θ = 2, version 2
  // Learner 1's final state is rebuilt from version 0, which stayed kept: θ = 0 − (−3) = 3 exactly (learner 0: 2).
  ASSERT_EQ(s.receive_final(state(1, -3.0f, 0)), SyncReject::kNone);
  ASSERT_EQ(s.receive_final(state(0, 0.0f, 2)), SyncReject::kNone);
  s.retire(2.0, 0);
  s.retire(2.0, 1);
  ASSERT_EQ(s.final_round().size(), 1u);
  EXPECT_FLOAT_EQ(value(s), 2.5f);
  EXPECT_EQ(s.stale_bases(), 0);
  // Undone (a learner that resumed from an earlier step), and refused without the final round.
  s.set_finished(3.0, 1, false);
  EXPECT_FALSE(s.finished(1));
  o.final_round = false;
  Syncer plain(o, one_fragment(), global0(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  EXPECT_THROW(plain.set_finished(0.0, 1, true), SyncError);
}

// Found by review: a learner marked finished lowers the quorum, and a round reaches it; undone (the learner resumed
// from an earlier step) the quorum rises again, and the round had kept its quorum time, so when the learner's push
// came the grace window had long run out and the round merged at once. The window now starts when the raised quorum
// is reached.
TEST(SyncFinalRound, UndoingAFinishRestartsTheRoundsWaitForItsQuorum) {
  SyncOptions o;
  o.learners = 3;
  o.quorum = 2;
  o.grace = true;
  o.overlap = 5;
  o.sync_every = 10;
  o.final_round = true;
  Syncer s(o, one_fragment(), global0(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  s.set_finished(0.0, 1, true);
  s.set_finished(0.0, 2, true);  // quorum 1: learner 0's push reaches it
  ASSERT_EQ(s.receive(0.0, state(0, -1.0f, 0)), SyncReject::kNone);
  s.set_finished(1.0, 1, false);  // both back: quorum 2, one arrival
  s.set_finished(1.0, 2, false);
  EXPECT_TRUE(s.stalled());
  // Learner 1's push reaches the quorum at t = 10; learner 2 may still come: the window (at most 0.8 · τ · ξ_step =
  // 4 s) runs from now.
  ASSERT_EQ(s.receive(10.0, state(1, -1.0f, 0)), SyncReject::kNone);
  const RoundDecision d = s.decide(10.0, 0);
  ASSERT_EQ(d.kind, RoundDecision::kWaitUntil) << "merged with no grace window: its quorum time was t = 0";
  EXPECT_GT(d.until, 10.0);
  EXPECT_LE(d.until, 14.0);
}

// Found by review: the history's memory cap (2M + 8 versions, for learners that went silent) also dropped the version
// a held final state is anchored at. Learner 0 finishes early (θ = 1 against version 0) while learner 1 merges 20 more
// times: version 0 must stay kept, or θ_0 is rebuilt against version 20 and carries learner 1's 20 updates a second
// time (the mean 20.5 instead of 10.5). The cap still bounds what nothing pins.
TEST(SyncFinalRound, AHeldStateKeepsItsVersionPastTheHistoryCap) {
  SyncOptions o;
  o.learners = 2;
  o.quorum = 1;
  o.grace = false;
  o.final_round = true;
  o.weighting = "uniform";
  Syncer s(o, one_fragment(), global0(), MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  ASSERT_EQ(s.receive_final(state(0, -1.0f, 0)), SyncReject::kNone);  // θ_0 = 0 − (−1) = 1
  s.set_finished(0.0, 0, true);
  for (int64_t v = 0; v < 20; ++v) {
    ASSERT_EQ(s.receive(static_cast<double>(v), state(1, -1.0f, v)), SyncReject::kNone);
    ASSERT_TRUE(s.on_round(static_cast<double>(v), 0).merged());  // Θ = v + 1
  }
  EXPECT_FLOAT_EQ(value(s), 20.0f);
  ASSERT_EQ(s.receive_final(state(1, 0.0f, 20)), SyncReject::kNone);  // θ_1 = 20
  s.retire(21.0, 0);
  s.retire(21.0, 1);
  ASSERT_EQ(s.final_round().size(), 1u);
  EXPECT_FLOAT_EQ(value(s), 10.5f);
  EXPECT_EQ(s.stale_bases(), 0);
}

TEST(SyncFinalRound, BaseAnchorRebasesEveryStateOntoTheCurrentModel) {
  // Θ + Σ ŵ·(−Δ) = 2 + ¼·1 + ¼·3 + 0 = 3: learner 0's step counts from Θ = 2, not from the version it held.
  Case c("base");
  c.finals();
  ASSERT_EQ(c.s.final_round().size(), 1u);
  EXPECT_FLOAT_EQ(value(c.s), 3.0f);
}

TEST(SyncFinalRound, UniformWeightingCountsEveryLearnerOnce) {
  Case c("global", "uniform");
  c.finals();
  ASSERT_EQ(c.s.final_round().size(), 1u);
  EXPECT_NEAR(value(c.s), (1.0f + 5.0f + 2.0f) / 3.0f, 1e-6);
}

TEST(SyncFinalRound, BadStatesAreRefusedAndALaterOneReplacesAnEarlier) {
  Case c("global");
  Contribution nan = state(0, -1.0f, 0);
  nan.deltas[0][1][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(c.s.receive_final(nan), SyncReject::kNonFinite);
  EXPECT_EQ(c.s.receive_final(state(1, -1.0f, 5)), SyncReject::kFutureBase);
  EXPECT_EQ(c.s.rejected().at("non_finite"), 1);
  EXPECT_EQ(c.s.rejected().at("future_base"), 1);
  EXPECT_EQ(c.s.finals_held(), 0);
  // Learner 1 says θ = 4, then θ = 6: the later state counts, alone here (weight 1).
  EXPECT_EQ(c.s.receive_final(state(1, -2.0f, 1)), SyncReject::kNone);
  EXPECT_EQ(c.s.receive_final(state(1, -4.0f, 1)), SyncReject::kNone);
  EXPECT_EQ(c.s.finals_held(), 1);
  ASSERT_EQ(c.s.final_round().size(), 1u);
  EXPECT_FLOAT_EQ(value(c.s), 6.0f);
}

// The learner's half: under sync.final_round the last step pushes nothing; after it final_pushes() holds the
// state of every fragment whose push is answered, Δ = Θ^v − θ, and none for a fragment still in flight.
TEST(LearnerFinalRound, TheLastStepPushesNothingAndTheFinalStatesWaitForTheAnswers) {
  torch::manual_seed(0);
  std::vector<std::pair<std::string, at::Tensor>> params = {{"a", torch::zeros({4})}, {"b", torch::zeros({4})}};
  const ModelPlan plan = plan_model(params, 2, 4);
  SyncOptions o;
  o.learners = 1;
  o.quorum = 1;
  o.sync_every = 4;
  o.overlap = 0;
  o.fragments = 2;
  o.wait_for_answer = false;
  o.apply = "rebase";
  o.final_round = true;
  LearnerCore core(o, plan, params, /*total_steps=*/6);
  std::vector<Push> sent;
  for (int64_t step = 1; step <= 6; ++step) {
    params[0].second.add_(1.0);  // θ moves +1 a step, everywhere: θ = step
    params[1].second.add_(1.0);
    for (auto& p : core.after_step(step, 10, 1.0)) sent.push_back(p);
  }
  EXPECT_TRUE(core.final_pushes(5).empty());  // only after the last step
  // Each fragment pushed once on its schedule (H = 4, offsets 0 and 2: steps 4 and 2) and was unanswered at the
  // last step, which pushed nothing.
  ASSERT_EQ(sent.size(), 2u);
  for (const auto& p : sent) EXPECT_LT(p.step, 6);
  EXPECT_EQ(core.in_flight(), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(core.final_pushes(6).empty());  // both wait for their answers
  // The answers: Θ' = θ as pushed (nothing merged from others; Θ^0 = 0, so Θ' = −Δ). Rebasing keeps what came after.
  std::map<int64_t, int64_t> pushed_at;
  for (const auto& p : sent) {
    pushed_at[p.fragment] = p.step;
    std::vector<float> d(static_cast<size_t>(p.elements));
    decode_floats_into(p.payload.data(), p.payload.size(), p.encoding, d.size(), d.data());
    core.receive(p.fragment, 1, torch::from_blob(d.data(), {p.elements}, torch::kFloat).neg().clone(), /*covers=*/-1);
  }
  EXPECT_EQ(core.apply_due(6).size(), 2u);
  EXPECT_TRUE(core.in_flight().empty());
  const std::vector<Push> finals = core.final_pushes(6);
  ASSERT_EQ(finals.size(), 2u);
  for (const auto& f : finals) {
    EXPECT_TRUE(f.final);
    EXPECT_EQ(f.base_version, 1);
    // θ = 6 after the rebase, the version held = θ at the push: Δ = Θ^1 − θ = (push step) − 6 everywhere, the
    // counters the steps since the push.
    const int64_t since = 6 - pushed_at.at(f.fragment);
    EXPECT_EQ(f.c_steps, since);
    EXPECT_EQ(f.c_tokens, 10 * since);
    std::vector<float> d(static_cast<size_t>(f.elements));
    decode_floats_into(f.payload.data(), f.payload.size(), f.encoding, d.size(), d.data());
    for (float x : d) EXPECT_FLOAT_EQ(x, -static_cast<float>(since));
  }
  // Nothing became outstanding: final states get no answer.
  EXPECT_TRUE(core.in_flight().empty());
}

}  // namespace final_round_cases
}  // namespace deloco
