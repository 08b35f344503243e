// deloco/embed.h — a learner whose training loop is the caller's: a PyTorch script through the Python module
// (python/, docs/python.md), or any C++ program that trains its own model and optimizer. The caller keeps its data
// loading, optimizer and precision; deloco does the rest exactly as `deloco learner` does, through the same
// LearnerNode (deloco/runtime.h) and learner core (deloco/learner.h): the join and state download, the counters, the
// pushes in net.encoding with error feedback, applying merged fragments, rejoining a syncer that went away.
//
// Use
//   EmbeddedLearner L(opts, named_parameters);   // loads the config, joins: the model now holds the global Θ
//   for (int64_t s = L.start_step(); !L.done(); ++s) {
//     ... forward, backward, optimizer step on the same parameter tensors ...
//     L.step(tokens, loss);                      // may change the parameters in place (a merged fragment)
//   }
//   L.close();                                   // the goodbye; the summary
//
// Contract
//  * The parameters: named float32 tensors on any device, each defined and dense, names unique; the same names,
//    order and shapes as the run's model (its fingerprint is checked by the syncer: another model is refused, and
//    step() then throws naming both fingerprints). deloco updates them in place, outside autograd, only inside the
//    constructor and step(); the caller must not reallocate them (optimizers update in place, which is fine).
//  * The config: a TOML file, or the JSON of `deloco run` (RUN/config.json), then DELOCO_SET (overrides, one
//    "section.key=value" per line), then the options' `sets`; the environment of `deloco learner` (deloco/runtime.h
//    apply_node_environment, DELOCO_LEARNER_ID); the options' connect/keys last. Learner-local state
//    (learner.state_dir) is not written: the caller owns its optimizer and saves it itself. learner.ranks must be 1.
//  * Records go to OUT/learner-N.jsonl as `deloco learner` writes them, so `deloco run`'s live view, summaries and
//    `deloco report` read a caller-trained learner like any other.
//  * Errors: ConfigError (config, id, parameters), IoError (records file), RefusedError (refused by the
//    syncer for good), TransportError (comms failure), std::logic_error (calls out of order), each with a message
//    naming the problem (all but the last are deloco::Error, deloco/error.h).
//  * Not thread-safe: one thread calls it (the comms thread is deloco's own).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace deloco {

struct EmbeddedLearnerOptions {
  std::string config;             // config file; "" : DELOCO_CONFIG (one of them is required)
  std::vector<std::string> sets;  // "section.key=value", applied after DELOCO_SET's
  int64_t learner_id = -1;        // -1: DELOCO_LEARNER_ID
  std::string connect;            // syncer endpoint(s); "" : DELOCO_SYNCER, else net.address
  std::string secret_key;         // own .key file; "" : DELOCO_SECRET_KEY, else net.secret_key
  std::string syncer_key;         // the syncer's .pub file; "" : DELOCO_SERVER_KEY, else net.server_key
  std::string out;                // folder of learner-N.jsonl; "" : DELOCO_OUT, else syncer.out_dir, else runs/learner-N
};

// The config an EmbeddedLearner with these options would run with ({"section": {"key": value}}), without joining:
// what a script reads before it builds its model (the model file, the data). Throws ConfigError as the constructor.
nlohmann::json read_learner_config(const EmbeddedLearnerOptions& opts);

class LearnerNode;
struct RuntimeConfig;
namespace rec {
class RecordWriter;
}

class EmbeddedLearner {
 public:
  // Loads and checks the config and the parameters, dials the syncer and joins (waits up to net.join_timeout for
  // the global state, which it installs into the parameters; without a syncer it trains on alone and joins later).
  EmbeddedLearner(const EmbeddedLearnerOptions& opts, std::vector<std::pair<std::string, at::Tensor>> params);
  // A learner not closed leaves with reason "stop" (errors swallowed). In a process forked from the one that made
  // it (e.g. a DataLoader worker), destruction does nothing: the parent's learner is the parent's.
  ~EmbeddedLearner();
  EmbeddedLearner(const EmbeddedLearner&) = delete;
  EmbeddedLearner& operator=(const EmbeddedLearner&) = delete;

  int64_t learner_id() const { return id_; }
  int64_t start_step() const { return start_step_; }  // the step to train next after the join (a restart resumes)
  int64_t steps_done() const;                          // inner steps counted so far (start_step + steps trained)
  int64_t total_steps() const;                         // train.steps
  bool done() const { return done_; }                  // train.steps reached, stop requested, or closed
  const RuntimeConfig& config() const;
  nlohmann::json config_json() const { return config_json_; }  // every key, as `deloco learner` would see it

  // One inner step was trained on `tokens` tokens with training loss `loss` (for the records): counts it, sends
  // the pushes due, applies the merged fragments whose time has come, and waits if the algorithm says so. Returns
  // whether to train another step (false once train.steps are done or stop() was called).
  bool step(int64_t tokens, double loss);
  void stop() { stop_.store(true); }                   // the next step() returns false; thread-safe
  // The goodbye ("done" when train.steps were trained, else "stop") and the summary. Idempotent: later calls
  // return the same summary.
  nlohmann::json close();

 private:
  int64_t id_ = 0, start_step_ = 0;
  int owner_pid_ = 0;  // the process that constructed it (a forked child's copy does nothing on destruction)
  bool done_ = false, closed_ = false;
  double last_ = 0;  // steady-clock seconds when the caller's current step began
  nlohmann::json config_json_, summary_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<rec::RecordWriter> records_;
  std::unique_ptr<LearnerNode> node_;
};

}  // namespace deloco
