// records/kinds.h — the schema of deloco's records: every record kind a deloco process writes, with its fields,
// written once. The writers (the simulator, the syncer and learner nodes, `deloco train`, `deloco run`) build these
// structs; the readers (`deloco report`, the dashboard, `deloco run`'s live view) parse lines into them
// (records/record.h: to_json, from_json). A field added here is written and read everywhere at once.
//
// Where each kind is written:
//   syncer.jsonl      (syncer node; `deloco sim`'s metrics.jsonl for the kinds the simulator also writes)
//   learner-N.jsonl   (learner node, the embedded learner)
//   metrics.jsonl     (`deloco sim`: the simulator's records; `deloco train`: train and eval)
//   events.jsonl      (`deloco run`: chaos, net_fault)
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

// A kind whose one field is a text saying what happened ("detail").
template <const char* K> struct DetailRecord : RecordBase {
  static constexpr const char* kKind = K;
  std::string detail;
  template <class V> void fields(V& v) { v("detail", detail); }
};

// ---- The syncer's merge rounds (syncer node and simulator) ------------------------------------------------------

// A fragment merged: version `version` of fragment `fragment` from `learners` with `weights`.
struct Merge : RecordBase {
  static constexpr const char* kKind = "merge";
  int64_t fragment = -1, version = 0;
  int64_t quorum = 0;                 // contributions merged
  std::vector<int64_t> learners;
  std::vector<double> weights;
  std::vector<int64_t> staleness;     // per contribution: merges of the fragment since its base version
  double grace = 0;                   // the grace window when the round merged (s)
  double grace_wait = 0;              // now − the time the round reached its quorum (s)
  double delta_norm = 0;
  int64_t tokens = 0;                 // tokens trained by all learners so far
  std::optional<int64_t> merges;      // merges so far (syncer node)
  // Syncer node: ξ_sync's transfer terms when it merged (s): the measured upload and broadcast times (moving
  // averages), or the hand-off time of the broadcast before any was measured.
  std::optional<double> upload_seconds, broadcast_seconds;
  template <class V> void fields(V& v) {
    v("fragment", fragment); v("version", version); v("quorum", quorum); v("learners", learners);
    v("weights", weights); v("staleness", staleness); v("grace", grace); v("grace_wait", grace_wait); v("delta_norm", delta_norm);
    v("tokens", tokens); v("merges", merges); v("upload_seconds", upload_seconds);
    v("broadcast_seconds", broadcast_seconds);
  }
};

// sync.final_round (deloco/sync.h: Syncer::final_round): fragment `fragment` of the final model, version `version`,
// is the weighted mean of these learners' final states (a round rolled back is a merge_rolled_back record).
struct FinalMerge : RecordBase {
  static constexpr const char* kKind = "final_merge";
  int64_t fragment = -1, version = 0;
  std::vector<int64_t> learners;
  std::vector<double> weights;
  std::vector<int64_t> staleness;     // per state: merges of the fragment since the version it was taken against
  double delta_norm = 0;              // ‖the final Θ_p − Θ_p before it‖
  template <class V> void fields(V& v) {
    v("fragment", fragment); v("version", version); v("learners", learners); v("weights", weights);
    v("staleness", staleness); v("delta_norm", delta_norm);
  }
};

// A round rolled back by the core (a non-finite or refused merge): nothing changed, its contributors are told.
struct MergeRolledBack : RecordBase {
  static constexpr const char* kKind = "merge_rolled_back";
  int64_t fragment = -1, version = 0;
  std::vector<int64_t> learners;
  std::string reason, detail;
  template <class V> void fields(V& v) {
    v("fragment", fragment); v("version", version); v("learners", learners); v("reason", reason); v("detail", detail);
  }
};

// A merged fragment that could not be encoded for its broadcast (the syncer's failure; learners catch up later).
struct BroadcastFailed : RecordBase {
  static constexpr const char* kKind = "broadcast_failed";
  int64_t fragment = -1, version = 0;
  std::string detail;
  template <class V> void fields(V& v) { v("fragment", fragment); v("version", version); v("detail", detail); }
};

// A contribution refused (by the core, or the node before it); `learner` (RecordBase) names its sender.
struct Reject : RecordBase {
  static constexpr const char* kKind = "reject";
  int64_t fragment = -1;
  std::string reason;
  std::optional<std::string> detail;
  // A refused join (a hello, or a message from a connection that has not joined), not a refused contribution.
  std::optional<bool> join;
  template <class V> void fields(V& v) {
    v("fragment", fragment); v("reason", reason); v("detail", detail); v("join", join);
  }
};

// A push its learner's schedule made due but that never went on the wire (learner records), with why:
//  * superseded — it waited in the outbox (its link's push window full) and a newer push of the fragment replaced
//    it; the newer one's Θ^v − θ and counters hold its progress;
//  * not_joined — due while the link to the syncer was down; its progress stays in θ for the next push;
//  * send_failed — the transport refused the frame; likewise;
//  * at_end — still in the outbox when the learner left;
//  * unanswered_at_end — sync.apply = rebase: the last step's push of a fragment whose previous push was still
//    unanswered then (a second push would carry that one's part again): the steps since are not in the final model.
//    With sync.final_round: a fragment whose answer did not come within net.join_timeout after the last step (or
//    whose syncer shard was gone), so its final state was not sent.
struct PushUnsent : RecordBase {
  static constexpr const char* kKind = "push_unsent";
  int64_t fragment = -1, step = 0;
  std::string reason;
  std::optional<int64_t> replaced_by;  // superseded: the step of the push that replaced it
  template <class V> void fields(V& v) {
    v("fragment", fragment); v("step", step); v("reason", reason); v("replaced_by", replaced_by);
  }
};

// An accepted contribution that no merge took (syncer records), with why:
//  * replaced — a newer push of the fragment from the same learner arrived before the round merged and took its
//    place (it holds the same progress and more);
//  * pending_at_end — it still waited for a quorum when the syncer stopped.
// Refused contributions are `reject` records; a round rolled back is a reject of each of its contributions.
struct ContributionUnmerged : RecordBase {
  static constexpr const char* kKind = "contribution_unmerged";
  int64_t fragment = -1;
  std::string reason;
  template <class V> void fields(V& v) { v("fragment", fragment); v("reason", reason); }
};

// net.encoding = auto / net.broadcast_encoding = auto (sync/codec_fit.h, docs/runtime.md "Codecs fitted to the
// link"): a codec choice changed (syncer node, simulator). scope "learner": learner m's fit — its push codec, the
// broadcast codec its link alone would take, its sync period (H, or stretched when no codec fits) — with the figures
// it was made from; scope "broadcast": the codec of the delta broadcast (one per syncer: the coarsest of the live
// learners' fits), `learner` absent.
struct CodecChanged : RecordBase {
  static constexpr const char* kKind = "codec_changed";
  std::string scope;                       // learner | broadcast
  std::string push, broadcast;             // encoding names (push: scope learner only)
  std::optional<std::string> previous;     // the codec(s) before, "push/broadcast" or the broadcast's ("": first fit)
  std::optional<int64_t> period;           // the learner's sync period
  std::optional<bool> fits;                // the pair met the rule's three conditions
  // bytes/s and latency (s) measured each way on the link, its step time (s), merges per fragment per period; the
  // chosen pair's seconds per
  // period up and down, of one synchronisation, and the bounds (u·T, τ·ξ).
  std::optional<double> up_rate, down_rate, up_latency, down_latency, step_time, broadcasts_per_period, up_s, down_s,
      sync_s, budget_s, overlap_s;
  template <class V> void fields(V& v) {
    v("scope", scope); v("push", push); v("broadcast", broadcast); v("previous", previous); v("period", period);
    v("fits", fits); v("up_rate", up_rate); v("down_rate", down_rate);
    v("up_latency", up_latency); v("down_latency", down_latency); v("step_time", step_time);
    v("broadcasts_per_period", broadcasts_per_period); v("up_s", up_s); v("down_s", down_s); v("sync_s", sync_s);
    v("budget_s", budget_s); v("overlap_s", overlap_s);
  }
};

// An evaluation of the global model during the run (syncer shard 0, simulator; `deloco train`: the trainer's).
struct Eval : RecordBase {
  static constexpr const char* kKind = "eval";
  double val_loss = 0, val_bpb = 0;
  std::string loss_unit;
  int64_t tokens = 0;
  std::optional<int64_t> outer_steps;       // merges so far (simulator)
  std::optional<int64_t> merges;            // merges so far (syncer node)
  std::optional<nlohmann::json> shards;     // a sharded syncer: which checkpoint of each shard was evaluated
  std::optional<int64_t> step;              // `deloco train`
  std::optional<double> elapsed_s, eval_s;  // `deloco train`
  template <class V> void fields(V& v) {
    v("val_loss", val_loss); v("val_bpb", val_bpb); v("loss_unit", loss_unit); v("tokens", tokens);
    v("outer_steps", outer_steps); v("merges", merges); v("shards", shards); v("step", step);
    v("elapsed_s", elapsed_s); v("eval_s", eval_s);
  }
};

// The evaluation at the end of the run: Eval's fields.
struct FinalEval : Eval {
  static constexpr const char* kKind = "final_eval";
};

// ---- The syncer node's life ---------------------------------------------------------------------------------

// The syncer started (or resumed from its checkpoint).
struct Started : RecordBase {
  static constexpr const char* kKind = "started";
  bool resumed = false;
  int64_t merges = 0;
  std::string endpoint;
  int64_t metrics_port = 0;
  int64_t learners = 0;
  std::string fingerprint;
  std::vector<int64_t> versions;
  int64_t shards = 1;
  std::vector<int64_t> fragments;
  std::string metrics_warning;
  bool follows = false;  // started as the standby of a pair: its own state (resumed or not) only until an image
  template <class V> void fields(V& v) {
    v("follows", follows); v("resumed", resumed); v("merges", merges); v("endpoint", endpoint); v("metrics_port", metrics_port);
    v("learners", learners); v("fingerprint", fingerprint); v("versions", versions); v("shards", shards);
    v("fragments", fragments); v("metrics_warning", metrics_warning);
  }
};

// The syncer's periodic status.
struct Status : RecordBase {
  static constexpr const char* kKind = "status";
  int64_t alive = 0;
  std::vector<int64_t> connected;  // the learners connected
  bool stalled = false, blocked = false;
  double uptime = 0, goodput = 0;
  // rejected: refused contributions and other messages (the summary's contributions_rejected); joins_refused apart.
  int64_t merges = 0, rejected = 0, bytes_in = 0, bytes_out = 0, tokens = 0;
  std::optional<int64_t> joins_refused;
  template <class V> void fields(V& v) {
    v("alive", alive); v("connected", connected); v("stalled", stalled); v("blocked", blocked); v("uptime", uptime);
    v("goodput", goodput); v("merges", merges); v("rejected", rejected); v("joins_refused", joins_refused); v("bytes_in", bytes_in);
    v("bytes_out", bytes_out); v("tokens", tokens);
  }
};

// A learner's hello accepted: it joined (or joined again: restart).
struct Join : RecordBase {
  static constexpr const char* kKind = "join";
  std::string instance;
  bool restart = false;
  std::optional<int64_t> step;
  std::optional<int64_t> state_bytes;
  std::string identity;
  template <class V> void fields(V& v) {
    v("instance", instance); v("restart", restart); v("step", step); v("state_bytes", state_bytes);
    v("identity", identity);
  }
};

// A learner that left ("leave") or went silent past net.dead_after ("silent").
struct Lost : RecordBase {
  static constexpr const char* kKind = "lost";
  std::string reason;
  std::optional<double> silent_seconds;
  template <class V> void fields(V& v) { v("reason", reason); v("silent_seconds", silent_seconds); }
};

// A learner finished for good (`how`: done, ...).
struct Retired : RecordBase {
  static constexpr const char* kKind = "retired";
  std::string how;
  template <class V> void fields(V& v) { v("how", how); }
};

// sync.final_round (syncer node and simulator): the syncer heard the learner's last step with no push of it still to
// come (`finished`: no round waits for its push any more, Syncer::set_finished), or a hello resuming from an earlier
// step `step` (not finished: it pushes again).
struct LearnerFinished : RecordBase {
  static constexpr const char* kKind = "learner_finished";
  bool finished = true;
  int64_t step = 0;
  template <class V> void fields(V& v) { v("finished", finished); v("step", step); }
};

// A state request dropped: a download to that connection is still outstanding.
inline constexpr char kStateRequestDroppedKind[] = "state_request_dropped";
using StateRequestDropped = DetailRecord<kStateRequestDroppedKind>;

// Every connected learner stopped advancing for max(4·dead_after, 20 step times) (`learners` names them).
struct LearnersBlocked : RecordBase {
  static constexpr const char* kKind = "learners_blocked";
  std::vector<int64_t> learners;
  std::string detail;
  template <class V> void fields(V& v) { v("learners", learners); v("detail", detail); }
};

// Learners advance again after learners_blocked.
struct LearnersAdvancing : RecordBase {
  static constexpr const char* kKind = "learners_advancing";
  template <class V> void fields(V&) {}
};

// Connections refused by the CURVE allow-list (`total` so far, `new` since the last record).
struct AuthDenied : RecordBase {
  static constexpr const char* kKind = "auth_denied";
  int64_t total = 0, fresh = 0;
  std::string detail;
  template <class V> void fields(V& v) { v("total", total); v("new", fresh); v("detail", detail); }
};

// A checkpoint of the syncer committed.
struct CheckpointSaved : RecordBase {
  static constexpr const char* kKind = "checkpoint";
  std::string path;
  int64_t merges = 0;
  template <class V> void fields(V& v) { v("path", path); v("merges", merges); }
};

// ---- The standby pair (syncer node; docs/reliability.md) ------------------------------------------------------

// A standby took over: the leader's lease lapsed after `silent_seconds` without a word; it leads `epoch` now, from
// the `merges` it replicated (journal entries `journal`, rounds it checked against the leader's and how many differed).
// model_hash: FNV-1a-64 (decimal) of Θ's fp32 bytes, tensor by tensor in name order, as it took over.
struct TakeOver : RecordBase {
  static constexpr const char* kKind = "takeover";
  int64_t epoch = 0, merges = 0, journal = 0, rounds_checked = 0, mismatches = 0, learners_told = 0;
  double silent_seconds = 0;
  std::string model_hash;
  std::string detail;  // "" : the lease lapsed; else why a pair that had no leader elected this syncer
  template <class V> void fields(V& v) {
    v("epoch", epoch); v("merges", merges); v("journal", journal); v("rounds_checked", rounds_checked);
    v("mismatches", mismatches); v("learners_told", learners_told); v("silent_seconds", silent_seconds);
    v("model_hash", model_hash); v("detail", detail);
  }
};

// The first merge a standby made after taking over (the failover is over): `seconds_after_takeover`.
struct FailoverMerge : RecordBase {
  static constexpr const char* kKind = "failover_merge";
  int64_t epoch = 0, fragment = -1, version = 0;
  double seconds_after_takeover = 0;
  template <class V> void fields(V& v) {
    v("epoch", epoch); v("fragment", fragment); v("version", version); v("seconds_after_takeover", seconds_after_takeover);
  }
};

// A leader learned of a newer epoch (a learner's hello, a standby's follow): it was replaced and follows now.
struct StepDown : RecordBase {
  static constexpr const char* kKind = "step_down";
  int64_t epoch = 0, newer_epoch = 0, merges = 0;
  std::string detail;
  template <class V> void fields(V& v) {
    v("epoch", epoch); v("newer_epoch", newer_epoch); v("merges", merges); v("detail", detail);
  }
};

// Leader: a standby began following (sent an image at `journal`, dropping the `dropped` waiting contributions) or
// was dropped (silent for the lease). Standby: an image arrived (it follows from there). Either: `paused`, the
// process did not run for longer than half a lease (its silence timers start again).
struct Standby : RecordBase {
  static constexpr const char* kKind = "standby";
  std::string event;  // following | dropped | image | mismatch | gap | refused | malformed | paused
  int64_t epoch = 0, journal = 0, merges = 0, dropped = 0;
  std::string detail;
  template <class V> void fields(V& v) {
    v("event", event); v("epoch", epoch); v("journal", journal); v("merges", merges); v("dropped", dropped);
    v("detail", detail);
  }
};

// A learner moved its link for a shard to the other syncer of the pair (it announced it leads `epoch`).
struct SyncerFailover : RecordBase {
  static constexpr const char* kKind = "syncer_failover";
  int64_t step = 0, epoch = 0;
  template <class V> void fields(V& v) { v("step", step); v("epoch", epoch); }
};

// ---- The inner loop (simulator, learner node, embedded learner, `deloco train`) -------------------------------

// A learner's progress every log_every steps.
struct Learner : RecordBase {
  static constexpr const char* kKind = "learner";
  int64_t step = 0;
  std::optional<double> loss;
  std::optional<int64_t> tokens;
  std::optional<double> step_time;
  template <class V> void fields(V& v) { v("step", step); v("loss", loss); v("tokens", tokens); v("step_time", step_time); }
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
  int64_t fragment = -1, version = 0, step = 0;
  template <class V> void fields(V& v) { v("fragment", fragment); v("version", version); v("step", step); }
};

// A learner dropped its drift of a fragment after a refusal that says it cannot be merged.
struct DriftDropped : RecordBase {
  static constexpr const char* kKind = "drift_dropped";
  int64_t fragment = -1, version = 0, step = 0;
  std::optional<std::string> detail;
  template <class V> void fields(V& v) {
    v("fragment", fragment); v("version", version); v("step", step); v("detail", detail);
  }
};

// A learner trained its last step.
struct LearnerDone : RecordBase {
  static constexpr const char* kKind = "learner_done";
  int64_t step = 0;
  // The learner node's summary (learner node, embedded learner): counts, times and bytes of its whole run.
  std::optional<int64_t> steps_trained, tokens, pushes, pushes_dropped, pushes_superseded, broadcasts, rejected, bytes_sent,
      bytes_received, ranks;
  // Every push its schedule made due, and those still in the outbox at the end: pushes_due = pushes (sent) +
  // pushes_superseded + pushes_dropped + pushes_unsent_at_end (each unsent one is a push_unsent record).
  std::optional<int64_t> pushes_due, pushes_unsent_at_end;
  std::optional<int64_t> joins_refused;  // refusals of its hellos (duplicate_id, not_leader, ...): not in `rejected`
  std::optional<int64_t> record_errors;  // its records the sink failed to take (a full disk): not in the file
  std::optional<int64_t> served_chunks, served_bytes;  // rejoin from peers: state chunks this learner served (net.serve)
  std::optional<nlohmann::json> serve_refused;  // ... and the state requests it refused, by reason (ServeRefused)
  // The delta broadcast (net.broadcast_delta): fragment_delta frames added to the version held, and those whose base
  // this learner did not hold (it asked for the whole fragment).
  std::optional<int64_t> deltas_applied, deltas_unapplied;
  std::optional<double> wall_seconds, busy_seconds, steps_per_second, train_steps_per_second, comm_seconds,
      comm_fraction, wait_seconds, group_comm_seconds;
  std::optional<bool> finished;                        // trained every step and every shard let it in
  std::optional<std::vector<int64_t>> unreached_shards;  // shards that refused its key for the whole run
  std::optional<std::string> error;
  // The training compute precision (train.precision = auto: what the matmul probe chose, and the rates it measured).
  std::optional<std::string> precision, precision_setting;
  std::optional<double> fp32_gflops, bf16_gflops;
  template <class V> void fields(V& v) {
    v("step", step); v("steps_trained", steps_trained); v("tokens", tokens); v("wall_seconds", wall_seconds);
    v("busy_seconds", busy_seconds); v("steps_per_second", steps_per_second);
    v("train_steps_per_second", train_steps_per_second); v("comm_seconds", comm_seconds);
    v("comm_fraction", comm_fraction); v("wait_seconds", wait_seconds); v("pushes", pushes);
    v("pushes_dropped", pushes_dropped); v("pushes_superseded", pushes_superseded); v("pushes_due", pushes_due);
    v("pushes_unsent_at_end", pushes_unsent_at_end); v("broadcasts", broadcasts); v("rejected", rejected);
    v("record_errors", record_errors);
    v("finished", finished); v("bytes_sent", bytes_sent); v("bytes_received", bytes_received); v("ranks", ranks);
    v("group_comm_seconds", group_comm_seconds); v("unreached_shards", unreached_shards); v("error", error);
    v("precision", precision); v("precision_setting", precision_setting); v("fp32_gflops", fp32_gflops);
    v("bf16_gflops", bf16_gflops); v("served_chunks", served_chunks); v("served_bytes", served_bytes);
    v("serve_refused", serve_refused); v("joins_refused", joins_refused);
    v("deltas_applied", deltas_applied); v("deltas_unapplied", deltas_unapplied);
  }
};

// ---- The learner node's link to the syncer --------------------------------------------------------------------

// A fragment pushed (after step `step`, against version `base_version`).
struct Push : RecordBase {
  static constexpr const char* kKind = "push";
  int64_t fragment = -1, step = 0, bytes = 0, base_version = 0;
  std::optional<std::string> encoding;  // the push's codec (learner node; net.encoding = auto changes it)
  std::optional<bool> final;            // a final state (sync.final_round), not a push the syncer merges
  template <class V> void fields(V& v) {
    v("fragment", fragment); v("step", step); v("bytes", bytes); v("base_version", base_version); v("encoding", encoding);
    v("final", final);
  }
};

// The learner holds Θ: it trains on from `step` (`resume_step`: the syncer's record of it). Downloaded at this join:
// download_bytes and download_seconds; joined again without a download (the state it holds is current):
// hello_seconds, the time from the hello to the welcome.
struct Joined : RecordBase {
  static constexpr const char* kKind = "joined";
  int64_t step = 0, syncer_round = 0;
  std::optional<int64_t> download_bytes;
  std::optional<double> download_seconds, hello_seconds;
  int64_t resume_step = 0;
  std::optional<bool> state_held;  // true: the learner held the syncer's state already (hashes matched), no download
  // Rejoin from peers: of download_bytes, those donor learners served; the donors the welcome named and those that
  // lied (a chunk whose hash was not the syncer's).
  std::optional<int64_t> peer_bytes, donors, donors_lied;
  // Where the time of a fetched download went: hello to welcome; per source (the syncer first, then each donor) the
  // chunks it served and the seconds from the welcome to its first chunk (-1: none); donors' refusals (not_held)
  // and chunks that timed out; chunks asked of a second source at the end of the fetch (endgame_asks).
  std::optional<double> welcome_seconds;
  std::optional<std::vector<int64_t>> source_chunks;
  std::optional<std::vector<double>> source_first_seconds;
  std::optional<int64_t> donor_refused, donor_timeouts, endgame_asks;
  template <class V> void fields(V& v) {
    v("step", step); v("syncer_round", syncer_round); v("download_bytes", download_bytes);
    v("download_seconds", download_seconds); v("resume_step", resume_step); v("hello_seconds", hello_seconds);
    v("state_held", state_held); v("peer_bytes", peer_bytes); v("donors", donors); v("donors_lied", donors_lied);
    v("welcome_seconds", welcome_seconds); v("source_chunks", source_chunks);
    v("source_first_seconds", source_first_seconds); v("donor_refused", donor_refused);
    v("donor_timeouts", donor_timeouts); v("endgame_asks", endgame_asks);
  }
};

// A donor learner served a state chunk whose hash is not the syncer's (rejoin from peers): it is used no more, and the
// chunk is fetched from the syncer.
struct PeerLied : RecordBase {
  static constexpr const char* kKind = "peer_lied";
  int64_t donor = -1, chunk = -1;
  std::string detail;
  template <class V> void fields(V& v) { v("donor", donor); v("chunk", chunk); v("detail", detail); }
};

// A learner that serves peers (net.serve) refused a state request: `reason` stranger (no ticket, or a key that is not
// the ticket's learner's), bad_ticket, busy (kFetchWindow chunks queued or on their way to that learner), not_held
// or malformed; `count` of that reason so far. Written at the 1st, 2nd, 4th, 8th, ... of each reason.
struct ServeRefused : RecordBase {
  static constexpr const char* kKind = "serve_refused";
  std::string reason, detail;
  int64_t count = 0;
  template <class V> void fields(V& v) { v("reason", reason); v("count", count); v("detail", detail); }
};

// The first welcome of a join that downloads the state: Joined's fields (hello_seconds); "joined" follows once the
// download is verified.
struct Welcome : Joined {
  static constexpr const char* kKind = "welcome";
};

// The syncer refused this learner (a reject frame): `code` names the reject reason.
struct Rejected : RecordBase {
  static constexpr const char* kKind = "rejected";
  std::string reason, code;
  template <class V> void fields(V& v) { v("reason", reason); v("code", code); }
};

// The syncer's CURVE allow-list refused this learner's key (retrying with backoff).
struct AuthRefused : RecordBase {
  static constexpr const char* kKind = "auth_refused";
  int64_t refusals = 0, step = 0;
  std::string detail;
  template <class V> void fields(V& v) { v("refusals", refusals); v("step", step); v("detail", detail); }
};

// No frame from the syncer for `silent_seconds`.
struct SyncerLost : RecordBase {
  static constexpr const char* kKind = "syncer_lost";
  int64_t step = 0;
  double silent_seconds = 0;
  template <class V> void fields(V& v) { v("step", step); v("silent_seconds", silent_seconds); }
};

// The learner's transport to the syncer reconnected (its `connections`-th connection): it says hello again.
struct Reconnected : RecordBase {
  static constexpr const char* kKind = "reconnected";
  int64_t step = 0, connections = 0;
  template <class V> void fields(V& v) { v("step", step); v("connections", connections); }
};

// A state download that made no progress (no new chunk) for `idle_seconds`: dropped, and asked for again.
struct DownloadStalled : RecordBase {
  static constexpr const char* kKind = "download_stalled";
  int64_t step = 0, chunks = 0, chunks_held = 0;
  double idle_seconds = 0;
  template <class V> void fields(V& v) {
    v("step", step); v("chunks", chunks); v("chunks_held", chunks_held); v("idle_seconds", idle_seconds);
  }
};

// The syncer holds an older version of a fragment than this learner (it restarted from an older checkpoint).
struct SyncerBehind : RecordBase {
  static constexpr const char* kKind = "syncer_behind";
  int64_t fragment = -1, syncer_version = 0, held_version = 0;
  template <class V> void fields(V& v) { v("fragment", fragment); v("syncer_version", syncer_version); v("held_version", held_version); }
};

// Joined again: the pushes of `fragments` sent before the join count as refused.
struct PushesSettled : RecordBase {
  static constexpr const char* kKind = "pushes_settled";
  std::vector<int64_t> fragments;
  std::string detail;
  template <class V> void fields(V& v) { v("fragments", fragments); v("detail", detail); }
};

// A frame that could not be read (or a state whose hash did not match).
inline constexpr char kBadFrameKind[] = "bad_frame";
using BadFrame = DetailRecord<kBadFrameKind>;

// The learner-local state (AdamW moments) read back at start.
struct StateRestored : RecordBase {
  static constexpr const char* kKind = "state_restored";
  std::string path;
  int64_t step = 0;
  template <class V> void fields(V& v) { v("path", path); v("step", step); }
};

// The learner-local state could not be read: moved aside to `kept_at` ("" when it could not be moved).
struct StateUnusable : RecordBase {
  static constexpr const char* kKind = "state_unusable";
  std::string path, detail, kept_at;
  template <class V> void fields(V& v) { v("path", path); v("detail", detail); v("kept_at", kept_at); }
};

// A syncer shard sent no state within net.dead_after; training goes on.
inline constexpr char kShardMissingKind[] = "shard_missing";
using ShardMissing = DetailRecord<kShardMissingKind>;

// No welcome within net.join_timeout; training goes on alone.
inline constexpr char kAloneKind[] = "alone";
using Alone = DetailRecord<kAloneKind>;

// A wait for an answer given up (not joined).
struct WaitAbandoned : RecordBase {
  static constexpr const char* kKind = "wait_abandoned";
  int64_t step = 0;
  std::string detail;
  template <class V> void fields(V& v) { v("step", step); v("detail", detail); }
};

// The stop of a learner group could not reach every rank.
inline constexpr char kGroupStopUndeliveredKind[] = "group_stop_undelivered";
using GroupStopUndelivered = DetailRecord<kGroupStopUndeliveredKind>;

// The leave message could not be sent.
struct LeaveUndelivered : RecordBase {
  static constexpr const char* kKind = "leave_undelivered";
  std::string reason;
  template <class V> void fields(V& v) { v("reason", reason); }
};

// ---- Failures in the simulator --------------------------------------------------------------------------------

struct Fail : RecordBase {
  static constexpr const char* kKind = "fail";
  int64_t step = 0;
  template <class V> void fields(V& v) { v("step", step); }
};

// The simulator: a failed learner is back. The syncer node: the same process said hello again on the connection
// that holds its id while joined (not a new join; Join's fields, rate-limited).
struct Rejoin : RecordBase {
  static constexpr const char* kKind = "rejoin";
  int64_t step = 0;
  std::optional<std::string> instance;      // syncer node
  std::optional<bool> restart;              // syncer node
  std::optional<int64_t> state_bytes;       // syncer node
  std::optional<std::string> identity;      // syncer node
  template <class V> void fields(V& v) {
    v("step", step); v("instance", instance); v("restart", restart); v("state_bytes", state_bytes);
    v("identity", identity);
  }
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

// A network fault of `deloco run` on a testbed host (chaos.net, events.jsonl): one record per thing done to the
// host's link — the fault's "start", each change of a flapping link between ("down", "up") and its "end" (the heal;
// also when the run ended during the fault: detail says so). `at` is when it was due (seconds since the run started),
// "t" when it was done; `learners` are the learners on that host (none: the syncer's host 0).
struct NetFault : RecordBase {
  static constexpr const char* kKind = "net_fault";
  std::string fault;              // partition | flap | slow
  int64_t host = -1;
  std::vector<int64_t> learners;
  std::string phase;              // start | down | up | end
  std::string action;             // "link down" | "link up" | "rate 200kbit"
  double at = 0;
  bool ok = true;                 // the testbed command succeeded
  std::optional<std::string> detail;
  template <class V> void fields(V& v) {
    v("fault", fault); v("host", host); v("learners", learners); v("phase", phase); v("action", action);
    v("at", at); v("ok", ok); v("detail", detail);
  }
};

// The record that replaces the records of one rate-limit key beyond 20 in 10 s at a syncer: kind
// "<kind>_suppressed", reason = the key. Its kind is not fixed, so suppressed_record() builds it, not a struct.
nlohmann::json suppressed_record(const std::string& kind, const std::string& key);

// The syncer node's last record: its summary (records/summary.h) with kind "done" and "stopped" (whether it was
// stopped before every learner retired). Its fields are the summary's, so done_record() builds it, not a struct.
nlohmann::json done_record(const nlohmann::json& summary, bool stopped);

}  // namespace deloco::rec
