// sync/policy.h — the syncer core's own rules, private to src/sync (the Syncer of deloco/sync.h applies them; the
// tests beside it check them): a round's quorum decision and the cap on a contribution's share of a merge. Pure
// functions of their arguments: no I/O, no clock, no state.
#pragma once

#include <cstdint>
#include <vector>

#include "deloco/sync.h"

namespace deloco {

// Normalised weights (summing to 1) capped at max(cap, 1/n) each: weights above the cap are set to it and the
// excess is given to the uncapped ones in proportion to their weights, repeatedly, until none exceeds it (water
// filling). cap ≥ 1 returns `w` unchanged; one weight stays 1.
std::vector<double> cap_shares(std::vector<double> w, double cap);

// What a fragment's round knows when deciding.
struct RoundState {
  int64_t arrivals = 0;         // accepted contributions waiting
  int64_t connected = 0;        // learners currently connected
  int64_t connected_arrived = 0;  // of those, how many have a contribution waiting
  double first_arrival = 0;     // time of the first waiting contribution
  double quorum_time = -1;      // time the K-th arrival came (< 0: not yet)
  int64_t retired = 0;          // learners that finished training and will never send again (finished ones included)
  int64_t finished = 0;         // of those, the ones past their last step, not yet retired (Syncer::set_finished)
};

// The quorum actually required: min(K, M − retired) — finished learners cannot hold the others back.
int64_t effective_quorum(const RoundState& s, const SyncOptions& o);

// Merge now, wait for more arrivals, or wait until the grace window (`grace` seconds after the quorum) closes. Nobody
// else can come, so it merges at once, when every connected learner has a contribution waiting, or when every learner
// is retired or finished and one is finished (sync.final_round: they push nothing more).
RoundDecision decide_round(double now, const RoundState& s, const SyncOptions& o, double grace);

}  // namespace deloco
