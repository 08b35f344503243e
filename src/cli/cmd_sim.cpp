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
#include "util/fs.h"

namespace deloco::cli {
namespace fs = std::filesystem;
namespace {

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
  std::ofstream metrics((fs::path(dir) / "metrics.jsonl").string());
  if (!metrics) throw IoError("cannot open '" + dir + "/metrics.jsonl' for writing");
  std::cerr << "deloco sim: " << cfg.sync.learners << " learners, K=" << cfg.sync.quorum << ", P=" << cfg.sync.fragments
            << ", H=" << cfg.sync.sync_every << ", tau=" << cfg.sync.overlap << (cfg.sync.grace ? ", grace" : "")
            << ", merge " << cfg.merge.preset << (cfg.merge.method.empty() ? "" : "/" + cfg.merge.method) << ", outer "
            << cfg.outer.kind << " lr " << cfg.outer.lr << "; run folder " << dir << "\n";
  const auto t0 = std::chrono::steady_clock::now();
  SimResult res = sim.run([&](const nlohmann::json& j) {
    metrics << j.dump() << "\n";
    const std::string kind = j["kind"];
    if (kind == "eval" || kind == "final_eval") {
      std::cerr << std::fixed << std::setprecision(1) << "t=" << j["t"].get<double>() << "s tokens "
                << j["tokens"].get<int64_t>() << " outer " << j["outer_steps"].get<int64_t>() << ": val loss "
                << std::setprecision(4) << j["val_loss"].get<double>() << "\n";
    } else if (kind == "fail" || kind == "rejoin") {
      std::cerr << std::fixed << std::setprecision(1) << "t=" << j["t"].get<double>() << "s learner "
                << j["learner"].get<int64_t>() << " " << kind << "\n";
    }
  });
  metrics.flush();
  res.summary["wall_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.summary["run_dir"] = dir;
  res.summary["config"] = schema.to_json();
  write_file_atomic((fs::path(dir) / "summary.json").string(), res.summary.dump(2) + "\n");
  write_summary(args.common, res.summary);
  std::cout << std::fixed << std::setprecision(4) << "final val loss " << res.summary["final_val_loss"].get<double>()
            << " (start " << res.summary["initial_val_loss"].get<double>() << "), uptime "
            << res.summary["uptime"].get<double>() << ", goodput " << res.summary["goodput"].get<double>() << ", "
            << res.summary["outer_steps"].get<int64_t>() << " fragment merges, "
            << res.summary["contributions_merged"].get<int64_t>() << " contributions merged, "
            << res.summary["contributions_rejected"].get<int64_t>() << " rejected, "
            << res.summary["failures"].get<int64_t>() << " failures; " << std::setprecision(1)
            << res.summary["virtual_seconds"].get<double>() << " virtual s\nsummary: "
            << (fs::path(dir) / "summary.json").string() << "\n";
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
