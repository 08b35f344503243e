// Tests of roles/push_window.h from its contract (docs/runtime.md, "Flow control"; docs/reliability.md on rejoins):
// at most two unacknowledged pushes while the syncer acknowledges, none held back while it does not, and a rejoin
// settles as refused exactly the pushes the syncer says it never read.
#include "push_window.h"

#include <gtest/gtest.h>

namespace deloco {
namespace push_window_cases {

TEST(PushWindow, AFullLinkHoldsTheThirdPushOnlyWhileTheSyncerAcknowledges) {
  PushWindow w;
  w.sent(0);
  w.sent(1);
  w.sent(2);
  EXPECT_FALSE(w.full());  // no acknowledgement heard yet: an older syncer gets every push at once
  w.acknowledged(1);       // it read the first
  EXPECT_EQ(w.unacknowledged(), 2);
  EXPECT_TRUE(w.full());
  w.acknowledged(2);
  EXPECT_EQ(w.unacknowledged(), 1);
  EXPECT_FALSE(w.full());
  w.sent(3);
  EXPECT_TRUE(w.full());
  w.new_leader();  // a failover: the new leader has acknowledged nothing yet
  EXPECT_FALSE(w.full());
}

TEST(PushWindow, ARejoinSettlesThePushesTheSyncerNeverRead) {
  PushWindow w;
  w.sent(4);
  w.sent(1);
  w.sent(7);
  w.acknowledged(1);  // the first left the window
  // The syncer read two of our three pushes before the hello: only fragment 7's is lost.
  EXPECT_EQ(w.welcomed(false, 2), (std::vector<int64_t>{7}));
  EXPECT_EQ(w.unsettled(), (std::set<int64_t>{1, 4}));  // still answerable
  EXPECT_EQ(w.unacknowledged(), 0);                     // a fresh window
  w.settle(4);
  w.settle(1);
  EXPECT_TRUE(w.unsettled().empty());
}

TEST(PushWindow, ASyncerThatCannotSayHowManyItReadSettlesEveryUnansweredPush) {
  PushWindow w;
  w.sent(2);
  w.sent(3);
  w.settle(2);  // answered by a merge
  EXPECT_EQ(w.welcomed(false, -1), (std::vector<int64_t>{3}));
  PushWindow v;
  v.sent(5);
  EXPECT_EQ(v.welcomed(false, 9), (std::vector<int64_t>{5}));  // more than we sent: not this connection's count
}

TEST(PushWindow, ARepeatedWelcomeSettlesNothing) {
  PushWindow w;
  w.sent(0);
  EXPECT_TRUE(w.welcomed(true, 0).empty());
  EXPECT_EQ(w.unsettled(), (std::set<int64_t>{0}));
}

TEST(PushWindow, AnswersAndRefusalsSettle) {
  PushWindow w;
  w.sent(6);
  w.sent(6);  // a newer push of the same fragment
  w.settle(6);
  EXPECT_TRUE(w.unsettled().empty());
  EXPECT_TRUE(w.welcomed(false, 0).empty());  // nothing left to settle
}

// Defect: every broadcast of p settled our push of p, also one that did not hold it (another learner's merge that
// overtook it). After a failover the new leader's welcome (which cannot say what it read) then did not count the
// push as refused, and a learner waiting for its answer waited for good.
TEST(PushWindow, OnlyABroadcastThatHoldsThePushSettlesIt) {
  PushWindow w;
  w.sent(3, /*base=*/5);
  w.answered(3, /*covers=*/5);  // holds pushes based below version 5: not ours
  EXPECT_EQ(w.unsettled(), (std::set<int64_t>{3}));
  EXPECT_EQ(w.welcomed(false, -1), (std::vector<int64_t>{3}));  // so a failover's welcome refuses it
  w.sent(3, 6);
  w.answered(3, 7);  // holds ours
  EXPECT_TRUE(w.unsettled().empty());
  w.sent(2, 9);
  w.answered(2, -1);  // an unmarked broadcast (an older syncer) answers any push
  EXPECT_TRUE(w.unsettled().empty());
}

}  // namespace push_window_cases
}  // namespace deloco
