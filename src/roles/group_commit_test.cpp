// Tests of roles/group_commit.h from its contract (docs/reliability.md, "Group commit"): nothing staged is handed
// out before a commit, a commit hands out the newest merge of each fragment and every record in order, a flood cannot
// put the commit off past the latest checkpoint's duration, and stepping down forgets what no disk holds.
#include "group_commit.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace deloco {
namespace group_commit_cases {

using GC = GroupCommit<std::string, int>;

TEST(GroupCommit, NothingIsStagedUntilACheckpointIsDue) {
  GC g;
  EXPECT_FALSE(g.merged(1.0, false));
  EXPECT_FALSE(g.due());
  EXPECT_TRUE(g.merged(2.0, true));  // this merge makes a checkpoint due: it is staged itself
  EXPECT_TRUE(g.due());
  EXPECT_EQ(g.gathered(), 0);
  EXPECT_TRUE(g.merged(2.5, false));  // while due, every merge is staged, whatever the rule says
  EXPECT_TRUE(g.merged(2.6, true));
  EXPECT_EQ(g.gathered(), 2);
}

TEST(GroupCommit, ACommitHandsOutTheNewestOfEachFragmentThenEveryRecordInOrder) {
  GC g;
  ASSERT_TRUE(g.merged(0.0, true));
  g.stage(3, "p3 v1");
  g.stage_record(31);
  ASSERT_TRUE(g.merged(0.1, false));
  g.stage(1, "p1 v1");
  g.stage_record(11);
  ASSERT_TRUE(g.merged(0.2, false));
  g.stage(3, "p3 v2");  // replaces v1: learners get the newest only
  g.stage_record(32);
  EXPECT_EQ(g.staged(), 2u);
  std::vector<std::string> sent;
  std::vector<int> records;
  g.committed(0.4, [&](int64_t p, std::string&& b) { sent.push_back(std::to_string(p) + ":" + b); },
              [&](int&& r) { records.push_back(r); });
  EXPECT_EQ(sent, (std::vector<std::string>{"1:p1 v1", "3:p3 v2"}));
  EXPECT_EQ(records, (std::vector<int>{31, 11, 32}));  // every merge is recorded, in merge order
  EXPECT_FALSE(g.due());
  EXPECT_EQ(g.staged(), 0u);
  EXPECT_DOUBLE_EQ(g.last_seconds(), 0.4);
  // The next commit starts empty: nothing is handed out twice.
  sent.clear();
  records.clear();
  g.committed(0.1, [&](int64_t, std::string&& b) { sent.push_back(b); }, [&](int&& r) { records.push_back(r); });
  EXPECT_TRUE(sent.empty());
  EXPECT_TRUE(records.empty());
}

TEST(GroupCommit, GatheringLastsAtMostAsLongAsTheLatestCheckpointTook) {
  GC g;
  EXPECT_FALSE(g.gathered_enough(100.0));  // nothing due
  ASSERT_TRUE(g.merged(10.0, true));
  EXPECT_TRUE(g.gathered_enough(10.0));  // no checkpoint measured yet: commit at the first chance
  g.committed(2.0, [](int64_t, std::string&&) {}, [](int&&) {});
  ASSERT_TRUE(g.merged(20.0, true));
  EXPECT_FALSE(g.gathered_enough(21.9));
  EXPECT_TRUE(g.gathered_enough(22.0));  // however many pushes still wait
  EXPECT_TRUE(g.merged(21.0, false));    // a later merge does not move the start
  EXPECT_TRUE(g.gathered_enough(22.0));
}

TEST(GroupCommit, SteppingDownForgetsWhatNoDiskHolds) {
  GC g;
  ASSERT_TRUE(g.merged(0.0, true));
  g.stage(0, "p0 v7");
  g.stage_record(7);
  g.abandon();
  EXPECT_FALSE(g.due());
  EXPECT_EQ(g.staged(), 0u);
  int handed = 0;
  g.committed(0.1, [&](int64_t, std::string&&) { ++handed; }, [&](int&&) { ++handed; });
  EXPECT_EQ(handed, 0);
}

}  // namespace group_commit_cases
}  // namespace deloco
