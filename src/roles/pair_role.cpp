// The standby pair's role table (pair_role.h has the table and the contract).
#include "pair_role.h"

#include "protocol.h"

namespace deloco {

std::optional<PairRole::Transition> PairRole::on(Event e, int64_t other_epoch) {
  State to = state_;
  int64_t epoch = epoch_;
  switch (e) {
    case Event::kNewerEpoch:
      if (other_epoch <= epoch_) return std::nullopt;
      epoch = other_epoch;
      if (state_ == State::kLeader) to = State::kAsking;  // step down: ask the newer leader for an image
      break;
    case Event::kImage:
      if (state_ == State::kLeader || other_epoch < epoch_) return std::nullopt;
      epoch = other_epoch;
      to = State::kFollowing;
      break;
    case Event::kReplicaBroken:
      if (state_ != State::kFollowing) return std::nullopt;
      to = State::kAsking;
      break;
    case Event::kLeaseLapsed:
    case Event::kElected: {
      if (state_ != (e == Event::kLeaseLapsed ? State::kFollowing : State::kAsking)) return std::nullopt;
      const std::optional<int64_t> next = proto::next_epoch(epoch_, e == Event::kElected ? other_epoch : 0);
      if (!next) return std::nullopt;  // never lead an epoch learners refuse
      epoch = *next;
      to = State::kLeader;
      break;
    }
  }
  if (to == state_ && epoch == epoch_) return std::nullopt;
  const Transition t{state_, to, epoch};
  state_ = to;
  epoch_ = epoch;
  return t;
}

const char* PairRole::name(State s) {
  switch (s) {
    case State::kLeader: return "leader";
    case State::kAsking: return "asking";
    case State::kFollowing: return "following";
  }
  return "?";
}

const char* PairRole::name(Event e) {
  switch (e) {
    case Event::kNewerEpoch: return "newer_epoch";
    case Event::kImage: return "image";
    case Event::kReplicaBroken: return "replica_broken";
    case Event::kLeaseLapsed: return "lease_lapsed";
    case Event::kElected: return "elected";
  }
  return "?";
}

}  // namespace deloco
