// Tests of roles/syncer_link.h from its rules (docs/runtime.md, "Protocol" and "Faults"): hello pacing and its
// doubling, heartbeats and the goodbye, when the syncer counts as gone (with its patience, bounded, and during a
// download), what a failover starts afresh, and which CURVE refusals are recorded.
#include "syncer_link.h"

#include <gtest/gtest.h>

#include <vector>

namespace deloco {
namespace syncer_link_cases {

SyncerLink link() { return SyncerLink({/*heartbeat=*/1.0, /*dead_after=*/10.0, /*join_timeout=*/60.0}); }

TEST(SyncerLink, HellosDoubleWhileUnansweredUpToDeadAfterAndAWelcomeResetsThem) {
  SyncerLink s = link();
  EXPECT_TRUE(s.hello_due(0.0));
  std::vector<double> intervals;
  for (int i = 0; i < 6; ++i) {
    s.hello_sent(0.0, /*taken=*/true);
    intervals.push_back(s.hello_interval());
  }
  EXPECT_EQ(intervals, (std::vector<double>{2, 4, 8, 10, 10, 10}));  // capped at net.dead_after
  EXPECT_FALSE(s.hello_due(9.9));
  EXPECT_TRUE(s.hello_due(10.0));
  s.hello_sent(10.0, /*taken=*/false);  // the transport refused it: not counted as unanswered
  EXPECT_EQ(s.hellos_unanswered(), 6);
  EXPECT_DOUBLE_EQ(s.hello_sent_at(), 10.0);
  s.welcomed();
  EXPECT_DOUBLE_EQ(s.hello_interval(), 1.0);
  s.hello_now();
  EXPECT_TRUE(s.hello_due(10.0));
  EXPECT_FALSE(s.standby_hello_due(-1e9 + 1.0));
  EXPECT_TRUE(s.standby_hello_due(0.0));
  s.standby_hello_sent(0.0);
  EXPECT_FALSE(s.standby_hello_due(1.9));  // every max(1 s, 2 heartbeats)
  EXPECT_TRUE(s.standby_hello_due(2.0));
}

TEST(SyncerLink, TheSyncerIsGoneAfterDeadAfterPlusItsBoundedPatienceOrTheJoinTimeoutWhileDownloading) {
  SyncerLink s = link();
  s.heard(100.0);
  EXPECT_FALSE(s.lost(110.0, false));
  EXPECT_TRUE(s.lost(110.01, false));
  s.set_patience(5.0);  // a slow link's frames: the syncer allows for them, and so does the learner
  EXPECT_FALSE(s.lost(115.0, false));
  EXPECT_TRUE(s.lost(115.01, false));
  s.set_patience(1e12);  // a peer's value is capped at 20 net.dead_after
  EXPECT_FALSE(s.lost(310.0, false));
  EXPECT_TRUE(s.lost(310.01, false));
  s.set_patience(0);
  EXPECT_FALSE(s.lost(160.0, true));  // a download: net.join_timeout
  EXPECT_TRUE(s.lost(160.01, true));
  EXPECT_DOUBLE_EQ(s.silent_for(160.0), 60.0);
}

TEST(SyncerLink, HeartbeatsAndTheGoodbyeGoEveryHeartbeatAndTheGoodbyeAgainAfterALoss) {
  SyncerLink s = link();
  EXPECT_TRUE(s.beat_due(0.0));
  s.beat_sent(0.0);
  EXPECT_FALSE(s.beat_due(0.9));
  EXPECT_TRUE(s.beat_due(1.0));
  EXPECT_TRUE(s.leave_due(1.0));
  s.leave_sent(1.0);  // with its heartbeat
  EXPECT_FALSE(s.beat_due(1.5));
  EXPECT_FALSE(s.leave_due(1.5));
  s.leave_again();
  EXPECT_TRUE(s.leave_due(1.5));
}

TEST(SyncerLink, AFailoverStartsPacingSilenceAndPatienceAfresh) {
  SyncerLink s = link();
  for (int i = 0; i < 4; ++i) s.hello_sent(50.0, true);
  s.heard(0.0);
  s.set_patience(30.0);
  s.leave_sent(50.0);
  s.failed_over(60.0);
  EXPECT_TRUE(s.hello_due(60.0));  // hello the new leader at once
  EXPECT_EQ(s.hellos_unanswered(), 0);
  EXPECT_FALSE(s.lost(70.0, false));  // silence counts from the failover, without the old link's patience
  EXPECT_TRUE(s.lost(70.01, false));
  EXPECT_TRUE(s.leave_due(60.0));
  EXPECT_FALSE(s.standby_hello_due(61.9));  // the old leader hears from us a little later
  EXPECT_TRUE(s.standby_hello_due(62.0));
}

TEST(SyncerLink, CurveRefusalsAreRecordedAtTheFirstSecondFourthAndSoOn) {
  SyncerLink s = link();
  std::vector<uint64_t> recorded;
  for (uint64_t n = 0; n <= 20; ++n)
    if (s.auth_refused(n)) recorded.push_back(n);
  EXPECT_EQ(recorded, (std::vector<uint64_t>{1, 2, 4, 8, 16}));
  EXPECT_EQ(s.auth_refusals(), 20u);
  EXPECT_FALSE(s.auth_refused(20));  // no new refusal
  EXPECT_TRUE(s.auth_refused(100));  // a jump past twice the last recorded
}

}  // namespace syncer_link_cases
}  // namespace deloco
