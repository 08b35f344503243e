#include "run/chaos.h"

#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace deloco::run {
namespace {

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
    double at = 0;
    while (s.next_syncer_kill(now, &at)) out.emplace_back(now, "syncer " + std::to_string(at));
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
  double at = 0;
  ASSERT_TRUE(s.next_syncer_kill(30, &at));
  EXPECT_EQ(at, 12);
  EXPECT_FALSE(s.syncer_kill_due(39));
  EXPECT_TRUE(s.syncer_kill_due(40));
  ASSERT_TRUE(s.next_syncer_kill(40, &at));
  EXPECT_EQ(at, 40);
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

}  // namespace
}  // namespace deloco::run
