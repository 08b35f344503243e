// Tests of roles/pair_role.h from its contract (docs/reliability.md, "A standby syncer"): the expected table below is
// written from the documented behaviour of a pair, not read from pair_role.cpp, and every state × event is checked
// against it; then two syncers driven through random histories (partitions, pauses, lost images, elections) never
// hold one epoch as leaders both, and a leader that hears a newer epoch steps down.
#include "pair_role.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <tuple>

#include "protocol.h"

namespace deloco {
namespace pair_role_cases {

using S = PairRole::State;
using E = PairRole::Event;

struct Expect {
  S to;
  int64_t epoch;  // the epoch after, from a syncer at epoch 5 and an event carrying epoch 7
};

// A syncer at epoch 5; the event carries epoch 7 (where it carries one).
std::map<std::pair<S, E>, Expect> expected_table() {
  return {
      // A leader steps down only on a newer epoch; images, broken replicas, lapsed leases and elections are
      // a follower's business.
      {{S::kLeader, E::kNewerEpoch}, {S::kAsking, 7}},
      {{S::kLeader, E::kImage}, {S::kLeader, 5}},
      {{S::kLeader, E::kReplicaBroken}, {S::kLeader, 5}},
      {{S::kLeader, E::kLeaseLapsed}, {S::kLeader, 5}},
      {{S::kLeader, E::kElected}, {S::kLeader, 5}},
      // Asking: an image makes it follow (the leader's epoch); an election makes it lead above both epochs; it cannot
      // take over by a lapsed lease (it holds nothing trustworthy to lead with).
      {{S::kAsking, E::kNewerEpoch}, {S::kAsking, 7}},
      {{S::kAsking, E::kImage}, {S::kFollowing, 7}},
      {{S::kAsking, E::kReplicaBroken}, {S::kAsking, 5}},
      {{S::kAsking, E::kLeaseLapsed}, {S::kAsking, 5}},
      {{S::kAsking, E::kElected}, {S::kLeader, 8}},
      // Following: a broken replica sends it back to asking; a lapsed lease makes it lead the next epoch; an
      // election is for a pair with no leader, and it follows one.
      {{S::kFollowing, E::kNewerEpoch}, {S::kFollowing, 7}},
      {{S::kFollowing, E::kImage}, {S::kFollowing, 7}},
      {{S::kFollowing, E::kReplicaBroken}, {S::kAsking, 5}},
      {{S::kFollowing, E::kLeaseLapsed}, {S::kLeader, 6}},
      {{S::kFollowing, E::kElected}, {S::kFollowing, 5}},
  };
}

TEST(PairRole, EveryStateAndEventDoesWhatTheTableSays) {
  const auto table = expected_table();
  int checked = 0;
  for (S s : PairRole::kStates)
    for (E e : PairRole::kEvents) {
      SCOPED_TRACE(std::string(PairRole::name(s)) + " × " + PairRole::name(e));
      const auto it = table.find({s, e});
      ASSERT_NE(it, table.end());
      PairRole r(s, 5);
      const auto t = r.on(e, 7);
      EXPECT_EQ(r.state(), it->second.to);
      EXPECT_EQ(r.epoch(), it->second.epoch);
      const bool changes = it->second.to != s || it->second.epoch != 5;
      ASSERT_EQ(t.has_value(), changes);
      if (t) {
        EXPECT_EQ(t->from, s);
        EXPECT_EQ(t->to, it->second.to);
        EXPECT_EQ(t->epoch, it->second.epoch);
      }
      ++checked;
    }
  EXPECT_EQ(checked, static_cast<int>(table.size()));
}

TEST(PairRole, OlderOrEqualEpochsChangeNothingAndEpochsNeverGoDown) {
  for (S s : PairRole::kStates)
    for (E e : PairRole::kEvents)
      for (int64_t other : {0, 3, 5}) {
        PairRole r(s, 5);
        r.on(e, other);
        EXPECT_GE(r.epoch(), 5);
        if (e == E::kNewerEpoch) {  // not newer: nothing
          EXPECT_EQ(r.state(), s);
          EXPECT_EQ(r.epoch(), 5);
        }
        if (e == E::kImage && other < 5) EXPECT_EQ(r.state(), s);  // an older leader's image is not followed
      }
  PairRole r(S::kLeader, 9);
  r.restore_epoch(4);
  EXPECT_EQ(r.epoch(), 9);
  r.restore_epoch(12);
  EXPECT_EQ(r.epoch(), 12);
}

TEST(PairRole, NoTakeoverPastTheLargestEpochLearnersAccept) {
  PairRole f(S::kFollowing, proto::kMaxEpoch);
  EXPECT_FALSE(f.on(E::kLeaseLapsed).has_value());
  EXPECT_EQ(f.state(), S::kFollowing);
  PairRole a(S::kAsking, 3);
  EXPECT_FALSE(a.on(E::kElected, proto::kMaxEpoch).has_value());
  EXPECT_EQ(a.state(), S::kAsking);
}

// Two syncers of one pair through random histories. The world may deliver what a syncer would hear (the other's
// epoch, a leader's image), lose a replica entry, and make any follower believe its leader is gone (a partition or a
// pause: a lease can lapse while the leader lives). An election happens only as the node allows it: the other
// syncer asks to follow (kAsking) and this one wins the tie-break (higher epoch, then slot 0).
TEST(PairRole, RandomHistoriesNeverHaveTwoLeadersOfOneEpoch) {
  int64_t both_led = 0, stepped_down = 0;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    PairRole p[2] = {PairRole(S::kLeader, 1), PairRole(S::kAsking, 1)};
    int64_t top[2] = {1, 1};  // each syncer's epoch never goes down
    for (int step = 0; step < 2000; ++step) {
      const int x = static_cast<int>(rng() % 2), y = 1 - x;
      switch (rng() % 5) {
        case 0:  // x hears y's epoch: its lease or follow request (a leader), or its journal (a follower of y)
          if (p[x].leads() || p[y].leads()) {
            const bool was_leader = p[x].leads();
            p[x].on(E::kNewerEpoch, p[y].epoch());
            if (was_leader && !p[x].leads()) {
              ++stepped_down;
              EXPECT_LT(top[x], p[x].epoch());
            }
          }
          break;
        case 1:  // x asks and gets y's image
          if (p[y].leads()) p[x].on(E::kImage, p[y].epoch());
          break;
        case 2: p[x].on(E::kReplicaBroken); break;
        case 3: p[x].on(E::kLeaseLapsed); break;
        case 4:
          if (p[y].state() == S::kAsking &&
              std::make_tuple(p[x].epoch(), y) > std::make_tuple(p[y].epoch(), x))  // slot 0 wins a tie
            p[x].on(E::kElected, p[y].epoch());
          break;
      }
      for (int i = 0; i < 2; ++i) {
        ASSERT_GE(p[i].epoch(), top[i]) << "seed " << seed << " step " << step;
        top[i] = p[i].epoch();
      }
      if (p[0].leads() && p[1].leads()) {
        ++both_led;  // a partitioned old leader beside its successor: fenced by the epoch
        ASSERT_NE(p[0].epoch(), p[1].epoch()) << "seed " << seed << " step " << step;
        // The older one steps down as soon as it hears the newer.
        const int older = p[0].epoch() < p[1].epoch() ? 0 : 1;
        PairRole copy = p[older];
        copy.on(E::kNewerEpoch, p[1 - older].epoch());
        EXPECT_FALSE(copy.leads());
      }
    }
  }
  EXPECT_GT(both_led, 0);  // the histories did reach the dangerous states
  EXPECT_GT(stepped_down, 0);
}

}  // namespace pair_role_cases
}  // namespace deloco
