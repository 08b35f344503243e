// Tests of roles/state_fetch.h from its rules (docs/reliability.md, "Rejoin from peers"): who is asked which chunk,
// when a donor's chunk goes to the syncer, when a donor is asked nothing more, and the endgame's duplicate asks.
#include "state_fetch.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

namespace deloco {
namespace state_fetch_cases {

using Asks = std::vector<std::pair<size_t, int64_t>>;

// Runs one schedule() at t, every request sent unless `refuse` names its source; returns the asks made.
Asks schedule(StateFetch& f, double t, const std::vector<bool>& have, std::set<size_t> refuse = {}) {
  Asks asks;
  f.schedule(t, have, [&](size_t i, int64_t k) {
    if (refuse.count(i)) return false;
    asks.emplace_back(i, k);
    return true;
  });
  return asks;
}

std::set<int64_t> chunks_of(const Asks& a, size_t source) {
  std::set<int64_t> s;
  for (const auto& [i, k] : a)
    if (i == source) s.insert(k);
  return s;
}

TEST(StateFetch, TheSyncerTakesTheEndAndDonorsTheFrontEachWithinItsWindow) {
  StateFetch f(12, 0.0, 2);
  f.add_donor(5);
  f.add_donor(6);
  std::vector<bool> have(12, false);
  const Asks a = schedule(f, 0.0, have);
  EXPECT_EQ(chunks_of(a, 0), (std::set<int64_t>{10, 11}));
  EXPECT_EQ(chunks_of(a, 1), (std::set<int64_t>{0, 1}));
  EXPECT_EQ(chunks_of(a, 2), (std::set<int64_t>{2, 3}));
  EXPECT_TRUE(schedule(f, 0.1, have).empty());  // every window is full
  f.answered(1, 0, 0.2, true);
  have[0] = true;
  EXPECT_EQ(schedule(f, 0.2, have), (Asks{{1, 4}}));  // room for one more at donor 1
}

TEST(StateFetch, ChunksAlreadyHeldAreNotAsked) {
  StateFetch f(4, 0.0, 4);
  std::vector<bool> have{true, false, true, false};
  EXPECT_EQ(chunks_of(schedule(f, 0.0, have), 0), (std::set<int64_t>{1, 3}));
}

TEST(StateFetch, ADonorsSlowChunkGoesToTheSyncerAndTwoTimeoutsBanIt) {
  StateFetch f(6, 0.0, 1);
  f.add_donor(3);
  std::vector<bool> have(6, false);
  EXPECT_EQ(schedule(f, 0.0, have), (Asks{{0, 5}, {1, 0}}));
  f.answered(0, 5, 1.0, true);
  have[5] = true;
  // Donor 1 sat on chunk 0 for kTimeout: the syncer gets it first, before any other chunk.
  const Asks a = schedule(f, StateFetch::kTimeout, have);
  EXPECT_EQ(a.front(), (std::pair<size_t, int64_t>{0, 0}));
  EXPECT_EQ(f.sources()[1].timeouts, 1);
  EXPECT_FALSE(f.sources()[1].banned);
  const int64_t donors_chunk = *chunks_of(a, 1).begin();
  schedule(f, 2 * StateFetch::kTimeout, have);
  EXPECT_EQ(f.sources()[1].timeouts, 2);
  EXPECT_TRUE(f.sources()[1].banned);
  EXPECT_FALSE(f.outstanding(1, donors_chunk));  // what it held went to the syncer
  EXPECT_TRUE(chunks_of(schedule(f, 30.0, have), 1).empty());
}

TEST(StateFetch, ThreeRefusalsBanADonorButBusyOnesDoNot) {
  StateFetch f(40, 0.0, 1);
  f.add_donor(1);
  std::vector<bool> have(40, false);
  for (int n = 0; n < 5; ++n) {
    const Asks a = schedule(f, n, have);
    const auto mine = chunks_of(a, 1);
    ASSERT_EQ(mine.size(), 1u);
    f.refused(1, *mine.begin(), /*busy=*/true);
  }
  EXPECT_FALSE(f.sources()[1].banned);
  StateFetch g(40, 0.0, 1);
  g.add_donor(1);
  for (int n = 0; n < 3; ++n) {
    const auto mine = chunks_of(schedule(g, n, have), 1);
    ASSERT_EQ(mine.size(), 1u);
    g.refused(1, *mine.begin(), /*busy=*/false);
  }
  EXPECT_TRUE(g.sources()[1].banned);
}

TEST(StateFetch, ALyingDonorIsAskedNothingMoreAndCountedOnce) {
  StateFetch f(10, 0.0, 3);
  f.add_donor(7);
  std::vector<bool> have(10, false);
  schedule(f, 0.0, have);
  ASSERT_TRUE(f.outstanding(1, 0));
  EXPECT_TRUE(f.lied(1, 0));
  EXPECT_FALSE(f.lied(1, -1));  // a second bad answer: no second count
  EXPECT_EQ(f.liars(), 1);
  EXPECT_FALSE(f.outstanding(1, 1));
  // The syncer takes the chunks the liar held, first.
  f.answered(0, 9, 0.1, true);
  f.answered(0, 8, 0.1, true);
  f.answered(0, 7, 0.1, true);
  have[9] = have[8] = have[7] = true;
  const Asks a = schedule(f, 0.2, have);
  EXPECT_EQ(chunks_of(a, 0), (std::set<int64_t>{0, 1, 2}));
  EXPECT_TRUE(chunks_of(a, 1).empty());
}

TEST(StateFetch, ASourceThatCannotTakeRequestsIsRetriedAndADonorBannedAfterTheTimeout) {
  StateFetch f(4, 0.0, 2);
  f.add_donor(2);
  std::vector<bool> have(4, false);
  EXPECT_TRUE(chunks_of(schedule(f, 0.0, have, {1}), 1).empty());
  EXPECT_TRUE(chunks_of(schedule(f, 0.01, have, {1}), 1).empty());  // waits 20 ms before asking again
  EXPECT_FALSE(f.sources()[1].banned);
  schedule(f, StateFetch::kTimeout + 1, have, {1});
  EXPECT_TRUE(f.sources()[1].banned);
  // The syncer is never banned for it: it is asked again.
  StateFetch g(2, 0.0, 2);
  schedule(g, 0.0, have, {0});
  EXPECT_FALSE(schedule(g, StateFetch::kTimeout + 1, have).empty());
}

TEST(StateFetch, TheEndgameAsksAnOverdueChunkOfASecondSourceAndTheFirstAnswerCounts) {
  StateFetch f(2, 0.0, 1);
  f.add_donor(4);
  std::vector<bool> have(2, false);
  EXPECT_EQ(schedule(f, 0.0, have), (Asks{{0, 1}, {1, 0}}));
  f.answered(0, 1, 1.0, true);  // the syncer answered in 1 s: the mean answer time
  have[1] = true;
  // Nothing left to ask; chunk 0 has waited 1.5 s at the donor (< 2 × 1 s): not yet.
  EXPECT_TRUE(schedule(f, 1.5, have).empty());
  // At 2.5 s it is overdue: the syncer is asked too.
  EXPECT_EQ(schedule(f, 2.5, have), (Asks{{0, 0}}));
  EXPECT_EQ(f.endgame_asks(), 1);
  f.answered(0, 0, 2.6, true);
  EXPECT_FALSE(f.outstanding(1, 0));  // the donor's answer, when it comes, is dropped
  EXPECT_EQ(f.sources()[0].got, 2);
  EXPECT_EQ(f.sources()[1].got, 0);
}

}  // namespace state_fetch_cases
}  // namespace deloco
