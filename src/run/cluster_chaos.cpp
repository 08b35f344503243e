// `deloco run`'s chaos (contract in cluster.h): learner and syncer kills by the run's progress, restarts, and the
// network faults it schedules on a testbed (chaos.net), healed at the end.
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

void LocalCluster::restarts_and_continues() {
  const double now = elapsed();
  for (Child* c : all()) {
    if (c->pid == 0 && !c->done && c->restart_at >= 0 && now >= c->restart_at) start(*c);
    if (c->pid != 0 && c->stopped && now >= c->cont_at) {
      ::kill(c->pid, SIGCONT);
      c->stopped = false;
      note("chaos: SIGCONT " + c->name);
    }
  }
}

// A random learner that runs, is not stopped and is not about to finish (nullptr: none).
Child* LocalCluster::pick_learner() {
  std::vector<Child*> candidates;
  for (size_t n = 0; n < learners_.size(); ++n) {
    Child& c = learners_[n];
    const LearnerView& v = records_.learners()[n];
    if (c.pid == 0 || c.stopped || c.done || v.finished ||
        !chaos_may_hit(v.step, cfg_.run.train.steps, cfg_.sync.sync_every))
      continue;
    candidates.push_back(&c);
  }
  if (candidates.empty()) return nullptr;
  return candidates[chaos_.pick(candidates.size())];
}

void LocalCluster::chaos() {
  for (const Child& c : syncers_)
    if (c.done) return;  // the end: nobody would be there to rejoin
  const double now = elapsed();
  std::vector<int64_t> steps;  // the progress marks (chaos.*_progress) go by the learners' records
  for (const LearnerView& v : records_.learners()) steps.push_back(v.step);
  chaos_.set_progress(run_progress(steps, cfg_.run.train.steps));
  if (chaos_.learner_kill_due(now)) {
    if (Child* c = pick_learner()) {
      // In a learner group, any of its ranks: the group goes down as one (reap()).
      const size_t k = cfg_.learner.ranks > 1 ? chaos_.pick(static_cast<size_t>(cfg_.learner.ranks)) : 0;
      Child* victim = k == 0 ? c : &followers_[static_cast<size_t>(c->learner)][k - 1];
      if (victim->pid != 0) {
        ::kill(victim->pid, SIGKILL);
        victim->chaos_killed = true;
        c->chaos_killed = true;
        ++learner_kills_;
        rejoins_.killed(c->learner, unix_now());
        note("chaos: SIGKILL " + victim->name + (k > 0 ? " (its group restarts in " : " (restart in ") +
                    fixed(cfg_.chaos.restart_delay, 1) + " s)");
      }
    }
  }
  if (chaos_.learner_stop_due(now)) {
    if (Child* c = pick_learner()) {
      ::kill(c->pid, SIGSTOP);
      c->stopped = true;
      c->cont_at = now + cfg_.chaos.stop_seconds;
      ++learner_stops_;
      note("chaos: SIGSTOP " + c->name + " for " + fixed(cfg_.chaos.stop_seconds, 1) + " s");
    }
  }
  ChaosMark at;
  while (chaos_.syncer_kill_due(now)) {
    // A sharded syncer: the kills go to the shards in turn (shard 0, 1, ..., then 0 again). A standby pair: the
    // kill goes to the syncer that leads (as its records tell), and the other takes over. It waits until the other
    // holds the leader's image and follows it, and (after an earlier kill of that shard) until a takeover: killing
    // the leader before would be a double failure, which a pair survives only by electing a leader from the two
    // syncers' own checkpoints (docs/reliability.md), not the single failure chaos sets out to inject.
    const size_t s = static_cast<size_t>(syncer_kills_ % S_);
    const bool pair = !standbys_.empty();
    if (pair) {
      const SyncerView& v = records_.shard(static_cast<int64_t>(s));
      if (v.epoch <= killed_epoch_[s] || !v.replica_ready()) {
        if (!kill_wait_noted_)
          note("chaos: the kill of syncer shard " + std::to_string(s) + " waits until " +
               (v.epoch <= killed_epoch_[s] ? "the other syncer of the pair takes over" : "its standby follows the leader"));
        kill_wait_noted_ = true;
        break;
      }
    }
    chaos_.next_syncer_kill(now, &at);
    Child& victim = pair && records_.shard(static_cast<int64_t>(s)).leader == "standby" ? standbys_[s] : syncers_[s];
    const std::string who = (S_ == 1 ? std::string("the syncer") : "syncer shard " + std::to_string(victim.shard)) +
                            (pair ? std::string(" (the leader: ") + victim.name + ")" : std::string());
    if (any_learner_finished()) {
      note("chaos: skipped the kill of " + who + " at " + at.text() + " (a learner already finished)");
    } else if (victim.pid == 0) {
      note("chaos: skipped the kill of " + who + " at " + at.text() + " (it is down)");
    } else {
      ::kill(victim.pid, SIGKILL);
      victim.chaos_killed = true;
      ++syncer_kills_;
      if (pair) killed_epoch_[s] = records_.shard(static_cast<int64_t>(s)).epoch;
      kill_wait_noted_ = false;
      note("chaos: SIGKILL " + who + (at.by_progress ? " at " + at.text() : std::string()) +
           (pair ? " (its standby takes over; it restarts as the standby in " : " (restart with --resume in ") +
           fixed(cfg_.chaos.restart_delay, 1) + " s)");
    }
  }
}

void LocalCluster::net_chaos() {
  for (const NetAction& a : net_chaos_.due(elapsed())) do_net_action(a, false);
}

void LocalCluster::heal_network() {
  for (const NetAction& a : net_chaos_.heal()) do_net_action(a, true);
}

void LocalCluster::do_net_action(const NetAction& a, bool at_exit) {
  const NetFault& f = net_chaos_.faults()[a.fault];
  const std::string host = std::to_string(a.host);
  std::vector<int64_t> on_host;  // the learners with a rank on the host
  const int64_t hosts = static_cast<int64_t>(testbed_addrs_.size());
  for (int64_t n = 0; a.host > 0 && n < M_; ++n) {
    const auto h = testbed_hosts_of(n, cfg_.learner.ranks, hosts);
    if (std::find(h.begin(), h.end(), a.host) != h.end()) on_host.push_back(n);
  }
  std::string who = "host " + host;
  if (a.host == 0) who += " (the syncer's)";
  for (size_t i = 0; i < on_host.size(); ++i)
    who += (i == 0 ? " (learner " : ", ") + std::to_string(on_host[i]) + (i + 1 == on_host.size() ? ")" : "");
  std::string action, err;
  if (a.op == NetAction::kShape) {
    action = "rate " + a.rate;
    err = testbed_command({"shape", host, a.rate});
  } else {
    const bool down = a.op == NetAction::kLinkDown;
    action = down ? "link down" : "link up";
    err = testbed_command({"link", host, down ? "down" : "up"});
  }
  rec::NetFault r;
  r.fault = net_fault_name(f.kind);
  r.host = a.host;
  r.learners = on_host;
  r.phase = a.phase;
  r.action = action;
  r.at = a.at;
  r.ok = err.empty();
  if (!err.empty()) r.detail = err;
  else if (at_exit) r.detail = "the run ended during the fault";
  r.t = unix_now();
  try {
    rec::RecordWriter((dir_ / "events.jsonl").string()).write(r);
  } catch (const std::exception&) {  // best effort, as note()
  }
  if (!err.empty()) {
    note("chaos: FAILED to set " + who + "'s " + action + " (" + r.fault + "): " + err);
    return;
  }
  const std::string dur = fixed(f.duration, 0) + " s";
  std::string what;
  if (a.phase == "start") {
    if (f.kind == NetFaultKind::kPartition) what = who + " partitioned: link down for " + dur;
    if (f.kind == NetFaultKind::kFlap) what = who + " link flapping for " + dur + " (down and up every " + fixed(f.period, 1) + " s)";
    if (f.kind == NetFaultKind::kSlow)
      what = who + " link slowed to " + a.rate + " for " + dur + " (its own: " + testbed_rates_[static_cast<size_t>(a.host)] + ")";
  } else if (a.phase == "end") {
    what = who + (f.kind == NetFaultKind::kSlow ? " link back to " + a.rate : std::string(" link up")) + ": the " +
           r.fault + " of " + dur + (at_exit ? " healed as the run ends" : " is over");
  }
  if (!what.empty()) note("chaos: " + what);  // a flapping link's changes between: records only
}

std::string LocalCluster::testbed_command(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"bash", testbed_script_};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log = (dir_ / "logs" / "testbed.log").string();
  pid_t pid = 0;
  try {
    pid = spawn_program("/bin/bash", argv, child_environment({"TESTBED_NAME=" + cfg_.testbed.name}), log);
  } catch (const std::exception& e) {
    return e.what();
  }
  // The script runs a few `ip` and `tc` commands: well under a second. Bounded all the same.
  int status = 0;
  for (int waited_ms = 0;; waited_ms += 5) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return std::string("waitpid: ") + std::strerror(errno);
    if (waited_ms >= 30000) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return "scripts/testbed.sh " + args[0] + " took more than 30 s (killed); see " + log;
    }
    ::usleep(5000);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return "scripts/testbed.sh " + args[0] + " " + args[1] + " failed (" +
         (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status)) : std::string("killed by a signal")) +
         "); see " + log;
}

}  // namespace deloco::run
