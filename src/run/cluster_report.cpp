// `deloco run`'s status lines and its summary, per shard and for the run (contract in cluster.h).
#include "run/cluster.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <tuple>

#include "deloco/error.h"
#include "records/kinds.h"
#include "records/record.h"
#include "records/summary.h"
#include "util/checkpoint_store.h"
#include "util/clock.h"
#include "util/env.h"

namespace deloco::run {
namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> LocalCluster::status() const {
  StatusInput in;
  in.elapsed = elapsed();
  in.stopping = stopping_;
  in.steps = cfg_.run.train.steps;
  in.slow_learner = cfg_.chaos.enabled ? cfg_.chaos.slow_learner : -1;
  in.syncer = records_.syncer();
  in.shards = S_;
  in.shards_up = 0;
  in.syncer_state = ProcessState{true, false, true};
  for (size_t k = 0; k < syncers_.size(); ++k) {
    const Child& c = syncers_[k];
    const Child* b = standbys_.empty() ? nullptr : &standbys_[k];
    const bool up = c.pid != 0 || (b && b->pid != 0);  // a standby pair: up while either of the two runs
    in.shards_up += up ? 1 : 0;
    in.syncer_state.running = in.syncer_state.running && up;
    in.syncer_state.sigstopped = in.syncer_state.sigstopped || c.stopped;
    in.syncer_state.done = in.syncer_state.done && (c.done || (b && b->done));
  }
  in.learners = records_.learners();
  for (const Child& c : learners_) in.learner_states.push_back(ProcessState{c.pid != 0, c.stopped, c.done});
  return status_lines(in);
}

// A sharded syncer's summary: the shards' own, combined (run/summary.h: combine_shard_summaries), each shard's
// under "shards". The validation loss is the caller's: shard 0's last evaluation read the other shards'
// checkpoints as they were then, so `deloco run` evaluates the assembled final model instead (cmd_run.cpp).
json LocalCluster::sharded_summary() const {
  std::vector<json> shards;
  for (int64_t k = 0; k < S_; ++k) shards.push_back(shard_summary(k));
  return combine_shard_summaries(shards);
}

// Shard k's syncer summary; a standby pair's: that of the syncer that led at the end (the newer epoch).
json LocalCluster::shard_summary(int64_t k) const {
  json primary = read_syncer_summary((shard_dir(k) / "syncer-summary.json").string());
  if (standbys_.empty()) return primary;
  const fs::path other = standby_dir(k) / "syncer-summary.json";
  if (!fs::exists(other)) return primary;
  json standby = read_syncer_summary(other.string());
  const auto led = [](const json& s) {
    const json p = s.value("pair", json::object());
    return std::make_pair(p.value("role", "") == "leader", p.value("epoch", int64_t{0}));
  };
  return led(standby) > led(primary) ? standby : primary;
}

// The syncer's summary (kept whole, as it wrote it) with the run's own fields.
json LocalCluster::make_summary() {
  rec::RunSummary s;
  s.extra = S_ == 1 ? shard_summary(0) : sharded_summary();
  s.wall_seconds = elapsed();
  json& x = s.extra;
  x["learners"] = M_;
  x["run_dir"] = dir_.string();
  x["endpoint"] = dial_addr_;
  if (!testbed_addrs_.empty()) {
    // Where each learner's ranks ran: per learner, the host of each rank (rank 0 first).
    json placement = json::array();
    for (int64_t n = 0; n < M_; ++n) {
      json ranks = json::array();
      for (int64_t r = 0; r < std::max<int64_t>(1, cfg_.learner.ranks); ++r) ranks.push_back(learner_host(n, r));
      placement.push_back(ranks);
    }
    x["testbed"] = {{"name", cfg_.testbed.name}, {"hosts", testbed_addrs_}, {"learner_hosts", placement},
                    {"uid", run_as_.drop ? run_as_.uid : ::geteuid()}};
  }
  if (!net_chaos_.faults().empty()) {
    json faults = json::array();
    for (size_t i = 0; i < net_chaos_.faults().size(); ++i) {
      const NetFault& f = net_chaos_.faults()[i];
      json j = {{"fault", net_fault_name(f.kind)}, {"host", f.host}, {"at", f.at}, {"for", f.duration},
                {"started", net_chaos_.started(i)}, {"ended", net_chaos_.ended(i)}, {"text", f.text}};
      if (f.kind == NetFaultKind::kFlap) j["period"] = f.period;
      for (const NetAction& a : net_chaos_.plan())
        if (a.fault == i && a.phase == "start" && a.op == NetAction::kShape) j["rate"] = a.rate;
      faults.push_back(j);
    }
    x["net_faults"] = faults;
  }
  if (std::any_of(precision_.begin(), precision_.end(), [](const json& p) { return !p.is_null(); }))
    x["learner_precision"] = precision_;  // per learner: what it trained in (train.precision = auto: and why)
  x["plaintext"] = cfg_.net.plaintext;
  x["learner_kills"] = learner_kills_;
  x["learner_stops"] = learner_stops_;
  x["syncer_kills"] = syncer_kills_;
  x["rejoin_seconds"] = rejoins_.rejoin_seconds();
  x["recontribute_seconds"] = rejoins_.recontribute_seconds();
  json restarts = json::object();
  for (Child* c : all()) restarts[c->name] = std::max(0, c->starts - 1);
  x["syncer_shards"] = S_;
  x["restarts"] = restarts;
  if (forced_syncer_stop_) x["syncer_forced_stop"] = true;
  std::vector<PushTally> tallies;
  for (const LearnerView& v : records_.learners()) tallies.push_back(v.pushes);
  x["push_accounting"] = push_accounting(tallies, x);
  return s.to_json();
}

}  // namespace deloco::run
