// Tests of roles/hello_admission.h from its contract (docs/runtime.md, "Protocol", identity): one row per check, each
// failing alone, and the order in which they decide when several fail.
#include "hello_admission.h"

#include <gtest/gtest.h>

namespace deloco {
namespace hello_admission_cases {

using R = proto::RejectReason;

HelloFacts good() {
  HelloFacts f;
  f.header_learner = f.body_learner = 2;
  f.learners = 4;
  f.identity = "learner-2";
  f.paired = true;
  f.hello_epoch = 3;
  f.epoch = 3;
  f.connection_learner = 2;
  return f;
}

TEST(HelloAdmission, AHelloThatPassesEveryCheckIsAdmitted) {
  EXPECT_EQ(check_hello(good()).kind, HelloVerdict::kAdmit);
  HelloFacts plain = good();
  plain.identity.clear();  // plaintext: no identity to check
  plain.connection_learner.reset();
  plain.hello_epoch = 0;  // never joined a pair's leader
  EXPECT_EQ(check_hello(plain).kind, HelloVerdict::kAdmit);
}

TEST(HelloAdmission, EachCheckRefusesWithItsReasonAndNamesTheProblem) {
  struct Row {
    const char* what;
    void (*change)(HelloFacts&);
    HelloVerdict::Kind kind;
    R reason;
    int64_t learner;
    const char* says;
  };
  const Row rows[] = {
      {"header and body disagree", [](HelloFacts& f) { f.header_learner = 1; }, HelloVerdict::kRefuse,
       R::kLearnerIdMismatch, 1, "header says learner 1 but its body says learner 2"},
      {"id out of range", [](HelloFacts& f) { f.header_learner = f.body_learner = 4; f.identity = "learner-4"; },
       HelloVerdict::kRefuse, R::kUnknownLearner, 4, "not in [0, 4)"},
      {"a key bound to no learner", [](HelloFacts& f) { f.identity = "ops"; }, HelloVerdict::kRefuse, R::kUnboundKey, 2,
       "name its .pub file learner-2.pub"},
      {"a key bound to another learner", [](HelloFacts& f) { f.identity = "learner-3"; }, HelloVerdict::kRefuse,
       R::kKeyIdMismatch, 2, "may only join as learner 3"},
      {"joined a newer leader", [](HelloFacts& f) { f.hello_epoch = 4; }, HelloVerdict::kNewerEpoch, R::kOther, 0, ""},
      {"a connection changing its id", [](HelloFacts& f) { f.connection_learner = 1; }, HelloVerdict::kRefuse,
       R::kLearnerIdMismatch, 2, "joined as learner 1"},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    HelloFacts f = good();
    r.change(f);
    const HelloVerdict v = check_hello(f);
    EXPECT_EQ(v.kind, r.kind);
    if (r.kind != HelloVerdict::kRefuse) continue;
    EXPECT_EQ(v.reason, r.reason);
    EXPECT_EQ(v.learner, r.learner);
    EXPECT_NE(v.detail.find(r.says), std::string::npos) << v.detail;
  }
}

TEST(HelloAdmission, ANewerEpochMattersOnlyToAPairAndAnOlderOneNotAtAll) {
  HelloFacts f = good();
  f.hello_epoch = 9;
  f.paired = false;  // no pair: epochs mean nothing here
  EXPECT_EQ(check_hello(f).kind, HelloVerdict::kAdmit);
  f = good();
  f.hello_epoch = 1;  // it joined an older leader: this one leads now
  EXPECT_EQ(check_hello(f).kind, HelloVerdict::kAdmit);
}

TEST(HelloAdmission, TheFirstFailingCheckDecides) {
  HelloFacts f = good();
  f.header_learner = 1;        // fails first
  f.identity = "learner-3";    // would fail the key check
  f.connection_learner = 0;    // would fail the connection check
  EXPECT_EQ(check_hello(f).reason, R::kLearnerIdMismatch);
  EXPECT_EQ(check_hello(f).learner, 1);
  f = good();
  f.identity = "learner-3";
  f.hello_epoch = 7;  // the key is checked before the epoch: a stranger's epoch is no hint
  EXPECT_EQ(check_hello(f).kind, HelloVerdict::kRefuse);
  EXPECT_EQ(check_hello(f).reason, R::kKeyIdMismatch);
}

}  // namespace hello_admission_cases
}  // namespace deloco
