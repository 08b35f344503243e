// src/run/summary.h — the results of `deloco run`: how long learners killed by chaos took to come back, the
// summary.json fields the supervisor adds to the syncer's own summary, and the short report on stdout.
//
// Contract: pure bookkeeping and formatting, no I/O except read_syncer_summary(). Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deloco::run {

// {"median", "max", "count"} of `v`, or null when empty.
nlohmann::json median_max(std::vector<double> v);

// Every learner SIGKILLed by chaos, and how long it took to join again (its next "joined" record) and to
// contribute again (its next "push" record). Times are Unix seconds from the records.
class RejoinLog {
 public:
  explicit RejoinLog(int64_t learners);
  void killed(int64_t learner, double t_unix);
  // A "joined" record of `learner` at t: closes its open kill when t is not before it and returns the seconds
  // since that kill; -1 when no kill was open (a first join, or a restart after a crash).
  double joined(int64_t learner, double t);
  // A "push" record of `learner` at t: closes its open kill for the re-contribution time.
  void pushed(int64_t learner, double t);
  nlohmann::json rejoin_seconds() const;        // median_max of the closed rejoin times
  nlohmann::json recontribute_seconds() const;  // median_max of the closed re-contribution times

 private:
  struct Kill {
    int64_t learner;
    double t_unix;
    double rejoin = -1, recontribute = -1;
  };
  std::vector<Kill> kills_;
  std::vector<int64_t> open_join_, open_push_;  // per learner: index into kills_ awaiting a joined / push record
};

// The syncer's own summary file as a JSON object; {} with a warning on stderr when unreadable or not an object,
// {"syncer_summary_missing": true} when absent.
nlohmann::json read_syncer_summary(const std::string& path);

// A sharded syncer's summary from its shards' own summaries (shard 0 first, as read_syncer_summary gives them):
// shard 0's summary with the fields every shard keeps for itself combined over all shards, and each shard's brief
// under "shards". Counters are summed (merges, contributions, bytes, broadcasts sent / superseded / acknowledged,
// transfers measured, state snapshots / downloads / held / dropped requests, grace waits, rejects by reason,
// connections, ...); uptime is the lowest; tokens the highest (every shard counts the same learners' tokens); the
// measured transfer times (upload_seconds, broadcast_seconds: each shard's moving average) the mean over the shards
// that measured one, null when none did; joins (per learner) the most any shard saw. What every shard shares
// (learners, send_window_bytes, goodput: the same learners' busy time) stays shard 0's; what is one shard's own
// (shard, fragments, checkpoint, its evaluation, peak_rss_bytes, parameters) is left to the briefs.
// "syncer_summary_missing" is set when any shard's summary was.
nlohmann::json combine_shard_summaries(const std::vector<nlohmann::json>& shards);

// One learner's pushes, summed over its processes: from the learner_done record of each that wrote one, and from the
// push and push_unsent records of each that did not (a process killed by chaos; `from_records` counts those): due =
// sent + superseded + dropped + unsent_at_end (records/kinds.h: PushUnsent).
struct PushTally {
  int64_t due = 0, sent = 0, superseded = 0, dropped = 0, unsent_at_end = 0, processes = 0, from_records = 0;
  PushTally& operator+=(const PushTally& o) {
    due += o.due, sent += o.sent, superseded += o.superseded, dropped += o.dropped, unsent_at_end += o.unsent_at_end;
    processes += o.processes, from_records += o.from_records;
    return *this;
  }
};
// The run summary's "push_accounting" (docs/runtime.md, "Every push accounted for"): what the learners' schedules
// made due and what became of each push — sent, or not sent (superseded, dropped, at the end) — and of those sent,
// from the syncer's summary (combined over shards): merged, final states merged by the final round (sync.final_round),
// refused (a reject, or its round rolled back; by reason),
// replaced by the same learner's newer push before a merge, waiting at the end, and `unaccounted` = sent − the
// rest (pushes the final syncer process never counted: in flight when it was killed, read by an earlier process of
// a restarted syncer, lost with a connection). Per learner and in all.
nlohmann::json push_accounting(const std::vector<PushTally>& learners, const nlohmann::json& syncer);

// The short final report: results, chaos counts with rejoin times, and where `summary_file` is.
std::string final_report(const nlohmann::json& summary, const std::string& summary_file);
// The closing lines of `deloco run`: how to evaluate, sample and load the final global model of `run_dir` (its
// `latest` checkpoint), as commands with the real paths; `program` is how the user invoked deloco.
std::string use_the_model(const std::string& program, const std::string& run_dir);

}  // namespace deloco::run
