// End-to-end tests of the `deloco` executable: real processes, real files, the real corpus (data/sotu, fetched
// by scripts/setup.sh). CTest passes DELOCO_BINARY and DELOCO_SOURCE_DIR.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/gpt/model.h"
#include "util/blas.h"
#include "util/fs.h"

namespace deloco {
namespace cli_cases {
namespace fs = std::filesystem;

struct Result {
  int code;
  std::string out;
};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

const std::string kSrc = env_or("DELOCO_SOURCE_DIR", ".");
const std::string kBin = env_or("DELOCO_BINARY", "./deloco");

// `env` is a prefix of VAR=value words (or `env -u VAR ...`) for this one command.
Result run(const std::string& args, const std::string& env = "") {
  std::string cmd = env + " OMP_WAIT_POLICY=PASSIVE " + kBin + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  Result r{-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("deloco_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::exists(kSrc + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string tiny(const std::string& out, int steps = 20) {
    return "--config " + kSrc + "/configs/tiny.toml --set data.path=" + kSrc + "/data/sotu --set train.out_dir=" +
           (dir_ / out).string() + " --set train.steps=" + std::to_string(steps) +
           " --set train.threads=1 --set train.log_every=1 --set train.eval_every=10 --set train.checkpoint_every=10";
  }
  std::vector<nlohmann::json> records(const std::string& run, const std::string& kind) {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir_ / run / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      if (j["kind"] == kind) out.push_back(j);
    }
    return out;
  }
  fs::path dir_;
};

TEST_F(Cli, TrainWritesCheckpointMetricsAndSummary) {
  auto r = run("train " + tiny("a") + " --summary " + (dir_ / "s.json").string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto s = nlohmann::json::parse(read_file((dir_ / "s.json").string()));
  for (const char* key : {"final_val_loss", "val_bpb", "tokens", "wall_seconds", "outer_steps", "uptime", "goodput",
                          "bytes_sent", "contributions_merged", "contributions_rejected"})
    EXPECT_TRUE(s.contains(key)) << key;
  EXPECT_LT(s["final_val_loss"].get<double>(), std::log(256.0));
  EXPECT_EQ(s["tokens"].get<int64_t>(), 20 * 8 * 32);
  EXPECT_TRUE(fs::exists(dir_ / "a" / "checkpoints" / "step_00000020" / "model.safetensors"));
  EXPECT_EQ(records("a", "eval").size(), 2u);
  EXPECT_EQ(records("a", "train").size(), 20u);
  auto ev = run("eval --checkpoint " + (dir_ / "a").string());
  ASSERT_EQ(ev.code, 0) << ev.out;
  EXPECT_NE(ev.out.find("bits/byte"), std::string::npos);
  auto sm = run("sample --checkpoint " + (dir_ / "a").string() + " --prompt 'The ' --tokens 40 --seed 3");
  ASSERT_EQ(sm.code, 0) << sm.out;
  EXPECT_EQ(sm.out.rfind("The ", 0), 0u) << sm.out;
  EXPECT_GE(sm.out.size(), 44u);
}

TEST_F(Cli, DefaultConfigRuns) {
  auto r = run("train --config " + kSrc + "/configs/small.toml --set data.path=" + kSrc + "/data/sotu --set train.out_dir=" +
               (dir_ / "small").string() + " --set train.steps=2 --set train.eval_tokens=2048 --summary " +
               (dir_ / "s.json").string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto s = nlohmann::json::parse(read_file((dir_ / "s.json").string()));
  EXPECT_EQ(s["params"].get<int64_t>(), 1853568);
  EXPECT_NE(r.out.find("unigram entropy"), std::string::npos);
}

// OpenBLAS falls back to generic SSE3 kernels on CPU models newer than itself; deloco then names the kernels the
// CPU runs (util/blas.h). Whatever this machine is, the process must end up with kernels no worse than the CPU
// allows, while a user's own OPENBLAS_CORETYPE, or DELOCO_KEEP_BLAS_CORE=1, is obeyed.
TEST_F(Cli, OpenBlasRunsTheKernelsTheCpuHasUnlessTheUserChose) {
  const std::string clean = "env -u OPENBLAS_CORETYPE -u DELOCO_OPENBLAS_FALLBACK -u DELOCO_KEEP_BLAS_CORE";
  auto blas_of = [&](const std::string& name, const std::string& env) {
    auto r = run("train " + tiny(name, 2) + " --summary " + (dir_ / (name + ".json")).string(), clean + " " + env);
    EXPECT_EQ(r.code, 0) << r.out;
    return nlohmann::json::parse(read_file((dir_ / (name + ".json")).string()))["blas"].get<std::string>();
  };
  const std::string automatic = blas_of("auto", "");
  if (automatic.empty()) GTEST_SKIP() << "libtorch here does not use OpenBLAS";
  ASSERT_EQ(automatic.rfind("OpenBLAS ", 0), 0u) << automatic;
  const std::string core = automatic.substr(9, automatic.find(' ', 9) - 9);
  EXPECT_EQ(better_openblas_core(core, host_cpu_features()), "") << automatic;
  if (automatic.find("set by deloco") != std::string::npos)
    EXPECT_NE(better_openblas_core(automatic.substr(automatic.rfind(' ') + 1, automatic.size() - automatic.rfind(' ') - 2),
                                   host_cpu_features()),
              "")
        << "deloco replaced a choice that was not a generic fallback: " << automatic;

  EXPECT_EQ(blas_of("user", "OPENBLAS_CORETYPE=Prescott"), "OpenBLAS Prescott");
  const std::string kept = blas_of("kept", "DELOCO_KEEP_BLAS_CORE=1");
  EXPECT_EQ(kept.find("set by deloco"), std::string::npos) << kept;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr)  // then this test process has OpenBLAS's own choice
    EXPECT_EQ(kept, "OpenBLAS " + openblas_core_name());
}

TEST_F(Cli, StopAndResumeGiveTheSameLossesAsAnUnbrokenRun) {
  ASSERT_EQ(run("train " + tiny("straight")).code, 0);
  auto first = run("train " + tiny("broken") + " --stop-at-step 10");
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_EQ(records("broken", "train").size(), 10u);
  auto second = run("train --resume " + (dir_ / "broken").string());
  ASSERT_EQ(second.code, 0) << second.out;
  auto a = records("straight", "train"), b = records("broken", "train");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i + 1;
  auto ea = records("straight", "eval"), eb = records("broken", "eval");
  EXPECT_EQ(ea.back()["val_loss"].get<double>(), eb.back()["val_loss"].get<double>());
}

TEST_F(Cli, CheckpointLoadsInPyTorchWithTheSameOutputs) {
  ASSERT_EQ(run("train " + tiny("a", 10)).code, 0);
  const std::string ck = (dir_ / "a" / "checkpoints" / "step_00000010").string();
  const std::string text = "Fellow citizens of the Senate";
  FILE* p = ::popen(("/usr/bin/python3 " + kSrc + "/tests/python/checkpoint_loss.py " + ck + " '" + text + "' 2>&1").c_str(), "r");
  char buf[4096] = {0};
  std::string py;
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) py.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << py;
  auto c = read_checkpoint(ck, false);
  ModelConfig mc;
  const auto& m = c.manifest["config"]["model"];
  mc.block_size = m["block_size"];
  mc.n_layer = m["n_layer"];
  mc.n_head = m["n_head"];
  mc.n_embd = m["n_embd"];
  mc.tie_embeddings = m["tie_embeddings"];
  GPT model(mc, 0);
  load_parameters(named_parameters(*model), c.model, ck);
  std::vector<int64_t> toks(text.begin(), text.end());
  auto t = torch::tensor(toks, torch::kLong).view({1, -1});
  torch::NoGradGuard g;
  const int64_t T = t.size(1) - 1;
  double mine = model->loss(t.narrow(1, 0, T), t.narrow(1, 1, T)).item<double>();
  EXPECT_NEAR(std::stod(py), mine, 1e-5) << py;
}

TEST_F(Cli, BadConfigsAreRejectedWithTheirNames) {
  std::ofstream(dir_ / "bad.toml") << "[train]\nstepz = 10\n";
  auto r = run("train --config " + (dir_ / "bad.toml").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("bad.toml"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("train.stepz"), std::string::npos) << r.out;
  std::ofstream(dir_ / "type.toml") << "[model]\nn_layer = \"four\"\n";
  r = run("train --config " + (dir_ / "type.toml").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("model.n_layer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("integer"), std::string::npos) << r.out;
  std::ofstream(dir_ / "syntax.toml") << "[model\nn_layer = 2\n";
  r = run("train --config " + (dir_ / "syntax.toml").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("not valid TOML"), std::string::npos) << r.out;
  r = run("train " + tiny("x") + " --set train.nope=1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("train.nope"), std::string::npos) << r.out;
  r = run("train " + tiny("x") + " --set data.path=" + (dir_ / "no_such_corpus").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("no_such_corpus"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  r = run("train --config " + (dir_ / "missing.toml").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("missing.toml"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  // Found by review: sync.learners = 0 (the demo config's "one per core") let a syncer and learners on different
  // machines each count their own cores, and learners trained on overlapping data. Only `deloco run` resolves it.
  for (const char* role : {"syncer --bind tcp://127.0.0.1:0", "learner --id 0 --connect tcp://127.0.0.1:1"}) {
    r = run(std::string(role) + " --set sync.learners=0 --set net.plaintext=true --out " + (dir_ / "node").string());
    EXPECT_EQ(r.code, 1) << role;
    EXPECT_NE(r.out.find("--set sync.learners=M"), std::string::npos) << r.out;
  }
}

TEST_F(Cli, ExistingRunIsNeverOverwritten) {
  fs::create_directories(dir_ / "taken");
  std::ofstream(dir_ / "taken" / "precious.txt") << "keep me";
  auto r = run("train " + tiny("taken"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("already exists"), std::string::npos) << r.out;
  EXPECT_EQ(read_file((dir_ / "taken" / "precious.txt").string()), "keep me");
  EXPECT_FALSE(fs::exists(dir_ / "taken" / "metrics.jsonl"));
}

TEST_F(Cli, CorruptTruncatedOrMismatchedCheckpointsAreRejected) {
  ASSERT_EQ(run("train " + tiny("a", 10)).code, 0);
  const fs::path ck = dir_ / "a" / "checkpoints" / "step_00000010";
  const std::string model_file = (ck / "model.safetensors").string();
  const std::string good = read_file(model_file);

  auto shape = run("eval --checkpoint " + ck.string() + " --set model.n_embd=64");
  EXPECT_EQ(shape.code, 1);
  EXPECT_NE(shape.out.find("wte.weight"), std::string::npos) << shape.out;
  EXPECT_NE(shape.out.find("shape"), std::string::npos) << shape.out;

  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;
  write_file_atomic(model_file, flipped);
  auto corrupt = run("eval --checkpoint " + ck.string());
  EXPECT_EQ(corrupt.code, 1);
  EXPECT_NE(corrupt.out.find("model.safetensors"), std::string::npos) << corrupt.out;
  EXPECT_NE(corrupt.out.find("corrupt"), std::string::npos) << corrupt.out;

  write_file_atomic(model_file, good.substr(0, good.size() - 100));
  auto truncated = run("eval --checkpoint " + ck.string());
  EXPECT_EQ(truncated.code, 1);
  EXPECT_NE(truncated.out.find("truncated"), std::string::npos) << truncated.out;

  auto missing = run("eval --checkpoint " + (dir_ / "nothing").string());
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("does not exist"), std::string::npos) << missing.out;

  // Resuming from the damaged checkpoint fails and leaves the run as it was.
  auto before = read_file((dir_ / "a" / "metrics.jsonl").string());
  auto resume = run("train --resume " + ck.string() + " --set train.steps=20");
  EXPECT_EQ(resume.code, 1);
  EXPECT_EQ(read_file((dir_ / "a" / "metrics.jsonl").string()), before);
}

// Issue 11 item 13d: a checkpoint whose weights hold NaN evaluated to "val loss -nan" and exit 0. It is now refused,
// naming the checkpoint and the first non-finite tensor, by eval and sample alike.
TEST_F(Cli, EvalRefusesACheckpointWithNonFiniteWeights) {
  ASSERT_EQ(run("train " + tiny("a", 10)).code, 0);
  Checkpoint ck = read_checkpoint((dir_ / "a").string(), /*with_optimizer=*/false);
  ASSERT_TRUE(ck.model.tensors.count("wte.weight"));
  ck.model.tensors.at("wte.weight")[3][5] = std::nanf("");
  ck.model.tensors.at("wte.weight")[7][1] = std::numeric_limits<float>::infinity();
  const fs::path poisoned = dir_ / "poisoned";
  write_checkpoint(poisoned.string(), ck.manifest, ck.model, nullptr);
  for (const char* cmd : {"eval", "sample"}) {
    auto r = run(std::string(cmd) + " --checkpoint " + poisoned.string());
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find(poisoned.string()), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("'wte.weight'"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("2 NaN/Inf"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("val loss"), std::string::npos) << r.out;
  }
  // The untouched checkpoint still evaluates.
  auto good = run("eval --checkpoint " + (dir_ / "a").string());
  EXPECT_EQ(good.code, 0) << good.out;
}

// Issue 11 item 13a: non-finite numbers are refused for every float key, naming the key, before anything runs.
TEST_F(Cli, NonFiniteConfigNumbersAreRefusedNamingTheKey) {
  for (const std::string set : {"train.lr=inf", "train.lr=nan", "net.dead_after=inf", "learner.slowdown=inf"}) {
    const std::string key = set.substr(0, set.find('='));
    const std::string cmd = key.rfind("train.", 0) == 0 ? "train " + tiny("x") : "syncer --config " + kSrc +
                                                                                 "/configs/tiny.toml --set net.plaintext=true";
    // A missing corpus: were the value accepted, the command would fail right after (not train or wait for peers).
    auto r = run(cmd + " --set data.path=" + (dir_ / "no-corpus").string() + " --set " + set);
    EXPECT_EQ(r.code, 1) << set << ": " << r.out;
    EXPECT_NE(r.out.find("'" + key + "'"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("finite"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(fs::exists(dir_ / "x" / "metrics.jsonl"));
}

}  // namespace
}  // namespace deloco

namespace deloco {
namespace cli_cases {

// A preset sets its outer rates unless the config names them, and the summary records what was used.
// `deloco goodput --fit`: a table written by `deloco goodput --csv` is fitted, the fitted TOML reruns through
// `--config` to exactly the fitted column, and a malformed table is refused naming its line.
TEST_F(Cli, GoodputFitWritesAConfigThatReproducesTheFittedColumn) {
  const std::string grid = " --chips 6250,12500,25000 --learners 1,2 --days 3 --seeds 2 --threads 2";
  const fs::path table = dir_ / "table.csv", fitted = dir_ / "table.fit.toml";
  auto made = run("goodput" + grid + " --restart-minutes 15 --csv " + table.string());
  ASSERT_EQ(made.code, 0) << made.out;
  auto fit = run("goodput --days 3 --seeds 2 --threads 2 --fit " + table.string() +
                 " --fit-params restart_minutes --fit-evals 60 --summary " + (dir_ / "fit.json").string());
  ASSERT_EQ(fit.code, 0) << fit.out;
  EXPECT_NE(fit.out.find("fitted config written to " + fitted.string()), std::string::npos) << fit.out;
  const auto f = nlohmann::json::parse(read_file((dir_ / "fit.json").string()));
  ASSERT_EQ(f["parameters"].size(), 1u);
  EXPECT_NEAR(f["parameters"][0]["value"].get<double>(), 15.0, 1.5) << fit.out;
  EXPECT_EQ(f["rows"].size(), 12u);  // 3 chip counts x (dp, elastic_dp, diloco M=1, M=2)
  auto again = run("goodput --config " + fitted.string() + " --summary " + (dir_ / "again.json").string());
  ASSERT_EQ(again.code, 0) << again.out;
  const auto a = nlohmann::json::parse(read_file((dir_ / "again.json").string()));
  ASSERT_EQ(a["rows"].size(), f["rows"].size()) << again.out;
  for (const auto& row : f["rows"]) {
    bool found = false;
    for (const auto& r : a["rows"])
      if (r["scheme"] == row["scheme"] && r["chips"] == row["chips"] && r["learners"] == row["learners"]) {
        EXPECT_EQ(r["goodput"].get<double>(), row["fitted"].get<double>()) << row.dump();
        found = true;
      }
    EXPECT_TRUE(found) << row.dump();
  }
  // The fleet profile of docs/goodput.md loads and turns every further failure mode on.
  auto fleet = run("goodput --config " + kSrc + "/configs/goodput-fleet.toml --chips 150000 --days 2 --seeds 1");
  ASSERT_EQ(fleet.code, 0) << fleet.out;
  for (const char* part : {"quorum K=1", "swap 5 min", "resets 80%", "domains of 16 slices", "syncer MTBF 720 h",
                           "catch-up 2 min"})
    EXPECT_NE(fleet.out.find(part), std::string::npos) << part << " missing from\n" << fleet.out;
  write_file_atomic((dir_ / "bad.csv").string(), "scheme,learners,chips,goodput\ndp,,6250,0.5\ndiloco,,6250,0.5\n");
  auto bad = run("goodput --fit " + (dir_ / "bad.csv").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("bad.csv:3: a diloco row needs a learner count"), std::string::npos) << bad.out;
}

// `deloco report` over a real `deloco sim` folder and a real `deloco train` folder: one self-contained page with
// both runs' data, PNGs through gnuplot, and clear errors for a folder that is not a run.
TEST_F(Cli, ReportOverlaysASimAndATrainRunInOneSelfContainedPage) {
  auto sim = run("sim --config " + kSrc + "/configs/tiny.toml --set data.path=" + kSrc +
                 "/data/sotu --set train.steps=40 --set sync.learners=2 --set sync.quorum=1 --set sync.sync_every=10"
                 " --set train.eval_tokens=512 --set train.eval_every=10 --set train.threads=1 --set sim.out_dir=" +
                 (dir_ / "sim-a").string());
  ASSERT_EQ(sim.code, 0) << sim.out;
  auto train = run("train " + tiny("train-b", 30));
  ASSERT_EQ(train.code, 0) << train.out;
  // A record line torn by a crash, and text that would close a <script> element if pasted raw.
  {
    std::ofstream m(dir_ / "sim-a" / "metrics.jsonl", std::ios::app);
    m << "{\"kind\":\"reject\",\"learner\":0,\"fragment\":0,\"reason\":\"</script><b>x\",\"t\":1}\n{\"kind\":\"mer";
  }
  const fs::path html = dir_ / "out" / "report.html", png = dir_ / "png", js = dir_ / "report.json";
  auto r = run("report " + (dir_ / "sim-a").string() + " " + (dir_ / "train-b").string() + " --out " + html.string() +
               " --png " + png.string() + " --summary " + js.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("skipped 1 line(s) that were not JSON records"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(": not a JSON object with a string \"kind\"; skipped"), std::string::npos) << r.out;
  const std::string page = read_file(html.string());
  EXPECT_EQ(page.find("<script src"), std::string::npos);  // nothing loaded at run time
  EXPECT_EQ(page.find("<link"), std::string::npos);
  EXPECT_NE(page.find("uPlot"), std::string::npos);
  EXPECT_NE(page.find("\\u003c/script\\u003e\\u003cb\\u003ex"), std::string::npos);  // < > escaped in the data
  EXPECT_EQ(page.find("</script><b>x"), std::string::npos);
  const auto s = nlohmann::json::parse(read_file(js.string()));
  ASSERT_EQ(s["runs"].size(), 2u);
  const auto& a = s["runs"][0];
  const auto& b = s["runs"][1];
  EXPECT_EQ(a["name"], "sim-a");
  EXPECT_EQ(a["kind"], "sim");
  EXPECT_EQ(b["kind"], "train");
  EXPECT_GE(a["evals"].size(), 2u);  // the initial and the final evaluation at least
  EXPECT_GE(b["evals"].size(), 2u);
  EXPECT_GT(a["merges"].size(), 0u);
  EXPECT_EQ(a["learners"].size(), 2u);
  EXPECT_EQ(b["learners"].size(), 1u);
  // Time runs from the first record; the losses are the records' own.
  for (const auto& e : a["evals"]) EXPECT_GE(e[0].get<double>(), 0.0);
  EXPECT_NEAR(a["evals"].back()[2].get<double>(), a["summary"]["final_val_loss"].get<double>(), 1e-9);
  for (const char* chart : {"val_loss_time", "val_loss_tokens", "merges_per_minute"})
    EXPECT_TRUE(fs::exists(png / (std::string(chart) + ".png"))) << chart << "\n" << r.out;
  EXPECT_FALSE(a.contains("thinned_to"));  // the default limit is far above this run's records
  // --max-points thins each long series, says so, and keeps the last record.
  const size_t merges = a["merges"].size();
  ASSERT_GT(merges, 3u);
  auto t = run("report " + (dir_ / "sim-a").string() + " --out " + (dir_ / "t.html").string() +
               " --max-points 3 --summary " + (dir_ / "t.json").string());
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("charts thinned to 3 of up to"), std::string::npos) << t.out;
  const auto thin = nlohmann::json::parse(read_file((dir_ / "t.json").string()))["runs"][0];
  EXPECT_EQ(thin["thinned_to"], 3);
  ASSERT_EQ(thin["merges"].size(), 3u);
  EXPECT_EQ(thin["merges"].back(), a["merges"].back());
  EXPECT_EQ(thin["merges"].front(), a["merges"].front());
  // Not a run folder, and a missing one.
  fs::create_directories(dir_ / "empty");
  auto e = run("report " + (dir_ / "empty").string() + " --out " + (dir_ / "e.html").string());
  EXPECT_NE(e.code, 0);
  EXPECT_NE(e.out.find("holds no summary.json and no records"), std::string::npos) << e.out;
  EXPECT_FALSE(fs::exists(dir_ / "e.html"));
  auto m = run("report " + (dir_ / "nowhere").string());
  EXPECT_NE(m.code, 0);
  EXPECT_NE(m.out.find("nowhere"), std::string::npos) << m.out;
}

TEST(CliPresets, IsolocoAloneYieldsItsOuterRatesInTheSummary) {
  const fs::path dir = fs::temp_directory_path() / ("deloco_cli_preset_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string base = "sim --config " + kSrc + "/configs/tiny.toml --set data.path=" + kSrc +
                           "/data/sotu --set train.steps=20 --set sync.learners=2 --set sync.quorum=1"
                           " --set sync.sync_every=10 --set train.eval_tokens=512 --set train.threads=1";
  auto r = run(base + " --set merge.preset=isoloco --set sim.out_dir=" + (dir / "a").string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto s = nlohmann::json::parse(std::ifstream(dir / "a" / "summary.json"));
  EXPECT_DOUBLE_EQ(s["config"]["outer"]["lr"].get<double>(), 1.8);
  EXPECT_DOUBLE_EQ(s["config"]["outer"]["momentum"].get<double>(), 0.8);
  EXPECT_EQ(s["config"]["outer"]["kind"].get<std::string>(), "nesterov");
  // A rate the config names wins over the preset's.
  r = run(base + " --set merge.preset=isoloco --set outer.lr=0.5 --set sim.out_dir=" + (dir / "b").string());
  ASSERT_EQ(r.code, 0) << r.out;
  s = nlohmann::json::parse(std::ifstream(dir / "b" / "summary.json"));
  EXPECT_DOUBLE_EQ(s["config"]["outer"]["lr"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["config"]["outer"]["momentum"].get<double>(), 0.8);
  // No preset named: diloco's.
  r = run(base + " --set sim.out_dir=" + (dir / "c").string());
  ASSERT_EQ(r.code, 0) << r.out;
  s = nlohmann::json::parse(std::ifstream(dir / "c" / "summary.json"));
  EXPECT_EQ(s["config"]["merge"]["preset"].get<std::string>(), "diloco");
  EXPECT_DOUBLE_EQ(s["config"]["outer"]["lr"].get<double>(), 0.7);
  // An unknown preset names itself and the known ones.
  r = run(base + " --set merge.preset=sparkle --set sim.out_dir=" + (dir / "d").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("sparkle"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("iso_cts"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
