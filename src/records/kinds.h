// records/kinds.h — the schema of deloco's records: every record kind a deloco process writes, with its fields,
// written once. The writers (the simulator, the syncer and learner nodes, `deloco train`, `deloco run`) build these
// structs; the readers (`deloco report`, the dashboard, `deloco run`'s live view) parse lines into them
// (records/record.h: to_json, from_json). A field added here is written and read everywhere at once.
//
// Where each kind is written:
//   syncer.jsonl      (syncer node; `deloco sim`'s metrics.jsonl for the kinds the simulator also writes)
//   learner-N.jsonl   (learner node, the embedded learner)
//   metrics.jsonl     (`deloco sim`: the simulator's records; `deloco train`: train and eval)
//   events.jsonl      (`deloco run`: chaos)
// Times ("t", RecordBase) are unix seconds for the nodes and `deloco run`, virtual seconds for the simulator;
// `deloco train` records carry elapsed_s instead.
//
// Contract: plain data (records/record.h states how fields are written and read). A field that a kind writes only
// sometimes is a std::optional. Field names are the files' format: renaming one breaks readers of existing runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "records/record.h"

namespace deloco::rec {

// ---- The syncer's merge rounds (syncer node and simulator) ------------------------------------------------------

// A fragment merged: version `version` of fragment `fragment` from `learners` with `weights`.
struct Merge : RecordBase {
  static constexpr const char* kKind = "merge";
  int64_t fragment = -1, version = 0;
  int64_t quorum = 0;                 // contributions merged
  std::vector<int64_t> learners;
  std::vector<double> weights;
  double grace = 0;                   // the grace window when the round merged (s)
  double grace_wait = 0;              // now − the time the round reached its quorum (s)
  double delta_norm = 0;
  int64_t tokens = 0;                 // tokens trained by all learners so far
  std::optional<int64_t> merges;      // merges so far (syncer node)
  template <class V> void fields(V& v) {
    v("fragment", fragment); v("version", version); v("quorum", quorum); v("learners", learners);
    v("weights", weights); v("grace", grace); v("grace_wait", grace_wait); v("delta_norm", delta_norm);
    v("tokens", tokens); v("merges", merges);
  }
};

// A contribution refused (by the core, or the node before it).
struct Reject : RecordBase {
  static constexpr const char* kKind = "reject";
  int64_t learner = -1, fragment = -1;
  std::string reason;
  std::optional<std::string> detail;
  template <class V> void fields(V& v) {
    v("learner", learner); v("fragment", fragment); v("reason", reason); v("detail", detail);
  }
};

// The evaluation of the global model.
struct Eval : RecordBase {
  static constexpr const char* kKind = "eval";
  double val_loss = 0, val_bpb = 0;
  std::string loss_unit;
  int64_t tokens = 0;
  std::optional<int64_t> outer_steps;  // merges so far (simulator, syncer node)
  std::optional<int64_t> step;         // `deloco train`
  std::optional<double> elapsed_s, eval_s;  // `deloco train`
  template <class V> void fields(V& v) {
    v("val_loss", val_loss); v("val_bpb", val_bpb); v("loss_unit", loss_unit); v("tokens", tokens);
    v("outer_steps", outer_steps); v("step", step); v("elapsed_s", elapsed_s); v("eval_s", eval_s);
  }
};

// ---- The inner loop -------------------------------------------------------------------------------------------

// A learner's progress: every log_every steps (simulator, learner node).
struct Learner : RecordBase {
  static constexpr const char* kKind = "learner";
  std::optional<int64_t> learner;      // simulator (one file for all); a learner node's file is its own
  int64_t step = 0;
  std::optional<double> loss;
  std::optional<int64_t> tokens;
  std::optional<double> step_time;
  std::optional<std::string> model_fingerprint;  // the first record of a learner node
  template <class V> void fields(V& v) {
    v("learner", learner); v("step", step); v("loss", loss); v("tokens", tokens); v("step_time", step_time);
    v("model_fingerprint", model_fingerprint);
  }
};

// `deloco train`'s progress.
struct Train : RecordBase {
  static constexpr const char* kKind = "train";
  int64_t step = 0, tokens = 0;
  double loss = 0, lr = 0, tokens_per_s = 0, elapsed_s = 0;
  template <class V> void fields(V& v) {
    v("step", step); v("tokens", tokens); v("loss", loss); v("lr", lr); v("tokens_per_s", tokens_per_s);
    v("elapsed_s", elapsed_s);
  }
};

// A merged fragment applied by a learner at step `step`.
struct Apply : RecordBase {
  static constexpr const char* kKind = "apply";
  std::optional<int64_t> learner;
  int64_t fragment = -1, version = 0, step = 0;
  template <class V> void fields(V& v) {
    v("learner", learner); v("fragment", fragment); v("version", version); v("step", step);
  }
};

// A learner dropped its drift of a fragment after a refusal that says it cannot be merged.
struct DriftDropped : RecordBase {
  static constexpr const char* kKind = "drift_dropped";
  std::optional<int64_t> learner;
  int64_t fragment = -1, version = 0, step = 0;
  std::optional<std::string> detail;
  template <class V> void fields(V& v) {
    v("learner", learner); v("fragment", fragment); v("version", version); v("step", step); v("detail", detail);
  }
};

// A learner trained its last step.
struct LearnerDone : RecordBase {
  static constexpr const char* kKind = "learner_done";
  std::optional<int64_t> learner;
  int64_t step = 0;
  template <class V> void fields(V& v) { v("learner", learner); v("step", step); }
};

// ---- Failures (simulator) -------------------------------------------------------------------------------------

struct Fail : RecordBase {
  static constexpr const char* kKind = "fail";
  int64_t learner = -1, step = 0;
  template <class V> void fields(V& v) { v("learner", learner); v("step", step); }
};

struct Rejoin : RecordBase {
  static constexpr const char* kKind = "rejoin";
  int64_t learner = -1, step = 0;
  template <class V> void fields(V& v) { v("learner", learner); v("step", step); }
};

struct SyncerPause : RecordBase {
  static constexpr const char* kKind = "syncer_pause";
  template <class V> void fields(V&) {}
};

struct SyncerResume : RecordBase {
  static constexpr const char* kKind = "syncer_resume";
  template <class V> void fields(V&) {}
};

// ---- `deloco run` ---------------------------------------------------------------------------------------------

// A chaos action of `deloco run` (events.jsonl).
struct Chaos : RecordBase {
  static constexpr const char* kKind = "chaos";
  std::string what;
  template <class V> void fields(V& v) { v("what", what); }
};

}  // namespace deloco::rec
