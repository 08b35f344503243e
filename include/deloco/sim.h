// deloco/sim.h — the deterministic discrete-event simulator behind `deloco sim` (docs/sim.md).
//
// M learners, each a real Trainer (own model replica, own data shard, AdamW), and one Syncer (deloco/sync.h) live
// in one process. Time is virtual: an event queue ordered by (time, sequence number) drives everything, so a run
// is a pure function of (config, seed): the same inputs give bit-identical metrics and parameters (same build,
// same thread count). Step times are base × speed factor × straggler factor × jitter (seeded per learner);
// a transfer takes latency + bytes / bandwidth (or waits its turn on queued links: SimOptions::queued_links). A chaos schedule injects learner failures (Poisson with a mean
// time between failures, or listed times), downtime and rejoin (the rejoining learner receives the current global
// parameters), stragglers and syncer pauses.
//
// Definitions reported in the summary:
//  * uptime  = 1 − (virtual time during which global training is stalled) / (total virtual time); it is stalled
//              while some fragment holds contributions but fewer than the quorum, while the syncer is paused with
//              contributions waiting, or while no learner is up.
//  * goodput = (virtual time learners spent in completed inner steps) / (M × total virtual time).
//  * outer_steps = number of fragment merges (P per full model sync).
// Errors: inconsistent configs throw ConfigError/SyncError from validate() before any model is built.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deloco/algorithm.h"
#include "deloco/gpt/config.h"
#include "deloco/workload.h"

namespace deloco {

class ConfigSchema;
class Corpus;  // deloco/gpt/data.h

struct SimOptions {
  double step_time = 1.0;              // seconds per inner step of a speed-1 learner
  std::vector<double> speed_factors;   // per learner multiplier of the step time (missing: 1)
  double slow_fraction = 0.0;          // the last ⌊fraction·M⌋ learners are slow ...
  double slow_factor = 1.0;            // ... by this factor (applied on top of speed_factors)
  double jitter = 0.0;                 // relative standard deviation of each step time
  double latency = 0.0;                // seconds per message
  double bandwidth = 0.0;              // bytes per second per learner link (0: infinite)
  // Queued links (false: every transfer independent, latency + bytes / bandwidth, as many at once as are sent).
  // true: each direction of each link is a queue that carries one transfer at a time, first come first served: a
  // learner's uplink and downlink at `bandwidth`, and, when syncer_bandwidth > 0, the syncer's own inbound and
  // outbound link, shared by every learner. A transfer waits until every link on its path is free, then takes
  // latency + bytes / (the slowest of their rates). Models the testbed, where the syncer's host link carries every
  // push in and every broadcast out (bursts of pushes then take their sum, not the time of one).
  bool queued_links = false;
  double syncer_bandwidth = 0.0;       // bytes per second each way of the syncer's link (0: not a bottleneck)
  // At the end, also evaluate each learner's own final parameters and their plain mean on the global model's
  // validation tokens (summary: learners_val_loss, learners_mean_val_loss): how far the global model lags what
  // the learners hold (M + 1 more evaluations).
  bool eval_learners = false;
  double merge_time = 0.0;             // seconds the syncer spends merging one fragment
  double eval_interval = 0.0;          // virtual seconds between evaluations of the global model (0: end only)
  double max_time = 0.0;               // stop at this virtual time (0: when every learner finished train.steps)
  int64_t log_every = 10;              // learner-loss records every this many inner steps
  int64_t seed = 1;                    // jitter and chaos randomness
  std::string out_dir;                 // run folder of `deloco sim` ("" : runs/<config>-<time>)
  // Chaos.
  double mtbf = 0.0;                   // mean virtual time between failures of one learner (0: none)
  std::vector<double> fail_times;      // listed failures: at fail_times[i] learner fail_learners[i] fails
  std::vector<int64_t> fail_learners;
  double downtime = 0.0;               // seconds a failed learner stays down before rejoining
  std::vector<double> straggler_times;  // at straggler_times[i] learner straggler_learners[i] slows down
  std::vector<int64_t> straggler_learners;
  double straggler_duration = 0.0;
  double straggler_factor = 1.0;
  std::vector<double> pause_times;     // the syncer pauses at these times ...
  double pause_duration = 0.0;         // ... for this long
};

// The algorithm (sync.*, merge.*, outer.*, the push and broadcast codecs: deloco/algorithm.h) plus the simulated
// cluster (sim.*).
struct SimConfig : AlgorithmConfig {
  SimOptions sim;
  void bind(ConfigSchema& schema);      // the algorithm's keys and sim.*
  // Cross-checks with the run config (resolving the preset's outer optimizer first); throws ConfigError naming the
  // key.
  void validate(const RunConfig& run) const;
};

// Summary: the fields every run summary shares (command, final_val_loss, val_bpb, loss_unit, tokens, outer_steps,
// uptime, goodput, ...) plus simulator specifics.
struct SimResult {
  nlohmann::json summary;
};

// The run config a simulation trains with: `run`, except that train.precision = "auto" becomes "fp32". Outside the
// simulator, auto times fp32 and bf16 matmuls and takes the faster (deloco/gpt/precision.h); where the two are close
// that choice flips on timing noise, and one run of a simulation would then train in another precision than the
// next. A simulation is a function of its config, so it trains in bf16 only when train.precision = "bf16" says so.
// And train.optimizer = "auto" becomes merge.preset's inner optimizer (resolve_inner_optimizer, deloco/algorithm.h).
RunConfig simulated_run(const RunConfig& run, const AlgorithmConfig& algo);

class Simulator {
 public:
  // Builds M workloads with `workloads(m, M)` (every learner starts from learner 0's initial parameters) plus one
  // evaluator `workloads(0, 1)`, and the syncer. `run` gives train.steps and the logging cadence. Throws on
  // inconsistent configs.
  Simulator(const RunConfig& run, const SimConfig& cfg, WorkloadFactory workloads);
  // The built-in GPT on `corpus` (gpt_workloads).
  Simulator(const RunConfig& run, const SimConfig& cfg, std::shared_ptr<const Corpus> corpus);
  ~Simulator();

  // Runs to the end. `record` receives every metrics record (JSON objects with "kind" and "t").
  SimResult run(const std::function<void(const nlohmann::json&)>& record = nullptr);

  // Called right after a rejoining learner installed the global parameters (tests use it).
  std::function<void(int64_t learner, std::vector<std::pair<std::string, at::Tensor>>& local,
                     const std::vector<std::pair<std::string, at::Tensor>>& global)>
      on_rejoin;

  const std::vector<std::pair<std::string, at::Tensor>>& global() const;
  Workload& learner(int64_t m);
  const Syncer& syncer() const;
  const std::string& precision() const;  // train.precision as the learners train: fp32 or bf16 (simulated_run)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deloco
