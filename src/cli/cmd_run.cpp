// `deloco run`: the main job on one machine (DESIGN.md §1, §4). An orchestrator that starts one `deloco syncer`
// and M `deloco learner` child processes of this same binary over the real transport, shows a live view built from
// their JSONL records, injects chaos (SIGKILL / SIGSTOP learners, kill -9 the syncer) and writes a summary.
//
//   * Run folder RUN (syncer.out_dir or runs/<config>-<time>): config.json, keys/ (CURVE, unless net.plaintext),
//     logs/<process>.log (stdout+stderr of every incarnation), syncer.jsonl, learner-N.jsonl, checkpoints/,
//     syncer-summary.json (the syncer's own), summary.json (the syncer's fields plus wall time, chaos, rejoin times).
//   * Endpoint: ipc://RUN/syncer.sock, unless the config names another net.address than the default (then that
//     address is used as is), or the socket path is too long for ipc (then a free tcp port on 127.0.0.1).
//   * Children: each in its own process group (Ctrl-C reaches only the orchestrator, which forwards SIGINT/SIGTERM
//     to every child, waits a bounded time, then SIGKILLs) and with PR_SET_PDEATHSIG so none outlives it.
//     Learners run one intra-op thread each (one learner per core).
//   * Failures: a child that exits non-zero without having been killed by chaos is restarted after 1 s; three such
//     failures of one process within 10 s (or five within 120 s: a slower crash loop) stop the run with exit
//     status 1 and that process's log tail.
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common.h"
#include "commands.h"
#include "deloco/clock.h"
#include "deloco/config.h"
#include "deloco/fs.h"
#include "deloco/runtime.h"
#include "deloco/stop_signals.h"
#include "deloco/transport.h"

extern char** environ;

namespace deloco::cli {
namespace fs = std::filesystem;
using nlohmann::json;
namespace {

// ---- small helpers -------------------------------------------------------------------------------------------

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

// The last `lines` lines of a file ("" when unreadable).
std::string tail_of(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(line);
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += "    " + l + "\n";
  return out;
}

// A free TCP port on 127.0.0.1 (the kernel's choice; released again before the syncer binds it).
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("cannot create a socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("cannot find a free port on 127.0.0.1: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Where the syncer binds and the learners dial. See the file comment.
std::pair<std::string, std::string> choose_endpoints(const NetOptions& net, const fs::path& dir) {
  if (net.address != NetOptions{}.address) {
    std::string dial = net.address;
    for (const char* any : {"tcp://*:", "tcp://0.0.0.0:"})
      if (dial.rfind(any, 0) == 0) dial = "tcp://127.0.0.1:" + dial.substr(std::strlen(any));
    return {net.address, dial};
  }
  const std::string sock = (fs::absolute(dir) / "syncer.sock").lexically_normal().string();
  if (sock.size() < 100) return {"ipc://" + sock, "ipc://" + sock};  // sun_path holds 107 bytes
  const std::string tcp = "tcp://127.0.0.1:" + std::to_string(free_loopback_port());
  return {tcp, tcp};
}

// ---- child processes ---------------------------------------------------------------------------------------

// The environment of a child: ours without the DELOCO_* address/key fallbacks (the command line says everything),
// plus `extra` ("NAME=value").
std::vector<std::string> child_environment(const std::vector<std::string>& extra) {
  static const char* kDrop[] = {"DELOCO_SYNCER", "DELOCO_BIND", "DELOCO_SECRET_KEY", "DELOCO_SERVER_KEY", "DELOCO_ALLOW",
                                "DELOCO_LEARNER_ID"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    bool drop = std::find(std::begin(kDrop), std::end(kDrop), name) != std::end(kDrop);
    for (const auto& x : extra) drop = drop || x.substr(0, x.find('=')) == name;
    if (!drop) env.push_back(kv);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Starts /proc/self/exe with `argv` and `env` in a new process group, stdout and stderr appended to `log`.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log) {
  std::vector<char*> av, ev;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  for (const auto& e : env) ev.push_back(const_cast<char*>(e.c_str()));
  ev.push_back(nullptr);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("cannot open log file '" + log + "': " + std::strerror(errno));
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    if (null_fd >= 0) ::close(null_fd);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {  // child: async-signal-safe calls only
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve("/proc/self/exe", av.data(), ev.data());
    static const char msg[] = "deloco run: exec of /proc/self/exe failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so signals to the group work at once
  ::close(fd);
  if (null_fd >= 0) ::close(null_fd);
  return pid;
}

// One supervised process: the syncer or learner N, across its incarnations.
struct Proc {
  std::string name;            // "syncer" | "learner-N"
  int64_t learner = -1;        // -1: the syncer
  pid_t pid = 0;               // 0 while not running
  bool stopped = false;        // SIGSTOPped by chaos
  bool done = false;           // exited 0
  bool chaos_killed = false;   // the running incarnation was SIGKILLed by chaos
  double restart_at = -1;      // seconds since start at which to start it again (-1: none due)
  double cont_at = -1;         // seconds since start at which to SIGCONT it
  int starts = 0;
  std::deque<double> failures;  // times of recent unexpected exits
  std::string last_exit;       // "exit 3", "signal 11"
};

// ---- tailing the JSONL records -------------------------------------------------------------------------------

// Reads the complete new lines of a file that another process appends to (it may not exist yet).
class Tailer {
 public:
  explicit Tailer(std::string path) : path_(std::move(path)) {}
  template <class F>
  void poll(F&& on_line) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::pread(fd, buf, sizeof(buf), offset_);
      if (n <= 0) break;
      offset_ += n;
      partial_.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    size_t start = 0, nl;
    while ((nl = partial_.find('\n', start)) != std::string::npos) {
      on_line(partial_.substr(start, nl - start));
      start = nl + 1;
    }
    partial_.erase(0, start);
  }

 private:
  std::string path_;
  off_t offset_ = 0;
  std::string partial_;  // an incomplete last line, kept until its newline arrives
};

struct LearnerView {
  int64_t step = -1;
  double loss = NAN;
  bool finished = false;  // a learner_done record was seen
  int joins = 0;
};

struct SyncerView {
  int64_t merges = 0;
  int64_t quorum = -1;
  double val_loss = NAN, val_bpb = NAN;
  double uptime = NAN;
  int64_t rejected = 0;
  int starts = 0;
};

// A learner SIGKILLed by chaos, and how long it took to join again and to push again.
struct Kill {
  int64_t learner;
  double t_unix;
  double rejoin = -1, recontribute = -1;
};

json median_max(std::vector<double> v) {
  if (v.empty()) return nullptr;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return json{{"median", med}, {"max", v.back()}, {"count", n}};
}

// The next merge-count milestone after `m`: 10, 20, 50, 100, 200, 500, ...
int64_t next_milestone(int64_t m) {
  for (int64_t base = 10;; base *= 10)
    for (int64_t k : {1, 2, 5})
      if (k * base > m) return k * base;
}

// ---- the orchestrator ------------------------------------------------------------------------------------------

struct RunArgs {
  CommonOptions common;
};

class Orchestrator {
 public:
  Orchestrator(const RuntimeConfig& cfg, const CommonOptions& common, int64_t learners, fs::path dir)
      : cfg_(cfg), common_(common), M_(learners), dir_(std::move(dir)), rng_(static_cast<uint64_t>(cfg.chaos.seed)) {
    tty_ = ::isatty(STDERR_FILENO) == 1;
    syncer_.name = "syncer";
    for (int64_t n = 0; n < M_; ++n) {
      Proc p;
      p.name = "learner-" + std::to_string(n);
      p.learner = n;
      learners_.push_back(p);
      tailers_.emplace_back((dir_ / ("learner-" + std::to_string(n) + ".jsonl")).string());
    }
    views_.resize(static_cast<size_t>(M_));
    open_join_.assign(static_cast<size_t>(M_), -1);
    open_push_.assign(static_cast<size_t>(M_), -1);
  }

  // Keys, endpoint and the argument lists of the children.
  void prepare() {
    fs::create_directories(dir_ / "logs");
    std::tie(bind_addr_, dial_addr_) = choose_endpoints(cfg_.net, dir_);
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    base_args_ = {ec ? std::string("deloco") : self.string()};  // argv[0] only; exec always uses /proc/self/exe
    if (!common_.config_path.empty()) base_args_.insert(base_args_.end(), {"--config", common_.config_path});
    for (const auto& s : common_.sets) base_args_.insert(base_args_.end(), {"--set", s});
    add_set(base_args_, "sync.learners=" + std::to_string(M_));
    if (!cfg_.net.plaintext) make_keys();
  }

  json run() {
    const StopSignals& stop = install_stop_signals();
    t0_ = std::chrono::steady_clock::now();
    start(syncer_);
    for (auto& p : learners_) start(p);
    schedule_chaos();
    std::string fatal;
    while (!stop.requested.load()) {
      try {
        reap();
        if (finished()) break;
        restarts_and_continues();
        if (cfg_.chaos.enabled) chaos();
      } catch (const std::exception& e) {  // a process failing too often, or one that cannot be started
        fatal = e.what();
        break;
      }
      poll_records();
      if (elapsed() >= next_status_) {
        draw_status();
        next_status_ = elapsed() + (tty_ ? 2.0 : 5.0);
      }
      if (all_learners_done() && syncer_.pid != 0 && elapsed() - learners_done_at_ > kSyncerGrace) {
        event("the syncer did not exit " + fixed(kSyncerGrace, 0) + " s after the last learner finished: stopping it");
        forced_syncer_stop_ = true;
        break;
      }
      ::usleep(100 * 1000);
    }
    const int sig = stop.first.load();
    stopping_ = true;
    shutdown(sig != 0 ? sig : SIGTERM);
    poll_records();
    draw_status();  // the final state stays on screen
    restore_stop_signals();
    if (!fatal.empty()) throw std::runtime_error(fatal);
    json summary = make_summary();
    if (sig != 0) summary["interrupted"] = strsignal(sig);
    return summary;
  }

 private:
  static constexpr double kSyncerGrace = 120.0;  // seconds the syncer may take to finish after the last learner
  static constexpr double kStopWait = 20.0;      // seconds children get to exit after SIGINT/SIGTERM
  static constexpr double kFailureRestartDelay = 1.0;  // seconds before a crashed process is started again

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

  static void add_set(std::vector<std::string>& args, const std::string& kv) {
    args.insert(args.end(), {"--set", kv});
  }

  void make_keys() {
    const fs::path keys = dir_ / "keys";
    fs::create_directories(keys / "allow");
    write_keypair((keys / "syncer").string(), generate_keypair());
    for (int64_t n = 0; n < M_; ++n) {
      const std::string stem = "learner-" + std::to_string(n);
      write_keypair((keys / stem).string(), generate_keypair());
      fs::copy_file(keys / (stem + ".pub"), keys / "allow" / (stem + ".pub"));
    }
  }

  std::vector<std::string> argv_of(const Proc& p) const {
    std::vector<std::string> a = base_args_;
    const fs::path keys = dir_ / "keys";
    if (p.learner < 0) {
      a.insert(a.begin() + 1, "syncer");
      a.insert(a.end(), {"--bind", bind_addr_, "--out", dir_.string(), "--summary",
                         (dir_ / "syncer-summary.json").string()});
      add_set(a, "train.threads=1");
      if (!cfg_.net.plaintext) {
        add_set(a, "net.secret_key=" + (keys / "syncer.key").string());
        add_set(a, "net.allow=" + (keys / "allow").string());
      }
      if (p.starts > 0 && has_checkpoint()) a.push_back("--resume");
    } else {
      a.insert(a.begin() + 1, "learner");
      a.insert(a.end(), {"--id", std::to_string(p.learner), "--connect", dial_addr_, "--out", dir_.string()});
      add_set(a, "train.threads=1");
      if (cfg_.chaos.enabled && p.learner == cfg_.chaos.slow_learner)
        add_set(a, "learner.slowdown=" + fixed(cfg_.chaos.slow_factor, 6));
      if (!cfg_.net.plaintext) {
        add_set(a, "net.secret_key=" + (keys / (p.name + ".key")).string());
        add_set(a, "net.server_key=" + (keys / "syncer.pub").string());
      }
    }
    return a;
  }

  // Whether the syncer has a checkpoint to --resume from (`deloco syncer` marks it with RUN/latest).
  bool has_checkpoint() const {
    std::error_code ec;
    return fs::exists(dir_ / "latest", ec);
  }

  void start(Proc& p) {
    const std::string log = (dir_ / "logs" / (p.name + ".log")).string();
    const auto argv = argv_of(p);
    {
      std::ofstream l(log, std::ios::app);
      l << "=== deloco run: start #" << p.starts + 1 << " at +" << fixed(elapsed(), 1) << " s:";
      for (size_t i = 1; i < argv.size(); ++i) l << " " << argv[i];
      l << "\n";
    }
    // One thread per process: M learners, one per core, and a syncer that mostly waits.
    p.pid = spawn(argv, child_environment({"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"}), log);
    p.stopped = false;
    p.chaos_killed = false;
    p.restart_at = -1;
    p.cont_at = -1;
    if (p.starts > 0) event((p.learner < 0 ? std::string("restarted the syncer") : "restarted " + p.name) +
                            (p.learner < 0 && argv.back() == "--resume" ? " with --resume" : ""));
    ++p.starts;
  }

  // Collects exited children and decides what happens next. Throws runtime_error for a process failing too often.
  void reap() {
    for (Proc* p : all()) {
      if (p->pid == 0) continue;
      int status = 0;
      const pid_t r = ::waitpid(p->pid, &status, WNOHANG);
      if (r != p->pid) continue;
      p->pid = 0;
      p->stopped = false;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      p->last_exit = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                       : std::string("signal ") + strsignal(WTERMSIG(status));
      if (ok) {
        p->done = true;
        if (p->learner >= 0 && all_learners_done()) learners_done_at_ = elapsed();
        if (p->learner < 0 && !all_learners_done())
          event("the syncer exited 0 while learners still train; waiting for them");
        continue;
      }
      if (p->chaos_killed) {
        p->restart_at = elapsed() + cfg_.chaos.restart_delay;
        continue;
      }
      const double now = elapsed();
      p->failures.push_back(now);
      while (!p->failures.empty() && now - p->failures.front() > 120.0) p->failures.pop_front();
      const auto recent = std::count_if(p->failures.begin(), p->failures.end(), [&](double t) { return now - t <= 10.0; });
      if (recent >= 3 || p->failures.size() >= 5)
        throw std::runtime_error(p->name + " failed " + (recent >= 3 ? "3 times within 10 s" : "5 times within 120 s") +
                                 " (last: " + p->last_exit + "); log " +
                                 (dir_ / "logs" / (p->name + ".log")).string() + " ends with:\n" +
                                 tail_of((dir_ / "logs" / (p->name + ".log")).string(), 20));
      event(p->name + " exited unexpectedly (" + p->last_exit + "); restarting it in " +
            fixed(kFailureRestartDelay, 1) + " s");
      p->restart_at = now + kFailureRestartDelay;
    }
  }

  bool all_learners_done() const {
    return std::all_of(learners_.begin(), learners_.end(), [](const Proc& p) { return p.done; });
  }
  bool any_learner_finished() const {
    for (size_t n = 0; n < learners_.size(); ++n)
      if (learners_[n].done || views_[n].finished) return true;
    return false;
  }
  bool finished() const { return syncer_.done && all_learners_done(); }

  std::vector<Proc*> all() {
    std::vector<Proc*> v{&syncer_};
    for (auto& p : learners_) v.push_back(&p);
    return v;
  }

  void restarts_and_continues() {
    const double now = elapsed();
    for (Proc* p : all()) {
      if (p->pid == 0 && !p->done && p->restart_at >= 0 && now >= p->restart_at) start(*p);
      if (p->pid != 0 && p->stopped && now >= p->cont_at) {
        ::kill(p->pid, SIGCONT);
        p->stopped = false;
        event("chaos: SIGCONT " + p->name);
      }
    }
  }

  // ---- chaos ----
  double exp_delay(double mean) { return std::exponential_distribution<double>(1.0 / mean)(rng_); }

  void schedule_chaos() {
    if (!cfg_.chaos.enabled) return;
    if (cfg_.chaos.kill_interval > 0) next_kill_ = exp_delay(cfg_.chaos.kill_interval);
    if (cfg_.chaos.stop_interval > 0) next_stop_ = exp_delay(cfg_.chaos.stop_interval);
    syncer_kills_at_ = cfg_.chaos.syncer_kill_at;
    std::sort(syncer_kills_at_.begin(), syncer_kills_at_.end());
  }

  // A random learner that runs, is not stopped and is not about to finish (nullptr: none).
  Proc* pick_learner() {
    std::vector<Proc*> c;
    const int64_t steps = cfg_.run.train.steps;
    const int64_t margin = std::max<int64_t>(cfg_.sync.sync_every, steps / 20);
    for (size_t n = 0; n < learners_.size(); ++n) {
      Proc& p = learners_[n];
      if (p.pid == 0 || p.stopped || p.done || views_[n].finished || views_[n].step >= steps - margin) continue;
      c.push_back(&p);
    }
    if (c.empty()) return nullptr;
    return c[std::uniform_int_distribution<size_t>(0, c.size() - 1)(rng_)];
  }

  void chaos() {
    if (syncer_.done) return;  // the end: nobody would be there to rejoin
    const double now = elapsed();
    if (next_kill_ >= 0 && now >= next_kill_) {
      next_kill_ = now + exp_delay(cfg_.chaos.kill_interval);
      if (Proc* p = pick_learner()) {
        ::kill(p->pid, SIGKILL);
        p->chaos_killed = true;
        ++learner_kills_;
        const size_t n = static_cast<size_t>(p->learner);
        open_join_[n] = open_push_[n] = static_cast<int64_t>(kills_.size());
        kills_.push_back(Kill{p->learner, unix_now()});
        event("chaos: SIGKILL " + p->name + " (restart in " + fixed(cfg_.chaos.restart_delay, 1) + " s)");
      }
    }
    if (next_stop_ >= 0 && now >= next_stop_) {
      next_stop_ = now + exp_delay(cfg_.chaos.stop_interval);
      if (Proc* p = pick_learner()) {
        ::kill(p->pid, SIGSTOP);
        p->stopped = true;
        p->cont_at = now + cfg_.chaos.stop_seconds;
        ++learner_stops_;
        event("chaos: SIGSTOP " + p->name + " for " + fixed(cfg_.chaos.stop_seconds, 1) + " s");
      }
    }
    while (next_syncer_kill_ < syncer_kills_at_.size() && now >= syncer_kills_at_[next_syncer_kill_]) {
      const double at = syncer_kills_at_[next_syncer_kill_++];
      if (any_learner_finished()) {
        event("chaos: skipped the syncer kill at " + fixed(at, 0) + " s (a learner already finished)");
      } else if (syncer_.pid == 0) {
        event("chaos: skipped the syncer kill at " + fixed(at, 0) + " s (the syncer is down)");
      } else {
        ::kill(syncer_.pid, SIGKILL);
        syncer_.chaos_killed = true;
        ++syncer_kills_;
        event("chaos: SIGKILL the syncer (restart with --resume in " + fixed(cfg_.chaos.restart_delay, 1) + " s)");
      }
    }
  }

  // ---- records and the live view ----
  void poll_records() {
    syncer_tail_.poll([&](const std::string& line) { on_record(line, -1); });
    for (size_t n = 0; n < tailers_.size(); ++n)
      tailers_[n].poll([&](const std::string& line) { on_record(line, static_cast<int64_t>(n)); });
  }

  void on_record(const std::string& line, int64_t learner) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string()) return;
    try {
      if (learner < 0) on_syncer_record(j);
      else on_learner_record(j, learner);
    } catch (const json::exception&) {
      // A record with an unexpected field type: the live view ignores it.
    }
  }

  void on_syncer_record(const json& j) {
    const std::string kind = j["kind"];
    SyncerView& s = syncer_view_;
    if (kind == "started") {
      ++s.starts;
      if (j.value("resumed", false))
        event("syncer resumed at " + std::to_string(j.value("merges", int64_t{0})) + " merges");
    } else if (kind == "merge") {
      s.merges = j.value("merges", s.merges + 1);
      s.quorum = j.value("quorum", s.quorum);
      if (s.merges >= next_milestone_) {
        event(std::to_string(s.merges) + " merges");
        next_milestone_ = next_milestone(s.merges);
      }
    } else if (kind == "eval") {
      s.val_loss = j.value("val_loss", NAN);
      s.val_bpb = j.value("val_bpb", NAN);
      event("eval: val loss " + fixed(s.val_loss, 4) + " nats/byte, " + fixed(s.val_bpb, 3) + " bits/byte after " +
            std::to_string(j.value("merges", s.merges)) + " merges");
    } else if (kind == "status") {
      s.uptime = j.value("uptime", s.uptime);
      s.rejected = j.value("rejected", s.rejected);
    }
  }

  void on_learner_record(const json& j, int64_t n) {
    const std::string kind = j["kind"];
    LearnerView& v = views_[static_cast<size_t>(n)];
    const double t = j.value("t", unix_now());
    const std::string name = "learner-" + std::to_string(n);
    if (kind == "learner") {
      v.step = j.value("step", v.step);
      v.loss = j.value("loss", v.loss);
    } else if (kind == "joined") {
      ++v.joins;
      int64_t& k = open_join_[static_cast<size_t>(n)];
      if (k >= 0 && t >= kills_[static_cast<size_t>(k)].t_unix) {
        kills_[static_cast<size_t>(k)].rejoin = t - kills_[static_cast<size_t>(k)].t_unix;
        event(name + " rejoined " + fixed(kills_[static_cast<size_t>(k)].rejoin, 1) + " s after its kill, resuming at step " +
              std::to_string(std::max(j.value("step", int64_t{0}), j.value("resume_step", int64_t{0}))));
        k = -1;
      } else if (v.joins > 1) {
        event(name + " rejoined at step " +
              std::to_string(std::max(j.value("step", int64_t{0}), j.value("resume_step", int64_t{0}))));
      }
      v.step = std::max({v.step, j.value("step", v.step), j.value("resume_step", v.step)});
    } else if (kind == "push") {
      int64_t& k = open_push_[static_cast<size_t>(n)];
      if (k >= 0 && t >= kills_[static_cast<size_t>(k)].t_unix) {
        kills_[static_cast<size_t>(k)].recontribute = t - kills_[static_cast<size_t>(k)].t_unix;
        k = -1;
      }
    } else if (kind == "learner_done") {
      v.finished = true;
      v.step = j.value("step", v.step);
      event(name + " finished " + std::to_string(v.step) + " steps");
    } else if (kind == "syncer_lost") {
      event(name + " lost the syncer at step " + std::to_string(j.value("step", int64_t{0})));
    } else if (kind == "rejected") {
      event(name + " was rejected: " + j.value("reason", std::string("?")));
    }
  }

  std::string learner_cell(size_t n) const {
    const Proc& p = learners_[n];
    const LearnerView& v = views_[n];
    std::string state;
    if (p.done) state = "done";
    else if (p.pid == 0) state = stopping_ ? "stopped" : "DOWN";
    else if (p.stopped) state = "STOPPED";
    std::ostringstream o;
    o << "L" << n;
    if (v.step >= 0) o << " " << v.step << "/" << cfg_.run.train.steps << " " << fixed(v.loss, 3);
    else if (state.empty()) o << " starting";
    if (!state.empty()) o << " " << state;
    if (cfg_.chaos.enabled && static_cast<int64_t>(n) == cfg_.chaos.slow_learner) o << " SLOW";
    return o.str();
  }

  std::vector<std::string> status_lines() const {
    const SyncerView& s = syncer_view_;
    std::ostringstream h;
    h << "[" << std::setw(6) << format_duration(elapsed()) << "] syncer "
      << (syncer_.done ? "done" : syncer_.pid == 0 ? (stopping_ ? "stopped" : "DOWN") : "up") << " | merges " << s.merges;
    if (s.quorum >= 0) h << " (last quorum " << s.quorum << ")";
    h << " | val " << fixed(s.val_loss, 4) << " nats, " << fixed(s.val_bpb, 3) << " bpb | uptime "
      << (std::isfinite(s.uptime) ? fixed(100 * s.uptime, 0) + "%" : "-") << " | rejects " << s.rejected;
    std::vector<std::string> lines{h.str()};
    const size_t per_line = 4;
    for (size_t n = 0; n < learners_.size(); n += per_line) {
      std::string l = "  ";
      for (size_t i = n; i < std::min(learners_.size(), n + per_line); ++i)
        l += (i > n ? " | " : "") + learner_cell(i);
      lines.push_back(l);
    }
    return lines;
  }

  size_t terminal_width() const {
    winsize w{};
    if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 10) return w.ws_col;
    return 200;
  }

  void clear_status() {
    if (tty_ && drawn_lines_ > 0) std::cerr << "\033[" << drawn_lines_ << "A\r\033[J";
    drawn_lines_ = 0;
  }

  void draw_status() {
    const auto lines = status_lines();
    if (!tty_) {  // one plain line per update
      std::string all = lines[0];
      for (size_t i = 1; i < lines.size(); ++i) all += " |" + lines[i].substr(1);
      std::cerr << all << "\n";
      return;
    }
    clear_status();
    const size_t width = terminal_width() - 1;
    for (const auto& l : lines) std::cerr << (l.size() > width ? l.substr(0, width) : l) << "\n";
    drawn_lines_ = lines.size();
    std::cerr.flush();
  }

  // One line per event; in a terminal the status block is redrawn below it.
  void event(const std::string& what) {
    const bool redraw = tty_ && drawn_lines_ > 0;
    clear_status();
    std::cerr << "[" << std::setw(6) << format_duration(elapsed()) << "] " << what << "\n";
    if (redraw) draw_status();
  }

  // ---- shutdown and results ----
  void shutdown(int sig) {
    std::vector<Proc*> running;
    for (Proc* p : all())
      if (p->pid != 0) running.push_back(p);
    if (running.empty()) return;
    clear_status();
    std::cerr << "deloco run: sending " << strsignal(sig) << " to " << running.size()
              << " process(es) and waiting up to " << fixed(kStopWait, 0) << " s\n";
    for (Proc* p : running) {
      ::kill(p->pid, sig);
      if (p->stopped) ::kill(p->pid, SIGCONT);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kStopWait);
    while (std::chrono::steady_clock::now() < deadline) {
      bool any = false;
      for (Proc* p : running) {
        if (p->pid == 0) continue;
        int status = 0;
        if (::waitpid(p->pid, &status, WNOHANG) == p->pid) p->pid = 0;
        else any = true;
      }
      if (!any) return;
      ::usleep(50 * 1000);
    }
    for (Proc* p : running) {
      if (p->pid == 0) continue;
      std::cerr << "deloco run: " << p->name << " did not stop in time: SIGKILL\n";
      ::kill(p->pid, SIGKILL);
      ::waitpid(p->pid, nullptr, 0);
      p->pid = 0;
    }
  }

  json make_summary() {
    json s = json::object();
    const fs::path syncer_summary = dir_ / "syncer-summary.json";
    if (fs::exists(syncer_summary)) {
      try {
        s = json::parse(read_file(syncer_summary.string()));
      } catch (const std::exception& e) {
        std::cerr << "deloco run: warning: cannot read " << syncer_summary.string() << ": " << e.what() << "\n";
      }
      if (!s.is_object()) s = json::object();
    } else {
      s["syncer_summary_missing"] = true;
    }
    std::vector<double> rejoin, recontribute;
    for (const Kill& k : kills_) {
      if (k.rejoin >= 0) rejoin.push_back(k.rejoin);
      if (k.recontribute >= 0) recontribute.push_back(k.recontribute);
    }
    s["wall_seconds"] = elapsed();
    s["learners"] = M_;
    s["run_dir"] = dir_.string();
    s["endpoint"] = bind_addr_;
    s["plaintext"] = cfg_.net.plaintext;
    s["learner_kills"] = learner_kills_;
    s["learner_stops"] = learner_stops_;
    s["syncer_kills"] = syncer_kills_;
    s["rejoin_seconds"] = median_max(rejoin);
    s["recontribute_seconds"] = median_max(recontribute);
    json restarts = json::object();
    for (Proc* p : all()) restarts[p->name] = std::max(0, p->starts - 1);
    s["restarts"] = restarts;
    if (forced_syncer_stop_) s["syncer_forced_stop"] = true;
    return s;
  }

  const RuntimeConfig& cfg_;
  const CommonOptions& common_;
  const int64_t M_;
  const fs::path dir_;
  std::mt19937_64 rng_;
  bool tty_ = false;
  std::string bind_addr_, dial_addr_;
  std::vector<std::string> base_args_;
  Proc syncer_;
  std::vector<Proc> learners_;
  std::chrono::steady_clock::time_point t0_;
  // records
  Tailer syncer_tail_{(dir_ / "syncer.jsonl").string()};
  std::vector<Tailer> tailers_;
  std::vector<LearnerView> views_;
  SyncerView syncer_view_;
  int64_t next_milestone_ = 10;
  // live view
  double next_status_ = 2.0;
  size_t drawn_lines_ = 0;
  // chaos
  double next_kill_ = -1, next_stop_ = -1;
  std::vector<double> syncer_kills_at_;
  size_t next_syncer_kill_ = 0;
  int64_t learner_kills_ = 0, learner_stops_ = 0, syncer_kills_ = 0;
  std::vector<Kill> kills_;
  std::vector<int64_t> open_join_, open_push_;  // per learner: index into kills_ awaiting a joined / push record
  double learners_done_at_ = 0;
  bool forced_syncer_stop_ = false;
  bool stopping_ = false;  // the run is over: processes not running are "stopped", not DOWN
};

// The short final report on stdout.
void print_report(const json& s, const std::string& summary_file) {
  auto num = [&](const char* k) { return s.contains(k) && s[k].is_number() ? s[k].get<double>() : NAN; };
  auto count = [&](const char* k) { return s.contains(k) && s[k].is_number() ? std::to_string(s[k].get<int64_t>()) : "-"; };
  auto med_max = [&](const char* k) {
    if (!s.contains(k) || !s[k].is_object()) return std::string("n/a");
    return "median " + fixed(s[k]["median"].get<double>(), 1) + " s, max " + fixed(s[k]["max"].get<double>(), 1) + " s";
  };
  std::cout << "deloco run: " << format_duration(num("wall_seconds")) << ", " << count("learners")
            << " learners: final val loss " << fixed(num("final_val_loss"), 4) << " nats/byte, "
            << fixed(num("val_bpb"), 3) << " bits/byte; " << count("outer_steps") << " fragment merges, "
            << count("contributions_merged") << " contributions merged, " << count("contributions_rejected")
            << " rejected; uptime " << fixed(num("uptime"), 3) << ", goodput " << fixed(num("goodput"), 3) << "\n";
  std::cout << "chaos: " << count("learner_kills") << " learner kills (rejoin " << med_max("rejoin_seconds")
            << "; contributing again " << med_max("recontribute_seconds") << "), " << count("learner_stops")
            << " stops, " << count("syncer_kills") << " syncer kills\n";
  std::cout << "summary: " << summary_file << "\n";
}

void run_run(const RunArgs& args) {
  RuntimeConfig cfg;
  ConfigSchema schema;
  cfg.bind(schema);
  apply_config(schema, args.common);
  cfg.validate();
  const int64_t M = cfg.resolved_learners();
  const bool auto_m = cfg.sync.learners == 0;
  cfg.sync.learners = M;  // resolved once; every child gets --set sync.learners=M
  const std::string dir = new_run_dir(cfg.syncer.out_dir, args.common, "run",
                                      "choose another with --set syncer.out_dir=DIR");
  fs::create_directories(dir);
  write_file_atomic((fs::path(dir) / "config.json").string(), schema.to_json().dump(2) + "\n");

  Orchestrator orch(cfg, args.common, M, dir);
  orch.prepare();
  std::cerr << "deloco run: " << M << " learner" << (M == 1 ? "" : "s") << (auto_m ? " (one per core)" : "")
            << ", K=" << cfg.sync.quorum << ", P=" << cfg.sync.fragments << ", H=" << cfg.sync.sync_every
            << (cfg.sync.grace ? ", grace" : "") << ", merge " << cfg.merge_preset
            << (cfg.merge_method.empty() ? "" : "/" + cfg.merge_method) << ", outer " << cfg.outer.kind
            << (cfg.net.plaintext ? ", plaintext" : ", CURVE") << (cfg.chaos.enabled ? ", chaos on" : "")
            << "\nrun folder: " << dir << " (logs in " << dir << "/logs)\n";
  json summary = orch.run();
  summary["config"] = schema.to_json();
  const std::string summary_file = (fs::path(dir) / "summary.json").string();
  write_file_atomic(summary_file, summary.dump(2) + "\n");
  write_summary(args.common, summary);
  if (summary.contains("interrupted"))
    throw std::runtime_error("interrupted (" + summary["interrupted"].get<std::string>() +
                             "): every process was stopped; partial summary in " + summary_file);
  print_report(summary, summary_file);
  if (summary.contains("syncer_summary_missing"))
    throw std::runtime_error("the syncer wrote no summary; see " + dir + "/logs/syncer.log");
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand(
      "run", "the main job on one machine: a syncer and M learner processes over the real transport, with chaos");
  add_common_options(sub, &args->common);
  sub->callback([args] { run_run(*args); });
}

}  // namespace deloco::cli
