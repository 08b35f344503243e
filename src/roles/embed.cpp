// The caller-trained learner (deloco/embed.h): a LearnerNode in step-driven use over the caller's own parameters.
#include "deloco/embed.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "deloco/config.h"
#include "deloco/gpt/model.h"
#include "deloco/runtime.h"
#include "records/record.h"
#include "util/env.h"
#include "util/fs.h"

namespace deloco {
namespace fs = std::filesystem;
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A model trained by the caller: what a learner node needs of it (names, shapes, fingerprint) and a step count.
// The node never calls inner_step() in step-driven use.
class CallerTrainedModel : public Workload {
 public:
  explicit CallerTrainedModel(std::vector<std::pair<std::string, at::Tensor>> params)
      : params_(std::move(params)), fingerprint_(model_fingerprint(params_)) {}
  std::vector<std::pair<std::string, at::Tensor>>& parameters() override { return params_; }
  StepResult inner_step() override { throw std::logic_error("a caller-trained model is trained by its caller"); }
  EvalResult evaluate() override { throw std::logic_error("a caller-trained model is evaluated by its caller"); }
  int64_t step() const override { return step_; }
  void set_step(int64_t step) override { step_ = step; }
  std::map<std::string, at::Tensor> optimizer_state() const override { return {}; }
  void load_optimizer_state(const std::map<std::string, at::Tensor>&) override {}
  std::string fingerprint() const override { return fingerprint_; }

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::string fingerprint_;
  int64_t step_ = 0;
};

void check_parameters(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  if (params.empty()) throw ConfigError("the model has no parameters to train");
  std::set<std::string> seen;
  for (const auto& [name, t] : params) {
    if (!seen.insert(name).second) throw ConfigError("parameter '" + name + "' is given twice");
    if (!t.defined()) throw ConfigError("parameter '" + name + "' is an undefined tensor");
    if (t.is_sparse()) throw ConfigError("parameter '" + name + "' is sparse; deloco syncs dense tensors");
    if (t.scalar_type() != at::kFloat)
      throw ConfigError("parameter '" + name + "' is " + std::string(c10::toString(t.scalar_type())) +
                        "; deloco syncs float32 parameters (keep the master weights in float32 and use autocast "
                        "for bf16 compute)");
  }
}

void load_config_file(ConfigSchema& schema, const std::string& path) {
  if (fs::path(path).extension() == ".json") {
    std::ifstream in(path);
    if (!in) throw ConfigError("cannot read config '" + path + "'");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError("config '" + path + "' is not valid JSON: " + e.what());
    }
    schema.from_json(j, path);
  } else {
    schema.load_file(path);
  }
}

// The one load order (deloco/config.h's load_config): the config file, the environment (addresses and keys, then
// DELOCO_SET), the options' sets, the options' connect/keys; validated.
void load_learner_config(ConfigSchema& schema, RuntimeConfig& cfg, const EmbeddedLearnerOptions& opts) {
  const std::string path = !opts.config.empty() ? opts.config : environment_string("DELOCO_CONFIG");
  if (path.empty())
    throw ConfigError("give the run's config: config=PATH (a TOML file, or RUN/config.json of `deloco run`) or "
                      "DELOCO_CONFIG");
  ConfigSources src;
  src.base = [&] { load_config_file(schema, path); };
  src.environment = [&] { apply_node_environment(cfg, NodeRole::kLearner); };
  src.sets = opts.sets;
  src.flags = [&] {
    if (!opts.connect.empty()) cfg.net.address = opts.connect;
    if (!opts.secret_key.empty()) cfg.net.secret_key = opts.secret_key;
    if (!opts.syncer_key.empty()) cfg.net.server_key = opts.syncer_key;
  };
  load_config(schema, src);
  cfg.validate();
}

}  // namespace

nlohmann::json read_learner_config(const EmbeddedLearnerOptions& opts) {
  ConfigSchema schema;
  RuntimeConfig cfg;
  cfg.bind(schema);
  load_learner_config(schema, cfg, opts);
  return schema.to_json();
}

EmbeddedLearner::EmbeddedLearner(const EmbeddedLearnerOptions& opts,
                                 std::vector<std::pair<std::string, at::Tensor>> params)
    : owner_pid_(static_cast<int>(::getpid())) {
  check_parameters(params);
  ConfigSchema schema;
  RuntimeConfig cfg;
  cfg.bind(schema);
  load_learner_config(schema, cfg, opts);
  if (cfg.learner.ranks != 1)
    throw ConfigError("learner.ranks=" + std::to_string(cfg.learner.ranks) +
                      ": a caller-trained learner is one process; set learner.ranks=1 (a data-parallel group of "
                      "your own can run inside the script, with rank 0 alone calling deloco)");
  id_ = opts.learner_id >= 0 ? opts.learner_id : environment_integer("DELOCO_LEARNER_ID", -1);
  if (id_ < 0) throw ConfigError("give the learner id: learner_id=N or DELOCO_LEARNER_ID");
  cfg.require_explicit_learners("an embedded learner");
  if (id_ >= cfg.resolved_learners())
    throw ConfigError("learner id " + std::to_string(id_) + " is not in [0, sync.learners=" +
                      std::to_string(cfg.resolved_learners()) + ")");
  cfg.learner.state_dir.clear();  // the caller owns its optimizer state
  config_json_ = schema.to_json();

  std::string dir = !opts.out.empty() ? opts.out : environment_string("DELOCO_OUT");
  if (dir.empty()) dir = cfg.syncer.out_dir;
  if (dir.empty()) dir = "runs/learner-" + std::to_string(id_);
  fs::create_directories(dir);
  records_ = std::make_unique<rec::RecordWriter>((fs::path(dir) / ("learner-" + std::to_string(id_) + ".jsonl")).string());

  auto model = std::make_unique<CallerTrainedModel>(std::move(params));
  const TransportOptions topts = node_transport_options(cfg, *model, NodeRole::kLearner);
  LearnerLinks links = dial_learner_links(cfg, topts);
  rec::RecordWriter* sink = records_.get();
  node_ = std::make_unique<LearnerNode>(cfg, id_, std::move(links.syncers), std::move(model),
                                        [sink](const nlohmann::json& j) { sink->write_json(j); });
  if (!links.standbys.empty()) node_->standbys(std::move(links.standbys));  // a standby syncer pair per shard
  node_->peers(std::move(links.serve), links.serve_key, links.donor_options);  // rejoin from peers (net.serve)
  start_step_ = node_->start(stop_);
  done_ = !node_->next(stop_);  // the first boundary: a state installed at the join is applied before step 0
  last_ = seconds_now();
}

EmbeddedLearner::~EmbeddedLearner() {
  // A forked child (a DataLoader worker) holds a copy of this object but not its comms thread or sockets: it must
  // neither say goodbye for the parent nor join a thread it does not have. Its copies are left to the exit.
  if (::getpid() != owner_pid_) {
    (void)node_.release();
    (void)records_.release();
    return;
  }
  try {
    close();
  } catch (...) {
  }
}

int64_t EmbeddedLearner::steps_done() const { return node_->step(); }
int64_t EmbeddedLearner::total_steps() const { return node_->config().run.train.steps; }
const RuntimeConfig& EmbeddedLearner::config() const { return node_->config(); }

bool EmbeddedLearner::step(int64_t tokens, double loss) {
  if (closed_) throw std::logic_error("step() after close()");
  if (done_)
    throw std::logic_error("step() after training ended (train.steps=" + std::to_string(total_steps()) +
                           " reached or stop requested): check done() or step()'s result");
  if (tokens < 0) throw std::invalid_argument("tokens must be ≥ 0, got " + std::to_string(tokens));
  const double t = seconds_now();
  StepResult r;
  r.tokens = tokens;
  r.loss = loss;
  node_->stepped(r, t - last_);
  done_ = !node_->next(stop_);
  last_ = seconds_now();
  return !done_;
}

nlohmann::json EmbeddedLearner::close() {
  if (closed_) return summary_;
  closed_ = true;
  done_ = true;
  summary_ = node_->finish();
  return summary_;
}

}  // namespace deloco
