#include "run/chaos.h"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "deloco/config.h"
#include "deloco/error.h"
#include "support/proc.h"

namespace deloco::run {
namespace chaos_cases {

ChaosOptions chaos(int64_t seed) {
  ChaosOptions o;
  o.enabled = true;
  o.kill_interval = 3;
  o.stop_interval = 5;
  o.syncer_kill_at = {40, 12};
  o.seed = seed;
  return o;
}

// What a run of `seconds` in steps of 0.1 s would do: (time, what) with what = kill/stop pick or syncer kill.
std::vector<std::pair<double, std::string>> replay(const ChaosOptions& o, double seconds = 60) {
  ChaosSchedule s(o);
  std::vector<std::pair<double, std::string>> out;
  for (int i = 0; i <= static_cast<int>(seconds * 10); ++i) {
    const double now = i / 10.0;
    if (s.learner_kill_due(now)) out.emplace_back(now, "kill L" + std::to_string(s.pick(4)));
    if (s.learner_stop_due(now)) out.emplace_back(now, "stop L" + std::to_string(s.pick(4)));
    ChaosMark at;
    while (s.next_syncer_kill(now, &at)) out.emplace_back(now, "syncer " + std::to_string(at.at));
  }
  return out;
}

TEST(ChaosSchedule, SameSeedSameScheduleOtherSeedAnother) {
  const auto a = replay(chaos(3)), b = replay(chaos(3)), c = replay(chaos(4));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int kills = 0, stops = 0;
  for (const auto& [t, what] : a) {
    kills += what.rfind("kill", 0) == 0;
    stops += what.rfind("stop", 0) == 0;
  }
  EXPECT_GE(kills, 5);  // mean 3 s over 60 s: ~20
  EXPECT_GE(stops, 3);  // mean 5 s over 60 s: ~12
}

TEST(ChaosSchedule, SyncerKillsInOrderOnceEach) {
  std::vector<std::string> syncer;
  for (const auto& [t, what] : replay(chaos(1)))
    if (what.rfind("syncer", 0) == 0) syncer.push_back(what.substr(7, 2) + "@" + std::to_string(static_cast<int>(t)));
  EXPECT_EQ(syncer, (std::vector<std::string>{"12@12", "40@40"}));
}

// A kill that waits for its target (a pair's standby not following yet) stays due, without being taken, until the
// caller takes it; then the next one is due at its own time.
TEST(ChaosSchedule, ADueSyncerKillStaysDueUntilTaken) {
  ChaosSchedule s(chaos(1));
  EXPECT_FALSE(s.syncer_kill_due(11.9));
  EXPECT_TRUE(s.syncer_kill_due(12));
  EXPECT_TRUE(s.syncer_kill_due(30));  // asked again later: still the same kill
  ChaosMark at;
  ASSERT_TRUE(s.next_syncer_kill(30, &at));
  EXPECT_EQ(at.at, 12);
  EXPECT_FALSE(at.by_progress);
  EXPECT_FALSE(s.syncer_kill_due(39));
  EXPECT_TRUE(s.syncer_kill_due(40));
  ASSERT_TRUE(s.next_syncer_kill(40, &at));
  EXPECT_EQ(at.at, 40);
  EXPECT_FALSE(s.syncer_kill_due(1000));
}

TEST(ChaosSchedule, DisabledOrZeroIntervalIsNeverDue) {
  ChaosOptions off = chaos(1);
  off.enabled = false;
  EXPECT_TRUE(replay(off).empty());
  ChaosOptions only_syncer = chaos(1);
  only_syncer.kill_interval = 0;
  only_syncer.stop_interval = 0;
  EXPECT_EQ(replay(only_syncer).size(), 2u);
}

TEST(ChaosSchedule, LearnersNearTheEndAreSpared) {
  EXPECT_TRUE(chaos_may_hit(0, 1000, 10));
  EXPECT_TRUE(chaos_may_hit(949, 1000, 10));   // margin max(10, 1000/20 = 50)
  EXPECT_FALSE(chaos_may_hit(950, 1000, 10));
  EXPECT_FALSE(chaos_may_hit(30, 100, 70));     // margin sync_every = 70
  EXPECT_TRUE(chaos_may_hit(-1, 100, 10));      // no step seen yet
}

// ---- The progress clock (issue 52, defect 10) ------------------------------------------------------------------

ChaosOptions by_progress(int64_t seed) {
  ChaosOptions o;
  o.enabled = true;
  o.kill_interval_progress = 0.1;
  o.syncer_kill_at_progress = {0.75, 0.5};
  o.seed = seed;
  return o;
}

// A run whose learners advance 1/1000 of train.steps every `seconds_per_step` seconds: (progress, what) of every
// chaos action, the progress in thousandths so the comparison is exact.
std::vector<std::pair<int, std::string>> replay_progress(const ChaosOptions& o, double seconds_per_step) {
  ChaosSchedule s(o);
  std::vector<std::pair<int, std::string>> out;
  for (int i = 0; i <= 1000; ++i) {
    const double now = i * seconds_per_step;
    s.set_progress(i / 1000.0);
    if (s.learner_kill_due(now)) out.emplace_back(i, "kill L" + std::to_string(s.pick(4)));
    ChaosMark at;
    while (s.next_syncer_kill(now, &at)) out.emplace_back(i, "syncer " + at.text());
  }
  return out;
}

// The defect: the demo's kills were in seconds, so a faster run ended before its syncer kill. By progress, a run
// 1000 times faster or slower gets the same kills at the same points of the run.
TEST(ChaosSchedule, ProgressMarksLandAtTheSamePointOfTheRunAtAnySpeed) {
  const auto fast = replay_progress(by_progress(7), 0.001), slow = replay_progress(by_progress(7), 1.0),
             slower = replay_progress(by_progress(7), 1000.0);
  EXPECT_EQ(fast, slow);
  EXPECT_EQ(fast, slower);
  EXPECT_NE(fast, replay_progress(by_progress(8), 0.001));  // another seed: other learner kills
  std::vector<std::pair<int, std::string>> syncer;
  int kills = 0;
  for (const auto& e : fast) {
    if (e.second.rfind("syncer", 0) == 0) syncer.push_back(e);
    kills += e.second.rfind("kill", 0) == 0;
  }
  EXPECT_EQ(syncer, (std::vector<std::pair<int, std::string>>{{500, "syncer 50% of train.steps"},
                                                              {750, "syncer 75% of train.steps"}}));
  EXPECT_GE(kills, 4);   // mean 0.1 of the run: ~10
  EXPECT_LE(kills, 25);
}

TEST(ChaosSchedule, ProgressOnlyRisesAndAMarkIsDueOnlyOnceReached) {
  ChaosSchedule s(by_progress(1));
  ChaosMark at;
  EXPECT_FALSE(s.syncer_kill_due(1e6));  // no progress yet: time alone never triggers a progress mark
  s.set_progress(0.499);
  EXPECT_FALSE(s.syncer_kill_due(0));
  s.set_progress(0.6);
  s.set_progress(0.2);  // a restarted learner's lower step: ignored
  EXPECT_DOUBLE_EQ(s.progress(), 0.6);
  EXPECT_TRUE(s.syncer_kill_due(0));
  EXPECT_TRUE(s.syncer_kill_due(0));  // still the same kill until taken
  ASSERT_TRUE(s.next_syncer_kill(0, &at));
  EXPECT_TRUE(at.by_progress);
  EXPECT_EQ(at.at, 0.5);
  EXPECT_FALSE(s.next_syncer_kill(1e6, &at));  // 0.75 not reached
  s.set_progress(1.0);
  ASSERT_TRUE(s.next_syncer_kill(0, &at));
  EXPECT_EQ(at.at, 0.75);
  EXPECT_FALSE(s.syncer_kill_due(1e6));
}

// Progress that jumps past several learner-kill marks at once (records come every train.log_every steps) gives one
// kill, and the next is drawn from there.
TEST(ChaosSchedule, AProgressJumpGivesOneLearnerKill) {
  ChaosOptions o = by_progress(3);
  o.kill_interval_progress = 0.01;
  ChaosSchedule s(o);
  s.set_progress(0.9);
  EXPECT_TRUE(s.learner_kill_due(0));
  EXPECT_FALSE(s.learner_kill_due(0));
  EXPECT_FALSE(s.learner_kill_due(1e6));  // the seconds clock has no learner kills here
}

TEST(ChaosSchedule, BothClocksTogetherSecondsFirst) {
  ChaosOptions o = by_progress(1);
  o.syncer_kill_at = {10};
  ChaosSchedule s(o);
  s.set_progress(0.8);
  ChaosMark at;
  ASSERT_TRUE(s.next_syncer_kill(10, &at));
  EXPECT_FALSE(at.by_progress);
  EXPECT_EQ(at.text(), "10 s");
  ASSERT_TRUE(s.next_syncer_kill(10, &at));
  EXPECT_EQ(at.text(), "50% of train.steps");
  ASSERT_TRUE(s.next_syncer_kill(10, &at));
  EXPECT_EQ(at.text(), "75% of train.steps");
  EXPECT_FALSE(s.next_syncer_kill(10, &at));
  EXPECT_EQ((ChaosMark{1.0 / 3, true}.text()), "33.3% of train.steps");
}

TEST(ChaosSchedule, RunProgressIsTheFurthestLearner) {
  EXPECT_EQ(run_progress({}, 1500), 0);
  EXPECT_EQ(run_progress({-1, -1}, 1500), 0);  // no step seen yet
  EXPECT_DOUBLE_EQ(run_progress({300, 750, -1}, 1500), 0.5);
  EXPECT_EQ(run_progress({2000}, 1500), 1);  // clamped
  EXPECT_EQ(run_progress({10}, 0), 0);
}

// ---- The keys (bound in src/roles/runtime_config.cpp) ------------------------------------------------------------

std::string config_error(const std::vector<std::string>& sets, const std::string& toml = "") {
  RuntimeConfig cfg;
  ConfigSchema schema;
  cfg.bind(schema);
  try {
    if (!toml.empty()) schema.load_file(toml);
    for (const auto& s : sets) schema.apply_override(s);
    schema.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ChaosConfig, ProgressKeysAreCheckedNamingTheKey) {
  EXPECT_EQ(config_error({"chaos.syncer_kill_at_progress=0.25,0.5", "chaos.kill_interval_progress=0.2"}), "");
  for (const char* bad : {"chaos.syncer_kill_at_progress=0.5,1", "chaos.syncer_kill_at_progress=0",
                          "chaos.syncer_kill_at_progress=-0.1", "chaos.kill_interval_progress=1.5",
                          "chaos.kill_interval_progress=-0.1"}) {
    const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
    const std::string e = config_error({bad});
    EXPECT_NE(e.find("config key '" + key + "'"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("fraction"), std::string::npos) << bad << ": " << e;
  }
}

// One clock per kind: both forms of one kind are refused, naming both keys and how to clear one.
TEST(ChaosConfig, BothFormsOfOneKindAreRefused) {
  std::string e = config_error({"chaos.syncer_kill_at=75", "chaos.syncer_kill_at_progress=0.5"});
  EXPECT_NE(e.find("chaos.syncer_kill_at_progress and chaos.syncer_kill_at are both set"), std::string::npos) << e;
  EXPECT_NE(e.find("--set chaos.syncer_kill_at_progress="), std::string::npos) << e;
  e = config_error({"chaos.kill_interval=50", "chaos.kill_interval_progress=0.3"});
  EXPECT_NE(e.find("chaos.kill_interval_progress=0.3 and chaos.kill_interval=50 are both set"), std::string::npos) << e;
  // Clearing the progress form brings the seconds form back (the demo's config with a time of one's own).
  EXPECT_EQ(config_error({"chaos.syncer_kill_at_progress=", "chaos.syncer_kill_at=75", "chaos.kill_interval_progress=0",
                          "chaos.kill_interval=50"},
                         test::source_dir() + "/configs/demo.toml"),
            "");
}

// The demo (the config of a bare `deloco run`) schedules its chaos by progress: the syncer is killed about mid-run
// and learners are killed during it, however long the run takes on this machine.
TEST(ChaosConfig, TheDemoKillsTheSyncerMidRunByProgress) {
  RuntimeConfig cfg;
  ConfigSchema schema;
  cfg.bind(schema);
  schema.load_file(test::source_dir() + "/configs/demo.toml");
  schema.validate();
  ASSERT_TRUE(cfg.chaos.enabled);
  EXPECT_TRUE(cfg.chaos.syncer_kill_at.empty());
  EXPECT_EQ(cfg.chaos.kill_interval, 0);
  ASSERT_EQ(cfg.chaos.syncer_kill_at_progress.size(), 1u);
  EXPECT_GE(cfg.chaos.syncer_kill_at_progress[0], 0.3);
  EXPECT_LE(cfg.chaos.syncer_kill_at_progress[0], 0.7);
  // Its schedule over a run of any length: one syncer kill, before the last learner kills are spared (the last
  // 5% of train.steps), so a kill is never skipped because a learner finished first.
  for (double seconds_per_step : {0.001, 0.1}) {
    const auto actions = replay_progress(cfg.chaos, seconds_per_step);
    int syncer = 0, kills = 0;
    for (const auto& [thousandths, what] : actions) {
      if (what.rfind("syncer", 0) == 0) {
        ++syncer;
        EXPECT_LT(thousandths, 950) << what;
      }
      kills += what.rfind("kill", 0) == 0 && thousandths < 950;
    }
    EXPECT_EQ(syncer, 1);
    EXPECT_GE(kills, 1);  // chaos.seed = 1 draws its first learner kill before the spared end
  }
}

}  // namespace
}  // namespace deloco::run
