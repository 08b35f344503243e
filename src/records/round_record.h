// records/round_record.h — the record of a merged round (rec::Merge, records/kinds.h) from the core's RoundResult
// (deloco/sync.h), built in one place for both drivers that merge: the simulator and the syncer node. Header-only:
// it needs the core's types, which deloco_base does not build against.
#pragma once

#include <cstdint>

#include "deloco/sync.h"
#include "records/kinds.h"

namespace deloco::rec {

// `fragment`: the model's fragment id (a shard's local index mapped back by the caller); `tokens`: the tokens every
// learner trained on so far. The envelope (t) and the syncer node's `merges` are the caller's to set.
inline Merge merge_record(const RoundResult& r, int64_t fragment, int64_t tokens) {
  Merge m;
  m.fragment = fragment;
  m.version = r.outcome.version;
  m.quorum = static_cast<int64_t>(r.outcome.learners.size());
  m.learners = r.outcome.learners;
  m.weights = r.outcome.weights;
  m.staleness = r.outcome.staleness;
  m.grace = r.grace;
  m.grace_wait = r.grace_wait;
  m.delta_norm = r.outcome.delta_norm;
  m.tokens = tokens;
  return m;
}

}  // namespace deloco::rec
