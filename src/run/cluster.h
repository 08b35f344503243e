// src/run/cluster.h — `deloco run` as a library call (DESIGN.md §1, §4): one `deloco syncer` (or S shards) and M `deloco learner`
// child processes of this same executable on this machine, over the real transport, with a live view, chaos
// (chaos.h), restarts (supervisor.h) and a summary (summary.h).
//
//   * Run folder (`dir`): config.json (written by the caller), keys/ (CURVE, unless net.plaintext), logs/<process>.log
//     (stdout+stderr of every incarnation), syncer.jsonl, learner-N.jsonl, checkpoints/, syncer-summary.json (the
//     syncer's own); run() returns the syncer's fields plus wall time, chaos counts and rejoin times.
//   * Endpoint: ipc://DIR/syncer.sock, unless the config names another net.address than the default (then that
//     address is used as is, with a wildcard host dialled as 127.0.0.1), or the socket path is too long for ipc
//     (then a free tcp port on 127.0.0.1).
//   * Children: each in its own process group, stopped with the signal that stopped the run (SIGTERM when the run
//     ended by itself), waited for up to 20 s, then SIGKILLed. Every child runs one intra-op thread (learners: one
//     per core) and gets the run's --config and --set arguments plus sync.learners=M and its own endpoint, keys
//     and id.
//   * Learner groups (learner.ranks = R > 1): learner N is R processes, learner-N (rank 0, the one that talks to the
//     syncer) and learner-N.rank-r, started together with a fresh group port each time. Any of them exiting
//     without finishing takes the whole group down (the others are SIGKILLed) and the group restarts as one; chaos
//     kills a random rank of a random learner. Rank 0's record (exit, crash loop, status) stands for the group.
//   * A sharded syncer (syncer.shards = S > 1): S processes syncer.shard-s (`deloco syncer --shard s`), each with its
//     own run folder RUN/shard-s (syncer.jsonl, checkpoints/, syncer-summary.json) and endpoint (ipc RUN/syncer-s.sock
//     or the addresses net.address lists or derives); learners get every endpoint, comma-separated. Chaos kills the
//     shards in turn; each resumes from its own folder. The live view and the summary sum the shards (summary
//     "shards": each shard's own figures); cmd_run.cpp assembles and evaluates the global model afterwards.
//   * Failures: a child that exits non-zero without having been killed by chaos is restarted after 1 s; a crash
//     loop (supervisor.h) ends run() with RunError carrying that process's log tail. A learner (rank 0,
//     `deloco learner` or a learner command alike) that exits 0 has finished only when the last learner_done record
//     its incarnation wrote to learner-N.jsonl does not say "finished": false; one that exits 0 without such a record
//     (it never joined, or stopped early) is a failure like any other: said so ("learner-N exited 0 before
//     finishing (...)"), restarted, and counted by the crash-loop policy. A syncer still up
//     120 s after the last learner finished is stopped (summary: "syncer_forced_stop").
//   * On a testbed (testbed.name, docs/testbed.md): the hosts are read from /run/<name>.testbed (written by
//     scripts/testbed.sh up; RunError saying how to make it when absent, or with fewer than 2 hosts). Every syncer
//     shard runs in host 0's network namespace and binds tcp://<host 0>:testbed.port + s; rank r of learner n (of R
//     ranks) runs in host 1 + (n·R + r) mod (hosts − 1) (testbed_host_of, net_chaos.h: a host of its own when the
//     testbed has 1 + M·R hosts or more; a note on stderr when it has fewer and ranks share hosts) and dials those.
//     A learner group's store is at rank 0's host's testbed address (--master-addr), and its ranks get
//     GLOO_SOCKET_IFNAME=eth0, so the all-reduce crosses the testbed's links. The syncer's metrics endpoint and
//     dashboard listen on host 0's address (this machine reaches it over the testbed's bridge). The summary's
//     "testbed" names the hosts, each learner's ranks' hosts ("learner_hosts") and the uid the hosts' processes ran
//     as ("uid").
//   * Rights on a testbed (testbed_access.h, testbed_run_as): run as root, `deloco run` starts the processes inside
//     the hosts as the invoking user when one is known (TestbedAccess::user, --testbed-user; else SUDO_UID and
//     SUDO_GID), with that user's groups, HOME, USER and LOGNAME: each child joins its host's namespace as root, then
//     drops root (RunAs, supervisor.h) before exec. The run folder (new or empty when the run began) and all
//     prepare() made in it (config.json, keys/, logs/, shard and standby folders) are handed to that user first
//     (lchown, symlinks not followed; RunError for a run folder of a third user, or a file in it with other hard
//     links). When no user is known, root keeps root and prepare() says so once on stderr. The testbed script
//     (below) and everything off the hosts keep this process's rights.
//   * Network faults (chaos.net with chaos.enabled, net_chaos.h): scheduled from the run's start and carried out
//     with the testbed's own scripts/testbed.sh (`link H down|up`, `shape H RATE`), run with this process's rights:
//     TestbedAccess::script (--testbed-script), else the state file's script=, else the source tree's that this
//     executable was built from, and only when no one but root (or this user) could change it or a folder above it
//     (resolve_testbed_script, testbed_access.h; else prepare() throws RunError naming the problem). Never one found
//     from the working directory. Its output goes to logs/testbed.log. Each action writes a net_fault record (and a chaos line) to events.jsonl. Every fault still
//     on when the run ends (finished, interrupted, failed) is healed before run() returns or throws: link up, the
//     host's own rate (rate<h>= of the state file as it was at prepare()). The summary lists the faults
//     ("net_faults").
//   * Thread: run() blocks the calling thread; the object is not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deloco/runtime.h"
#include "records/record.h"
#include "run/chaos.h"
#include "run/live_view.h"
#include "run/net_chaos.h"
#include "run/summary.h"
#include "run/supervisor.h"
#include "run/testbed_access.h"
#include "util/stop_signals.h"

namespace deloco::run {

// How the children get their configuration: the same --config file and --set overrides as the run.
struct ChildConfig {
  std::string config_path;        // "" : none
  std::vector<std::string> sets;  // "section.key=value"
  // Learners that are a program of the user's instead of `deloco learner` (`deloco run --learner-command N=CMD`,
  // e.g. a PyTorch script using the Python module). Each is started as `/bin/sh -c 'exec CMD'` (so CMD is one
  // program and its arguments, and the pid is the program's: chaos and the final stop signal reach it), in the
  // run's working directory, with the environment the Python module and deloco/embed.h read: DELOCO_CONFIG =
  // RUN/config.json, DELOCO_SET (sync.learners=M), DELOCO_LEARNER_ID, DELOCO_SYNCER, DELOCO_SECRET_KEY and
  // DELOCO_SERVER_KEY (unless plaintext), DELOCO_OUT = RUN; PYTHONPATH gets the build's python/ folder first
  // when there is one beside the executable. Restarted, killed by chaos and summarised like any learner.
  std::map<int64_t, std::string> learner_commands;
};

class LocalCluster {
 public:
  // `cfg` must outlive the object; `learners` = M ≥ 1; `dir` new or empty; `access`: on a testbed, the script to run
  // and the user to run the hosts' processes as (testbed_access.h; unused off a testbed).
  LocalCluster(const RuntimeConfig& cfg, ChildConfig children, int64_t learners, std::filesystem::path dir,
               TestbedAccess access = {});
  LocalCluster(const LocalCluster&) = delete;  // callbacks hold `this`
  LocalCluster& operator=(const LocalCluster&) = delete;
  // Creates logs/ (and keys/ unless plaintext), chooses the endpoint and the children's arguments.
  void prepare();
  // Runs until every process finished, `stop` is requested (its first signal is forwarded to the children and
  // reported as "interrupted": strsignal) or a crash loop (throws). Returns the summary.
  nlohmann::json run(const StopSignals& stop);

 private:
  double elapsed() const;
  void make_keys();
  // Gives the run folder and everything in it to run_as_ (see "Rights on a testbed" above).
  void hand_over_run_folder();
  std::vector<std::string> argv_of(const Child& c) const;
  std::vector<std::string> learner_command_environment(int64_t learner) const;
  bool has_checkpoint(int64_t shard) const;
  // Shard s's run folder: the run folder itself when unsharded, else RUN/shard-s.
  std::filesystem::path shard_dir(int64_t s) const;
  bool any_syncer_running() const;
  void start(Child& c);
  void reap();
  bool all_learners_done() const;
  bool any_learner_finished() const;
  bool learners_still_training() const;
  bool finished() const;
  std::vector<Child*> all();
  std::vector<Child*> everyone();  // all() plus the other ranks of learner groups
  void stop_group(int64_t learner);  // SIGKILLs and reaps the ranks > 0 of a learner
  void restarts_and_continues();
  void chaos();
  Child* pick_learner();
  // Network faults (chaos.net): the due actions, and at the end the heal of every fault still on.
  void net_chaos();
  void heal_network();
  void do_net_action(const NetAction& a, bool at_exit);
  // Runs scripts/testbed.sh with `args` for this run's testbed; "" when it succeeded, else what went wrong.
  std::string testbed_command(const std::vector<std::string>& args);
  void poll_records();
  // Reads learner n's new records (live view, and whether its current incarnation finished).
  void poll_learner(size_t n);
  // Why learner n's incarnation that just exited 0 has not finished ("" when it has: its learner_done said so).
  std::string unfinished_reason(size_t n);
  // A notable thing `deloco run` itself did or saw (chaos, a restart, an exit): printed in the live view and
  // appended to RUN/events.jsonl ({"kind":"chaos","what":...,"t":...}) for `deloco report`.
  void note(const std::string& what);
  std::vector<std::string> status() const;
  nlohmann::json make_summary();
  nlohmann::json sharded_summary() const;
  nlohmann::json shard_summary(int64_t k) const;

  static constexpr double kSyncerGrace = 120.0;        // seconds the syncer may take after the last learner
  static constexpr double kStopWait = 20.0;            // seconds children get to exit after SIGINT/SIGTERM
  static constexpr double kFailureRestartDelay = 1.0;  // seconds before a crashed process is started again

  const RuntimeConfig& cfg_;
  const ChildConfig children_;
  const TestbedAccess access_;
  RunAs run_as_;  // on a testbed: whom the hosts' processes run as (drop = false: this process's user)
  const int64_t M_;
  const std::filesystem::path dir_;
  const bool tty_;  // stderr is a terminal
  const int64_t S_;                 // syncer.shards
  std::vector<std::string> testbed_addrs_;  // per testbed host (empty: not on a testbed)
  std::vector<std::string> testbed_rates_;  // per testbed host: its link's own rate (rate<h>=, "none": unshaped)
  std::string testbed_script_;              // scripts/testbed.sh of the testbed ("" : no network faults)
  NetChaosSchedule net_chaos_;
  // The network namespace a child runs in ("" : this machine's own).
  std::string netns_of(const Child& c) const;
  // On a testbed: the host of rank r of learner n (testbed_host_of, net_chaos.h).
  int64_t learner_host(int64_t learner, int64_t rank) const;
  std::vector<std::string> bind_addrs_;  // per shard
  std::string dial_addr_;                // every shard's endpoint, comma-separated
  std::vector<std::string> base_args_;
  std::vector<Child> syncers_;  // one per shard
  // syncer.standby: the second syncer of each shard's pair (its run folder shard_dir(s)/standby), the pair's
  // endpoints (which of the two leads each shard: RunRecords::shard(s).leader, from the takeover records; chaos kills
  // the leader, and the other takes over).
  std::vector<Child> standbys_;
  std::vector<std::string> standby_addrs_;
  // The epoch of each shard's leader when chaos last killed it: the next kill of that shard waits for a takeover
  // (a newer epoch in the records) and for the new leader's standby to follow it (SyncerView::replica_ready).
  std::vector<int64_t> killed_epoch_;
  bool kill_wait_noted_ = false;
  std::filesystem::path standby_dir(int64_t s) const { return shard_dir(s) / "standby"; }
  std::vector<Child> learners_;
  std::vector<std::vector<Child>> followers_;  // per learner: ranks 1..R-1 of its group (empty when R = 1)
  std::vector<int> group_port_;                // per learner: the group store port of its current incarnation
  std::chrono::steady_clock::time_point t0_;
  ChaosSchedule chaos_;
  int64_t learner_kills_ = 0, learner_stops_ = 0, syncer_kills_ = 0;
  RejoinLog rejoins_;
  LiveView view_;
  RunRecords records_;
  std::vector<rec::RecordTailer> syncer_tails_;  // per shard
  std::vector<rec::RecordTailer> standby_tails_;  // per shard (syncer.standby)
  std::vector<rec::RecordTailer> tailers_;
  // Per learner, about its current incarnation: its last learner_done record said "finished" (-1: none yet, 0: it
  // said false, 1: it did), and the learner's joins before it started.
  std::vector<int> done_record_;
  std::vector<nlohmann::json> precision_;  // per learner: the compute precision its last learner_done reported (null: none)
  std::vector<int> joins_at_start_;
  double next_status_ = 2.0;
  double learners_done_at_ = 0;
  bool forced_syncer_stop_ = false;
  bool stopping_ = false;  // the run is over: processes not running are "stopped", not DOWN
};

}  // namespace deloco::run
