// roles/pair_role.h — the role of one syncer of a standby pair (net.standby; docs/reliability.md, "A standby
// syncer") as an explicit state machine: which role it holds, its fencing epoch, and the one table that says what each
// event does in each state. The syncer node (syncer_standby.cpp) tells it what happened and does what the transition
// says (step down, follow, take over); nothing else changes the role or the epoch.
//
// States: kLeader (merges, answers learners; a syncer with no pair is always this), kAsking (a follower that holds
// no image of the leader's state it can trust: asks the leader for one), kFollowing (applies the leader's journal,
// checks its rounds, and may take over).
//
// The table (every state × every event; "—": no change):
//                   kLeader                 kAsking                      kFollowing
//   kNewerEpoch(e)  kAsking, epoch e (step  — (epoch e)                  — (epoch e)
//                   down)
//   kImage(e)       —                       kFollowing (epoch e)         — (epoch e: a fresh image)
//   kReplicaBroken  —                       —                            kAsking
//   kLeaseLapsed    —                       —                            kLeader, epoch next (take over)
//   kElected(e)     —                       kLeader, epoch next (take    —
//                                           over a leaderless pair)
// kNewerEpoch and kImage carry the other syncer's epoch e and do nothing unless e is above this one's (kImage: at
// least it). "next" is proto::next_epoch(epoch, e): above both; when it would pass 2^53 − 1 (which learners refuse)
// the transition does not happen. Why no two leaders share an epoch: a syncer leads only by kLeaseLapsed (it followed,
// so its epoch is the leader's, and it takes the next one) or kElected (the other asked to follow it, so the other
// leads nothing); either way the new epoch is above every epoch the other syncer holds, and a leader that hears a
// newer one steps down (pair_role_test.cpp checks both, for every state and event and over random histories).
// Whether a follower's silence is a lapsed lease, and which syncer of a leaderless pair is elected, the node decides
// (repl::leads_leaderless); this class only says what follows from it. No I/O, no clock; not thread-safe.
#pragma once

#include <cstdint>
#include <optional>

namespace deloco {

class PairRole {
 public:
  enum class State { kLeader, kAsking, kFollowing };
  enum class Event { kNewerEpoch, kImage, kReplicaBroken, kLeaseLapsed, kElected };
  static constexpr State kStates[] = {State::kLeader, State::kAsking, State::kFollowing};
  static constexpr Event kEvents[] = {Event::kNewerEpoch, Event::kImage, Event::kReplicaBroken, Event::kLeaseLapsed,
                                      Event::kElected};

  // What an event did: the state before and after, and the epoch after.
  struct Transition {
    State from, to;
    int64_t epoch;
    bool changed() const { return from != to; }
  };

  explicit PairRole(State s = State::kLeader, int64_t epoch = 1) : state_(s), epoch_(epoch) {}

  State state() const { return state_; }
  int64_t epoch() const { return epoch_; }
  bool leads() const { return state_ == State::kLeader; }
  bool follows() const { return state_ != State::kLeader; }  // kAsking or kFollowing
  bool following() const { return state_ == State::kFollowing; }

  // Applies the table to `e` (`other_epoch`: the epoch the event carries; kNewerEpoch, kImage, kElected). Returns
  // the transition made, or nullopt when the event changes nothing here (no state and no epoch change).
  std::optional<Transition> on(Event e, int64_t other_epoch = 0);

  // A checkpoint's epoch (--resume): the epoch is never lowered.
  void restore_epoch(int64_t saved) {
    if (saved > epoch_) epoch_ = saved;
  }
  // A syncer configured as the standby of a pair starts asking (SyncerNode::pair).
  void start_following() { state_ = State::kAsking; }

  static const char* name(State s);
  static const char* name(Event e);

 private:
  State state_;
  int64_t epoch_;
};

}  // namespace deloco
