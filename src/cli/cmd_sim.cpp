// `deloco sim`: M learners and the syncer in one process on a virtual clock (deloco/sim.h).
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <thread>

#include <torch/torch.h>

#include "commands.h"
#include "common.h"
#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "deloco/sim.h"
#include "records/kinds.h"
#include "records/summary.h"
#include "util/fs.h"

namespace deloco::cli {
namespace fs = std::filesystem;
namespace {

// A number of a record or summary read back: a NaN was written as null.
double number_or_nan(const std::optional<double>& v) { return v ? *v : std::nan(""); }

struct SimArgs {
  CommonOptions common;
};

void run_sim(const SimArgs& args) {
  RunConfig run;
  SimConfig cfg;
  ConfigSchema schema;
  run.bind(schema);
  cfg.bind(schema);
  apply_config(schema, args.common);
  cfg.validate(run);  // fail fast, before the corpus or any model is built

  const std::string dir =
      new_run_dir(cfg.sim.out_dir, args.common, "sim", "choose another with --set sim.out_dir=DIR");
  configure_threads(run.train.threads);

  auto corpus = std::make_shared<const Corpus>(Corpus::load(run.data));
  Simulator sim(run, cfg, corpus);
  fs::create_directories(dir);
  write_file_atomic((fs::path(dir) / "config.json").string(), schema.to_json().dump(2) + "\n");
  rec::RecordWriter metrics((fs::path(dir) / "metrics.jsonl").string());
  std::cerr << "deloco sim: " << cfg.sync.learners << " learners, K=" << cfg.sync.quorum << ", P=" << cfg.sync.fragments
            << ", H=" << cfg.sync.sync_every << ", tau=" << cfg.sync.overlap << (cfg.sync.grace ? ", grace" : "")
            << ", inner " << simulated_run(run, cfg).train.optimizer << ", merge " << cfg.merge.preset
            << (cfg.merge.method.empty() ? "" : "/" + cfg.merge.method) << ", outer "
            << cfg.outer.kind << " lr " << cfg.outer.lr << ", " << sim.precision()
            << (run.train.precision == "auto" ? " (train.precision = auto is fp32 in the simulator)" : "")
            << "; run folder " << dir << "\n";
  const auto t0 = std::chrono::steady_clock::now();
  SimResult res = sim.run([&](const nlohmann::json& j) {
    metrics.write_json(j);
    std::optional<rec::Eval> ev = rec::from_json<rec::Eval>(j);
    if (!ev) ev = rec::from_json<rec::FinalEval>(j);
    if (ev) {
      // val_loss null: NaN (a diverged model).
      const double loss = j.contains("val_loss") && j["val_loss"].is_number() ? ev->val_loss : std::nan("");
      std::cerr << std::fixed << std::setprecision(1) << "t=" << ev->t.value_or(0) << "s tokens " << ev->tokens
                << " outer " << ev->outer_steps.value_or(0) << ": val loss " << std::setprecision(4) << loss << "\n";
    } else if (auto f = rec::from_json<rec::Fail>(j)) {
      std::cerr << std::fixed << std::setprecision(1) << "t=" << f->t.value_or(0) << "s learner "
                << f->learner.value_or(-1) << " fail\n";
    } else if (auto r = rec::from_json<rec::Rejoin>(j)) {
      std::cerr << std::fixed << std::setprecision(1) << "t=" << r->t.value_or(0) << "s learner "
                << r->learner.value_or(-1) << " rejoin\n";
    }
  });
  rec::RunSummary summary = rec::RunSummary::from_json(res.summary);
  summary.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  summary.extra["run_dir"] = dir;
  summary.extra["config"] = schema.to_json();
  rec::write_summary_file((fs::path(dir) / "summary.json").string(), summary);
  res.summary = summary.to_json();
  write_summary(args.common, res.summary);
  std::cout << std::fixed << std::setprecision(4) << "final val loss " << number_or_nan(summary.final_val_loss)
            << " (start " << number_or_nan(summary.initial_val_loss) << "), uptime " << number_or_nan(summary.uptime)
            << ", goodput " << number_or_nan(summary.goodput) << ", " << summary.outer_steps.value_or(0)
            << " fragment merges, " << summary.contributions_merged.value_or(0) << " contributions merged, "
            << summary.contributions_rejected.value_or(0) << " rejected, " << summary.failures.value_or(0)
            << " failures; " << std::setprecision(1) << res.summary.value("virtual_seconds", 0.0)
            << " virtual s\nsummary: " << (fs::path(dir) / "summary.json").string() << "\n";
}

}  // namespace

void add_sim_command(CLI::App& app) {
  auto args = std::make_shared<SimArgs>();
  CLI::App* sub = app.add_subcommand(
      "sim", "simulate M learners and the syncer in one process on a virtual clock (DiLoCo, Streaming, Decoupled, IsoLoCo)");
  add_common_options(sub, &args->common);
  sub->callback([args] { run_sim(*args); });
}

}  // namespace deloco::cli
