// src/run/live_view.h — what `deloco run` shows while it runs: it tails the JSON-lines records of the syncer and
// the learners (deloco/runtime.h lists them), keeps the latest state of each, turns notable records into event
// lines, and draws a status block (in a terminal: redrawn in place; otherwise one plain line per update).
//
// Contract: records are untrusted text, read through the record schema (records/kinds.h: rec::from_json): a line that
// is not a JSON object with a string "kind", or has a field the view uses of an unexpected type, is ignored; texts
// are cut to rec::kMaxRecordText bytes. The record files are tailed by rec::RecordTailer (records/record.h: a line
// over 1 MiB is skipped, a truncated or rotated file read again from its start). Formatting functions are pure. Not thread-safe: one supervising thread.
#pragma once

#include <sys/types.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "run/summary.h"

namespace deloco::run {

// `v` with `digits` decimals, or "-" when not finite.
std::string fixed(double v, int digits);

struct LearnerView {
  int64_t step = -1;
  double loss = NAN;
  bool finished = false;  // a learner_done record was seen
  int joins = 0;
  bool rejoin_announced = false;  // a sharded syncer: another shard's join already announced this restart
  PushTally pushes;  // its processes' pushes (summary.h): ended ones
  PushTally open;    // the running process's, from its push and push_unsent records (until its learner_done)
};

struct SyncerView {
  int64_t merges = 0;
  int64_t quorum = -1;
  double val_loss = NAN, val_bpb = NAN;
  double uptime = NAN;
  int64_t rejected = 0;
  int starts = 0;
  bool blocked = false;  // its latest status: every connected learner stopped advancing (learners_blocked)
  // A standby pair (syncer.standby): which of the two leads ("" : no pair; "primary" or "standby") and its epoch.
  std::string leader;
  int64_t epoch = 0;
  // Whether the other syncer of the pair follows the leader: it applied an image after the leader took over, and
  // no gap, mismatch or malformed entry made it ask again, nor did the leader drop it since. A kill of the leader
  // now is one failure, which the standby absorbs. Record times (unix), so the two files' order does not matter.
  double lead_since = 0;                 // the current leader's takeover
  double image_at[2] = {-1, -1};         // per syncer of the pair (0: primary, 1: standby): its latest image applied
  double lost_at[2] = {-1, -1};          // ... and the latest sign it stopped following
  bool replica_ready() const {
    const int other = leader == "standby" ? 0 : 1;
    return !leader.empty() && image_at[other] > lead_since && image_at[other] > lost_at[other];
  }
};

// The state of the run as its records tell it. `event` receives one line per notable record (a resumed syncer,
// merge milestones 10, 20, 50, 100, ..., evaluations, learners rejoining, finishing or ending unfinished, losing the
// syncer, rejected, refused by a syncer's CURVE allow-list, dropping a fragment's drift; learners all blocked);
// joined and push records of learners killed by chaos close their entries in `rejoins`.
// A sharded syncer (shards > 1): every shard's records are kept apart and syncer() sums them — merges, rejects and
// starts added, uptime the lowest, quorum the latest merge's, the validation loss shard 0's (it evaluates the
// assembled global model); events name the shard.
class RunRecords {
 public:
  RunRecords(int64_t learners, RejoinLog* rejoins, std::function<void(const std::string&)> event, int64_t shards = 1);
  // One line of syncer.jsonl of shard `shard` (learner < 0) or of learner-N.jsonl (learner = N). A standby pair:
  // `standby` says the line is from the shard's second syncer (its records go to the same shard's view: only the
  // syncer that leads writes merges and status).
  void on_line(const std::string& line, int64_t learner, int64_t shard = 0, bool standby = false);
  // A standby pair: the shards' views start with the primary leading at epoch 1.
  void set_pairs();
  SyncerView syncer() const;
  const SyncerView& shard(int64_t s) const { return shards_[static_cast<size_t>(s)]; }
  // Where the dashboard URL points (default 127.0.0.1; a testbed's host 0).
  void set_dashboard_host(std::string host) { dashboard_host_ = std::move(host); }
  const std::vector<LearnerView>& learners() const { return learners_; }
  // Learner n's process exited (its records read to the end first): one that wrote no learner_done (killed) has its
  // pushes counted from its push and push_unsent records.
  void process_ended(int64_t n);

 private:
  int64_t dashboard_port_ = 0;  // the dashboard URL already announced
  int64_t standby_port_ = 0;    // shard 0's standby syncer's dashboard port: announced when it takes over
  std::string dashboard_host_ = "127.0.0.1";
  void on_syncer_record(const nlohmann::json& j, int64_t shard, bool standby);
  void on_learner_record(const nlohmann::json& j, int64_t n);

  RejoinLog* rejoins_;
  std::function<void(const std::string&)> event_;
  std::vector<SyncerView> shards_;
  int64_t last_quorum_ = -1;
  std::vector<LearnerView> learners_;
  int64_t next_milestone_ = 10;
};

// The next merge-count milestone after `m`: 10, 20, 50, 100, 200, 500, ...
int64_t next_milestone(int64_t m);

// How a process looks from outside.
struct ProcessState {
  bool running = false;     // a process is alive (maybe SIGSTOPped)
  bool sigstopped = false;  // SIGSTOPped by chaos
  bool done = false;        // exited 0
};

struct StatusInput {
  double elapsed = 0;                // seconds since the run started
  bool stopping = false;             // the run is over: a process not running is "stopped", not "DOWN"
  int64_t steps = 0;                 // train.steps
  int64_t slow_learner = -1;         // marked SLOW (-1: none)
  SyncerView syncer;
  ProcessState syncer_state;          // a sharded syncer: up only while every shard is (see shards_up)
  int64_t shards = 1, shards_up = 1;  // shards running; the line says "1/2 shards up" when some are down
  std::vector<LearnerView> learners;
  std::vector<ProcessState> learner_states;
};

// The status block: a syncer line, then the learners four to a line, e.g.
//   [ 1m58s] syncer up | merges 251 (last quorum 1) | val 1.5006 nats, 2.165 bpb | uptime 95% | rejects 0
//     L0 1500/1500 1.380 done | L1 starting
std::vector<std::string> status_lines(const StatusInput& in);

// Writes event lines and the status block to `out` (stderr in `deloco run`).
class LiveView {
 public:
  // status: the current block; elapsed: seconds since the run started (for event time stamps).
  LiveView(std::ostream& out, bool tty, std::function<std::vector<std::string>()> status,
           std::function<double()> elapsed);
  // tty: erases the previous block and draws the current one, clipped to the terminal width; otherwise writes
  // it as one line (the block's lines joined by " |").
  void draw();
  // tty: erases the block (before other output).
  void clear();
  // "[ 1m58s] what"; in a terminal the block is redrawn below it. `what` may quote records (a reject reason): its
  // control characters are written as '?', so no record can move the cursor or recolour the terminal.
  void event(const std::string& what);

 private:
  std::ostream& out_;
  bool tty_;
  std::function<std::vector<std::string>()> status_;
  std::function<double()> elapsed_;
  size_t drawn_lines_ = 0;
};

}  // namespace deloco::run
