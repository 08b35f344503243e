// Configuration of the distributed runtime: every key of `deloco syncer`, `deloco learner` and `deloco run`.
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <sstream>
#include <thread>

#include "deloco/config.h"
#include "deloco/runtime.h"
#include "deloco/wire.h"
#include "run/net_chaos.h"
#include "util/env.h"
#include "util/text.h"

namespace deloco {

namespace {
// Durations are bounded above too: a finite but enormous timeout disables what it guards as surely as inf would
// (the binder already refuses non-finite numbers, deloco/config.h), and larger values overflow clock arithmetic.
constexpr double kMaxSeconds = 1e6;  // ~11.6 days
std::string fmt(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}
std::function<std::string()> seconds(const double* v, const char* key, bool zero_ok, double hi = kMaxSeconds) {
  return [v, key, zero_ok, hi] {
    const bool low_ok = zero_ok ? *v >= 0 : *v > 0;
    return low_ok && *v <= hi ? std::string()
                              : std::string(key) + " must be in " + (zero_ok ? "[0, " : "(0, ") + fmt(hi) +
                                    "] seconds (got " + fmt(*v) + ")";
  };
}
}  // namespace

void NetOptions::bind(ConfigSchema& s) {
  s.bind("net.address", &address,
         "syncer endpoint: tcp://host:port or ipc:///path; a sharded syncer: one, the others derived, or one per "
         "shard separated by commas (env DELOCO_SYNCER)",
         [this] {
           for (const std::string& a : split_endpoints(address))
             if (a.rfind("tcp://", 0) != 0 && a.rfind("ipc://", 0) != 0)
               return "net.address must start with tcp:// or ipc:// (got '" + a + "')";
           return std::string();
         });
  s.bind("net.standby", &standby,
         "the standby syncer's endpoint, as net.address (\"\" : no standby): learners dial both syncers of the pair "
         "and follow whichever leads; the standby follows net.address (docs/reliability.md)",
         [this] {
           if (standby.empty()) return std::string();
           for (const std::string& a : split_endpoints(standby))
             if (a.rfind("tcp://", 0) != 0 && a.rfind("ipc://", 0) != 0)
               return "net.standby must start with tcp:// or ipc:// (got '" + a + "')";
           return std::string();
         });
  s.bind("net.plaintext", &plaintext, "run without CURVE authentication and encryption (must be explicit)");
  s.bind("net.secret_key", &secret_key, "own .key file from `deloco keygen` (env DELOCO_SECRET_KEY)");
  s.bind("net.server_key", &server_key, "learners: the syncer's .pub file (env DELOCO_SERVER_KEY)");
  s.bind("net.allow", &allow, "syncer: allow-list file or folder of .pub files (env DELOCO_ALLOW)");
  s.bind("net.heartbeat", &heartbeat, "seconds between heartbeats", seconds(&heartbeat, "net.heartbeat", false, 60));
  s.bind("net.dead_after", &dead_after, "seconds of silence before a peer counts as gone", [this] {
    if (!(dead_after > heartbeat)) return std::string("net.dead_after must be > net.heartbeat");
    return seconds(&dead_after, "net.dead_after", false, 3600)();
  });
  s.bind("net.chunk_bytes", &chunk_bytes, "global-state download chunk size (bytes)", [this] {
    return chunk_bytes >= 4096 && chunk_bytes <= (int64_t{1} << 28)
               ? std::string()
               : std::string("net.chunk_bytes must be in [4096, 2^28]");
  });
  s.bind("net.join_timeout", &join_timeout, "seconds a learner waits for its first welcome",
         seconds(&join_timeout, "net.join_timeout", false, 86400));
  s.bind("net.tcp_timeout", &tcp_timeout,
         "TCP: seconds data may stay unacknowledged before the connection is dropped and dialled afresh, so a link "
         "that came back is used within seconds (0: the OS's retransmission limits, minutes); the floor: a slow "
         "link's connections wait 8 of their base retransmission timeouts where that is longer",
         seconds(&tcp_timeout, "net.tcp_timeout", true, 3600));
  s.bind("net.tcp_congestion", &tcp_congestion,
         "TCP congestion control of every connection, one the kernel offers (\"\": the system's; \"bbr\" paces its "
         "sends and keeps a slow link's queue short)",
         [this] {
           for (char c : tcp_congestion)
             if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'))
               return std::string("net.tcp_congestion must be a congestion control's name, like bbr or cubic (got '") +
                      tcp_congestion + "')";
           return tcp_congestion.size() < 16 ? std::string()
                                              : std::string("net.tcp_congestion is at most 15 characters (a kernel name)");
         });
  s.bind("net.lanes", &lanes,
         "learners: connections to each syncer shard, each authenticated alone; a payload of 1 MiB or more is split "
         "over them so that several threads encrypt it (1: one connection)",
         [this] {
           return lanes >= 1 && lanes <= TransportOptions::kMaxLanes
                      ? std::string()
                      : "net.lanes must be in [1, " + std::to_string(TransportOptions::kMaxLanes) + "] (got " +
                            std::to_string(lanes) + ")";
         });
  s.bind("net.io_threads", &io_threads, "ZeroMQ I/O threads per transport (encryption runs on them)", [this] {
    return io_threads >= 1 && io_threads <= 16
               ? std::string()
               : "net.io_threads must be in [1, 16] (got " + std::to_string(io_threads) + ")";
  });
  s.bind("net.serve", &serve,
         "learners: the endpoint (tcp://HOST:PORT or ipc://PATH) where this learner serves chunks of the state it "
         "holds to joining learners, so a rejoin does not load the syncer alone (\"\" : serve none; auto: `deloco run` "
         "picks one per learner; "
         "docs/reliability.md, \"Rejoin from peers\")",
         [this] {
           if (serve.empty() || serve == "auto") return std::string();
           if (serve.rfind("tcp://", 0) != 0 && serve.rfind("ipc://", 0) != 0)
             return "net.serve must start with tcp:// or ipc:// (got '" + serve + "')";
           if (serve.find("0.0.0.0") != std::string::npos || serve.find('*') != std::string::npos)
             return "net.serve must be an address joining learners can dial, not a wildcard (got '" + serve + "')";
           if (serve.size() > 256) return std::string("net.serve is longer than 256 bytes");
           return std::string();
         });
  s.bind("net.serve_rate", &serve_rate,
         "at most this many Mbit/s of state chunks sent to joining learners that fetch from peers: a learner's as a "
         "donor, the syncer's own share (default 200; 0: unbounded)", [this] {
           return std::isfinite(serve_rate) && serve_rate >= 0 && serve_rate <= 1e6
                      ? std::string()
                      : std::string("net.serve_rate must be in [0, 1e6] Mbit/s (0: unbounded)");
         });
  s.bind("net.donors", &donors,
         "syncer: at most this many learners a joining learner fetches the state from besides the syncer (0: the "
         "syncer sends it all)",
         [this] {
           return donors >= 0 && donors <= 32 ? std::string()
                                              : "net.donors must be in [0, 32] (got " + std::to_string(donors) + ")";
         });
  s.bind("net.max_frame_bytes", &max_frame_bytes,
         "largest frame a node accepts; a larger one drops the connection (0: sized to the model)", [this] {
           return max_frame_bytes >= 0 && max_frame_bytes <= (int64_t{1} << 40)
                      ? std::string()
                      : std::string("net.max_frame_bytes must be in [0, 2^40] (0: sized to the model)");
         });
}

TransportOptions NetOptions::transport() const {
  TransportOptions t;
  t.plaintext = plaintext;
  t.secret_key_file = secret_key;
  t.server_public_key_file = server_key;
  t.allow = allow;
  // max_frame_bytes: net.max_frame_bytes when set; otherwise node_transport_options (transport_options.cpp) sizes
  // it to what the node's role receives for its model, and this generic default only stands when neither is used.
  if (max_frame_bytes > 0) t.max_frame_bytes = static_cast<uint64_t>(max_frame_bytes);
  t.tcp_timeout = std::chrono::milliseconds(static_cast<int64_t>(tcp_timeout * 1000.0));
  t.tcp_congestion = tcp_congestion;
  t.lanes = static_cast<int>(lanes);
  t.io_threads = static_cast<int>(io_threads);
  return t;
}

std::vector<std::string> split_endpoints(const std::string& address) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = address.find(',', start);
    std::string a = address.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    while (!a.empty() && a.front() == ' ') a.erase(a.begin());
    while (!a.empty() && a.back() == ' ') a.pop_back();
    out.push_back(a);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::vector<std::string> shard_endpoints(const std::string& address, int64_t shards) {
  std::vector<std::string> given = split_endpoints(address);
  if (static_cast<int64_t>(given.size()) == shards) return given;
  if (given.size() != 1)
    throw ConfigError("net.address lists " + std::to_string(given.size()) + " endpoints but syncer.shards=" +
                      std::to_string(shards) + ": give one (the others are derived from it) or one per shard");
  const std::string& base = given[0];
  std::vector<std::string> out{base};
  for (int64_t s = 1; s < shards; ++s) {
    if (base.rfind("tcp://", 0) == 0) {
      const size_t colon = base.rfind(':');
      int64_t port = -1;
      try {
        size_t used = 0;
        port = std::stoll(base.substr(colon + 1), &used);
        if (used != base.size() - colon - 1) port = -1;
      } catch (const std::exception&) {
        port = -1;
      }
      if (colon < 6 || port < 0 || port + shards - 1 > 65535)
        throw ConfigError("cannot derive the endpoints of syncer.shards=" + std::to_string(shards) + " from net.address '" +
                          base + "' (shard s listens on its port + s): give a numeric port, or one endpoint per shard");
      out.push_back(base.substr(0, colon + 1) + std::to_string(port + s));
    } else {  // ipc://path: path-s, before a .sock extension when there is one
      const std::string suffix = "-" + std::to_string(s);
      const size_t ext = base.size() >= 5 && base.compare(base.size() - 5, 5, ".sock") == 0 ? base.size() - 5 : base.size();
      out.push_back(base.substr(0, ext) + suffix + base.substr(ext));
    }
  }
  return out;
}

void SyncerNodeOptions::bind(ConfigSchema& s) {
  s.bind("syncer.shards", &shards,
         "syncer processes, each serving a balanced part of the fragments (`deloco syncer --shard s`)",
         [this] { return shards >= 1 && shards <= 4096 ? "" : "syncer.shards must be in [1, 4096]"; });
  s.bind("syncer.out_dir", &out_dir, "run folder of the syncer (\"\" : runs/<config>-<time>)");
  s.bind("syncer.checkpoint_every", &checkpoint_every, "merges between checkpoints (0: only at the end)",
         [this] { return checkpoint_every >= 0 ? "" : "syncer.checkpoint_every must be ≥ 0"; });
  s.bind("syncer.eval_interval", &eval_interval, "seconds between evaluations of the global model (0: end only)",
         seconds(&eval_interval, "syncer.eval_interval", true));
  s.bind("syncer.metrics", &metrics, "Prometheus endpoint host:port (\"\" : off; port 0: any free port)");
  s.bind("syncer.standby", &standby,
         "`deloco run`: start a standby syncer beside each syncer (shard), at net.standby or derived endpoints");
  s.bind("syncer.lease", &lease,
         "standby pair: seconds without a word from the leader before its standby takes over (the leader renews "
         "every quarter of it)",
         seconds(&lease, "syncer.lease", false, 600));
}

void LearnerNodeOptions::bind(ConfigSchema& s) {
  s.bind("learner.slowdown", &slowdown, "stretch every inner step to this multiple of its time (chaos)",
         [this] { return slowdown >= 1 && slowdown <= 1000 ? "" : "learner.slowdown must be in [1, 1000]"; });
  s.bind("learner.state_dir", &state_dir, "folder of learner-local state (AdamW moments) for restarts (\"\": none)");
  s.bind("learner.state_every", &state_every, "inner steps between learner-local state writes (0: max(100, sync.sync_every))",
         [this] { return state_every >= 0 ? "" : "learner.state_every must be ≥ 0"; });
  s.bind("learner.ranks", &ranks, "processes per learner, a data-parallel group over c10d Gloo (RANK / --rank picks one)",
         [this] { return ranks >= 1 && ranks <= 4096 ? "" : "learner.ranks must be in [1, 4096]"; });
  s.bind("learner.bucket_mb", &bucket_mb, "gradient all-reduce bucket size of a learner group, MB",
         [this] { return bucket_mb > 0 && bucket_mb <= 4096 ? "" : "learner.bucket_mb must be in (0, 4096]"; });
  s.bind("learner.group_timeout", &group_timeout, "seconds a learner-group collective may take before the group fails",
         seconds(&group_timeout, "learner.group_timeout", false));
  s.bind("learner.serve_corrupt", &serve_corrupt,
         "fault drill: this learner corrupts every state chunk it serves to joining peers, who must catch it by its "
         "hash and fetch it elsewhere (net.serve)");
}

void ChaosOptions::bind(ConfigSchema& s) {
  s.bind("chaos.enabled", &enabled, "deloco run: inject failures");
  s.bind("chaos.kill_interval", &kill_interval, "mean seconds between SIGKILLs of a random learner (0: none)",
         seconds(&kill_interval, "chaos.kill_interval", true));
  s.bind("chaos.stop_interval", &stop_interval, "mean seconds between SIGSTOPs of a random learner (0: none)",
         seconds(&stop_interval, "chaos.stop_interval", true));
  s.bind("chaos.stop_seconds", &stop_seconds, "seconds a stopped learner stays stopped",
         seconds(&stop_seconds, "chaos.stop_seconds", true));
  s.bind("chaos.restart_delay", &restart_delay, "seconds before a killed process is restarted",
         seconds(&restart_delay, "chaos.restart_delay", true));
  s.bind("chaos.syncer_kill_at", &syncer_kill_at, "seconds after start at which the syncer is killed", [this] {
    for (double t : syncer_kill_at)
      if (!(t >= 0 && t <= kMaxSeconds)) return std::string("chaos.syncer_kill_at times must be in [0, 1e6] seconds");
    return std::string();
  });
  // The progress forms (src/run/chaos.h): fractions of train.steps the furthest learner reached. Each kind is
  // scheduled by one clock: a config that sets both forms is refused, naming both keys and how to clear one.
  s.bind("chaos.kill_interval_progress", &kill_interval_progress,
         "mean fraction of train.steps (the furthest learner's) between SIGKILLs of a random learner (0: none)",
         [this] {
           if (!(kill_interval_progress >= 0 && kill_interval_progress <= 1))
             return "chaos.kill_interval_progress must be in [0, 1], a fraction of train.steps (got " +
                    fmt(kill_interval_progress) + ")";
           if (kill_interval_progress > 0 && kill_interval > 0)
             return "chaos.kill_interval_progress=" + fmt(kill_interval_progress) + " and chaos.kill_interval=" +
                    fmt(kill_interval) + " are both set: space the learner kills by progress or by seconds, not both "
                    "(set the other to 0)";
           return std::string();
         });
  s.bind("chaos.syncer_kill_at_progress", &syncer_kill_at_progress,
         "fractions of train.steps (the furthest learner's) at which the syncer is killed, e.g. [0.5]: mid-run", [this] {
           for (double f : syncer_kill_at_progress)
             if (!(f > 0 && f < 1))
               return "chaos.syncer_kill_at_progress fractions must be in (0, 1) of train.steps (got " + fmt(f) + ")";
           if (!syncer_kill_at_progress.empty() && !syncer_kill_at.empty())
             return std::string("chaos.syncer_kill_at_progress and chaos.syncer_kill_at are both set: schedule the "
                                "syncer kills by progress or by seconds, not both (clear the other: "
                                "--set chaos.syncer_kill_at= or --set chaos.syncer_kill_at_progress=)");
           return std::string();
         });
  s.bind("chaos.slow_learner", &slow_learner, "learner slowed down by chaos.slow_factor (-1: none)");
  s.bind("chaos.slow_factor", &slow_factor, "step-time factor of the slow learner",
         [this] { return slow_factor >= 1 && slow_factor <= 1000 ? "" : "chaos.slow_factor must be in [1, 1000]"; });
  s.bind("chaos.seed", &seed, "seed of the chaos schedule");
  s.bind("chaos.net", &net,
         "network faults on the testbed, ';'-separated: \"partition host=H at=T for=D\", \"flap host=H at=T for=D "
         "period=P\", \"slow host=H at=T for=D [factor=F|rate=R]\" (learner=N for host=H; docs/testbed.md)",
         [this] {
           try {
             run::parse_net_faults(net);
           } catch (const ConfigError& e) {
             return std::string(e.what());
           }
           return std::string();
         });
}

void TestbedOptions::bind(ConfigSchema& s) {
  s.bind("testbed.name", &name, "deloco run: the testbed (scripts/testbed.sh) to place the processes on (\"\" : none)",
         [this] {
           if (name.empty()) return std::string();
           bool ok = name.size() <= 10 && std::islower(static_cast<unsigned char>(name[0]));
           for (char c : name) ok = ok && (std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)));
           return ok ? std::string() : "testbed.name must be 1-10 lower-case letters and digits, a letter first (got '" +
                                           clip_utf8(name, 40) + "')";
         });
  s.bind("testbed.port", &port, "the syncer's TCP port on the testbed's host 0 (shard s: port + s)",
         [this] { return port >= 1 && port <= 65000 ? "" : "testbed.port must be in [1, 65000]"; });
}

void RuntimeConfig::bind(ConfigSchema& s) {
  sync.learners_auto_ok = true;  // `deloco run`: 0 = one learner per core
  run.bind(s);
  AlgorithmConfig::bind(s);
  net.bind(s);
  syncer.bind(s);
  learner.bind(s);
  chaos.bind(s);
  testbed.bind(s);
}

void RuntimeConfig::require_explicit_learners(const std::string& who) const {
  if (sync.learners > 0) return;
  throw ConfigError(
      "sync.learners = 0 (one learner per core) is resolved by `deloco run` alone; " + who +
      " runs beside processes on other machines, each of which would count its own cores (and give learners "
      "overlapping data): set the number of learners, the same for the syncer and every learner "
      "(--set sync.learners=M)");
}

int64_t RuntimeConfig::resolved_learners() const {
  if (sync.learners > 0) return sync.learners;
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int64_t>(n) : 1;
}

void RuntimeConfig::validate() const {
  AlgorithmConfig algo = *this;
  algo.sync.learners = resolved_learners();
  algo.sync.learners_auto_ok = false;
  algo.resolve();
  algo.validate();
  if (static_cast<int64_t>(run.train.learner_batch_sizes.size()) > resolved_learners())
    throw ConfigError("train.learner_batch_sizes has more entries than sync.learners");
  if (run.train.steps < sync.sync_every)
    throw ConfigError("train.steps=" + std::to_string(run.train.steps) + " is less than sync.sync_every=" +
                      std::to_string(sync.sync_every) + ": no outer step would ever happen");
  if (syncer.shards > sync.fragments)
    throw ConfigError("syncer.shards=" + std::to_string(syncer.shards) + " is larger than sync.fragments=" +
                      std::to_string(sync.fragments) + ": every shard serves at least one fragment");
  if (syncer.shard < 0 || syncer.shard >= syncer.shards)
    throw ConfigError("shard " + std::to_string(syncer.shard) + " is not in [0, syncer.shards=" +
                      std::to_string(syncer.shards) + ")");
  shard_endpoints(net.address, syncer.shards);  // throws when they cannot be derived
  if (chaos.enabled && !run::parse_net_faults(chaos.net).empty() && testbed.name.empty())
    throw ConfigError("chaos.net schedules network faults on a testbed's hosts: set testbed.name too (docs/testbed.md)");
  if (chaos.slow_learner >= resolved_learners())
    throw ConfigError("chaos.slow_learner names learner " + std::to_string(chaos.slow_learner) + " of " +
                      std::to_string(resolved_learners()));
}

namespace {
void from_env(std::string* field, const char* var) { *field = environment_string(var, *field); }
}  // namespace

void apply_node_environment(RuntimeConfig& cfg, NodeRole role) {
  from_env(&cfg.net.secret_key, "DELOCO_SECRET_KEY");
  if (role == NodeRole::kSyncer) {
    from_env(&cfg.net.address, "DELOCO_BIND");
    from_env(&cfg.net.allow, "DELOCO_ALLOW");
  } else {
    from_env(&cfg.net.address, "DELOCO_SYNCER");
    from_env(&cfg.net.server_key, "DELOCO_SERVER_KEY");
  }
}

int64_t environment_integer(const char* name, int64_t fallback) {
  return environment_integer_in(name, fallback, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
}

}  // namespace deloco
