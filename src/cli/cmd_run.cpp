// `deloco run`: the main job on one machine (DESIGN.md §1, §4). Parses the config, creates the run folder, then
// hands over to run::LocalCluster (src/run/cluster.h: a syncer and M learner processes of this executable, live
// view, chaos, restarts), and writes summary.json and the short report.
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/gpt/data.h"
#include "deloco/gpt/train.h"
#include "deloco/runtime.h"
#include "demo_config.h"
#include "records/summary.h"
#include "run/cluster.h"
#include "run/summary.h"
#include "util/fs.h"
#include "util/stop_signals.h"

namespace deloco::cli {
namespace fs = std::filesystem;
using nlohmann::json;
namespace {

struct RunArgs {
  CommonOptions common;
  std::vector<std::string> learner_commands;  // "N=COMMAND"
  std::string testbed_script;                 // --testbed-script ("" : the state file's, else the source tree's)
  std::string testbed_user;                   // --testbed-user ("" : SUDO_UID/SUDO_GID)
};

// --learner-command N=COMMAND, checked against the run's learners.
std::map<int64_t, std::string> parse_learner_commands(const std::vector<std::string>& given, int64_t M,
                                                      const RuntimeConfig& cfg) {
  std::map<int64_t, std::string> out;
  for (const auto& g : given) {
    const size_t eq = g.find('=');
    int64_t n = -1;
    try {
      size_t used = 0;
      if (eq != std::string::npos) n = std::stoll(g.substr(0, eq), &used);
      if (eq == std::string::npos || used != eq) n = -1;
    } catch (const std::exception&) {
      n = -1;
    }
    if (n < 0 || eq + 1 >= g.size())
      throw ConfigError("--learner-command '" + g + "': write it as N=COMMAND, N a learner id");
    if (n >= M)
      throw ConfigError("--learner-command " + std::to_string(n) + ": the run has learners 0.." + std::to_string(M - 1) +
                        " (sync.learners=" + std::to_string(M) + ")");
    if (out.count(n) != 0) throw ConfigError("--learner-command " + std::to_string(n) + " is given twice");
    if (cfg.learner.ranks > 1)
      throw ConfigError("--learner-command needs learner.ranks=1 (a learner command is one process)");
    out[n] = g.substr(eq + 1);
  }
  return out;
}

// A sharded syncer: every shard checkpointed only its fragments. The global model is their union, committed as the
// run folder's own checkpoint (so `deloco eval --checkpoint RUN` and the commands use_the_model prints work as for
// one syncer), and its validation loss is the run's final one.
void assemble_and_evaluate(const RuntimeConfig& cfg, const std::string& dir, rec::RunSummary& summary) {
  std::vector<std::string> shards;
  for (int64_t s = 0; s < cfg.syncer.shards; ++s) shards.push_back((fs::path(dir) / ("shard-" + std::to_string(s))).string());
  try {
    const AssembledModel m = assemble_shards(shards, dir);
    summary.extra["checkpoint"] = m.dir;
    auto corpus = std::make_shared<const Corpus>(Corpus::load(cfg.run.data));
    std::unique_ptr<Workload> w = gpt_workloads(cfg.run, corpus)(0, 1);
    const Checkpoint ck = read_checkpoint(m.dir, /*with_optimizer=*/false);
    load_parameters(w->parameters(), ck.model, ck.dir);
    const EvalResult r = w->evaluate();
    summary.final_val_loss = r.loss;
    summary.val_bpb = r.bpb;
    summary.loss_unit = r.loss_unit;
    summary.extra["final_eval"] = "assembled from " + std::to_string(shards.size()) + " shards (" + std::to_string(m.merges) + " merges)";
  } catch (const std::exception& e) {
    summary.extra["assemble_error"] = e.what();
    std::cerr << "deloco run: could not assemble the global model from the shards: " << e.what() << "\n";
  }
}

void run_run(const RunArgs& args) {
  RuntimeConfig cfg;
  ConfigSchema schema;
  cfg.bind(schema);
  apply_config(schema, args.common, NoConfig::kDemo);
  // On a testbed the links are the point: pushes and broadcasts fitted to each link (net.encoding = auto,
  // net.broadcast_encoding = auto; docs/runtime.md) unless the config or a --set names its own.
  std::vector<std::string> sets = args.common.sets;
  if (!cfg.testbed.name.empty())
    for (const char* key : {"net.encoding", "net.broadcast_encoding"})
      if (!schema.assigned(key)) {
        const std::string kv = std::string(key) + "=auto";
        schema.apply_override(kv, "deloco run on a testbed");
        sets.push_back(kv);
      }
  cfg.validate();
  const bool demo = runs_demo(args.common, NoConfig::kDemo);
  const int64_t M = cfg.resolved_learners();
  const bool auto_m = cfg.sync.learners == 0;
  cfg.sync.learners = M;  // resolved once; every child gets --set sync.learners=M
  const std::string dir = new_run_dir(cfg.syncer.out_dir, args.common, demo ? "demo" : "run",
                                      "choose another with --set syncer.out_dir=DIR");
  fs::create_directories(dir);
  write_file_atomic((fs::path(dir) / "config.json").string(), schema.to_json().dump(2) + "\n");

  run::ChildConfig children{args.common.config_path, sets, parse_learner_commands(args.learner_commands, M, cfg)};
  if (cfg.testbed.name.empty() && (!args.testbed_script.empty() || !args.testbed_user.empty()))
    throw ConfigError(std::string(args.testbed_script.empty() ? "--testbed-user" : "--testbed-script") +
                      " is for a run on a testbed: set testbed.name too (docs/testbed.md)");
  run::LocalCluster cluster(cfg, children, M, dir, {args.testbed_script, args.testbed_user, build_source_tree()});
  cluster.prepare();
  TrainConfig inner = cfg.run.train;  // what the learners resolve train.optimizer = auto to
  resolve_inner_optimizer(inner, cfg.merge.preset);
  std::cerr << "deloco run: " << M << " learner" << (M == 1 ? "" : "s") << (auto_m ? " (one per core)" : "")
            << ", K=" << cfg.sync.quorum << ", P=" << cfg.sync.fragments << ", H=" << cfg.sync.sync_every
            << (cfg.sync.grace ? ", grace" : "") << ", inner " << inner.optimizer << ", merge " << cfg.merge.preset
            << (cfg.merge.method.empty() ? "" : "/" + cfg.merge.method) << ", outer " << cfg.outer.kind
            << (cfg.net.plaintext ? ", plaintext" : ", CURVE") << (cfg.chaos.enabled ? ", chaos on" : "")
            << "\nconfig: " << (demo ? std::string(kDemoConfigOrigin) : args.common.config_path)
            << "\nrun folder: " << dir << " (logs in " << dir << "/logs)\n";
  // The cluster's summary (the syncer's, with the run's own fields) is kept whole; the assembled model's evaluation
  // sets the typed loss fields over it.
  rec::RunSummary run_summary;
  try {
    run_summary.extra = cluster.run(install_stop_signals());
  } catch (...) {
    restore_stop_signals();
    throw;
  }
  restore_stop_signals();
  if (cfg.syncer.shards > 1 && !run_summary.extra.contains("interrupted")) assemble_and_evaluate(cfg, dir, run_summary);
  run_summary.extra["config"] = schema.to_json();
  const std::string summary_file = (fs::path(dir) / "summary.json").string();
  rec::write_summary_file(summary_file, run_summary);
  const json summary = run_summary.to_json();
  write_summary(args.common, summary);
  if (summary.contains("interrupted"))
    throw std::runtime_error("interrupted (" + summary.at("interrupted").get<std::string>() +
                             "): every process was stopped; partial summary in " + summary_file);
  std::cout << run::final_report(summary, summary_file) << run::use_the_model(self_command(), dir);
  if (summary.contains("syncer_summary_missing"))
    throw std::runtime_error("the syncer wrote no summary; see " + dir + "/logs/syncer.log");
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand(
      "run", "the main job on one machine: a syncer and M learner processes over the real transport, with chaos");
  add_common_options(sub, &args->common);
  sub->add_option("--learner-command", args->learner_commands,
                  "N=COMMAND: learner N is this program of yours instead of `deloco learner` (e.g. a PyTorch script "
                  "with the Python module, docs/python.md); repeatable")
      ->type_name("N=CMD");
  sub->add_option("--testbed-script", args->testbed_script,
                  "on a testbed with chaos.net: the testbed script to run (as root) to change links; it and its "
                  "folders must be writable by no one but root (default: the one the state file names, else the "
                  "source tree's this binary was built from; docs/testbed.md)")
      ->type_name("PATH");
  sub->add_option("--testbed-user", args->testbed_user,
                  "on a testbed, run as root: the user (name or uid) the processes inside the hosts run as (default: "
                  "the one who ran sudo, SUDO_UID/SUDO_GID; \"root\" keeps root)")
      ->type_name("USER");
  sub->callback([args] { run_run(*args); });
}

}  // namespace deloco::cli
