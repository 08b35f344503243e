// records/round_record.h — the record of a merged round (rec::Merge, records/kinds.h) from the core's RoundResult
// (deloco/sync.h), built in one place for both drivers that merge: the simulator and the syncer node. Header-only:
// it needs the core's types, which deloco_base does not build against.
#pragma once

#include <cstdint>

#include "deloco/sync.h"
#include "records/kinds.h"
#include "sync/codec_fit.h"

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

// A round the core rolled back (RoundResult::rolled_back()) of fragment `fragment` (the driver's id for it).
inline MergeRolledBack rolled_back_record(const RoundResult& r, int64_t fragment) {
  MergeRolledBack rb;
  rb.fragment = fragment;
  rb.version = r.outcome.version;
  rb.learners = r.outcome.learners;
  rb.reason = sync_reject_name(r.outcome.rejected);
  rb.detail = r.outcome.detail;
  return rb;
}

// The final round's record of one fragment (Syncer::final_round, merged).
inline FinalMerge final_merge_record(const RoundResult& r) {
  FinalMerge m;
  m.fragment = r.outcome.fragment;
  m.version = r.outcome.version;
  m.learners = r.outcome.learners;
  m.weights = r.outcome.weights;
  m.staleness = r.outcome.staleness;
  m.delta_norm = r.outcome.delta_norm;
  return m;
}

// net.encoding / net.broadcast_encoding = auto: learner m's fit changed from `before` to `now` (CodecFitter::refit),
// with the link's measurements it was made from.
inline CodecChanged codec_record(const CodecFitter& f, int64_t m, const CodecChoice& before, const CodecChoice& now,
                                 double step_time) {
  CodecChanged r;
  r.scope = "learner";
  r.learner = m;
  r.push = encoding_name(f.push_ladder().codecs.at(static_cast<size_t>(now.push)).encoding);
  r.broadcast = encoding_name(f.broadcast_ladder().codecs.at(static_cast<size_t>(now.broadcast)).encoding);
  r.previous = before.period > 0
                   ? std::string(encoding_name(f.push_ladder().codecs.at(static_cast<size_t>(before.push)).encoding)) +
                         "/" + encoding_name(f.broadcast_ladder().codecs.at(static_cast<size_t>(before.broadcast)).encoding)
                   : std::string();
  r.period = now.period;
  r.fits = now.fits;
  r.up_rate = f.up_rate(m);
  r.down_rate = f.down_rate(m);
  r.up_latency = f.up(m).latency;
  r.down_latency = f.down(m).latency;
  r.step_time = step_time;
  r.broadcasts_per_period = f.broadcasts_per_period(step_time);
  r.up_s = now.up;
  r.down_s = now.down;
  r.sync_s = now.sync;
  r.budget_s = now.budget;
  r.overlap_s = now.overlap_budget;
  return r;
}

// The delta broadcast's codec changed from ladder index `before` to `now` (CodecFitter::broadcast).
inline CodecChanged broadcast_codec_record(const CodecFitter& f, int before, int now) {
  CodecChanged r;
  r.scope = "broadcast";
  r.broadcast = encoding_name(f.broadcast_ladder().codecs.at(static_cast<size_t>(now)).encoding);
  r.previous = encoding_name(f.broadcast_ladder().codecs.at(static_cast<size_t>(before)).encoding);
  return r;
}

// Each learner's fit as it stands (a run summary's "codecs"): null for a learner not fitted yet.
inline nlohmann::json codec_summary(const CodecFitter& f, int64_t learners) {
  nlohmann::json codecs = nlohmann::json::array();
  for (int64_t m = 0; m < learners; ++m) {
    const CodecChoice& c = f.choice(m);
    if (c.period == 0) {
      codecs.push_back(nullptr);
      continue;
    }
    codecs.push_back({{"push", encoding_name(f.push_ladder().codecs.at(static_cast<size_t>(c.push)).encoding)},
                      {"broadcast", encoding_name(f.broadcast_ladder().codecs.at(static_cast<size_t>(c.broadcast)).encoding)},
                      {"period", c.period},
                      {"fits", c.fits},
                      {"up_rate", f.up_rate(m)},
                      {"down_rate", f.down_rate(m)},
                      {"up_latency", f.up(m).latency},
                      {"down_latency", f.down(m).latency}});
  }
  return codecs;
}

}  // namespace deloco::rec
