// Configuration of the distributed runtime: every key of `deloco syncer`, `deloco learner` and `deloco run`.
#include <filesystem>
#include <thread>

#include "deloco/config.h"
#include "deloco/runtime.h"
#include "deloco/wire.h"

namespace deloco {

namespace {
std::function<std::string()> positive(const double* v, const char* key) {
  return [v, key] { return *v > 0 ? std::string() : std::string(key) + " must be > 0"; };
}
std::function<std::string()> nonneg(const double* v, const char* key) {
  return [v, key] { return *v >= 0 ? std::string() : std::string(key) + " must be ≥ 0"; };
}
}  // namespace

void NetOptions::bind(ConfigSchema& s) {
  s.bind("net.address", &address, "syncer endpoint: tcp://host:port or ipc:///path (env DELOCO_SYNCER)", [this] {
    return address.rfind("tcp://", 0) == 0 || address.rfind("ipc://", 0) == 0
               ? std::string()
               : "net.address must start with tcp:// or ipc:// (got '" + address + "')";
  });
  s.bind("net.plaintext", &plaintext, "run without CURVE authentication and encryption (must be explicit)");
  s.bind("net.secret_key", &secret_key, "own .key file from `deloco keygen` (env DELOCO_SECRET_KEY)");
  s.bind("net.server_key", &server_key, "learners: the syncer's .pub file (env DELOCO_SERVER_KEY)");
  s.bind("net.allow", &allow, "syncer: allow-list file or folder of .pub files (env DELOCO_ALLOW)");
  s.bind("net.heartbeat", &heartbeat, "seconds between heartbeats", positive(&heartbeat, "net.heartbeat"));
  s.bind("net.dead_after", &dead_after, "seconds of silence before a peer counts as gone", [this] {
    return dead_after > heartbeat ? std::string() : std::string("net.dead_after must be > net.heartbeat");
  });
  s.bind("net.chunk_bytes", &chunk_bytes, "global-state download chunk size (bytes)", [this] {
    return chunk_bytes >= 4096 && chunk_bytes <= (int64_t{1} << 28)
               ? std::string()
               : std::string("net.chunk_bytes must be in [4096, 2^28]");
  });
  s.bind("net.join_timeout", &join_timeout, "seconds a learner waits for its first welcome",
         positive(&join_timeout, "net.join_timeout"));
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
  return t;
}

void SyncerNodeOptions::bind(ConfigSchema& s) {
  s.bind("syncer.out_dir", &out_dir, "run folder of the syncer (\"\" : runs/<config>-<time>)");
  s.bind("syncer.checkpoint_every", &checkpoint_every, "merges between checkpoints (0: only at the end)",
         [this] { return checkpoint_every >= 0 ? "" : "syncer.checkpoint_every must be ≥ 0"; });
  s.bind("syncer.eval_interval", &eval_interval, "seconds between evaluations of the global model (0: end only)",
         nonneg(&eval_interval, "syncer.eval_interval"));
  s.bind("syncer.metrics", &metrics, "Prometheus endpoint host:port (\"\" : off; port 0: any free port)");
}

void LearnerNodeOptions::bind(ConfigSchema& s) {
  s.bind("learner.slowdown", &slowdown, "stretch every inner step to this multiple of its time (chaos)",
         [this] { return slowdown >= 1 ? "" : "learner.slowdown must be ≥ 1"; });
  s.bind("learner.state_dir", &state_dir, "folder of learner-local state (AdamW moments) for restarts (\"\": none)");
  s.bind("learner.state_every", &state_every, "inner steps between learner-local state writes (0: max(100, sync.sync_every))",
         [this] { return state_every >= 0 ? "" : "learner.state_every must be ≥ 0"; });
}

void ChaosOptions::bind(ConfigSchema& s) {
  s.bind("chaos.enabled", &enabled, "deloco run: inject failures");
  s.bind("chaos.kill_interval", &kill_interval, "mean seconds between SIGKILLs of a random learner (0: none)",
         nonneg(&kill_interval, "chaos.kill_interval"));
  s.bind("chaos.stop_interval", &stop_interval, "mean seconds between SIGSTOPs of a random learner (0: none)",
         nonneg(&stop_interval, "chaos.stop_interval"));
  s.bind("chaos.stop_seconds", &stop_seconds, "seconds a stopped learner stays stopped",
         nonneg(&stop_seconds, "chaos.stop_seconds"));
  s.bind("chaos.restart_delay", &restart_delay, "seconds before a killed process is restarted",
         nonneg(&restart_delay, "chaos.restart_delay"));
  s.bind("chaos.syncer_kill_at", &syncer_kill_at, "seconds after start at which the syncer is killed", [this] {
    for (double t : syncer_kill_at)
      if (!(t >= 0)) return std::string("chaos.syncer_kill_at times must be ≥ 0");
    return std::string();
  });
  s.bind("chaos.slow_learner", &slow_learner, "learner slowed down by chaos.slow_factor (-1: none)");
  s.bind("chaos.slow_factor", &slow_factor, "step-time factor of the slow learner",
         [this] { return slow_factor >= 1 ? "" : "chaos.slow_factor must be ≥ 1"; });
  s.bind("chaos.seed", &seed, "seed of the chaos schedule");
}

void RuntimeConfig::bind(ConfigSchema& s) {
  sync.learners_auto_ok = true;  // `deloco run`: 0 = one learner per core
  run.bind(s);
  AlgorithmConfig::bind(s);
  net.bind(s);
  syncer.bind(s);
  learner.bind(s);
  chaos.bind(s);
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
  if (chaos.slow_learner >= resolved_learners())
    throw ConfigError("chaos.slow_learner names learner " + std::to_string(chaos.slow_learner) + " of " +
                      std::to_string(resolved_learners()));
}

}  // namespace deloco
