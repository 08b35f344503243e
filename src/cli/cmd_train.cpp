// `deloco train`, `deloco eval`, `deloco sample`: the single-learner baseline and its tools.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include <torch/torch.h>

#include "commands.h"
#include "common.h"
#include "data/tokenizer.h"
#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/gpt/model.h"
#include "deloco/gpt/train.h"
#include "records/kinds.h"
#include "records/record.h"
#include "records/summary.h"
#include "train/run_checkpoint.h"
#include "util/blas.h"
#include "util/clock.h"
#include "util/fs.h"
#include "util/malloc_tuning.h"
#include "util/stop_signals.h"

namespace deloco::cli {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::shared_ptr<const Corpus> load_corpus(const DataConfig& d) { return std::make_shared<const Corpus>(Corpus::load(d)); }

std::string checkpoint_name(int64_t step) {
  std::ostringstream o;
  o << "step_" << std::setw(8) << std::setfill('0') << step;
  return o.str();
}

// Commits a checkpoint of `tr` into run folder `run` (util/checkpoint_store.h: recovery, commit by rename,
// "latest", pruning to the newest `keep`); a run resumed from an older checkpoint that reaches a step it already
// checkpointed gets a new folder, never a refusal or a skip.
// `elapsed_s` is the run's training time so far, over every process that trained it (a resumed run's records go on
// from it, so the report's time axis does not start again at 0).
std::string save_train_checkpoint(Trainer& tr, const ConfigSchema& schema, const std::string& run, int64_t keep,
                                  double elapsed_s) {
  nlohmann::json manifest = tr.position();
  manifest["config"] = schema.to_json();
  manifest["kind"] = "train";
  manifest["elapsed_s"] = elapsed_s;
  TensorFile opt = tr.optimizer_file();
  return save_run_checkpoint(run, checkpoint_name(tr.step()), manifest, parameters_to_file(tr.parameters()), &opt, keep)
      .dir;
}

class Progress {
 public:
  explicit Progress(int64_t total) : total_(total), tty_(::isatty(STDERR_FILENO)) {}
  void update(int64_t step, double loss, double tok_per_s, double lr, double eta_s) {
    std::ostringstream o;
    o << "step " << step << "/" << total_ << " | loss " << std::fixed << std::setprecision(4) << loss << " | "
      << std::setprecision(0) << tok_per_s << " tok/s | lr " << std::scientific << std::setprecision(2) << lr
      << " | ETA " << format_duration(eta_s);
    if (tty_) std::cerr << "\r" << o.str() << "\033[K" << std::flush;
    else std::cerr << o.str() << "\n";
  }
  void line(const std::string& s) {
    if (tty_) std::cerr << "\r\033[K";
    std::cerr << s << "\n";
  }

 private:
  int64_t total_;
  bool tty_;
};

struct TrainArgs {
  CommonOptions common;
  std::string resume;
  int64_t stop_at_step = 0;
};

void run_train(const TrainArgs& args) {
  RunConfig cfg;
  ConfigSchema schema;
  cfg.bind(schema);
  std::string run_dir;
  Checkpoint resume_ck;
  if (!args.resume.empty()) {
    if (!args.common.config_path.empty())
      throw ConfigError("--resume takes its config from the checkpoint; change keys with --set instead of --config");
    // A run folder is about to be written again: clear what a crash left (uncommitted temporaries, a stale
    // "latest") first. Its newest committed checkpoint is found by scanning, whatever "latest" says.
    std::error_code ec;
    if (!fs::exists(fs::path(args.resume) / "manifest.json", ec) && fs::is_directory(fs::path(args.resume) / "checkpoints", ec))
      recover_run_folder(args.resume);
    resume_ck = read_checkpoint(args.resume, /*with_optimizer=*/true);
    // Only a train checkpoint continues here (older ones carry no kind): a syncer's holds Θ and the outer state, and
    // `train --resume` would restart AdamW from nothing and write train checkpoints into the syncer's folder.
    if (const std::string kind = resume_ck.manifest.value("kind", std::string("train")); kind != "train")
      throw CheckpointError("'" + resume_ck.dir + "' is a " + kind + " checkpoint; deloco train --resume continues a " +
                            "train checkpoint" + (kind == "syncer" ? " (a syncer's: deloco syncer --resume)" : ""));
    if (!resume_ck.manifest.contains("config")) throw CheckpointError("checkpoint '" + resume_ck.dir + "' has no config");
    schema.from_json(resume_ck.manifest["config"], resume_ck.dir + "/manifest.json");
    cfg.train.out_dir.clear();  // continue in the checkpoint's own run folder unless --set names another
    const std::string ck_run = fs::path(resume_ck.dir).parent_path().parent_path().string();
    apply_config(schema, args.common);
    run_dir = cfg.train.out_dir.empty() ? ck_run : cfg.train.out_dir;
  } else {
    apply_config(schema, args.common);
    run_dir = new_run_dir(cfg.train.out_dir, args.common, "default",
                          "resume it with --resume " + (cfg.train.out_dir.empty() ? std::string("DIR") : cfg.train.out_dir) +
                              " or choose another with --set train.out_dir=DIR");
  }
  cfg.train.out_dir = run_dir;
  configure_threads(cfg.train.threads);

  auto corpus = load_corpus(cfg.data);
  Trainer tr(cfg, corpus);
  cfg.model = tr.config().model;  // a TorchScript module's V and T, so config.json and the manifests say them
  if (!args.resume.empty()) tr.restore(resume_ck);
  if (tr.step() >= cfg.train.steps)
    throw ConfigError("the run is already at step " + std::to_string(tr.step()) + " of train.steps=" +
                      std::to_string(cfg.train.steps) + "; raise train.steps with --set to continue");
  fs::create_directories(run_dir);
  if (!args.resume.empty()) recover_run_folder(run_dir);
  if (args.resume.empty()) write_file_atomic((fs::path(run_dir) / "config.json").string(), schema.to_json().dump(2) + "\n");
  rec::RecordWriter metrics((fs::path(run_dir) / "metrics.jsonl").string());

  int64_t n_params = 0;
  for (const auto& [name, p] : tr.parameters()) n_params += p.numel();
  const char* unit = corpus->is_text() ? " bytes" : " tokens";
  std::cerr << "deloco train: " << n_params << " parameters, " << corpus->train_tokens().size() << " training" << unit << ", "
            << corpus->val_tokens().size() << " validation" << unit << " (unigram entropy " << std::fixed << std::setprecision(3)
            << corpus->unigram_entropy_bits() << " bits/byte), " << torch::get_num_threads() << " threads, device "
            << cfg.train.device << (blas_description().empty() ? "" : ", " + blas_description())
            << (malloc_description().empty() ? "" : ", " + malloc_description()) << "\n"
            << "run folder: " << run_dir << (args.resume.empty() ? "" : " (resumed at step " + std::to_string(tr.step()) + ")")
            << "\n";
  const PrecisionChoice precision = tr.resolve_precision();  // train.precision = auto measures here, before step 1
  std::cerr << "precision: " << precision.describe() << "\n";

  const StopSignals& stop = install_stop_signals();
  const int64_t end_step = args.stop_at_step > 0 ? std::min(args.stop_at_step, cfg.train.steps) : cfg.train.steps;
  const int64_t tokens_per_step = cfg.train.batch_size * cfg.model.block_size;
  Progress progress(cfg.train.steps);
  const auto t_start = Clock::now();
  // The time the run had trained before this process (its checkpoint's elapsed_s; 0 for a new run or a checkpoint
  // of a deloco before it was recorded), so the records' elapsed_s keeps growing across a resume.
  double elapsed_before = 0;
  if (!args.resume.empty()) {
    const auto it = resume_ck.manifest.find("elapsed_s");
    if (it != resume_ck.manifest.end() && it->is_number() && std::isfinite(it->get<double>()) && it->get<double>() > 0)
      elapsed_before = it->get<double>();
  }
  auto elapsed = [&] { return elapsed_before + seconds_since(t_start); };
  double train_seconds = 0;          // time inside train_step, excluding the first few warm-up steps
  int64_t timed_steps = 0;
  const int64_t start_step = tr.step();
  EvalResult last_eval;
  bool have_eval = false;
  std::string last_ckpt;
  double loss_ema = 0;
  auto do_eval = [&] {
    auto t0 = Clock::now();
    last_eval = tr.evaluate();
    have_eval = true;
    rec::Eval e;
    e.step = tr.step();
    e.tokens = tr.tokens_seen();
    e.val_loss = last_eval.loss;
    e.val_bpb = last_eval.bpb;
    e.loss_unit = last_eval.loss_unit;
    e.elapsed_s = elapsed();
    e.eval_s = seconds_since(t0);
    metrics.write(e);
    std::ostringstream o;
    o << "eval @ step " << tr.step() << ": val loss " << std::fixed << std::setprecision(4) << last_eval.loss << ", "
      << std::setprecision(3) << last_eval.bpb << " bits/byte";
    progress.line(o.str());
  };

  while (tr.step() < end_step && !stop.requested) {
    auto t0 = Clock::now();
    const double lr = tr.current_lr();
    const double loss = tr.train_step();
    if (!std::isfinite(loss))
      throw std::runtime_error("training loss became " + std::to_string(loss) + " at step " + std::to_string(tr.step()) +
                               "; lower train.lr (the last checkpoint in " + run_dir + " is intact)");
    const double dt = seconds_since(t0);
    if (tr.step() - start_step > 3) {
      train_seconds += dt;
      ++timed_steps;
    }
    loss_ema = (tr.step() - start_step == 1) ? loss : 0.9 * loss_ema + 0.1 * loss;
    const double tps = timed_steps > 0 ? timed_steps * tokens_per_step / train_seconds : tokens_per_step / dt;
    if (tr.step() % cfg.train.log_every == 0 || tr.step() == end_step) {
      rec::Train t;
      t.step = tr.step();
      t.tokens = tr.tokens_seen();
      t.loss = loss;
      t.lr = lr;
      t.tokens_per_s = tps;
      t.elapsed_s = elapsed();
      metrics.write(t);
      progress.update(tr.step(), loss_ema, tps, lr, (cfg.train.steps - tr.step()) * tokens_per_step / std::max(tps, 1e-9));
    }
    if (cfg.train.eval_every > 0 && tr.step() % cfg.train.eval_every == 0 && tr.step() != cfg.train.steps) do_eval();
    if (cfg.train.checkpoint_every > 0 && tr.step() % cfg.train.checkpoint_every == 0 && tr.step() != end_step)
      last_ckpt = save_train_checkpoint(tr, schema, run_dir, cfg.train.keep_checkpoints, elapsed());
  }
  if (stop.requested) progress.line("interrupted: saving a checkpoint at step " + std::to_string(tr.step()));
  if (tr.step() == cfg.train.steps || !have_eval) do_eval();
  if (tr.step() > start_step || last_ckpt.empty())
    last_ckpt = save_train_checkpoint(tr, schema, run_dir, cfg.train.keep_checkpoints, elapsed());
  const double wall = seconds_since(t_start);
  const double tps = timed_steps > 0 ? timed_steps * tokens_per_step / train_seconds : 0.0;

  rec::RunSummary summary;
  summary.command = "train";
  summary.final_val_loss = last_eval.loss;
  summary.val_bpb = last_eval.bpb;
  summary.tokens = tr.tokens_seen();
  summary.wall_seconds = wall;
  summary.outer_steps = 0;  // one learner: no merges, no downtime, nothing sent
  summary.uptime = 1.0;
  summary.goodput = 1.0;
  summary.bytes_sent = 0;
  summary.contributions_merged = 0;
  summary.contributions_rejected = 0;
  summary.extra = {
      {"steps", tr.step()},
      {"tokens_per_s", tps},
      {"params", n_params},
      {"threads", torch::get_num_threads()},
      {"precision", precision.chosen},
      {"precision_setting", precision.setting},
      {"fp32_gflops", precision.fp32_gflops},
      {"bf16_gflops", precision.bf16_gflops},
      {"blas", blas_description()},
      {"malloc", malloc_description()},
      {"unigram_entropy_bits", corpus->unigram_entropy_bits()},
      {"run_dir", run_dir},
      {"checkpoint", last_ckpt},
      {"interrupted", stop.requested.load()},
  };
  rec::write_summary_file((fs::path(run_dir) / "summary.json").string(), summary);
  write_summary(args.common, summary.to_json());
  std::cout << "checkpoint: " << last_ckpt << "\nsummary:    " << (fs::path(run_dir) / "summary.json").string()
            << "\nval loss " << std::fixed << std::setprecision(4) << last_eval.loss << (corpus->is_text() ? " nats/byte, " : " nats/token, ") << std::setprecision(3)
            << last_eval.bpb << " bits/byte after " << tr.tokens_seen() << " tokens in " << format_duration(wall)
            << " (unigram entropy " << corpus->unigram_entropy_bits() << " bits/byte)\n";
  if (stop.requested) std::exit(130);
}

// Parameters holding NaN or Inf make every loss and sample meaningless: refuse the checkpoint, naming it and the
// first such tensor (by name) with its count of non-finite values.
void require_finite_parameters(const Checkpoint& ck) {
  for (const auto& [name, t] : ck.model.tensors) {
    if (!t.is_floating_point()) continue;
    const at::Tensor bad = torch::isfinite(t).logical_not();
    const int64_t n = bad.sum().item<int64_t>();
    if (n > 0)
      throw CheckpointError("checkpoint '" + ck.dir + "' holds non-finite parameters: tensor '" + name + "' has " +
                            std::to_string(n) + " NaN/Inf values of " + std::to_string(t.numel()) +
                            " (the run diverged before this checkpoint; use an earlier one)");
  }
}

// Builds a model from a checkpoint's config (plus --set overrides) and loads its parameters.
struct Loaded {
  RunConfig cfg;
  std::unique_ptr<Trainer> trainer;
  Checkpoint ck;
};
Loaded load_for_inference(const std::string& path, const CommonOptions& common) {
  Loaded l;
  ConfigSchema schema;
  l.cfg.bind(schema);
  l.ck = read_checkpoint(path, /*with_optimizer=*/false);
  if (!l.ck.manifest.contains("config")) throw CheckpointError("checkpoint '" + l.ck.dir + "' has no config");
  require_finite_parameters(l.ck);
  schema.from_json(l.ck.manifest["config"], l.ck.dir + "/manifest.json");
  apply_config(schema, common);
  configure_threads(l.cfg.train.threads);
  l.trainer = std::make_unique<Trainer>(l.cfg, load_corpus(l.cfg.data));
  l.trainer->restore(l.ck);
  return l;
}

// The tokenizer that decodes a token-trained model's samples: data.tokenizer, else tokenizer.model beside the data.
std::string tokenizer_path(const DataConfig& d) {
  if (!d.tokenizer.empty()) return d.tokenizer;
  const fs::path dir = fs::is_directory(d.path) ? fs::path(d.path) : fs::path(d.path).parent_path();
  const fs::path p = dir / "tokenizer.model";
  if (!fs::exists(p))
    throw ConfigError("the model was trained on token files ('" + d.path + "') but no tokenizer decodes its samples: '" +
                      p.string() + "' does not exist; name one with --set data.tokenizer=FILE");
  return p.string();
}

}  // namespace

void add_train_commands(CLI::App& app) {
  auto train_args = std::make_shared<TrainArgs>();
  CLI::App* train = app.add_subcommand("train", "train one learner alone (the data-parallel baseline), with checkpoints");
  add_common_options(train, &train_args->common);
  train->add_option("--resume", train_args->resume, "continue a run folder or checkpoint exactly where it stopped");
  train->add_option("--stop-at-step", train_args->stop_at_step,
                    "checkpoint and stop at this step without changing the schedule (resume later)");
  train->callback([train_args] { run_train(*train_args); });

  auto eval_args = std::make_shared<std::pair<CommonOptions, std::string>>();
  CLI::App* ev = app.add_subcommand("eval", "validation loss and bits per byte of a checkpoint");
  add_common_options(ev, &eval_args->first, /*with_config=*/false);
  ev->add_option("--checkpoint", eval_args->second, "checkpoint folder, or a run folder of deloco train, syncer or run (its newest checkpoint)")->required();
  ev->callback([eval_args] {
    auto l = load_for_inference(eval_args->second, eval_args->first);
    auto r = l.trainer->evaluate();
    if (!std::isfinite(r.loss))
      throw CheckpointError("evaluating checkpoint '" + l.ck.dir + "' gave a non-finite validation loss (" +
                            std::to_string(r.loss) + ") although its parameters are finite");
    const bool global = l.ck.manifest.value("kind", std::string()) == "syncer";
    std::cout << "checkpoint " << l.ck.dir << (global ? " (global model after " : " (step ") << l.trainer->step()
              << (global ? " merges" : "") << "): val loss " << std::fixed
              << std::setprecision(4) << r.loss << (l.cfg.data.format == "text" ? " nats/byte, " : " nats/token, ")
              << std::setprecision(3) << r.bpb << " bits/byte over "
              << r.tokens << " tokens\n";
    rec::RunSummary summary;
    summary.command = "eval";
    summary.final_val_loss = r.loss;
    summary.val_bpb = r.bpb;
    // "tokens": the validation tokens scored (not RunSummary::tokens, the tokens trained on)
    summary.extra = {{"checkpoint", l.ck.dir}, {"step", l.trainer->step()}, {"tokens", r.tokens}};
    write_summary(eval_args->first, summary.to_json());
  });

  struct SampleArgs {
    CommonOptions common;
    std::string checkpoint, prompt = "\n";
    SampleOptions opts;
  };
  auto sa = std::make_shared<SampleArgs>();
  CLI::App* sample = app.add_subcommand("sample", "generate text from a checkpoint");
  add_common_options(sample, &sa->common, /*with_config=*/false);
  sample->add_option("--checkpoint", sa->checkpoint, "checkpoint folder, or a run folder of deloco train, syncer or run (its newest checkpoint)")->required();
  sample->add_option("--prompt", sa->prompt, "text to continue");
  sample->add_option("--tokens", sa->opts.tokens, "tokens to generate (bytes for byte-level models)")->check(CLI::PositiveNumber);
  sample->add_option("--temperature", sa->opts.temperature, "softmax temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  sample->add_option("--top-k", sa->opts.top_k, "sample among the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  sample->add_option("--seed", sa->opts.seed, "sampling seed");
  sample->callback([sa] {
    auto l = load_for_inference(sa->checkpoint, sa->common);
    std::string out;
    if (l.cfg.data.format == "text") {
      out = sample_text(l.trainer->model(), sa->prompt, sa->opts);
    } else {
      const Tokenizer tok = Tokenizer::load(tokenizer_path(l.cfg.data));
      std::vector<int64_t> prompt;
      for (uint32_t id : tok.encode(sa->prompt.empty() ? "\n" : sa->prompt)) prompt.push_back(id);
      out = tok.decode(sample_tokens(l.trainer->model(), prompt, tok.vocab_size(), sa->opts));
    }
    std::cout << sa->prompt << out << "\n";
    rec::RunSummary summary;
    summary.command = "sample";
    summary.extra = {{"checkpoint", l.ck.dir}, {"prompt", sa->prompt}, {"bytes", static_cast<int64_t>(out.size())}};
    write_summary(sa->common, summary.to_json());
  });
}

}  // namespace deloco::cli
