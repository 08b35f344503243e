// `deloco run` as a library call (contract in cluster.h): the children, their start, reaping and records. Beside it:
// cluster_chaos.cpp (kills, restarts and the testbed's network faults), cluster_report.cpp (status lines, summary).
#include "run/cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#include "deloco/transport.h"
#include "records/kinds.h"
#include "records/record.h"
#include "records/summary.h"
#include "util/checkpoint_store.h"
#include "util/clock.h"
#include "util/env.h"
#include "util/malloc_tuning.h"

namespace deloco::run {
namespace fs = std::filesystem;
using nlohmann::json;
namespace {

// A free TCP port on 127.0.0.1 (the kernel's choice; released again before the syncer binds it).
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw RunError(std::string("cannot create a socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw RunError(std::string("cannot find a free port on 127.0.0.1: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Where the syncer's shards bind and the learners dial. See cluster.h.
std::pair<std::vector<std::string>, std::string> choose_endpoints(const NetOptions& net, const fs::path& dir,
                                                                  int64_t shards) {
  std::vector<std::string> bind;
  if (net.address != NetOptions{}.address) {
    bind = shard_endpoints(net.address, shards);
  } else {
    const std::string sock = (fs::absolute(dir) / "syncer.sock").lexically_normal().string();
    if (sock.size() + 8 < 100) {  // sun_path holds 107 bytes ("-NNNN" of a shard included)
      bind = shard_endpoints("ipc://" + sock, shards);
    } else {
      for (int64_t s = 0; s < shards; ++s) bind.push_back("tcp://127.0.0.1:" + std::to_string(free_loopback_port()));
    }
  }
  std::string dial;
  for (std::string d : bind) {
    for (const char* any : {"tcp://*:", "tcp://0.0.0.0:"})
      if (d.rfind(any, 0) == 0) d = "tcp://127.0.0.1:" + d.substr(std::strlen(any));
    dial += (dial.empty() ? "" : ",") + d;
  }
  return {bind, dial};
}

void add_set(std::vector<std::string>& args, const std::string& kv) { args.insert(args.end(), {"--set", kv}); }

// What `deloco run` needs of the testbed `name`, from the state file scripts/testbed.sh up writes (hosts=N,
// addr<i>=A, rate<i>=R, script=PATH).
struct TestbedState {
  std::vector<std::string> addrs, rates;
  std::string script;  // "" : not named (a testbed made by an older script)
};

// `hosts`: how many hosts to suggest when the testbed is not up (one per process of the run).
TestbedState read_testbed(const std::string& name, int64_t hosts_wanted) {
  const std::string path = "/run/" + name + ".testbed";
  std::ifstream in(path);
  if (!in)
    throw RunError("testbed '" + name + "' is not up (no " + path + "): make it with `TESTBED_NAME=" + name +
                   " scripts/testbed.sh up --hosts " + std::to_string(hosts_wanted) + " --rate 10mbit` (as root)");
  int64_t hosts = -1;
  std::map<int64_t, std::string> addrs, rates;
  TestbedState st;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("hosts=", 0) == 0) hosts = std::atoll(line.c_str() + 6);
    if (line.rfind("addr", 0) == 0 && line.find('=') != std::string::npos)
      addrs[std::atoll(line.c_str() + 4)] = line.substr(line.find('=') + 1);
    if (line.rfind("rate", 0) == 0 && line.find('=') != std::string::npos)
      rates[std::atoll(line.c_str() + 4)] = line.substr(line.find('=') + 1);
    if (line.rfind("script=", 0) == 0) st.script = line.substr(7);
  }
  for (int64_t h = 0; h < hosts; ++h) {
    auto it = addrs.find(h);
    if (it == addrs.end()) throw RunError(path + " names no address of host " + std::to_string(h) + " (of " + std::to_string(hosts) + ")");
    st.addrs.push_back(it->second);
    auto r = rates.find(h);
    st.rates.push_back(r == rates.end() ? "none" : r->second);
  }
  if (st.addrs.size() < 2)
    throw RunError("testbed '" + name + "' has " + std::to_string(st.addrs.size()) +
                   " host(s): deloco run needs one for the syncer and at least one for the learners");
  return st;
}

}  // namespace

LocalCluster::LocalCluster(const RuntimeConfig& cfg, ChildConfig children, int64_t learners, fs::path dir,
                           TestbedAccess access)
    : cfg_(cfg),
      children_(std::move(children)),
      access_(std::move(access)),
      M_(learners),
      dir_(std::move(dir)),
      tty_(::isatty(STDERR_FILENO) == 1),
      S_(std::max<int64_t>(1, cfg.syncer.shards)),
      chaos_(cfg.chaos),
      rejoins_(learners),
      view_(std::cerr, tty_, [this] { return status(); }, [this] { return elapsed(); }),
      records_(learners, &rejoins_, [this](const std::string& e) { view_.event(e); }, S_) {
  for (int64_t s = 0; s < S_; ++s) {
    Child c;
    c.name = S_ == 1 ? "syncer" : "syncer.shard-" + std::to_string(s);
    c.shard = s;
    syncers_.push_back(c);
    syncer_tails_.emplace_back((shard_dir(s) / "syncer.jsonl").string());
    if (cfg.syncer.standby) {
      Child b = c;
      b.name += "-standby";
      b.standby = true;
      standbys_.push_back(b);
      standby_tails_.emplace_back((standby_dir(s) / "syncer.jsonl").string());
    }
  }
  killed_epoch_.assign(static_cast<size_t>(S_), 0);
  if (cfg.syncer.standby) records_.set_pairs();
  for (int64_t n = 0; n < M_; ++n) {
    Child c;
    c.name = "learner-" + std::to_string(n);
    c.learner = n;
    learners_.push_back(c);
    tailers_.emplace_back((dir_ / ("learner-" + std::to_string(n) + ".jsonl")).string());
    followers_.emplace_back();
    for (int64_t r = 1; r < cfg_.learner.ranks; ++r) {
      Child f;
      f.name = c.name + ".rank-" + std::to_string(r);
      f.learner = n;
      f.rank = r;
      followers_.back().push_back(f);
    }
  }
  group_port_.assign(static_cast<size_t>(M_), 0);
  done_record_.assign(static_cast<size_t>(M_), -1);
  precision_.assign(static_cast<size_t>(M_), json());
  joins_at_start_.assign(static_cast<size_t>(M_), 0);
}

void LocalCluster::prepare() {
  fs::create_directories(dir_ / "logs");
  if (!cfg_.testbed.name.empty()) {
    const int64_t R = std::max<int64_t>(1, cfg_.learner.ranks), wanted = 1 + M_ * R;
    const TestbedState tb = read_testbed(cfg_.testbed.name, std::max<int64_t>(3, wanted));
    testbed_addrs_ = tb.addrs;
    testbed_rates_ = tb.rates;
    const int64_t hosts = static_cast<int64_t>(testbed_addrs_.size());
    if (R > 1 && hosts < wanted)
      std::cerr << "deloco run: testbed '" << cfg_.testbed.name << "' has " << hosts << " hosts, fewer than the "
                << wanted << " that give the syncer and each of the " << M_ * R << " learner ranks a host of its own: "
                << "ranks share hosts (docs/testbed.md)\n";
    std::vector<NetFault> faults = parse_net_faults(cfg_.chaos.net);
    if (!faults.empty() && !cfg_.chaos.enabled)
      std::cerr << "deloco run: chaos.net is set but chaos.enabled is false: no network faults\n";
    if (!faults.empty() && cfg_.chaos.enabled) {
      place_net_faults(faults, hosts, M_, R);
      net_chaos_ = NetChaosSchedule(std::move(faults), testbed_rates_);
      try {
        testbed_script_ = resolve_testbed_script(access_, tb.script, ::geteuid());
      } catch (const RunError& e) {
        throw RunError(std::string("chaos.net on testbed '") + cfg_.testbed.name + "': " + e.what());
      }
    }
    // The processes on the hosts drop root to the invoking user, when one is known; said once either way.
    run_as_ = testbed_run_as(access_.user, std::getenv("SUDO_UID"), std::getenv("SUDO_GID"), ::geteuid());
    if (run_as_.drop)
      std::cerr << "deloco run: the processes on testbed '" << cfg_.testbed.name << "' run as "
                << (run_as_.name.empty() ? "uid " + std::to_string(run_as_.uid) : run_as_.name) << " (uid "
                << run_as_.uid << ", gid " << run_as_.gid << (access_.user.empty() ? ", from sudo" : "")
                << "); the run folder becomes theirs\n";
    else if (::geteuid() == 0)
      std::cerr << "deloco run: the processes on testbed '" << cfg_.testbed.name << "' run as root"
                << (access_.user.empty() ? ": no other user to run them as is known (not started through sudo by "
                                           "another user, no --testbed-user)"
                                         : " (--testbed-user " + access_.user + ")")
                << "\n";
    bind_addrs_.clear();
    dial_addr_.clear();
    for (int64_t s = 0; s < S_; ++s) {
      bind_addrs_.push_back("tcp://" + testbed_addrs_[0] + ":" + std::to_string(cfg_.testbed.port + s));
      dial_addr_ += (s > 0 ? "," : "") + bind_addrs_.back();
      if (cfg_.syncer.standby)  // the standby beside it on host 0, on the ports after the shards'
        standby_addrs_.push_back("tcp://" + testbed_addrs_[0] + ":" + std::to_string(cfg_.testbed.port + S_ + s));
    }
    records_.set_dashboard_host(testbed_addrs_[0]);
  } else {
    std::tie(bind_addrs_, dial_addr_) = choose_endpoints(cfg_.net, dir_, S_);
    if (cfg_.syncer.standby) {
      NetOptions pair = cfg_.net;
      pair.address = cfg_.net.standby.empty() ? NetOptions{}.address : cfg_.net.standby;
      // The standbys' sockets (when ipc) in RUN/standby: the standby's run folder when unsharded, else only theirs.
      fs::create_directories(dir_ / "standby");
      const std::string dial = choose_endpoints(pair, dir_ / "standby", S_).second;
      standby_addrs_ = split_endpoints(dial);
    }
  }
  for (int64_t s = 0; s < S_; ++s) fs::create_directories(shard_dir(s));
  for (int64_t s = 0; s < S_ && cfg_.syncer.standby; ++s) fs::create_directories(standby_dir(s));
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  base_args_ = {ec ? std::string("deloco") : self.string()};  // argv[0] only; exec always uses /proc/self/exe
  if (!children_.config_path.empty()) base_args_.insert(base_args_.end(), {"--config", children_.config_path});
  for (const auto& s : children_.sets) base_args_.insert(base_args_.end(), {"--set", s});
  add_set(base_args_, "sync.learners=" + std::to_string(M_));
  if (cfg_.syncer.standby) {
    // Every process knows both syncers of each pair: the learners dial both, each syncer follows the other.
    std::string standby;
    for (const auto& a : standby_addrs_) standby += (standby.empty() ? "" : ",") + a;
    add_set(base_args_, "net.address=" + dial_addr_);
    add_set(base_args_, "net.standby=" + standby);
  }
  if (!cfg_.net.plaintext) make_keys();
  if (run_as_.drop) hand_over_run_folder();
}

void LocalCluster::hand_over_run_folder() {
  const uid_t uid = run_as_.uid;
  const gid_t gid = run_as_.gid;
  struct stat st {};
  if (::lstat(dir_.c_str(), &st) != 0)
    throw IoError("cannot stat the run folder " + dir_.string() + ": " + std::strerror(errno));
  if (st.st_uid != 0 && st.st_uid != uid)
    throw RunError("the run folder " + dir_.string() + " belongs to uid " + std::to_string(st.st_uid) +
                   ", neither root nor uid " + std::to_string(uid) + " whom the testbed's processes run as");
  const auto give = [&](const fs::path& p) {
    struct stat s {};
    if (::lstat(p.c_str(), &s) != 0) throw IoError("cannot stat " + p.string() + ": " + std::strerror(errno));
    // Everything here was made by this run (the folder was new or empty); a file with another name elsewhere is not.
    if (S_ISREG(s.st_mode) && s.st_nlink > 1)
      throw RunError(p.string() + " has other hard links; not handing it to uid " + std::to_string(uid));
    if (::lchown(p.c_str(), uid, gid) != 0)
      throw IoError("cannot hand " + p.string() + " to uid " + std::to_string(uid) + ": " + std::strerror(errno));
  };
  give(dir_);
  for (const auto& e : fs::recursive_directory_iterator(dir_)) give(e.path());  // symlinks not followed
}

json LocalCluster::run(const StopSignals& stop) {
  t0_ = std::chrono::steady_clock::now();
  // Whatever ends the run, no network fault outlives it.
  struct HealAtExit {
    LocalCluster* c;
    ~HealAtExit() {
      try {
        c->heal_network();
      } catch (...) {
      }
    }
  } heal_at_exit{this};
  for (auto& c : syncers_) start(c);
  for (auto& c : standbys_) start(c);
  for (auto& c : learners_) start(c);
  std::string fatal;
  while (!stop.requested.load()) {
    try {
      reap();
      if (finished()) break;
      restarts_and_continues();
      if (cfg_.chaos.enabled) {
        chaos();
        net_chaos();
      }
    } catch (const std::exception& e) {  // a process failing too often, or one that cannot be started
      fatal = e.what();
      break;
    }
    poll_records();
    if (elapsed() >= next_status_) {
      view_.draw();
      next_status_ = elapsed() + (tty_ ? 2.0 : 5.0);
    }
    if (all_learners_done() && any_syncer_running() && elapsed() - learners_done_at_ > kSyncerGrace) {
      note("the syncer did not exit " + fixed(kSyncerGrace, 0) + " s after the last learner finished: stopping it");
      forced_syncer_stop_ = true;
      break;
    }
    ::usleep(100 * 1000);
  }
  const int sig = stop.first.load();
  stopping_ = true;
  heal_network();  // before the children's last words: a learner cut off now could not say goodbye
  const auto children = everyone();
  if (std::any_of(children.begin(), children.end(), [](const Child* c) { return c->pid != 0; })) view_.clear();
  stop_children(children, sig != 0 ? sig : SIGTERM, kStopWait, std::cerr);
  poll_records();
  view_.draw();  // the final state stays on screen
  if (!fatal.empty()) throw RunError(fatal);
  json summary = make_summary();
  if (sig != 0) summary["interrupted"] = strsignal(sig);
  return summary;
}

double LocalCluster::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void LocalCluster::make_keys() {
  const fs::path keys = dir_ / "keys";
  fs::create_directories(keys / "allow");
  write_keypair((keys / "syncer").string(), generate_keypair());
  for (int64_t n = 0; n < M_; ++n) {
    const std::string stem = "learner-" + std::to_string(n);
    write_keypair((keys / stem).string(), generate_keypair());
    fs::copy_file(keys / (stem + ".pub"), keys / "allow" / (stem + ".pub"));
  }
  // A standby pair: each syncer dials the other with the syncers' key, allowed under the name "syncer".
  if (cfg_.syncer.standby) fs::copy_file(keys / "syncer.pub", keys / "allow" / "syncer.pub");
}

std::vector<std::string> LocalCluster::argv_of(const Child& c) const {
  std::vector<std::string> a = base_args_;
  const fs::path keys = dir_ / "keys";
  if (c.learner < 0) {
    a.insert(a.begin() + 1, "syncer");
    const fs::path out = c.standby ? standby_dir(c.shard) : shard_dir(c.shard);
    // A standby pair binds the endpoints net.address and net.standby name (base_args_); a lone syncer its own.
    if (!cfg_.syncer.standby) a.insert(a.end(), {"--bind", bind_addrs_[static_cast<size_t>(c.shard)]});
    a.insert(a.end(), {"--out", out.string(), "--summary", (out / "syncer-summary.json").string()});
    if (S_ > 1) a.insert(a.end(), {"--shard", std::to_string(c.shard)});
    add_set(a, "train.threads=1");
    if (!testbed_addrs_.empty() && !cfg_.syncer.metrics.empty()) {  // the dashboard on host 0's address, same port
      const std::string& m = cfg_.syncer.metrics;
      add_set(a, "syncer.metrics=" + testbed_addrs_[0] + (m.rfind(':') != std::string::npos ? m.substr(m.rfind(':')) : ":0"));
    }
    if (!cfg_.net.plaintext) {
      add_set(a, "net.secret_key=" + (keys / "syncer.key").string());
      add_set(a, "net.allow=" + (keys / "allow").string());
    }
    // A pair's syncer restarted with a checkpoint of its own keeps it: the state it offers if the pair has no leader.
    if (cfg_.syncer.standby && c.starts > 0 && has_committed_checkpoint(out.string())) a.push_back("--resume");
    if (c.standby) {
      a.push_back("--standby");  // it follows whichever syncer of the pair leads
    } else if (cfg_.syncer.standby && c.starts > 0) {
      a.push_back("--follow");  // restarted: its standby took over when it died; it follows that one now
    } else if (c.starts > 0 && has_checkpoint(c.shard)) {
      a.push_back("--resume");
    }
  } else {
    a.insert(a.begin() + 1, "learner");
    a.insert(a.end(), {"--id", std::to_string(c.learner), "--connect", dial_addr_, "--out", dir_.string()});
    add_set(a, "train.threads=1");
    // The group's store: at rank 0's host (its testbed address, else this machine's loopback), a fresh port per start.
    if (cfg_.learner.ranks > 1) {
      const std::string master =
          testbed_addrs_.empty() ? "127.0.0.1" : testbed_addrs_[static_cast<size_t>(learner_host(c.learner, 0))];
      a.insert(a.end(), {"--rank", std::to_string(c.rank), "--world-size", std::to_string(cfg_.learner.ranks),
                         "--master-addr", master, "--master-port",
                         std::to_string(group_port_[static_cast<size_t>(c.learner)])});
    }
    if (cfg_.chaos.enabled && c.learner == cfg_.chaos.slow_learner)
      add_set(a, "learner.slowdown=" + fixed(cfg_.chaos.slow_factor, 6));
    if (!cfg_.net.plaintext) {
      add_set(a, "net.secret_key=" + (keys / ("learner-" + std::to_string(c.learner) + ".key")).string());
      add_set(a, "net.server_key=" + (keys / "syncer.pub").string());
    }
    // Rejoin from peers (net.serve=auto): rank 0 serves the state it holds to joining learners, at its testbed
    // host's address (a port per learner above the syncers'), else on an ipc socket in the run folder.
    if (cfg_.net.serve == "auto" && c.rank == 0) {
      std::string serve;
      if (!testbed_addrs_.empty()) {
        serve = "tcp://" + testbed_addrs_[static_cast<size_t>(learner_host(c.learner, 0))] + ":" +
                std::to_string(cfg_.testbed.port + 200 + c.learner);
      } else {
        const std::string sock = (fs::absolute(dir_) / ("serve-" + std::to_string(c.learner) + ".sock")).lexically_normal().string();
        serve = sock.size() < 100 ? "ipc://" + sock : "tcp://127.0.0.1:" + std::to_string(free_loopback_port());
      }
      add_set(a, "net.serve=" + serve);
      if (!cfg_.net.plaintext) add_set(a, "net.allow=" + (keys / "allow").string());
    } else if (cfg_.net.serve == "auto") {
      add_set(a, "net.serve=");
    }
  }
  return a;
}

// The environment of a learner command (ChildConfig::learner_commands): what deloco/embed.h reads.
std::vector<std::string> LocalCluster::learner_command_environment(int64_t learner) const {
  const fs::path keys = dir_ / "keys";
  std::vector<std::string> extra = {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1",
                                    "DELOCO_CONFIG=" + (dir_ / "config.json").string(),
                                    // Python learners serve no peers (yet): net.serve=auto is for deloco's own.
                                    "DELOCO_SET=sync.learners=" + std::to_string(M_) +
                                        (cfg_.net.serve == "auto" ? "\nnet.serve=" : ""),
                                    "DELOCO_LEARNER_ID=" + std::to_string(learner),
                                    "DELOCO_SYNCER=" + dial_addr_,
                                    "DELOCO_OUT=" + dir_.string()};
  // PyTorch allocates through glibc too: the same kept memory as deloco's own processes (util/malloc_tuning.h).
  for (std::string& e : malloc_environment()) extra.push_back(std::move(e));
  if (!cfg_.net.plaintext) {
    extra.push_back("DELOCO_SECRET_KEY=" + (keys / ("learner-" + std::to_string(learner) + ".key")).string());
    extra.push_back("DELOCO_SERVER_KEY=" + (keys / "syncer.pub").string());
  }
  std::error_code ec;
  const fs::path module_dir = fs::read_symlink("/proc/self/exe", ec).parent_path() / "python";
  if (!ec && fs::exists(module_dir / "deloco" / "__init__.py")) {
    const std::string old = environment_string("PYTHONPATH");
    extra.push_back("PYTHONPATH=" + module_dir.string() + (old.empty() ? "" : ":" + old));
  }
  return child_environment(extra);
}

// Whether the syncer has a checkpoint to --resume from: a committed folder in RUN/checkpoints (RUN/latest is only
// a hint, missing when the syncer died between its first commit and writing it).
bool LocalCluster::has_checkpoint(int64_t shard) const { return has_committed_checkpoint(shard_dir(shard).string()); }

int64_t LocalCluster::learner_host(int64_t learner, int64_t rank) const {
  return testbed_host_of(learner, rank, cfg_.learner.ranks, static_cast<int64_t>(testbed_addrs_.size()));
}

std::string LocalCluster::netns_of(const Child& c) const {
  if (testbed_addrs_.empty()) return "";
  const int64_t host = c.learner < 0 ? 0 : learner_host(c.learner, c.rank);
  return cfg_.testbed.name + "-h" + std::to_string(host);
}

fs::path LocalCluster::shard_dir(int64_t s) const { return S_ == 1 ? dir_ : dir_ / ("shard-" + std::to_string(s)); }

bool LocalCluster::any_syncer_running() const {
  return std::any_of(syncers_.begin(), syncers_.end(), [](const Child& c) { return c.pid != 0; });
}

void LocalCluster::start(Child& c) {
  const bool group_leader = c.learner >= 0 && c.rank == 0 && cfg_.learner.ranks > 1;
  if (group_leader) group_port_[static_cast<size_t>(c.learner)] = free_loopback_port();
  const std::string log = (dir_ / "logs" / (c.name + ".log")).string();
  const auto argv = argv_of(c);
  // A learner given by --learner-command runs the user's program instead of this binary.
  const auto found = c.learner >= 0 ? children_.learner_commands.find(c.learner) : children_.learner_commands.end();
  const std::string* command = found != children_.learner_commands.end() ? &found->second : nullptr;
  if (c.learner >= 0 && c.rank == 0) {  // a new incarnation: what it finishes is its own
    const size_t n = static_cast<size_t>(c.learner);
    poll_learner(n);  // the previous incarnation's records first
    done_record_[n] = -1;
    joins_at_start_[n] = records_.learners()[n].joins;
  }
  {
    std::ofstream l(log, std::ios::app);
    l << "=== deloco run: start #" << c.starts + 1 << " at +" << fixed(elapsed(), 1) << " s:";
    if (command != nullptr)
      l << " " << *command << " (learner command)";
    else
      for (size_t i = 1; i < argv.size(); ++i) l << " " << argv[i];
    l << "\n";
  }
  // One thread per process: M learners, one per core, and a syncer that mostly waits.
  // On a testbed host: the user run_as_ says (prepare), with that user's HOME, USER and LOGNAME.
  const std::string netns = netns_of(c);
  const RunAs as = netns.empty() ? RunAs{} : run_as_;
  std::vector<std::string> user_env;
  if (as.drop && !as.name.empty()) user_env = {"USER=" + as.name, "LOGNAME=" + as.name};
  if (as.drop && !as.home.empty()) user_env.push_back("HOME=" + as.home);
  if (command != nullptr) {
    std::vector<std::string> env = learner_command_environment(c.learner);
    for (const auto& kv : user_env) {
      const std::string name = kv.substr(0, kv.find('=') + 1);
      env.erase(std::remove_if(env.begin(), env.end(), [&](const std::string& e) { return e.rfind(name, 0) == 0; }),
                env.end());
      env.push_back(kv);
    }
    c.pid = spawn_program("/bin/sh", {"sh", "-c", "exec " + *command}, env, log, netns, as);
  } else {
    std::vector<std::string> env = {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"};
    // A learner group on the testbed: Gloo's pairs on the host's testbed interface (scripts/testbed.sh), whatever
    // this machine's GLOO_SOCKET_IFNAME says.
    if (c.learner >= 0 && cfg_.learner.ranks > 1 && !testbed_addrs_.empty()) env.push_back("GLOO_SOCKET_IFNAME=eth0");
    env.insert(env.end(), user_env.begin(), user_env.end());
    c.pid = spawn_self(argv, child_environment(env), log, netns, as);
  }
  c.stopped = false;
  c.chaos_killed = false;
  c.restart_at = -1;
  c.cont_at = -1;
  if (c.starts > 0 && c.rank == 0)
    note((c.learner < 0 ? std::string(S_ == 1 ? (c.standby ? "restarted " + c.name : std::string("restarted the syncer"))
                                           : "restarted syncer shard " + std::to_string(c.shard) +
                                                                               (c.standby ? " (its standby)" : ""))
                               : "restarted " + c.name) +
                (c.learner < 0 && argv.back() == "--resume" ? " with --resume" : "") +
                (c.learner < 0 && (argv.back() == "--follow" || argv.back() == "--standby") ? " as the standby" : "") +
                (group_leader ? " (its group of " + std::to_string(cfg_.learner.ranks) + " ranks)" : ""));
  ++c.starts;
  if (group_leader)
    for (Child& f : followers_[static_cast<size_t>(c.learner)]) {
      f.done = false;
      start(f);
    }
}

void LocalCluster::stop_group(int64_t learner) {
  for (Child& f : followers_[static_cast<size_t>(learner)]) {
    if (f.pid == 0) continue;
    ::kill(f.pid, SIGCONT);
    ::kill(f.pid, SIGKILL);
    while (!collect_exit(f)) ::usleep(1000);
  }
}

// Collects exited children and decides what happens next. Throws runtime_error for a crash loop.
void LocalCluster::reap() {
  // A rank > 0 that exits without finishing takes its group down: rank 0 is killed (and restarted by the code
  // below, as a crash unless chaos killed that rank), which takes the other ranks with it.
  for (size_t n = 0; n < followers_.size(); ++n)
    for (Child& f : followers_[n]) {
      if (!collect_exit(f) || f.done) continue;
      Child& leader = learners_[n];
      if (leader.pid != 0 && !leader.chaos_killed) {  // (a killed rank 0 took this rank with it: nothing to say)
        note(f.name + (f.chaos_killed ? " was killed" : " exited (" + f.last_exit + ")") + ": its group goes down");
        leader.chaos_killed = leader.chaos_killed || f.chaos_killed;
        ::kill(leader.pid, SIGCONT);
        ::kill(leader.pid, SIGKILL);
      }
      f.chaos_killed = false;
    }
  for (Child* c : all()) {
    if (!collect_exit(*c)) continue;
    if (c->learner >= 0 && c->rank == 0) {
      // Everything the process wrote is in its file now: read to the end, then count the pushes of one that wrote
      // no learner_done (killed) from its push records.
      poll_learner(static_cast<size_t>(c->learner));
      records_.process_ended(c->learner);
    }
    // A learner that exits 0 has finished only if its records say so (cluster.h); otherwise it failed.
    std::string unfinished;
    if (c->learner >= 0 && c->done) {
      unfinished = unfinished_reason(static_cast<size_t>(c->learner));
      if (!unfinished.empty()) {
        c->done = false;
        c->last_exit = "exit status 0 before finishing: " + unfinished;
      }
    }
    if (c->learner >= 0 && !c->done) stop_group(c->learner);
    if (c->done) {
      if (c->learner >= 0 && all_learners_done()) learners_done_at_ = elapsed();
      if (c->learner < 0 && learners_still_training())
        note(c->name + " exited 0 while learners still train; waiting for them");
      continue;
    }
    if (c->chaos_killed) {
      c->restart_at = elapsed() + cfg_.chaos.restart_delay;
      continue;
    }
    const double now = elapsed();
    const std::string loop = record_failure(*c, now);
    const std::string log = (dir_ / "logs" / (c->name + ".log")).string();
    if (!loop.empty())
      throw RunError(c->name + " failed " + loop + " (last: " + c->last_exit + "); log " + log +
                     " ends with:\n" + tail_of(log, 20));
    note(c->name + (unfinished.empty() ? " exited unexpectedly (" + c->last_exit + ")"
                                        : " exited 0 before finishing (" + unfinished + ")") +
         "; restarting it in " + fixed(kFailureRestartDelay, 1) + " s");
    c->restart_at = now + kFailureRestartDelay;
  }
}

bool LocalCluster::all_learners_done() const {
  return std::all_of(learners_.begin(), learners_.end(), [](const Child& c) { return c.done; });
}

// A learner that neither exited 0 nor wrote its learner_done record (one that did is only closing down).
bool LocalCluster::learners_still_training() const {
  for (size_t n = 0; n < learners_.size(); ++n)
    if (!learners_[n].done && !records_.learners()[n].finished) return true;
  return false;
}

bool LocalCluster::any_learner_finished() const {
  for (size_t n = 0; n < learners_.size(); ++n)
    if (learners_[n].done || records_.learners()[n].finished) return true;
  return false;
}

bool LocalCluster::finished() const {
  // A standby pair is finished when either of its syncers ended the run (the other is stopped with everyone).
  for (int64_t s = 0; s < S_; ++s) {
    const bool pair_done = syncers_[static_cast<size_t>(s)].done ||
                           (!standbys_.empty() && standbys_[static_cast<size_t>(s)].done);
    if (!pair_done) return false;
  }
  return all_learners_done();
}

std::vector<Child*> LocalCluster::all() {
  std::vector<Child*> v;
  for (auto& c : syncers_) v.push_back(&c);
  for (auto& c : standbys_) v.push_back(&c);
  for (auto& c : learners_) v.push_back(&c);
  return v;
}

std::vector<Child*> LocalCluster::everyone() {
  std::vector<Child*> v = all();
  for (auto& g : followers_)
    for (auto& f : g) v.push_back(&f);
  return v;
}

void LocalCluster::note(const std::string& what) {
  view_.event(what);
  rec::Chaos r;
  r.what = what;
  r.t = unix_now();
  try {
    rec::RecordWriter((dir_ / "events.jsonl").string()).write(r);
  } catch (const std::exception&) {  // best effort: the live view has it anyway
  }
}

void LocalCluster::poll_records() {
  for (size_t k = 0; k < syncer_tails_.size(); ++k)
    syncer_tails_[k].poll([&](const std::string& line) { records_.on_line(line, -1, static_cast<int64_t>(k)); });
  for (size_t k = 0; k < standby_tails_.size(); ++k)
    standby_tails_[k].poll([&](const std::string& line) { records_.on_line(line, -1, static_cast<int64_t>(k), true); });
  for (size_t n = 0; n < tailers_.size(); ++n) poll_learner(n);
}

void LocalCluster::poll_learner(size_t n) {
  tailers_[n].poll([&](const std::string& line) {
    records_.on_line(line, static_cast<int64_t>(n));
    if (line.find("\"learner_done\"") == std::string::npos) return;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return;
    const auto kind = j.find("kind");
    if (kind == j.end() || !kind->is_string() || kind->get<std::string>() != "learner_done") return;
    // No "finished" field: a learner_done of a writer that does not say; anything but true or absent: not finished.
    const auto f = j.find("finished");
    done_record_[n] = f == j.end() || (f->is_boolean() && f->get<bool>()) ? 1 : 0;
    if (j.contains("precision")) {
      json p = json::object();
      for (const char* k : {"precision", "precision_setting", "fp32_gflops", "bf16_gflops"})
        if (j.contains(k)) p[k] = j[k];
      precision_[n] = p;
    }
  });
}

std::string LocalCluster::unfinished_reason(size_t n) {
  poll_learner(n);  // the process is gone: everything it wrote is in the file
  if (done_record_[n] == 1) return "";
  const LearnerView& v = records_.learners()[n];
  if (done_record_[n] == 0)
    return "its learner_done record says it stopped at step " + std::to_string(v.step) + " of " +
           std::to_string(cfg_.run.train.steps);
  if (v.joins == joins_at_start_[n]) return "it never joined the syncer";
  return "it wrote no learner_done record to learner-" + std::to_string(n) + ".jsonl";
}

}  // namespace deloco::run
