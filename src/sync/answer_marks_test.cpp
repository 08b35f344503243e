// Tests of sync/answer_marks.h from its contract: a broadcast's mark is 1 + the base version of the learner's latest
// merged push of that fragment (0: none), per learner and fragment; forget() starts a learner afresh.
#include <gtest/gtest.h>

#include "sync/answer_marks.h"

namespace deloco {
namespace answer_marks_cases {

TEST(AnswerMarks, MarksTheLatestMergedPushPerLearnerAndFragment) {
  AnswerMarks a;
  EXPECT_EQ(a.mark(0, 0), 0);
  a.accepted(0, 0, 5);
  a.accepted(1, 0, 4);
  EXPECT_EQ(a.mark(0, 0), 0);  // accepted, not yet merged
  a.merged(0, {0});
  EXPECT_EQ(a.mark(0, 0), 6);
  EXPECT_EQ(a.mark(1, 0), 0);  // learner 1's push waits for another merge
  EXPECT_EQ(a.mark(0, 1), 0);  // another fragment
  a.accepted(0, 0, 6);
  a.merged(0, {1});  // learner 0's newer push not in this merge: its mark stays
  EXPECT_EQ(a.mark(0, 0), 6);
  EXPECT_EQ(a.mark(1, 0), 5);
  a.merged(0, {0, 1});
  EXPECT_EQ(a.mark(0, 0), 7);
  a.merged(1, {2});  // a learner that never pushed fragment 1: nothing to mark
  EXPECT_EQ(a.mark(2, 1), 0);
}

TEST(AnswerMarks, ForgetStartsOneLearnerAfresh) {
  AnswerMarks a;
  for (int64_t m = 0; m < 3; ++m)
    for (int64_t p = 0; p < 2; ++p) {
      a.accepted(m, p, 10 * m + p);
      a.merged(p, {m});
    }
  a.forget(1);
  EXPECT_EQ(a.mark(1, 0), 0);
  EXPECT_EQ(a.mark(1, 1), 0);
  a.merged(0, {1});  // its old accepted push is forgotten too
  EXPECT_EQ(a.mark(1, 0), 0);
  EXPECT_EQ(a.mark(0, 1), 2);
  EXPECT_EQ(a.mark(2, 0), 21);
  EXPECT_EQ(a.mark(2, 1), 22);
}

}  // namespace
}  // namespace deloco
