// Tests of the learner half of the core (deloco/learner.h), written from the rules in DESIGN.md §1–2 and the
// issue: pushes are Θ^v − θ, the τ answer rule, the wait rule, apply-and-reset, the step-time estimate.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "deloco/learner.h"
#include "deloco/merge.h"
#include "deloco/sync.h"
#include "wire/quantize.h"

namespace deloco {
namespace learner_cases {

struct Toy {
  std::vector<std::pair<std::string, at::Tensor>> params{{"w", torch::zeros({2, 3})}, {"b", torch::zeros({4})}};
  ModelPlan plan;
  std::vector<Fragment> frags;
  explicit Toy(int64_t P, int64_t H) : plan(plan_model(params, P, H)), frags(plan.fragments) {}
  // Simulates an inner step: every parameter moves by +1.
  void train() {
    torch::NoGradGuard ng;
    for (auto& [n, t] : params) t.add_(1.0);
  }
};

SyncOptions opts(int64_t H, int64_t tau, bool wait) {
  SyncOptions o;
  o.learners = 1;
  o.quorum = 1;
  o.sync_every = H;
  o.overlap = tau;
  o.wait_for_answer = wait;
  return o;
}

at::Tensor answer(const LearnerCore& c, int64_t p, float v) { return torch::full({c.layout(p).elements}, v); }

std::vector<float> decode(const Push& p) {
  return decode_floats(p.payload.data(), p.payload.size(), p.encoding, static_cast<size_t>(p.elements));
}

TEST(LearnerCore, PushesTheOuterGradientAgainstTheHeldVersion) {
  Toy toy(1, 2);
  LearnerCore core(opts(2, 0, false), toy.plan, toy.params, 100);
  toy.train();
  EXPECT_TRUE(core.after_step(1, 10, 1.0).empty());
  toy.train();
  auto pushes = core.after_step(2, 10, 1.0);
  ASSERT_EQ(pushes.size(), 1u);
  EXPECT_EQ(pushes[0].base_version, 0);
  EXPECT_EQ(pushes[0].c_steps, 2);
  EXPECT_EQ(pushes[0].c_tokens, 20);
  for (float x : decode(pushes[0])) EXPECT_EQ(x, -2.0f);  // Θ^0 = 0, θ = 2
  // The answer Θ = 5 (version 1) is applied; the next push is taken against it.
  core.receive(0, 1, answer(core, 0, 5.0f));
  auto applied = core.apply_due(2);
  ASSERT_EQ(applied.size(), 1u);
  EXPECT_EQ(applied[0].version, 1);
  EXPECT_EQ(toy.params[0].second[1][2].item<float>(), 5.0f);
  EXPECT_EQ(core.c_steps(0), 0);
  toy.train();
  core.after_step(3, 7, 1.0);
  toy.train();
  pushes = core.after_step(4, 7, 1.0);
  ASSERT_EQ(pushes.size(), 1u);
  EXPECT_EQ(pushes[0].base_version, 1);
  EXPECT_EQ(pushes[0].c_tokens, 14);
  for (float x : decode(pushes[0])) EXPECT_EQ(x, -2.0f);  // 5 − 7
}

// net.error_feedback_decay reaches the pushes (e ← βe + Δ, SparseLoCo). Ten elements, top-k keeps one (density 0.1,
// 8-bit values), one push per step, the answer Θ = 0 applied after the first. Round 1 moves one element by 10 and
// another by 6: Δ = Θ − θ sends −10 and carries −6. Round 2 moves a third element by 4: with β = 1 the carried −6
// is the largest and goes; with β = 0.5 it is −3, so the −4 goes instead.
TEST(LearnerCore, ErrorFeedbackDecayScalesTheCarriedResidual) {
  auto pushes = [](double beta) {
    Toy toy(1, 1);
    LearnerCore core(opts(1, 0, false), toy.plan, toy.params, 100, Codec(Encoding::kTopk8, TopkOptions{0.1, 0}), true,
                     beta);
    auto move = [&](int64_t i, float by) {
      torch::NoGradGuard ng;
      toy.params[0].second.view({-1})[i].add_(by);
    };
    std::vector<std::vector<float>> sent;
    move(0, 10.f);
    move(1, 6.f);
    auto p = core.after_step(1, 1, 1.0);
    EXPECT_EQ(p.size(), 1u);
    sent.push_back(decode(p.at(0)));
    core.receive(0, 1, answer(core, 0, 0.0f));
    EXPECT_EQ(core.apply_due(1).size(), 1u);
    move(2, 4.f);
    p = core.after_step(2, 1, 1.0);
    EXPECT_EQ(p.size(), 1u);
    sent.push_back(decode(p.at(0)));
    return sent;
  };
  auto only_value = [](const std::vector<float>& d) {
    std::vector<float> nz;
    for (float v : d)
      if (v != 0.f) nz.push_back(v);
    EXPECT_EQ(nz.size(), 1u);
    return nz.empty() ? 0.f : nz[0];
  };
  const auto classic = pushes(1.0), decayed = pushes(0.5);
  EXPECT_EQ(classic[0], decayed[0]);  // nothing carried yet
  EXPECT_NEAR(only_value(classic[0]), -10.f, 0.05f);
  EXPECT_NEAR(only_value(classic[1]), -6.f, 0.05f);
  EXPECT_NEAR(only_value(decayed[1]), -4.f, 0.05f);
  for (double bad : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    Toy toy(1, 1);
    EXPECT_THROW(LearnerCore(opts(1, 0, false), toy.plan, toy.params, 100, Codec(Encoding::kInt8), true, bad),
                 SyncError)
        << bad;
  }
}

// The hang of issue 10: with τ > 0 and waiting, an answer that came within τ steps was applied but the send stayed
// outstanding, so the learner waited for a second answer that never came.
// One shard's part of the global state (a sharded syncer): only its fragments are overwritten and reset; the
// others keep their parameters, versions, counters and outstanding sends.
TEST(LearnerCore, InstallingOneShardsPartLeavesTheOtherFragmentsAlone) {
  Toy toy(2, 2);
  LearnerCore core(opts(2, 0, false), toy.plan, toy.params, 100);
  toy.train();
  core.after_step(1, 10, 1.0);
  toy.train();
  auto pushes = core.after_step(2, 10, 1.0);  // fragment with offset 0 is due at step 2
  ASSERT_EQ(pushes.size(), 1u);
  const int64_t sent = pushes[0].fragment, other = 1 - sent;
  EXPECT_GE(core.outstanding(sent), 0);
  ASSERT_EQ(core.c_steps(other), 2);
  // The part of the shard serving `other`: its values 7, version 3.
  const int64_t n = core.layout(other).elements;
  core.install_fragments({other}, torch::full({n}, 7.0f), {3});
  EXPECT_EQ(core.version(other), 3);
  EXPECT_EQ(core.c_steps(other), 0);
  EXPECT_EQ(core.version(sent), 0);
  EXPECT_GE(core.outstanding(sent), 0);  // still waits for its answer
  for (const auto& name : core.layout(other).names)
    for (const auto& [pn, t] : toy.params)
      if (pn == name) EXPECT_TRUE(torch::all(t == 7.0f).item<bool>()) << name;
  for (const auto& name : core.layout(sent).names)
    for (const auto& [pn, t] : toy.params)
      if (pn == name) EXPECT_TRUE(torch::all(t == 2.0f).item<bool>()) << name;
  // The next push of `other` is taken against what was installed: Θ = 7, θ = 7 + 2 after two more steps.
  toy.train();
  toy.train();
  auto later = core.after_step(4, 10, 1.0);
  for (const auto& p : later)
    if (p.fragment == other) {
      EXPECT_EQ(p.base_version, 3);
      for (float x : decode(p)) EXPECT_EQ(x, -2.0f);
    }
  // Sizes and fragment ids are checked before anything changes.
  EXPECT_THROW(core.install_fragments({other}, torch::zeros({n + 1}), {4}), SyncError);
  EXPECT_THROW(core.install_fragments({5}, torch::zeros({n}), {4}), SyncError);
  EXPECT_THROW(core.install_fragments({other}, torch::zeros({n}), {4, 5}), SyncError);
  EXPECT_EQ(core.version(other), 3);
}

TEST(LearnerCore, AnAnswerWithinTauIsAppliedAtSendPlusTauAndClearsTheWait) {
  Toy toy(1, 4);
  LearnerCore core(opts(4, 2, true), toy.plan, toy.params, 100);
  for (int64_t s = 1; s <= 4; ++s) {
    toy.train();
    core.after_step(s, 1, 1.0);
  }
  EXPECT_EQ(core.outstanding(0), 4);
  EXPECT_FALSE(core.must_wait(4));  // τ = 2: two more steps before the answer is needed
  toy.train();
  core.after_step(5, 1, 1.0);
  core.receive(0, 1, answer(core, 0, 9.0f));  // arrives at step 5, before send + τ = 6
  EXPECT_TRUE(core.apply_due(5).empty());     // held until step 6
  EXPECT_EQ(toy.params[1].second[0].item<float>(), 5.0f);
  EXPECT_FALSE(core.must_wait(5));
  toy.train();
  core.after_step(6, 1, 1.0);
  EXPECT_EQ(core.apply_due(6).size(), 1u);
  EXPECT_EQ(toy.params[1].second[0].item<float>(), 9.0f);
  EXPECT_EQ(core.outstanding(0), -1);
  EXPECT_FALSE(core.must_wait(6));
  EXPECT_FALSE(core.must_wait(7));
  // The next send at step 8 is waited for at step 10, and only then.
  for (int64_t s = 7; s <= 9; ++s) {
    toy.train();
    core.after_step(s, 1, 1.0);
    EXPECT_FALSE(core.must_wait(s));
  }
  toy.train();
  core.after_step(10, 1, 1.0);
  EXPECT_EQ(core.waiting_for(10), std::vector<int64_t>{0});
  core.receive(0, 2, answer(core, 0, 1.0f));
  EXPECT_FALSE(core.must_wait(10));
  EXPECT_EQ(core.apply_due(10).size(), 1u);
}

TEST(LearnerCore, WithoutWaitingALateAnswerIsAppliedOnArrivalAndAnEarlyOneAtSendPlusTau) {
  Toy toy(1, 4);
  LearnerCore core(opts(4, 3, false), toy.plan, toy.params, 100);
  for (int64_t s = 1; s <= 4; ++s) core.after_step(s, 1, 1.0);
  for (int64_t s = 5; s <= 8; ++s) {
    EXPECT_FALSE(core.must_wait(s));  // never waits
    core.after_step(s, 1, 1.0);
  }
  // Late: sent at 8 (the one at 4 was never answered), the answer arrives at step 11 = 8 + τ: applied at once.
  for (int64_t s = 9; s <= 11; ++s) core.after_step(s, 1, 1.0);
  core.receive(0, 1, answer(core, 0, 2.0f));
  EXPECT_EQ(core.apply_due(11).size(), 1u);
  // Early: sent at 12, the answer arrives at 13 and is applied at 15.
  core.after_step(12, 1, 1.0);
  core.after_step(13, 1, 1.0);
  core.receive(0, 2, answer(core, 0, 3.0f));
  EXPECT_TRUE(core.apply_due(13).empty());
  core.after_step(14, 1, 1.0);
  EXPECT_TRUE(core.apply_due(14).empty());
  core.after_step(15, 1, 1.0);
  EXPECT_EQ(core.apply_due(15).size(), 1u);
  EXPECT_EQ(core.version(0), 2);
}

TEST(LearnerCore, AtTheEndOfTrainingAWaitingLearnerWaitsForItsLastAnswer) {
  Toy toy(1, 4);
  LearnerCore core(opts(4, 3, true), toy.plan, toy.params, /*total_steps=*/4);
  for (int64_t s = 1; s <= 4; ++s) core.after_step(s, 1, 1.0);
  EXPECT_TRUE(core.must_wait(4));  // step 4 is the last: send + τ is never reached
  core.receive(0, 1, answer(core, 0, 0.0f));
  EXPECT_EQ(core.apply_due(4).size(), 1u);
  EXPECT_FALSE(core.must_wait(4));
}

// A marked answer (a syncer that says which push it answers) that does not include the outstanding push is a newer
// Θ_p merged without it: a waiting learner keeps it back and waits on; the version that includes the push is the
// answer. (Taken as the answer, the next push would be based one version behind, and a learner that keeps doing so
// feeds each outer update back into the next: with delta_anchor = global and Nesterov momentum that loop diverges.)
TEST(LearnerCore, AWaitingLearnerWaitsForTheVersionThatIncludesItsPush) {
  Toy toy(1, 4);
  LearnerCore core(opts(4, 0, true), toy.plan, toy.params, /*total_steps=*/100);
  for (int64_t s = 1; s <= 4; ++s) {
    toy.train();
    core.after_step(s, 1, 1.0);
  }
  ASSERT_EQ(core.outstanding(0), 4);  // pushed with base version 0
  core.receive(0, 1, answer(core, 0, 7.0f), /*covers=*/0);  // version 1: another learner's merge, not ours
  EXPECT_EQ(core.waiting_for(4), std::vector<int64_t>{0});
  EXPECT_TRUE(core.apply_due(4).empty());
  EXPECT_EQ(toy.params[1].second[0].item<float>(), 4.0f);  // untouched
  core.receive(0, 2, answer(core, 0, 8.0f), /*covers=*/1);  // version 2 includes our push (base 0 < 1)
  EXPECT_FALSE(core.must_wait(4));
  const auto applied = core.apply_due(4);
  ASSERT_EQ(applied.size(), 1u);
  EXPECT_EQ(applied[0].version, 2);
  EXPECT_EQ(toy.params[1].second[0].item<float>(), 8.0f);
  // The next push is based on version 2; an answer marked with an older push (base 0: covers 1) does not answer it.
  for (int64_t s = 5; s <= 8; ++s) core.after_step(s, 1, 1.0);
  core.receive(0, 3, answer(core, 0, 9.0f), /*covers=*/1);
  EXPECT_TRUE(core.must_wait(8));
  core.receive(0, 4, answer(core, 0, 10.0f), /*covers=*/3);
  EXPECT_FALSE(core.must_wait(8));
  EXPECT_EQ(core.apply_due(8).size(), 1u);
  EXPECT_EQ(core.version(0), 4);
  // Unmarked answers (covers = −1: the simulator, an older syncer) answer any push, as before.
  for (int64_t s = 9; s <= 12; ++s) core.after_step(s, 1, 1.0);
  core.receive(0, 5, answer(core, 0, 11.0f));
  EXPECT_FALSE(core.must_wait(12));
  EXPECT_EQ(core.apply_due(12).size(), 1u);
}

// sync.apply = rebase, worked by hand: the learner moves +1 a step from 0, H = 2, τ = 0, one fragment, no waiting.
// Push at step 2 (θ = 2). Version 1 (Θ = 5) answers it and is applied at step 4 (θ = 4): θ = 5 + (4 − 2) = 7, and
// the counters keep the 2 steps after the push. Overwrite would leave θ = 5 and lose those 2 steps.
TEST(LearnerCore, RebaseKeepsTheStepsTrainedSinceThePush) {
  Toy toy(1, 2);
  SyncOptions o = opts(2, 0, false);
  o.apply = "rebase";
  LearnerCore core(o, toy.plan, toy.params, /*total_steps=*/100);
  for (int64_t s = 1; s <= 2; ++s) {
    toy.train();
    core.after_step(s, 10, 1.0);
  }
  ASSERT_EQ(core.outstanding(0), 2);
  toy.train();
  EXPECT_TRUE(core.after_step(3, 10, 1.0).empty());
  toy.train();
  // Step 4 is due, but the push of step 2 is unanswered: no second push (it would carry steps 1-2 again).
  EXPECT_TRUE(core.after_step(4, 10, 1.0).empty());
  core.receive(0, 1, answer(core, 0, 5.0f), /*covers=*/1);
  ASSERT_EQ(core.apply_due(4).size(), 1u);
  for (const auto& [n, t] : toy.params)
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.flatten()[i].item<float>(), 7.0f) << n;
  EXPECT_EQ(core.c_steps(0), 2);
  EXPECT_EQ(core.c_tokens(0), 20);
  EXPECT_EQ(core.outstanding(0), -1);
  // Step 4's push fell due while the push of step 2 was unanswered: it goes at step 5 (θ = 8), as soon as the
  // answer is in, not at step 6. It carries the progress since version 1: Δ = 5 − 8 = −3, 3 steps.
  toy.train();
  auto pushes = core.after_step(5, 10, 1.0);
  ASSERT_EQ(pushes.size(), 1u);
  EXPECT_EQ(pushes[0].step, 5);
  EXPECT_EQ(pushes[0].c_steps, 3);
  for (float x : decode(pushes[0])) EXPECT_EQ(x, -3.0f);
  toy.train();
  EXPECT_TRUE(core.after_step(6, 10, 1.0).empty());  // due, but step 5's push is unanswered
  // Version 2 (Θ = 10) does not hold it (covers 1: another learner's merge on version 1), applied at step 7
  // (θ = 10): θ = 10 + (10 − 5) = 15, the push still outstanding, moved along with it (its θ 8 → 13).
  toy.train();
  core.after_step(7, 10, 1.0);
  core.receive(0, 2, answer(core, 0, 10.0f), /*covers=*/1);
  ASSERT_EQ(core.apply_due(7).size(), 1u);
  EXPECT_EQ(toy.params[1].second[0].item<float>(), 15.0f);
  EXPECT_EQ(core.outstanding(0), 5);
  // Version 3 (Θ = 20) holds it; at step 8 (θ = 16): θ = 20 + (16 − 13) = 23, the 3 steps after the push.
  toy.train();
  core.after_step(8, 10, 1.0);
  core.receive(0, 3, answer(core, 0, 20.0f), /*covers=*/2);
  ASSERT_EQ(core.apply_due(8).size(), 1u);
  EXPECT_EQ(toy.params[1].second[0].item<float>(), 23.0f);
  EXPECT_EQ(core.c_steps(0), 3);
  EXPECT_EQ(core.outstanding(0), -1);
  // Step 6's push, overdue, goes at step 9 (θ = 24): 4 steps, Δ = 20 − 24.
  toy.train();
  pushes = core.after_step(9, 10, 1.0);
  ASSERT_EQ(pushes.size(), 1u);
  EXPECT_EQ(pushes[0].c_steps, 4);
  for (float x : decode(pushes[0])) EXPECT_EQ(x, -4.0f);
}

// Rebase keeps progress across answers, so the last step pushes every fragment that has some (and none outstanding).
TEST(LearnerCore, RebaseEndsWithAPushOfEveryFragmentWithProgress) {
  Toy toy(2, 10);
  SyncOptions o = opts(10, 0, false);
  o.apply = "rebase";
  LearnerCore core(o, toy.plan, toy.params, /*total_steps=*/13);
  std::vector<std::pair<int64_t, int64_t>> pushed;  // (step, fragment)
  for (int64_t s = 1; s <= 13; ++s) {
    toy.train();
    for (const Push& p : core.after_step(s, 1, 1.0)) {
      pushed.emplace_back(s, p.fragment);
      core.receive(p.fragment, core.version(p.fragment) + 1, answer(core, p.fragment, 0.0f), /*covers=*/1);
      core.apply_due(s);
    }
  }
  // Fragments 0 and 1 are due at steps 10 and 5 (offsets 0, 5); both push again at the last step, 13.
  EXPECT_EQ(pushed, (std::vector<std::pair<int64_t, int64_t>>{{5, 1}, {10, 0}, {13, 0}, {13, 1}}));
}

// A fragment in flight at the last step: its final push is held back (it would carry the outstanding push's part a
// second time), and the core says so. +1 a step, H = 2, 6 steps, one fragment: the push of step 2 is unanswered
// through step 6, so the pushes due at 4 and 6 are not made.
TEST(LearnerCore, RebaseSaysWhichFinalPushesWereHeldBack) {
  Toy toy(1, 2);
  SyncOptions o = opts(2, 0, false);
  o.apply = "rebase";
  LearnerCore core(o, toy.plan, toy.params, /*total_steps=*/6);
  for (int64_t s = 1; s <= 6; ++s) {
    toy.train();
    EXPECT_EQ(core.after_step(s, 10, 1.0).size(), s == 2 ? 1u : 0u) << s;
    if (s == 4) EXPECT_TRUE(core.held_back_at_end(s).empty());  // overdue, but not the last step
  }
  EXPECT_EQ(core.held_back_at_end(6), std::vector<int64_t>{0});
  EXPECT_EQ(core.c_steps(0), 6);  // counted from the held version 0: steps 1-2 pushed, 3-6 in no push
  // Answered at the last boundary: nothing is outstanding, but no step follows to push the rest.
  core.receive(0, 1, answer(core, 0, 5.0f), /*covers=*/1);
  ASSERT_EQ(core.apply_due(6).size(), 1u);
  EXPECT_EQ(core.outstanding(0), -1);
  EXPECT_EQ(core.c_steps(0), 4);  // steps 3-6
  EXPECT_EQ(core.held_back_at_end(6), std::vector<int64_t>{0});
  // Without rebase nothing is held back: the last step's push goes as scheduled.
  Toy toy2(1, 2);
  LearnerCore plain(opts(2, 0, false), toy2.plan, toy2.params, /*total_steps=*/6);
  for (int64_t s = 1; s <= 6; ++s) {
    toy2.train();
    plain.after_step(s, 10, 1.0);
  }
  EXPECT_TRUE(plain.held_back_at_end(6).empty());
}

TEST(LearnerCore, RebaseIsAConfigChoiceThatNeedsAlphaZero) {
  SyncOptions o;
  o.apply = "rebase";
  EXPECT_NO_THROW(o.validate());
  o.alpha = 0.5;
  EXPECT_THROW(o.validate(), SyncError);
  o.alpha = 0;
  o.apply = "keep";
  EXPECT_THROW(o.validate(), SyncError);
}

// Without the wait rule nothing is held back: a marked answer that lacks the push is applied when due (async mode).
TEST(LearnerCore, WithoutWaitingAnAnswerThatLacksThePushIsStillApplied) {
  Toy toy(1, 4);
  LearnerCore core(opts(4, 0, false), toy.plan, toy.params, /*total_steps=*/100);
  for (int64_t s = 1; s <= 4; ++s) core.after_step(s, 1, 1.0);
  core.receive(0, 1, answer(core, 0, 7.0f), /*covers=*/0);
  EXPECT_FALSE(core.must_wait(4));
  EXPECT_EQ(core.apply_due(4).size(), 1u);
}

// Issue 11: a rolled-back merge refuses every contributor at once. Under wait_for_answer a refused push must not
// leave its learner waiting for an answer that will never come; an answer received earlier still applies.
TEST(LearnerCore, ARefusedPushIsNoLongerWaitedFor) {
  Toy toy(1, 4);
  LearnerCore core(opts(4, 0, true), toy.plan, toy.params, /*total_steps=*/100);
  for (int64_t s = 1; s <= 4; ++s) core.after_step(s, 1, 1.0);
  EXPECT_TRUE(core.must_wait(4));
  core.refused(0);
  EXPECT_FALSE(core.must_wait(4));
  EXPECT_EQ(core.outstanding(0), -1);
  EXPECT_THROW(core.refused(1), SyncError);  // one fragment only
  // The next push is still Θ^0 − θ: the parameters moved by +1 in each of steps 5-8, so −4 everywhere.
  for (int64_t s = 5; s <= 8; ++s) {
    toy.train();
    auto pushes = core.after_step(s, 1, 1.0);
    if (s == 8) {
      ASSERT_EQ(pushes.size(), 1u);
      for (float v : decode(pushes[0])) EXPECT_FLOAT_EQ(v, -4.0f);
    }
  }
}

// Issue 29, defect 10: a push refused by a norm bound left its progress in θ, so every later push of that fragment
// carried it again and was refused again: the fragment never merged again for that learner. drop_drift replaces the
// drift by the held version, so the next round's push is an ordinary one and merges. Driven through the real Syncer.
TEST(LearnerCore, ANormRefusalDropsTheDriftAndTheFragmentMergesAgain) {
  for (const bool drop : {false, true}) {
    Toy toy(1, 1);
    LearnerCore core(opts(1, 0, false), toy.plan, toy.params, 100);
    SyncOptions o = opts(1, 0, false);
    o.max_delta_ratio = 2.0;  // ‖Θ‖ = 0: the bound is 2 · √10 · kDeltaRmsFloor
    std::vector<std::pair<std::string, at::Tensor>> global;
    for (const auto& [n, t] : toy.params) global.emplace_back(n, t.clone());
    Syncer syncer(o, toy.frags, global, MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
    auto round = [&](int64_t step, float move) {
      {
        torch::NoGradGuard ng;
        for (auto& [n, t] : toy.params) t.add_(move);
      }
      auto pushes = core.after_step(step, 1, 1.0);
      EXPECT_EQ(pushes.size(), 1u);
      const SyncReject why =
          syncer.receive(static_cast<double>(step), decode_push(0, pushes.at(0), core.layout(0)));
      if (why == SyncReject::kNone) {
        const RoundResult r = syncer.on_round(static_cast<double>(step), 0);
        EXPECT_TRUE(r.merged());
        EXPECT_TRUE(torch::equal(r.flat, torch::cat({syncer.fragment_tensors(0)[0].flatten(),
                                                     syncer.fragment_tensors(0)[1].flatten()})));
        core.receive(0, r.outcome.version, r.flat);
        core.apply_due(step);
      } else if (drop && refusal_drops_drift(why)) {
        core.drop_drift(0);
      } else {
        core.refused(0);
      }
      return why;
    };
    EXPECT_EQ(round(1, 100.0f), SyncReject::kNormRatio);  // a loss spike: ‖Δ‖ = 100 · √10
    EXPECT_TRUE(refusal_drops_drift(SyncReject::kNormRatio));
    if (drop) {
      for (const auto& [n, t] : toy.params) EXPECT_EQ(t.abs().max().item<float>(), 0.0f) << n << ": back at Θ^0";
      EXPECT_EQ(core.c_steps(0), 0);
      EXPECT_EQ(core.outstanding(0), -1);
    }
    // The next round moves θ by an ordinary +1: merged with the drop, refused again without it (the wedge).
    EXPECT_EQ(round(2, 1.0f), drop ? SyncReject::kNone : SyncReject::kNormRatio);
    EXPECT_EQ(round(3, 1.0f), drop ? SyncReject::kNone : SyncReject::kNormRatio);
    EXPECT_EQ(syncer.merged_contributions(), drop ? 2 : 0);
  }
  EXPECT_FALSE(refusal_drops_drift(SyncReject::kFutureBase));
  EXPECT_FALSE(refusal_drops_drift(SyncReject::kNonFinite));
}

// Found by review: under sync.apply = rebase a learner's counter is cut only by the answer to its own push, but the
// syncer bounded c_steps from the learner's last *accepted* push. A push accepted and then dropped (a standby taking
// over drops the waiting ones; a rolled-back round alike) left the bound short by that push's steps for good: every
// later push of the fragment was refused as counter_out_of_range. Driven by a real learner core and syncer.
TEST(LearnerCore, UnderRebaseAnAcceptedButUnmergedPushDoesNotLockTheFragmentOut) {
  Toy toy(1, 10);
  SyncOptions o = opts(10, 0, false);
  o.apply = "rebase";
  o.learners = 2;
  o.max_delta_ratio = 0;  // (the toy's drift is large against its Θ = 0)
  o.max_delta_outlier = 0;
  LearnerCore core(o, toy.plan, toy.params, 1000);
  std::vector<std::pair<std::string, at::Tensor>> global;
  for (const auto& [n, t] : toy.params) global.emplace_back(n, t.clone());
  Syncer syncer(o, toy.frags, global, MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  for (int64_t m = 0; m < 2; ++m) syncer.set_budget(m, {0, 1000});
  auto send = [&](const Push& p) {
    Contribution c = decode_push(0, p, core.layout(0));
    c.step = p.step;
    return syncer.receive(static_cast<double>(p.step), c);
  };
  at::Tensor late;  // the answer to push A, delivered at step 25
  int64_t accepted = 0;
  for (int64_t step = 1; step <= 70; ++step) {
    toy.train();
    for (const Push& p : core.after_step(step, 1, 1.0)) {
      const SyncReject why = send(p);
      EXPECT_EQ(why, SyncReject::kNone) << "step " << step << ": " << sync_reject_name(why);
      if (why != SyncReject::kNone) {
        core.refused(0);
        continue;
      }
      ++accepted;
      if (step == 10) {  // A: merged at once (version 1), its answer late
        const RoundResult r = syncer.on_round(10, 0);
        ASSERT_TRUE(r.merged());
        late = r.flat;
      } else if (step == 26) {  // B: accepted, then dropped (a standby took over): refused back to the learner
        syncer.drop_waiting();
        core.refused(0);
        // Another learner's merge (version 2) reaches learner 0, answering nothing of its own.
        Contribution other;
        other.learner = 1;
        other.fragment = 0;
        for (const auto& [n, t] : toy.params) other.deltas.push_back(torch::zeros_like(t));
        other.base_version = 1;
        other.c_steps = other.c_tokens = 10;
        other.step = 26;
        ASSERT_EQ(syncer.receive(26, other), SyncReject::kNone);
        const RoundResult r = syncer.on_round(26, 0);
        ASSERT_TRUE(r.merged());
        core.receive(0, r.outcome.version, r.flat);
      } else {  // later pushes: merged and answered at once
        const RoundResult r = syncer.on_round(static_cast<double>(step), 0);
        ASSERT_TRUE(r.merged());
        core.receive(0, r.outcome.version, r.flat);
      }
    }
    if (step == 25) core.receive(0, 1, late);
    core.apply_due(step);
  }
  EXPECT_EQ(accepted, 7);  // steps 10, 26, 30, 40, 50, 60, 70
  EXPECT_EQ(syncer.rejected().count("counter_out_of_range"), 0u);
  // The bound still holds a liar: a claim of more steps than it could have run since its last merged push.
  Contribution liar;
  liar.learner = 0;
  liar.fragment = 0;
  for (const auto& [n, t] : toy.params) liar.deltas.push_back(torch::zeros_like(t));
  liar.base_version = core.version(0);
  liar.c_steps = liar.c_tokens = 21;  // 70 − 70 + H = 10 allowed
  liar.step = 70;
  EXPECT_EQ(syncer.receive(70, liar), SyncReject::kCounterOutOfRange);
}

TEST(LearnerCore, OlderAnswersAreIgnoredAndAlphaMixes) {
  Toy toy(1, 2);
  SyncOptions o = opts(2, 0, false);
  o.alpha = 0.25;
  LearnerCore core(o, toy.plan, toy.params, 100);
  toy.train();  // θ = 1
  core.receive(0, 3, answer(core, 0, 5.0f));
  core.receive(0, 2, answer(core, 0, 100.0f));  // older than what is pending: ignored
  EXPECT_EQ(core.apply_due(1).size(), 1u);
  EXPECT_FLOAT_EQ(toy.params[0].second[0][0].item<float>(), 0.75f * 5.0f + 0.25f * 1.0f);
  core.receive(0, 3, answer(core, 0, 100.0f));  // not newer than held
  EXPECT_TRUE(core.apply_due(1).empty());
  EXPECT_THROW(core.receive(0, 4, torch::zeros({3})), SyncError);
}

TEST(LearnerCore, FragmentsAreDueStaggeredAndCountedSeparately) {
  Toy toy(2, 4);
  LearnerCore core(opts(4, 0, false), toy.plan, toy.params, 100);
  std::vector<std::pair<int64_t, int64_t>> sent;  // (step, fragment)
  for (int64_t s = 1; s <= 8; ++s)
    for (const auto& p : core.after_step(s, 3, 1.0)) sent.emplace_back(s, p.fragment);
  // offsets 0 and 2 (H/P apart): fragment 1 at steps 2 and 6, fragment 0 at 4 and 8.
  std::vector<std::pair<int64_t, int64_t>> want = {{2, 1}, {4, 0}, {6, 1}, {8, 0}};
  EXPECT_EQ(sent, want);
  EXPECT_EQ(core.c_steps(0), 8);
  core.receive(1, 1, answer(core, 1, 0.0f));
  core.apply_due(8);
  EXPECT_EQ(core.c_steps(1), 0);
  EXPECT_EQ(core.c_steps(0), 8);
  EXPECT_EQ(core.c_tokens(0), 24);
}

TEST(LearnerCore, StepTimeIsTheMeanSinceThePreviousPush) {
  Toy toy(1, 3);
  LearnerCore core(opts(3, 0, false), toy.plan, toy.params, 100);
  core.after_step(1, 1, 1.0);
  core.after_step(2, 1, 2.0);
  EXPECT_DOUBLE_EQ(core.step_time(), 1.5);  // running mean before the first push
  auto p = core.after_step(3, 1, 6.0);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_DOUBLE_EQ(p[0].step_time, 3.0);
  core.after_step(4, 1, 10.0);
  core.after_step(5, 1, 10.0);
  p = core.after_step(6, 1, 1.0);
  EXPECT_DOUBLE_EQ(p[0].step_time, 7.0);
}

TEST(LearnerCore, Int4PushesWithErrorFeedbackTrackTheTrueOuterGradients) {
  Toy toy(1, 1);
  LearnerCore core(opts(1, 0, false), toy.plan, toy.params, 100, Encoding::kInt4, /*error_feedback=*/true);
  torch::manual_seed(3);
  // θ drifts randomly; the learner never receives an answer, so every push is against Θ^0 = 0: Δ_s = −θ_s.
  std::vector<double> true_sum(10, 0.0), sent_sum(10, 0.0);
  for (int64_t s = 1; s <= 50; ++s) {
    {
      torch::NoGradGuard ng;
      toy.params[0].second.add_(torch::randn({2, 3}) * 0.1);
      toy.params[1].second.add_(torch::randn({4}) * 0.1);
    }
    auto pushes = core.after_step(s, 1, 1.0);
    ASSERT_EQ(pushes.size(), 1u);
    auto got = decode(pushes[0]);
    auto flat = torch::cat({toy.params[0].second.flatten(), toy.params[1].second.flatten()});
    for (int i = 0; i < 10; ++i) {
      true_sum[i] += -flat[i].item<double>();
      sent_sum[i] += got[i];
    }
  }
  // With error feedback the running sums differ by at most the last residual (half an int4 step).
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(sent_sum[i], true_sum[i], 0.2) << i;
}

// A push is cumulative against the version the learner holds (Θ^v − θ), and a refused one delivered nothing: the next
// push carries its progress again, so it must start from the residual the refused one started from, or it would also
// send what the codec left out of the refused push (about 90 % of a top-k push) a second time.
TEST(LearnerCore, ARefusedPushGivesBackItsErrorFeedbackResidual) {
  Toy toy(1, 1);
  const Codec topk(Encoding::kTopk8, TopkOptions{0.2, 0});
  LearnerCore core(opts(1, 0, /*wait=*/true), toy.plan, toy.params, 100, topk, /*error_feedback=*/true);
  torch::manual_seed(5);
  auto drift = [&] {
    torch::NoGradGuard ng;
    for (auto& [n, t] : toy.params) t.add_(torch::randn_like(t));
  };
  drift();
  auto first = core.after_step(1, 1, 1.0);
  ASSERT_EQ(first.size(), 1u);
  core.refused(0);
  auto again = core.after_step(2, 1, 1.0);  // θ unchanged: the same outer gradient, the same push
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].base_version, 0);
  EXPECT_EQ(again[0].payload, first[0].payload);
  // Refused again, then more steps: the push is what a learner that never pushed would send from this θ.
  core.refused(0);
  drift();
  auto later = core.after_step(3, 1, 1.0);
  ASSERT_EQ(later.size(), 1u);
  std::vector<std::pair<std::string, at::Tensor>> zeros;
  for (const auto& [n, t] : toy.params) zeros.emplace_back(n, torch::zeros_like(t));
  LearnerCore fresh(opts(1, 0, true), plan_model(zeros, 1, 1), zeros, 100, topk, /*error_feedback=*/true);
  {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < zeros.size(); ++i) zeros[i].second.copy_(toy.params[i].second);
  }
  auto reference = fresh.after_step(1, 1, 1.0);
  ASSERT_EQ(reference.size(), 1u);
  EXPECT_EQ(later[0].payload, reference[0].payload);
  // An accepted push keeps its residual: answered, the next version's push carries what the codec left out.
  core.receive(0, 1, answer(core, 0, 0.0f));
  ASSERT_EQ(core.apply_due(3).size(), 1u);
  auto next = core.after_step(4, 1, 1.0);  // θ = Θ^1 = 0: the push is the residual alone
  ASSERT_EQ(next.size(), 1u);
  EXPECT_NE(decode(next[0]), std::vector<float>(10, 0.0f));
}

TEST(LearnerCore, InstallResetsEverything) {
  Toy toy(1, 2);
  LearnerCore core(opts(2, 1, true), toy.plan, toy.params, 100);
  core.after_step(1, 1, 1.0);
  core.after_step(2, 1, 1.0);
  core.after_step(3, 1, 1.0);
  EXPECT_TRUE(core.must_wait(3));
  core.install(torch::full({10}, 4.0f), {7});
  EXPECT_FALSE(core.must_wait(3));
  EXPECT_EQ(core.version(0), 7);
  EXPECT_EQ(core.c_steps(0), 0);
  EXPECT_EQ(toy.params[0].second[1][1].item<float>(), 4.0f);
  EXPECT_THROW(core.install(torch::zeros({9}), {7}), SyncError);
  EXPECT_THROW(core.install(torch::zeros({10}), {7, 8}), SyncError);
}

// The core takes its fragments and layouts from the model plan, and refuses parameters that are not the plan's.
TEST(LearnerCore, TakesTheModelPlanAndRefusesOtherParameters) {
  Toy toy(2, 4);
  LearnerCore core(opts(4, 0, false), toy.plan, toy.params, 100);
  EXPECT_EQ(core.fragments().size(), 2u);
  EXPECT_EQ(core.model_layout().elements, 10);
  for (int64_t p = 0; p < 2; ++p) EXPECT_EQ(core.layout(p).names, toy.plan.fragment_layouts[p].names);
  auto reshaped = toy.params;
  reshaped[0].second = torch::zeros({3, 2});
  EXPECT_THROW(LearnerCore(opts(4, 0, false), toy.plan, reshaped, 100), SyncError);
  auto renamed = toy.params;
  renamed[1].first = "c";
  EXPECT_THROW(LearnerCore(opts(4, 0, false), toy.plan, renamed, 100), SyncError);
  auto fewer = toy.params;
  fewer.pop_back();
  EXPECT_THROW(LearnerCore(opts(4, 0, false), toy.plan, fewer, 100), SyncError);
}


// Dynamic local updates (Liu et al. 2024): H_m = max(1, round(H · fastest / ξ_m)). The syncer derives it from the
// step times the pushes carried; the learner follows it after its first push on the usual schedule.
TEST(DynamicLocalUpdates, ThePeriodScalesWithTheLearnersSpeed) {
  EXPECT_EQ(dynamic_sync_every(25, 1.0, 1.0), 25);
  EXPECT_EQ(dynamic_sync_every(25, 1.0, 1.18), 21);   // 25 / 1.18 = 21.2
  EXPECT_EQ(dynamic_sync_every(25, 1.0, 100.0), 1);   // never below one step
  EXPECT_EQ(dynamic_sync_every(25, 2.0, 1.0), 25);    // never above H
  EXPECT_EQ(dynamic_sync_every(25, 0.0, 1.0), 25);    // unknown: H
  EXPECT_EQ(dynamic_sync_every(25, 1.0, std::nan("")), 25);

  SyncOptions o;
  o.learners = 3;
  o.quorum = 1;
  o.sync_every = 20;
  o.overlap = 4;
  o.dynamic_local_updates = true;
  std::vector<std::pair<std::string, at::Tensor>> g{{"w", torch::zeros({4})}};
  Syncer s(o, plan_fragments({{"w", 16}}, 1, 20), g, MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  auto push = [&](int64_t m, double step_time) {
    Contribution c;
    c.learner = m;
    c.deltas = {torch::zeros({4})};
    c.c_steps = 1;
    c.c_tokens = 1;
    c.step_time = step_time;
    ASSERT_EQ(s.receive(0, c), SyncReject::kNone);
  };
  EXPECT_EQ(s.local_updates(0), 20);  // nothing heard yet
  push(0, 1.0);
  push(1, 2.0);
  push(2, 10.0);
  EXPECT_EQ(s.local_updates(0), 20);
  EXPECT_EQ(s.local_updates(1), 10);
  EXPECT_EQ(s.local_updates(2), 5);   // 20 / 10 = 2, but never at or below τ = 4
  s.retire(0, 0);                     // the fastest finished: the others are measured against learner 1
  EXPECT_EQ(s.local_updates(1), 20);
  // With waiting, K > 1 and several fragments, learners on different periods could each wait for a round the other
  // has not reached (seen: learner 1 pushed fragment 1 again before its first push of fragment 0): refused by name.
  SyncOptions risky = o;
  risky.quorum = 2;
  risky.fragments = 2;
  risky.wait_for_answer = true;
  try {
    risky.validate();
    ADD_FAILURE() << "accepted a combination that can deadlock";
  } catch (const SyncError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
  risky.fragments = 1;
  EXPECT_NO_THROW(risky.validate());
  o.dynamic_local_updates = false;
  Syncer off(o, plan_fragments({{"w", 16}}, 1, 20), g, MergePlan::preset("diloco"), OuterOptions{"sgd", 1.0, 0.0});
  EXPECT_EQ(off.local_updates(1), 20);
}

TEST(DynamicLocalUpdates, TheLearnerPushesEveryHmStepsAfterItsFirstPush) {
  Toy toy(1, 10);
  SyncOptions o = opts(10, 0, false);
  o.dynamic_local_updates = true;
  LearnerCore core(o, toy.plan, toy.params, 100);
  core.set_sync_every(4);  // told before the first push: the first push still comes at step 10 (aligned start)
  std::vector<int64_t> at;
  for (int64_t t = 1; t <= 30; ++t) {
    toy.train();
    for (const Push& p : core.after_step(t, 1, 1.0)) at.push_back(p.step);
    core.apply_due(t);
    if (t == 18) core.set_sync_every(10);  // the period changes after the push it follows
  }
  EXPECT_EQ(at, (std::vector<int64_t>{10, 14, 18, 28}));
  EXPECT_THROW(core.set_sync_every(0), SyncError);
  EXPECT_THROW(core.set_sync_every(11), SyncError);
  // Off: the period stays H whatever the syncer says.
  Toy toy2(1, 10);
  LearnerCore plain(opts(10, 0, false), toy2.plan, toy2.params, 100);
  plain.set_sync_every(4);
  EXPECT_EQ(plain.sync_every(), 10);
}

}  // namespace
}  // namespace deloco
