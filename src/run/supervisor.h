// src/run/supervisor.h — the child processes of `deloco run`: starting this same executable as a child, collecting
// its exit, telling a crash loop from a single crash, and stopping every child at the end.
//
// Contract
//  * spawn_self() starts /proc/self/exe in its own process group (Ctrl-C at the terminal reaches only the
//    supervisor, which forwards it), with PR_SET_PDEATHSIG = SIGKILL so no child outlives the supervisor, stdin
//    from /dev/null and stdout+stderr appended to a log file. Throws IoError when the log cannot be opened and
//    RunError (deloco/error.h) when fork fails.
//  * Children are tracked in Child records owned by the caller; the functions here only update the record they
//    are given. Not thread-safe: one supervising thread.
//  * The crash-loop policy (record_failure): three unexpected exits of one process within 10 s, or five within
//    120 s (a slower loop), end the run.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <iosfwd>
#include <string>
#include <vector>

namespace deloco::run {

// One supervised process: the syncer or learner N, across its incarnations.
struct Child {
  std::string name;             // "syncer" | "syncer.shard-S" | "learner-N" | "learner-N.rank-R"
  int64_t learner = -1;         // -1: the syncer
  int64_t shard = 0;            // the syncer's shard (syncer.shards > 1)
  bool standby = false;         // the second syncer of its shard's standby pair (syncer.standby)
  int64_t rank = 0;             // rank in the learner's group (learner.ranks > 1); ranks > 0 follow rank 0's Child
  pid_t pid = 0;                // 0 while not running
  bool stopped = false;         // SIGSTOPped by chaos
  bool done = false;            // exited 0
  bool chaos_killed = false;    // the running incarnation was SIGKILLed by chaos
  double restart_at = -1;       // seconds since start at which to start it again (-1: none due)
  double cont_at = -1;          // seconds since start at which to SIGCONT it
  int starts = 0;
  std::deque<double> failures;  // times of recent unexpected exits
  std::string last_exit;        // "exit status 3", "signal Segmentation fault"
};

// Whom a child runs as (spawn_program's run_as). drop = false: this process's own user, untouched. drop = true: in
// the child, after it joined its network namespace and before exec, setgroups(groups), setgid(gid) and setuid(uid)
// in that order, each checked, then a check that root cannot be regained (setuid(0) must fail), and
// PR_SET_PDEATHSIG set again (a change of user clears it); a child where any step fails writes which to its log and
// exits 126. Only root can drop; the caller's environment for the child is its own business (HOME, USER, ...).
struct RunAs {
  bool drop = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, the primary one included (empty: none)
  std::string name;           // the user's name ("" : not in the user database)
  std::string home;           // the user's home folder ("" : unknown)
};

// The environment of a child: ours without the DELOCO_* address/key/id fallbacks and torchrun's RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT (the command line says everything), plus `extra` ("NAME=value", replacing any variable of that name).
std::vector<std::string> child_environment(const std::vector<std::string>& extra);

// Starts /proc/self/exe with `argv` (argv[0] is only a name) and `env` as described above; returns its pid.
// netns: "" runs it on this machine's network; else the name of a network namespace (`ip netns`, /run/netns/NAME)
// it joins before exec (RunError naming it when it cannot be opened; a child that cannot join exits 126).
// run_as: whom the child runs as (RunAs above; the default keeps this process's user).
pid_t spawn_self(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log,
                 const std::string& netns = "", const RunAs& run_as = {});
// The same for another program (a path, e.g. "/bin/sh").
pid_t spawn_program(const std::string& program, const std::vector<std::string>& argv,
                    const std::vector<std::string>& env, const std::string& log, const std::string& netns = "",
                    const RunAs& run_as = {});

// If `c` is running and has exited, reaps it: pid = 0, stopped = false, last_exit set, done = true when it exited
// with status 0. Returns whether it exited. Never blocks.
bool collect_exit(Child& c);

// Records an unexpected exit of `c` at `now` (seconds) in c.failures. Returns "" while within the policy above,
// else what was exceeded: "3 times within 10 s" or "5 times within 120 s".
std::string record_failure(Child& c, double now);

// The last `lines` lines of a text file, each indented by four spaces ("" when unreadable).
std::string tail_of(const std::string& path, size_t lines);

// Sends `sig` to every running child in `children` (and SIGCONT to a SIGSTOPped one), waits up to `wait_seconds`
// for them to exit, then SIGKILLs and reaps the rest. Says what it does on `log`. Leaves every pid at 0.
void stop_children(const std::vector<Child*>& children, int sig, double wait_seconds, std::ostream& log);

}  // namespace deloco::run
