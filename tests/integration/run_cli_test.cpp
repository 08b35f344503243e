// End-to-end tests of `deloco run`: the orchestrator starts a real syncer and real learner processes of the
// `deloco` executable over ZeroMQ (ipc), in plaintext and with CURVE, with and without chaos. CTest passes
// DELOCO_BINARY and DELOCO_SOURCE_DIR; the corpus (data/sotu) comes from scripts/setup.sh.
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/proc.h"
#include "util/fs.h"

namespace deloco {
namespace run_cli_cases {
namespace fs = std::filesystem;

const std::string kSrc = test::source_dir();

// Runs `deloco ARGS` (split at spaces) to completion (SIGTERM after `limit_s` seconds, which `deloco run`
// forwards to its children); its stdout and stderr go to `log`.
test::Finished run(const std::string& args, const fs::path& log, int limit_s = 120) {
  std::vector<std::string> argv;
  std::istringstream words(args);
  for (std::string w; words >> w;) argv.push_back(w);
  return test::run_to_end(argv, log.string(), limit_s);
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

class RunCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("deloco_run_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::exists(kSrc + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // The tiny model, two learners, Decoupled DiLoCo with quorum 1, two fragments, everything small.
  std::string tiny(int steps, bool plaintext) const {
    return "--config " + kSrc + "/configs/tiny.toml --set data.path=" + kSrc + "/data/sotu --set syncer.out_dir=" +
           (dir_ / "run").string() + " --set train.steps=" + std::to_string(steps) +
           " --set sync.learners=2 --set sync.quorum=1 --set sync.fragments=2 --set sync.sync_every=10"
           " --set sync.wait_for_answer=false --set train.eval_every=0 --set train.log_every=10"
           " --set train.eval_tokens=2048 --set syncer.eval_interval=0 --set syncer.metrics="
           " --set net.plaintext=" +
           std::string(plaintext ? "true" : "false") + " --summary " + (dir_ / "s.json").string();
  }
  nlohmann::json summary() const { return nlohmann::json::parse(read_file((dir_ / "s.json").string())); }
  fs::path dir_;
};

void expect_trained(const nlohmann::json& s) {
  for (const char* key : {"final_val_loss", "val_bpb", "tokens", "wall_seconds", "outer_steps", "uptime", "goodput",
                          "bytes_sent", "contributions_merged", "contributions_rejected", "learner_kills",
                          "learner_stops", "syncer_kills", "rejoin_seconds", "recontribute_seconds"})
    EXPECT_TRUE(s.contains(key)) << key << " missing from " << s.dump();
  EXPECT_GT(s.value("outer_steps", 0), 0);
  EXPECT_GT(s.value("contributions_merged", 0), 0);
}

TEST_F(RunCli, PlaintextRunFinishesAndMerges) {
  auto r = run("run " + tiny(60, true), dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  EXPECT_EQ(s["learners"].get<int64_t>(), 2);
  EXPECT_EQ(s["learner_kills"].get<int64_t>(), 0);
  const fs::path run_dir = dir_ / "run";
  for (const char* f : {"config.json", "summary.json", "syncer.jsonl", "learner-0.jsonl", "learner-1.jsonl",
                        "logs/syncer.log", "logs/learner-0.log", "logs/learner-1.log"})
    EXPECT_TRUE(fs::exists(run_dir / f)) << f;
  EXPECT_FALSE(fs::exists(run_dir / "keys"));
  EXPECT_NE(r.out.find("summary: "), std::string::npos) << r.out;
}

// Issue 56: every push accounted for. Quorum 2 with learner 1 four times slower and no waiting: learner 0's pushes
// wait at the syncer for learner 1's, and each newer one of the same fragment replaces its waiting one. The summary's
// push_accounting adds up (due = sent + unsent, sent = merged + unmerged), each unmerged push is a
// contribution_unmerged record and each unsent one a push_unsent record, and the final report says so.
TEST_F(RunCli, EveryPushIsAccountedFor) {
  auto r = run("run " + tiny(60, true) +
                   " --set sync.quorum=2 --set chaos.enabled=true --set chaos.slow_learner=1 --set chaos.slow_factor=4",
               dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  ASSERT_TRUE(s.contains("push_accounting")) << s.dump();
  const auto& a = s["push_accounting"];
  const auto n = [](const nlohmann::json& o, const char* k) { return o.at(k).get<int64_t>(); };
  EXPECT_EQ(n(a, "due"), 2 * 60 / 10 * 2) << a.dump();  // 2 learners, 60 steps, H = 10, 2 fragments
  EXPECT_EQ(n(a, "due"), n(a, "sent") + n(a["unsent"], "superseded") + n(a["unsent"], "dropped") + n(a["unsent"], "at_end"))
      << a.dump();
  EXPECT_EQ(n(a, "sent"), n(a, "merged") + n(a["unmerged"], "refused") + n(a["unmerged"], "replaced") +
                              n(a["unmerged"], "pending_at_end"))
      << a.dump();
  EXPECT_EQ(n(a, "unaccounted"), 0) << a.dump();
  EXPECT_EQ(n(a, "merged"), s["contributions_merged"].get<int64_t>());
  EXPECT_GT(n(a["unmerged"], "replaced"), 0) << a.dump();
  for (int m = 0; m < 2; ++m) {
    const auto& l = a["learners"][m];
    EXPECT_EQ(n(l, "processes"), 1) << l.dump();
    EXPECT_EQ(n(l, "due"), 12) << l.dump();
  }
  int64_t unmerged = 0, unsent = 0;
  for (const auto& line : split_lines(read_file((dir_ / "run" / "syncer.jsonl").string()))) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "contribution_unmerged") continue;
    ++unmerged;
    EXPECT_TRUE(j["reason"] == "replaced" || j["reason"] == "pending_at_end") << line;
    EXPECT_TRUE(j.contains("learner") && j.contains("fragment")) << line;
  }
  for (const char* f : {"learner-0.jsonl", "learner-1.jsonl"})
    for (const auto& line : split_lines(read_file((dir_ / "run" / f).string())))
      unsent += line.find("\"kind\":\"push_unsent\"") != std::string::npos;
  EXPECT_EQ(unmerged, n(a["unmerged"], "replaced") + n(a["unmerged"], "pending_at_end"));
  EXPECT_EQ(unsent, n(a["unsent"], "superseded") + n(a["unsent"], "dropped") + n(a["unsent"], "at_end"));
  EXPECT_NE(r.out.find("replaced by a newer push"), std::string::npos) << r.out;
}

// sync.final_round over real processes: after its last step each learner sends its final state of both fragments
// (push records marked final); the syncer, once both retired, makes the final model their mean (a final_merge record
// per fragment, both learners at weight ½: the same batch), the pushes add up with them, and the run's final
// checkpoint is the final round's.
TEST_F(RunCli, TheFinalRoundAveragesEveryLearnersFinalState) {
  auto r = run("run " + tiny(60, true) + " --set sync.apply=rebase --set sync.final_round=true", dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  ASSERT_TRUE(s.contains("final_round")) << s.dump();
  const auto n = [](const nlohmann::json& o, const char* k) { return o.at(k).get<int64_t>(); };
  EXPECT_EQ(n(s["final_round"], "states_received"), 4) << s.dump();
  EXPECT_EQ(n(s["final_round"], "states_merged"), 4) << s.dump();
  EXPECT_EQ(n(s["final_round"], "fragments"), 2) << s.dump();
  const auto& a = s["push_accounting"];
  EXPECT_EQ(n(a, "final_states_merged"), 4) << a.dump();
  EXPECT_EQ(n(a, "due"), n(a, "sent") + n(a["unsent"], "superseded") + n(a["unsent"], "dropped") + n(a["unsent"], "at_end"))
      << a.dump();
  EXPECT_EQ(n(a, "unaccounted"), 0) << a.dump();
  int finals = 0;
  for (const char* f : {"learner-0.jsonl", "learner-1.jsonl"})
    for (const auto& line : split_lines(read_file((dir_ / "run" / f).string()))) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] == "push" && j.value("final", false)) {
        ++finals;
        EXPECT_EQ(j["step"].get<int64_t>(), 60) << line;
      }
    }
  EXPECT_EQ(finals, 4);
  int merges = 0;
  for (const auto& line : split_lines(read_file((dir_ / "run" / "syncer.jsonl").string()))) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "final_merge") continue;
    ++merges;
    EXPECT_EQ(j["learners"], nlohmann::json::parse("[0, 1]")) << line;
    EXPECT_DOUBLE_EQ(j["weights"][0].get<double>(), 0.5) << line;
    EXPECT_DOUBLE_EQ(j["weights"][1].get<double>(), 0.5) << line;
  }
  EXPECT_EQ(merges, 2);
  EXPECT_NE(read_file((dir_ / "run" / "latest").string()).find("-final"), std::string::npos);
}

// A testbed that is not up is named with the command that makes it; nothing starts (no root needed to see this).
TEST_F(RunCli, ATestbedThatIsNotUpIsNamedWithHowToMakeIt) {
  auto r = run("run " + tiny(20, true) + " --set testbed.name=nosuchbed", dir_ / "out.log");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("testbed 'nosuchbed' is not up (no /run/nosuchbed.testbed)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("scripts/testbed.sh up"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "run" / "syncer.jsonl"));
}

// Issue 18: the global model a run trains is a model you can use. The syncer's final checkpoint describes itself
// (its manifest carries the model, data and train config), `latest` names it, and `deloco eval`, `sample` and
// `merge` and the PyTorch reference take the run folder as it is. The loss eval reports is the run's final one.
TEST_F(RunCli, EvalSampleAndMergeTakeTheRunFolder) {
  auto r = run("run " + tiny(60, true), dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const double final_loss = summary()["final_val_loss"].get<double>();
  const fs::path run_dir = dir_ / "run";
  // The closing lines say how to use the model, with the real path.
  EXPECT_NE(r.out.find("use the model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" eval --checkpoint " + run_dir.string() + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" sample --checkpoint " + run_dir.string() + " --prompt"), std::string::npos) << r.out;
  // `latest` names the final checkpoint.
  const std::string latest = read_file((run_dir / "latest").string());
  const fs::path ck = run_dir / "checkpoints" / latest.substr(0, latest.find_last_not_of("\n ") + 1);
  const auto manifest = nlohmann::json::parse(read_file((ck / "manifest.json").string()));
  EXPECT_EQ(manifest["kind"], "syncer");
  EXPECT_EQ(manifest["final"], true);
  EXPECT_EQ(manifest["config"]["model"]["n_embd"], 48) << manifest["config"].dump();  // configs/tiny.toml

  auto ev = run("eval --checkpoint " + run_dir.string() + " --summary " + (dir_ / "eval.json").string(), dir_ / "eval.log");
  ASSERT_EQ(ev.code, 0) << ev.out;
  const auto e = nlohmann::json::parse(read_file((dir_ / "eval.json").string()));
  EXPECT_EQ(fs::path(e["checkpoint"].get<std::string>()), ck);
  EXPECT_NEAR(e["final_val_loss"].get<double>(), final_loss, 1e-6) << ev.out;

  auto sm = run("sample --checkpoint " + run_dir.string() + " --prompt The --tokens 40 --seed 3", dir_ / "sample.log");
  ASSERT_EQ(sm.code, 0) << sm.out;
  EXPECT_GE(sm.out.size(), 40u) << sm.out;

  // Base and input alike: the run folder stands for its newest checkpoint's weights.
  auto mg = run("merge --base " + run_dir.string() + " --inputs " + run_dir.string() + " " + (ck / "model.safetensors").string() +
                    " --method mean --out " + (dir_ / "merged.safetensors").string(),
                dir_ / "merge.log");
  ASSERT_EQ(mg.code, 0) << mg.out;
  EXPECT_TRUE(fs::exists(dir_ / "merged.safetensors"));
}

// Issue 12 item 1: a user's own PyTorch model (examples/llama: RMSNorm, rotary embeddings, SwiGLU), scripted by
// torch.jit.script, trained by `deloco run` over the real transport like the built-in GPT; its run folder then
// evaluates to the run's final loss and samples, with the module's own parameter names in the checkpoint.
// The outer step is plain averaging (SGD, η = 1, no momentum): a 60-step run is a handful of outer steps, and
// Nesterov (η 0.7, μ 0.9) over so few once overshot to a global loss of 6.9 with K = 1, and to 6.4 with K = 2 on a
// loaded machine, while both learners trained at 2.9-3.2. This test is about TorchScript models, not about
// short-horizon outer momentum; the average of two learners that learned has learned too.
TEST_F(RunCli, TrainsAUsersTorchScriptModel) {
  const fs::path model = dir_ / "llama.pt";
  const std::string make = "/usr/bin/python3 " + kSrc + "/examples/llama/make_model.py --out " + model.string() +
                           " --layers 1 --dim 32 --block 32 > " + (dir_ / "make.log").string() + " 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0) << read_file((dir_ / "make.log").string());
  auto r = run("run --config " + kSrc + "/examples/llama/llama.toml --set model.path=" + model.string() +
                   " --set data.path=" + kSrc + "/data/sotu --set syncer.out_dir=" + (dir_ / "run").string() +
                   " --set train.steps=60 --set train.warmup_steps=10 --set sync.learners=2 --set sync.quorum=2"
                   " --set sync.sync_every=10"
                   " --set sync.fragments=2 --set train.eval_tokens=2048 --set syncer.eval_interval=0"
                   " --set outer.kind=sgd --set outer.lr=1.0 --set outer.momentum=0"
                   " --set syncer.metrics= --set net.plaintext=true --summary " + (dir_ / "s.json").string(),
               dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  const double final_loss = s["final_val_loss"].get<double>();
  EXPECT_LT(final_loss, std::log(256.0));  // learned something from the bytes
  const fs::path run_dir = dir_ / "run";
  const std::string latest = read_file((run_dir / "latest").string());
  const fs::path ck = run_dir / "checkpoints" / latest.substr(0, latest.find_last_not_of("\n ") + 1);
  const std::string header = read_file((ck / "model.safetensors").string()).substr(0, 4096);
  EXPECT_NE(header.find("layers.0.feed_forward.w3.weight"), std::string::npos);
  // The manifest describes the module (T = 32 from make_model.py --block 32), not the config's defaults.
  const auto manifest = nlohmann::json::parse(read_file((ck / "manifest.json").string()));
  EXPECT_EQ(manifest["config"]["model"]["block_size"].get<int64_t>(), 32) << manifest["config"]["model"].dump();
  auto ev = run("eval --checkpoint " + run_dir.string() + " --summary " + (dir_ / "eval.json").string(), dir_ / "eval.log");
  ASSERT_EQ(ev.code, 0) << ev.out;
  EXPECT_NEAR(nlohmann::json::parse(read_file((dir_ / "eval.json").string()))["final_val_loss"].get<double>(), final_loss,
              1e-6);
  auto sm = run("sample --checkpoint " + run_dir.string() + " --prompt The --tokens 20 --seed 1", dir_ / "sample.log");
  ASSERT_EQ(sm.code, 0) << sm.out;
  // PyTorch reads the run folder too: the module from model.path, the checkpoint's weights by parameter name.
  // 2 KB of the corpus: long enough that a 60-step model's loss on it is stably below uniform (a short prompt's is not).
  std::vector<fs::path> docs;
  for (const auto& e : fs::directory_iterator(kSrc + "/data/sotu"))
    if (e.is_regular_file() && fs::file_size(e.path()) >= 2048) docs.push_back(e.path());
  ASSERT_FALSE(docs.empty());
  const std::string corpus_text = read_file(std::min_element(docs.begin(), docs.end())->string()).substr(0, 2048);
  ASSERT_EQ(corpus_text.size(), 2048u);
  write_file_atomic((dir_ / "text.txt").string(), corpus_text);
  const std::string py = "/usr/bin/python3 " + kSrc + "/tests/python/checkpoint_loss.py " + run_dir.string() + " @" +
                         (dir_ / "text.txt").string() + " > " + (dir_ / "py.log").string() + " 2>&1";
  ASSERT_EQ(std::system(py.c_str()), 0) << read_file((dir_ / "py.log").string());
  const double py_loss = std::stod(read_file((dir_ / "py.log").string()));
  EXPECT_TRUE(std::isfinite(py_loss));
  EXPECT_LT(py_loss, std::log(256.0));
}

// Issue 17: a PyTorch training script is a learner. Learner 1 is examples/pytorch/train.py (its own loop: AdamW,
// bf16 autocast) through the Python module, learner 0 is `deloco learner`, over CURVE, quorum 2: the merges must
// hold both, and the Python learner must have applied merged fragments and finished. Skipped when the build has no
// Python module (no pybind11-dev / python3-dev).
TEST_F(RunCli, MixesACppAndAPythonLearner) {
  const fs::path module_dir = fs::path(test::deloco_binary()).parent_path() / "python" / "deloco";
  if (!fs::exists(module_dir / "__init__.py")) GTEST_SKIP() << "the Python module is not built (" << module_dir << ")";
  const fs::path model = dir_ / "llama.pt";
  const std::string make = "/usr/bin/python3 " + kSrc + "/examples/llama/make_model.py --out " + model.string() +
                           " --layers 1 --dim 32 --block 32 > " + (dir_ / "make.log").string() + " 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0) << read_file((dir_ / "make.log").string());
  std::vector<std::string> argv = {"run", "--config", kSrc + "/examples/llama/llama.toml"};
  for (const std::string& set :
       {"model.path=" + model.string(), "data.path=" + kSrc + "/data/sotu", "syncer.out_dir=" + (dir_ / "run").string(),
        std::string("train.steps=60"), std::string("train.warmup_steps=10"), std::string("train.log_every=5"),
        std::string("sync.learners=2"), std::string("sync.quorum=2"), std::string("sync.sync_every=10"),
        std::string("sync.wait_for_answer=true"),
        std::string("sync.fragments=2"), std::string("train.eval_tokens=2048"), std::string("syncer.eval_interval=0"),
        std::string("outer.kind=sgd"), std::string("outer.lr=1.0"), std::string("outer.momentum=0"),
        // Issue 35: the Python learner pushes top-k and applies delta broadcasts like the C++ one.
        std::string("net.encoding=topk"), std::string("net.broadcast_encoding=topk"),
        std::string("net.topk_density=0.25"), std::string("net.topk_bits=8"), std::string("syncer.metrics=")})
    argv.insert(argv.end(), {"--set", set});
  argv.insert(argv.end(), {"--learner-command", "1=/usr/bin/python3 " + kSrc + "/examples/pytorch/train.py", "--summary",
                           (dir_ / "s.json").string()});
  const auto r = test::run_to_end(argv, (dir_ / "out.log").string(), 240);
  const fs::path run_dir = dir_ / "run";
  const fs::path py_log_file = run_dir / "logs" / "learner-1.log";
  ASSERT_EQ(r.code, 0) << r.out << (fs::exists(py_log_file) ? read_file(py_log_file.string()) : "");
  const auto s = summary();
  expect_trained(s);
  EXPECT_LT(s["final_val_loss"].get<double>(), std::log(256.0));
  // Quorum 2 and wait_for_answer: the learners go in lockstep (the C++ one waits while Python starts up), so the
  // merges hold both learners' contributions; at most the last could be one learner's (after the other retired).
  int merges = 0, both = 0;
  for (const auto& line : split_lines(read_file((run_dir / "syncer.jsonl").string()))) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "merge") continue;
    ++merges;
    const auto ls = j["learners"].get<std::vector<int64_t>>();
    both += std::count(ls.begin(), ls.end(), 0) == 1 && std::count(ls.begin(), ls.end(), 1) == 1;
  }
  EXPECT_GE(both, 6) << merges << " merges";  // 60 steps, H = 10, 2 fragments: 12 pushes each
  EXPECT_GE(both, merges - 1);
  // The Python learner: its records, merged fragments applied in place, a finished goodbye, its own log line.
  int applies = 0;
  int64_t deltas = 0;
  bool finished = false;
  for (const auto& line : split_lines(read_file((run_dir / "learner-1.jsonl").string()))) {
    const auto j = nlohmann::json::parse(line);
    applies += j["kind"] == "apply";
    if (j["kind"] == "learner_done") {
      finished = j["finished"].get<bool>() && j["step"].get<int64_t>() == 60;
      deltas = j.value("deltas_applied", int64_t{0});
    }
  }
  EXPECT_GT(applies, 0);
  EXPECT_GT(deltas, 0);
  EXPECT_TRUE(finished);
  const std::string py_log = read_file(py_log_file.string());
  EXPECT_NE(py_log.find("train.py: learner 1 trained 60 steps"), std::string::npos) << py_log;
  EXPECT_NE(py_log.find("bf16 autocast"), std::string::npos) << py_log;
}

// Issue 12: `deloco tokenize` turns the corpus into token files; `deloco run` trains on them (data.format = tokens);
// eval reports nats per token and bits per byte from the recorded bytes; sample decodes with the tokenizer.
TEST_F(RunCli, TokenizeThenRunEvalAndSampleOnTokenFiles) {
  const fs::path tok = dir_ / "bpe";
  auto t = run("tokenize --input " + kSrc + "/data/sotu --vocab 1024 --out " + tok.string(), dir_ / "tok.log");
  ASSERT_EQ(t.code, 0) << t.out;
  for (const char* f : {"train.bin", "val.bin", "tokenizer.model", "tokens.json"}) EXPECT_TRUE(fs::exists(tok / f)) << f;
  // Lockstep (quorum 2, each push's answer awaited): what this test checks is the token-file path, and its loss bound
  // must not depend on how two asynchronous learners interleave on a loaded machine. With quorum 1 and no waiting,
  // 60 steps of this 1024-token model ended at 6.0-6.6 nats in 60 runs here (loaded, slowed, stopped), once at 9.38 in
  // CI; the records are printed below if the bound fails again.
  auto r = run("run " + tiny(60, true) + " --set data.format=tokens --set data.path=" + tok.string() +
                   " --set model.vocab_size=1024 --set sync.quorum=2 --set sync.wait_for_answer=true",
               dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  const double loss = s["final_val_loss"].get<double>(), bpb = s["val_bpb"].get<double>();
  auto records = [&] {  // the learners' losses and the merges, to tell a diverged run from a broken one
    std::string out;
    for (const char* f : {"learner-0.jsonl", "learner-1.jsonl", "syncer.jsonl"})
      for (const auto& line : split_lines(read_file((dir_ / "run" / f).string())))
        if (line.find("\"kind\":\"learner\"") != std::string::npos || line.find("\"kind\":\"merge\"") != std::string::npos ||
            line.find("\"kind\":\"final_eval\"") != std::string::npos)
          out += line + "\n";
    return out;
  };
  EXPECT_LT(loss, std::log(1024.0)) << r.out << records();  // nats per token: better than uniform over the vocabulary
  const auto meta = nlohmann::json::parse(read_file((tok / "tokens.json").string()))["files"]["val.bin"];
  const double bytes_per_token = meta["bytes"].get<double>() / meta["tokens"].get<double>();
  EXPECT_GT(bytes_per_token, 2.5);
  EXPECT_NEAR(bpb, loss / bytes_per_token / std::log(2.0), 1e-9);
  auto ev = run("eval --checkpoint " + (dir_ / "run").string(), dir_ / "eval.log");
  ASSERT_EQ(ev.code, 0) << ev.out;
  EXPECT_NE(ev.out.find("nats/token"), std::string::npos) << ev.out;
  auto sm = run("sample --checkpoint " + (dir_ / "run").string() + " --prompt The --tokens 30 --seed 3", dir_ / "sample.log");
  ASSERT_EQ(sm.code, 0) << sm.out;
  // Decoded text, not ids: mostly letters, and more than one byte per token (the BPE pieces of a model trained for 60
  // steps are short; a run once sampled exactly 2 bytes per token, so the bound is not "about 4").
  size_t letters = 0, digits = 0;
  for (unsigned char c : sm.out) letters += std::isalpha(c) ? 1 : 0, digits += std::isdigit(c) ? 1 : 0;
  EXPECT_GT(sm.out.size(), 30u) << sm.out;
  EXPECT_GT(letters, 4 * digits + 20) << sm.out;
  EXPECT_NE(sm.out.find(' '), std::string::npos) << sm.out;
  // A model whose vocabulary is smaller than the data's ids is refused before training, naming the file.
  auto bad = run("train --config " + kSrc + "/configs/tiny.toml --set data.format=tokens --set data.path=" + tok.string() +
                     " --set model.vocab_size=256 --set train.out_dir=" + (dir_ / "bad").string(),
                 dir_ / "bad.log");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("train.bin"), std::string::npos) << bad.out;
}

// Issue 18: the bare `deloco run` is the README's demo (Decoupled DiLoCo, one learner per core, chaos on), from any
// working directory (the corpus is found in the source tree). Checked from its header and its config.json, then
// stopped.
TEST_F(RunCli, BareCommandRunsTheBuiltInDemoFromAnyDirectory) {
  const fs::path cwd = dir_ / "elsewhere";
  fs::create_directories(cwd);
  test::Proc p({"run"}, (dir_ / "bare.log").string(), {}, cwd.string());
  ASSERT_GT(p.pid(), 0) << "could not start " << test::deloco_binary();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && p.log().find("run folder: ") == std::string::npos &&
         p.wait(0) < 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string out = p.log();
  p.signal(SIGTERM);
  EXPECT_GE(p.wait(60), 0) << "deloco run did not stop on SIGTERM";
  EXPECT_NE(out.find("config: the built-in demo config (configs/demo.toml)"), std::string::npos) << out;
  EXPECT_NE(out.find("(one per core), K=1, P=4, H=40, grace, inner adamw, merge decoupled, outer nesterov, CURVE, chaos on"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("run folder: runs/demo-"), std::string::npos) << out;
  std::vector<fs::path> runs;
  if (fs::exists(cwd / "runs"))
    for (const auto& e : fs::directory_iterator(cwd / "runs")) runs.push_back(e.path());
  ASSERT_EQ(runs.size(), 1u) << out;
  const auto cfg = nlohmann::json::parse(read_file((runs[0] / "config.json").string()));
  EXPECT_EQ(cfg["data"]["path"], kSrc + "/data/sotu");
  EXPECT_EQ(cfg["model"]["n_embd"], 128);
  EXPECT_EQ(cfg["sync"]["fragments"], 4);
  EXPECT_EQ(cfg["chaos"]["enabled"], true);
}

// Issue 52, defect 10: the bare `deloco run` (the demo config, nothing set; only the summary's path and a fresh
// working directory for its run folder) kills the syncer about mid-run and resumes it, and the run finishes trained.
// The demo's kill used to come at 75 s by the clock, after a run that had got faster and ended in about 50 s; it
// now comes when the furthest learner is half-way through train.steps (chaos.syncer_kill_at_progress), however
// fast this machine is. The kills are checked where a user sees them: the console, the summary, the records.
TEST_F(RunCli, BareDemoKillsTheSyncerMidRunAndResumesIt) {
  const fs::path cwd = dir_ / "demo";
  fs::create_directories(cwd);
  test::Proc p({"run", "--summary", (dir_ / "s.json").string()}, (dir_ / "demo.log").string(), {}, cwd.string());
  ASSERT_GT(p.pid(), 0) << "could not start " << test::deloco_binary();
  int code = p.wait(900);
  if (code < 0) {
    p.signal(SIGTERM);
    p.wait(60);
  }
  const std::string out = p.log();
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("config: the built-in demo config (configs/demo.toml)"), std::string::npos) << out;
  const auto s = summary();
  expect_trained(s);
  EXPECT_GE(s["syncer_kills"].get<int64_t>(), 1) << out;
  EXPECT_GE(s["restarts"]["syncer"].get<int64_t>(), 1) << s.dump();
  EXPECT_EQ(s.value("resumed", false), true) << s.dump();  // the last syncer came back with --resume
  EXPECT_GE(s["learner_kills"].get<int64_t>(), 1) << out;
  EXPECT_LT(s["final_val_loss"].get<double>(), 3.0) << s.dump();  // below the corpus's unigram entropy (3.0 nats)
  for (const char* line : {"chaos: SIGKILL the syncer at 50% of train.steps (restart with --resume in 2.0 s)",
                           "restarted the syncer with --resume", "syncer resumed at ", "chaos: SIGKILL learner-"})
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  EXPECT_EQ(out.find("chaos: skipped"), std::string::npos) << out;
  // The records: the syncer restarted from a checkpoint of merges it had made and merged again after it; every
  // learner trained all 1500 steps of the demo.
  std::vector<fs::path> runs;
  if (fs::exists(cwd / "runs"))
    for (const auto& e : fs::directory_iterator(cwd / "runs")) runs.push_back(e.path());
  ASSERT_EQ(runs.size(), 1u) << out;
  int64_t resumed_at = -1, merges_after = 0;
  for (const auto& j : split_lines(read_file((runs[0] / "syncer.jsonl").string()))) {
    const auto r = nlohmann::json::parse(j);
    if (r["kind"] == "started" && r.value("resumed", false)) resumed_at = r.value("merges", int64_t{0});
    if (r["kind"] == "merge" && resumed_at >= 0) ++merges_after;
  }
  EXPECT_GT(resumed_at, 0) << "the syncer did not resume from a checkpoint of its merges";
  // Mid-run: when the syncer was killed (events.jsonl, unix time) the furthest learner's records (every
  // train.log_every = 10 steps) had reached half of train.steps = 1500, and not much more (the runner polls them
  // every 0.1 s). The old kill at 75 s came at 79% on this loaded machine, and not at all on a fast one.
  double killed_at = -1;
  for (const auto& j : split_lines(read_file((runs[0] / "events.jsonl").string()))) {
    const auto r = nlohmann::json::parse(j);
    if (killed_at < 0 && r.value("what", "").rfind("chaos: SIGKILL the syncer", 0) == 0) killed_at = r["t"].get<double>();
  }
  ASSERT_GT(killed_at, 0) << "no syncer kill in events.jsonl";
  int64_t furthest = -1;
  for (int64_t m = 0; m < s["learners"].get<int64_t>(); ++m)
    for (const auto& j : split_lines(read_file((runs[0] / ("learner-" + std::to_string(m) + ".jsonl")).string()))) {
      const auto r = nlohmann::json::parse(j);
      if (r["kind"] == "learner" && r["t"].get<double>() <= killed_at) furthest = std::max(furthest, r["step"].get<int64_t>());
    }
  EXPECT_GE(furthest, 750) << "the syncer was killed before the run was half done";
  EXPECT_LE(furthest, 900) << "the syncer was killed well after the run was half done";
  EXPECT_GT(merges_after, 0) << "the resumed syncer never merged";
  for (int64_t m = 0; m < s["learners"].get<int64_t>(); ++m) {
    bool finished = false;
    for (const auto& j : split_lines(read_file((runs[0] / ("learner-" + std::to_string(m) + ".jsonl")).string()))) {
      const auto r = nlohmann::json::parse(j);
      if (r["kind"] == "learner_done") finished = r.value("finished", false) && r.value("step", int64_t{0}) == 1500;
    }
    EXPECT_TRUE(finished) << "learner " << m;
  }
}

TEST_F(RunCli, CurveRunFinishesWithGeneratedKeys) {
  auto r = run("run " + tiny(60, false), dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  expect_trained(summary());
  const fs::path keys = dir_ / "run" / "keys";
  for (const char* f : {"syncer.key", "syncer.pub", "learner-0.key", "learner-1.pub", "allow/learner-0.pub",
                        "allow/learner-1.pub"})
    EXPECT_TRUE(fs::exists(keys / f)) << f;
  EXPECT_FALSE(fs::exists(keys / "allow" / "syncer.pub"));
  EXPECT_EQ(fs::status(keys / "learner-0.key").permissions() & fs::perms::others_read, fs::perms::none);
}

TEST_F(RunCli, ChaosKillsALearnerAndTheRunStillFinishes) {
  // ~1500 tiny steps take each learner several seconds; a kill every 2 s on average hits at least one of them.
  auto r = run("run " + tiny(1500, true) +
                   " --set chaos.enabled=true --set chaos.kill_interval=2 --set chaos.restart_delay=0.5 --set chaos.seed=3",
               dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  EXPECT_GE(s["learner_kills"].get<int64_t>(), 1) << r.out;
  EXPECT_TRUE(s["rejoin_seconds"].is_object()) << s.dump();
  EXPECT_NE(r.out.find("chaos: SIGKILL learner-"), std::string::npos) << r.out;
  // Every push accounted for under chaos: a killed process writes no learner_done, so its pushes are counted from
  // its push records; the syncer then merges no more than the learners' records say were sent (a kill between a
  // push leaving and its record being written could lose one record per kill).
  const auto& a = s["push_accounting"];
  const auto n = [](const nlohmann::json& o, const char* k) { return o.at(k).get<int64_t>(); };
  EXPECT_GE(n(a, "processes_from_records"), 1) << a.dump();
  EXPECT_EQ(n(a, "due"), n(a, "sent") + n(a["unsent"], "superseded") + n(a["unsent"], "dropped") + n(a["unsent"], "at_end"))
      << a.dump();
  EXPECT_GE(n(a, "unaccounted"), -s["learner_kills"].get<int64_t>()) << a.dump();
  int64_t processes = 0;
  for (const auto& l : a["learners"]) processes += n(l, "processes");
  EXPECT_GT(processes, 2) << "a killed learner's process is counted beside its restart: " << a.dump();
}

// Issue 53: MuLoCo (merge.preset = muloco: the learners train with Muon) learns under chaos, and a killed learner
// that restarts takes its Muon state back from learner.state_dir (its momentum for every hidden matrix).
TEST_F(RunCli, MuLoCoLearnsUnderChaosAndARestartKeepsMuonsState) {
  const fs::path state = dir_ / "state";
  auto r = run("run " + tiny(1500, true) + " --set merge.preset=muloco --set learner.state_dir=" + state.string() +
                   " --set chaos.enabled=true --set chaos.kill_interval=2 --set chaos.restart_delay=0.5"
                   " --set chaos.seed=3",
               dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  EXPECT_GE(s["learner_kills"].get<int64_t>(), 1) << r.out;
  // It learned: the byte model starts at about ln 256 = 5.5 nats.
  EXPECT_LT(s["final_val_loss"].get<double>(), 3.0) << s.dump();
  int64_t restored = 0;
  for (int64_t m : {0, 1})
    for (const auto& line : split_lines(read_file((dir_ / "run" / ("learner-" + std::to_string(m) + ".jsonl")).string())))
      restored += nlohmann::json::parse(line).value("kind", "") == "state_restored";
  EXPECT_GE(restored, 1) << "no restarted learner took its state back";
  // The saved states are Muon's: momentum for the hidden matrices, AdamW's moments for the rest, none for both.
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(state)) {
    if (e.path().filename() != "optimizer.safetensors") continue;
    const std::string bytes = read_file(e.path().string());
    ASSERT_GT(bytes.size(), 8u);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
    const auto header = nlohmann::json::parse(bytes.substr(8, n));
    EXPECT_TRUE(header.contains("muon_momentum/h.0.attn.c_attn.weight")) << header.dump().substr(0, 400);
    EXPECT_TRUE(header.contains("exp_avg/wte.weight")) << header.dump().substr(0, 400);
    EXPECT_FALSE(header.contains("exp_avg/h.0.attn.c_attn.weight"));
    ++files;
  }
  EXPECT_GE(files, 1u);
}

// Issue 33: the asynchronous outer variants run under the runtime exactly as configured for the simulator. Learner 1
// is slowed 3x, so with dynamic local updates the syncer's heartbeats give it a period of about H/3 and it pushes
// more often than learner 0 (K = M with waiting and one fragment keeps the two in step, so learner 0 cannot finish
// first and leave learner 1 the fastest: the counts do not depend on timing); the merge records list each
// contribution's staleness; the final checkpoint's outer state holds Delayed Nesterov's sum and count beside the
// momentum.
TEST_F(RunCli, AsynchronousOuterVariantsRunUnderTheRuntime) {
  auto r = run("run " + tiny(120, true) +
                   " --set outer.kind=delayed_nesterov --set outer.delay=3 --set sync.staleness=exp"
                   " --set sync.dynamic_local_updates=true --set chaos.enabled=true --set chaos.slow_learner=1"
                   " --set chaos.slow_factor=3 --set sync.quorum=2 --set sync.wait_for_answer=true --set sync.fragments=1",
               dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  expect_trained(summary());
  const fs::path run_dir = dir_ / "run";
  const auto records = [](const fs::path& f) {
    std::vector<nlohmann::json> out;
    for (const auto& line : split_lines(read_file(f.string()))) out.push_back(nlohmann::json::parse(line));
    return out;
  };
  std::vector<int64_t> steps[2];
  for (int64_t m : {0, 1})
    for (const auto& j : records(run_dir / ("learner-" + std::to_string(m) + ".jsonl")))
      if (j.value("kind", "") == "push") steps[m].push_back(j["step"].get<int64_t>());
  const auto gaps = [](const std::vector<int64_t>& v) {
    std::vector<int64_t> g;
    for (size_t i = 1; i < v.size(); ++i) g.push_back(v[i] - v[i - 1]);
    return g;
  };
  const auto g0 = gaps(steps[0]), g1 = gaps(steps[1]);
  ASSERT_FALSE(g0.empty());
  ASSERT_FALSE(g1.empty());
  // The fastest learner keeps H = 10; the slow one is told a shorter period (about 10 / 3) while both train.
  EXPECT_EQ(*std::min_element(g0.begin(), g0.end()), 10);
  EXPECT_LE(*std::min_element(g1.begin(), g1.end()), 5) << "learner 1 pushed at " << nlohmann::json(steps[1]).dump();
  EXPECT_GT(steps[1].size(), steps[0].size());
  int64_t merges = 0;
  for (const auto& j : records(run_dir / "syncer.jsonl"))
    if (j.value("kind", "") == "merge") {
      ++merges;
      ASSERT_TRUE(j.contains("staleness")) << j.dump();
      EXPECT_EQ(j["staleness"].size(), j["learners"].size()) << j.dump();
    }
  EXPECT_GT(merges, 0);
  const std::string latest = read_file((run_dir / "latest").string());
  const fs::path ck = run_dir / "checkpoints" / latest.substr(0, latest.find_last_not_of("\n ") + 1);
  const std::string outer = read_file((ck / "optimizer.safetensors").string());
  EXPECT_NE(outer.find(".delay_sum"), std::string::npos);
  EXPECT_NE(outer.find(".delay_count"), std::string::npos);
  EXPECT_NE(outer.find(".momentum_buffer"), std::string::npos);
}

// Issue 35: sparse pushes and the delta broadcast under the runtime. Top-k pushes at 10% with 4-bit values go up;
// merges come down as fragment_delta frames (top-k of the change, the syncer carrying the residual). A learner killed
// by chaos rejoins: its first broadcast of each fragment is whole (fp32), the deltas after it apply to that. The run
// trains, both learners apply deltas, and the syncer's per-learner byte counts show the downlink far below a whole
// fp32 fragment per merge.
TEST_F(RunCli, SparsePushesAndDeltaBroadcastsRunUnderTheRuntime) {
  auto r = run("run " + tiny(1000, true) +
                   " --set net.encoding=topk --set net.broadcast_encoding=topk --set net.topk_density=0.1"
                   " --set net.topk_bits=4 --set sync.quorum=2 --set sync.wait_for_answer=true"
                   " --set chaos.enabled=true --set chaos.kill_interval=2 --set chaos.restart_delay=0.5"
                   " --set chaos.seed=5",
               dir_ / "out.log", 240);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_trained(summary());
  EXPECT_GE(summary()["learner_kills"].get<int64_t>(), 1) << r.out;
  const fs::path run_dir = dir_ / "run";
  int64_t applied = 0, unapplied = 0, learners_done = 0;
  for (int64_t m : {0, 1})
    for (const auto& line : split_lines(read_file((run_dir / ("learner-" + std::to_string(m) + ".jsonl")).string()))) {
      const auto j = nlohmann::json::parse(line);
      if (j.value("kind", "") != "learner_done" || !j.contains("deltas_applied")) continue;
      applied += j["deltas_applied"].get<int64_t>();
      unapplied += j["deltas_unapplied"].get<int64_t>();
      ++learners_done;
    }
  EXPECT_GE(learners_done, 2);
  EXPECT_GT(applied, 10);
  EXPECT_LE(unapplied, applied / 4) << applied << " applied";
  nlohmann::json done;
  for (const auto& line : split_lines(read_file((run_dir / "syncer.jsonl").string()))) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "done") done = j;
  }
  ASSERT_FALSE(done.is_null());
  const nlohmann::json& x = done.contains("learner_bytes") ? done : done["extra"];
  ASSERT_TRUE(x.contains("learner_bytes")) << done.dump();
  EXPECT_GT(x["deltas_sent"].get<int64_t>(), 10);
  const int64_t merges = done["outer_steps"].get<int64_t>();
  for (const auto& b : x["learner_bytes"]) {
    EXPECT_GT(b["up"].get<int64_t>(), 0);
    EXPECT_GT(b["down"].get<int64_t>(), 0);
  }
  // Whole fp32 fragments for every merge would be merges × (model bytes / 2) per learner; the deltas at 10% of
  // 4-bit values are a small share of that even with the whole fragments after the joins.
  const int64_t params = done.value("parameters", x.value("parameters", int64_t{0}));
  ASSERT_GT(params, 0) << done.dump();
  for (const auto& b : x["learner_bytes"])
    EXPECT_LT(b["down"].get<int64_t>(), merges * params * 4 / 2 / 3) << b.dump() << " for " << merges << " merges";
}

// Issue 13: one learner that is a data-parallel group of two processes (c10d Gloo). Chaos kills a random rank; the
// whole group goes down, restarts and rejoins, and the run finishes with every push accepted.
TEST_F(RunCli, LearnerGroupOfTwoRanksSurvivesChaos) {
  auto r = run("run " + tiny(1500, true) +
                   " --set sync.learners=1 --set learner.ranks=2 --set chaos.enabled=true --set chaos.kill_interval=3"
                   " --set chaos.restart_delay=0.5 --set chaos.seed=5",
               dir_ / "out.log", 240);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  EXPECT_EQ(s["contributions_rejected"].get<int64_t>(), 0) << r.out;  // the group's tokens fit its budget
  EXPECT_GE(s["learner_kills"].get<int64_t>(), 1) << r.out;
  EXPECT_GE(s["restarts"]["learner-0"].get<int64_t>(), 1) << s.dump();
  EXPECT_NE(r.out.find("chaos: SIGKILL learner-0"), std::string::npos) << r.out;
  // Both ranks of the last incarnation ran to the end together: rank 1 was stopped by rank 0, not killed.
  const std::string follower = read_file((dir_ / "run" / "logs" / "learner-0.rank-1.log").string());
  EXPECT_NE(follower.find("stopped by rank 0"), std::string::npos) << follower;
  EXPECT_NE(follower.find("rank 1 of 2"), std::string::npos) << follower;
}

// Stopping `deloco run` signals every process at once. Rank 1 waits for rank 0's stop; rank 0 ends its group
// cleanly and saves its state (whether the syncer, stopping too, still answers its goodbye is another matter).
TEST_F(RunCli, StoppingARunStopsALearnerGroupCleanly) {
  std::vector<std::string> argv{"run"};
  std::istringstream words(tiny(100000, true) + " --set sync.learners=1 --set learner.ranks=2");
  for (std::string w; words >> w;) argv.push_back(w);
  test::Proc p(argv, (dir_ / "out.log").string());
  ASSERT_GT(p.pid(), 0);
  const fs::path records = dir_ / "run" / "learner-0.jsonl";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto trained = [&] { return fs::exists(records) && read_file(records.string()).find("\"kind\":\"learner\"") != std::string::npos; };
  while (std::chrono::steady_clock::now() < deadline && !trained() && p.wait(0) < 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(trained()) << p.log();
  p.signal(SIGTERM);
  EXPECT_GE(p.wait(60), 0) << "deloco run did not stop on SIGTERM";
  const std::string rec = read_file(records.string());
  EXPECT_NE(rec.find("\"kind\":\"learner_done\""), std::string::npos) << rec;
  EXPECT_EQ(rec.find("group_stop_undelivered"), std::string::npos) << rec;
  const std::string follower = read_file((dir_ / "run" / "logs" / "learner-0.rank-1.log").string());
  EXPECT_NE(follower.find("stopped by rank 0"), std::string::npos) << follower;
  EXPECT_TRUE(fs::exists(dir_ / "run" / "learner-0" / "state")) << "rank 0 saved no learner-local state";
}

// The kill is scheduled by progress, not by seconds: on a loaded machine (CI beside the science suite) the learners
// once joined only 0.07 s before a kill at 4 s, no checkpoint existed yet, and the syncer was rightly restarted
// without --resume. At 30% of the steps many merges (and checkpoints, every 2) are in.
TEST_F(RunCli, SyncerKilledByChaosResumesFromItsCheckpoint) {
  auto r = run("run " + tiny(1500, true) +
               " --set chaos.enabled=true --set chaos.syncer_kill_at_progress=0.3 --set chaos.restart_delay=0.5"
               " --set syncer.checkpoint_every=2", dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  EXPECT_EQ(s["syncer_kills"].get<int64_t>(), 1) << r.out;
  EXPECT_NE(r.out.find("restarted the syncer with --resume"), std::string::npos) << r.out;
  // The chaos is on record for `deloco report`, which shows it as an event of the run.
  const std::string events = read_file((dir_ / "run" / "events.jsonl").string());
  EXPECT_NE(events.find("\"what\":\"chaos: SIGKILL"), std::string::npos) << events;
  auto rep = run("report " + (dir_ / "run").string() + " --out " + (dir_ / "r.html").string() + " --summary " +
                     (dir_ / "r.json").string(),
                 dir_ / "report.log");
  ASSERT_EQ(rep.code, 0) << rep.out;
  const auto j = nlohmann::json::parse(read_file((dir_ / "r.json").string()));
  const auto& ev = j["runs"][0]["events"];
  EXPECT_TRUE(std::any_of(ev.begin(), ev.end(), [](const nlohmann::json& e) {
    return e[1].get<std::string>().find("chaos: SIGKILL") != std::string::npos;
  })) << ev.dump();
  EXPECT_GT(j["runs"][0]["merges"].size(), 0u);
  EXPECT_EQ(j["runs"][0]["learners"].size(), 2u);
}

// Records of a JSON-lines file, in order.
std::vector<nlohmann::json> records_of(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_file(path.string()));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A sharded syncer of two processes over CURVE, each killed once by chaos (shard 0, then shard 1) and resumed.
// While one shard is down the other keeps merging its fragments; the resumed shard continues from its checkpoint
// and merges again; the run's global model is assembled from both shards and evaluated.
// H = 40 as in configs/demo.toml: quorum-1 merges of single, stale contributions under Nesterov (lr 0.7, μ 0.9)
// every 10 inner steps diverge this tiny model within 3000 steps whether or not the syncer is sharded.
TEST_F(RunCli, ShardedSyncerSurvivesTheKillOfEitherShard) {
  // The kills come by the clock: at 6 s every shard has checkpointed even on a loaded machine (a shard killed
  // before its first checkpoint starts afresh), and learners slowed 2× (a sleep, no CPU) are still training when
  // shard 1 is back at 14 s even on a fast one.
  auto r = run("run " + tiny(5000, false) +
                   " --set sync.fragments=4 --set sync.sync_every=40 --set syncer.shards=2 --set learner.slowdown=2"
                   " --set chaos.enabled=true --set chaos.syncer_kill_at=6,12 --set chaos.restart_delay=2",
               dir_ / "out.log", 300);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  EXPECT_EQ(s["syncer_kills"].get<int64_t>(), 2) << r.out;
  EXPECT_EQ(s["syncer_shards"].get<int64_t>(), 2);
  ASSERT_EQ(s["shards"].size(), 2u) << s.dump();
  // The only refusals: a learner's message reaching a restarted shard before it noticed the restart and said
  // hello again (not_joined); nothing it pushed was refused.
  for (const auto& [reason, n] : s["rejects"].items()) EXPECT_EQ(reason, "not_joined") << s["rejects"].dump();
  // Each shard served its own half of the fragments, and the summary sums them.
  std::vector<int64_t> all;
  int64_t merges = 0;
  for (const auto& sh : s["shards"]) {
    for (int64_t p : sh["fragments"].get<std::vector<int64_t>>()) all.push_back(p);
    merges += sh["outer_steps"].get<int64_t>();
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(s["outer_steps"].get<int64_t>(), merges);
  EXPECT_NE(s.value("final_eval", std::string()).find("assembled from 2 shards"), std::string::npos) << s.dump();
  EXPECT_LT(s["final_val_loss"].get<double>(), 4.0) << s.dump();  // trained: uniform over bytes is 5.5 nats
  EXPECT_NE(r.out.find("restarted syncer shard 0 with --resume"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("restarted syncer shard 1 with --resume"), std::string::npos) << r.out;

  const fs::path run_dir = dir_ / "run";
  std::vector<std::vector<nlohmann::json>> recs{records_of(run_dir / "shard-0" / "syncer.jsonl"),
                                                records_of(run_dir / "shard-1" / "syncer.jsonl")};
  for (int k = 0; k < 2; ++k) {
    const auto& mine = recs[static_cast<size_t>(k)];
    const auto& other = recs[static_cast<size_t>(1 - k)];
    // Down from its last record before the second start until that start.
    size_t restart = 0;
    for (size_t i = 1; i < mine.size() && restart == 0; ++i)
      if (mine[i]["kind"] == "started") restart = i;
    ASSERT_GT(restart, 0u) << "shard " << k << " was not restarted";
    EXPECT_TRUE(mine[restart]["resumed"].get<bool>()) << mine[restart].dump();
    EXPECT_GT(mine[restart]["merges"].get<int64_t>(), 0) << "shard " << k << " resumed from nothing";
    const double down = mine[restart - 1]["t"].get<double>(), up = mine[restart]["t"].get<double>();
    int64_t others_merges = 0, own_after = 0;
    for (const auto& j : other)
      if (j["kind"] == "merge" && j["t"].get<double>() > down && j["t"].get<double>() < up) ++others_merges;
    for (size_t i = restart; i < mine.size(); ++i) own_after += mine[i]["kind"] == "merge" ? 1 : 0;
    EXPECT_GT(others_merges, 0) << "shard " << 1 - k << " stalled while shard " << k << " was down (" << down << " to "
                                << up << ")";
    EXPECT_GT(own_after, 0) << "shard " << k << " never merged again after its restart";
  }
  // The assembled global model is the run folder's checkpoint: `deloco eval` reads it like any other.
  auto e = run("eval --checkpoint " + run_dir.string(), dir_ / "eval.log");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("assembled_"), std::string::npos) << e.out;
}

// The hang of issue 10 with real processes: τ = 5 with waiting and a quorum of both learners. Each answer that
// comes within τ steps is applied at send + τ and clears the wait; the run finishes with every merge holding both.
// Standby pairs for a sharded syncer (issue 34, docs/reliability.md), over CURVE and ipc sockets (the short name keeps
// the run folder's socket paths within sun_path; a longer one fell back to TCP and hid that the standbys' socket
// folder was missing when sharded): chaos kills the leader of shard 0,
// of shard 1, then of each again (the syncers that took over). Each time the other syncer of the pair takes over with
// a newer epoch, and the killed one comes back as its standby; the run finishes, and every merge of every fragment
// has the next version across all four terms of its shard.
TEST_F(RunCli, StandbyPairsSurviveLeaderKills) {
  auto r = run("run " + tiny(3000, false) +
                   " --set sync.fragments=4 --set sync.sync_every=40 --set syncer.shards=2 --set learner.slowdown=2"
                   " --set syncer.standby=true --set syncer.lease=1 --set chaos.enabled=true"
                   " --set chaos.syncer_kill_at=6,10,14,18 --set chaos.restart_delay=1",
               dir_ / "out.log", 300);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  EXPECT_EQ(s["syncer_kills"].get<int64_t>(), 4) << r.out;
  ASSERT_EQ(s["shards"].size(), 2u) << s.dump();
  for (const auto& sh : s["shards"]) {  // the summary of the syncer that led each shard at the end
    ASSERT_TRUE(sh.contains("pair")) << sh.dump();
    EXPECT_EQ(sh["pair"]["role"], "leader") << sh.dump();
    EXPECT_EQ(sh["pair"]["epoch"], 3) << sh.dump();
    EXPECT_EQ(sh["pair"]["mismatches"], 0) << sh.dump();
  }
  for (const char* line : {"syncer shard 0 (standby) took over (epoch 2)", "syncer shard 1 (standby) took over (epoch 2)",
                           "syncer shard 0 (primary) took over (epoch 3)", "syncer shard 1 (primary) took over (epoch 3)",
                           "as the standby"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  EXPECT_LT(s["final_val_loss"].get<double>(), 4.0) << s.dump();
  const fs::path run_dir = dir_ / "run";
  for (int k = 0; k < 2; ++k) {
    const fs::path sd = run_dir / ("shard-" + std::to_string(k));
    std::vector<nlohmann::json> events;
    for (const fs::path& f : {sd / "syncer.jsonl", sd / "standby" / "syncer.jsonl"})
      for (const auto& j : records_of(f))
        if (j["kind"] == "merge" || j["kind"] == "takeover") events.push_back(j);
    std::sort(events.begin(), events.end(),
              [](const nlohmann::json& a, const nlohmann::json& b) { return a["t"].get<double>() < b["t"].get<double>(); });
    // A merge the killed leader checkpointed but never replicated (so never sent: broadcasts wait for the standby)
    // is void: the takeover's merge count says which.
    std::vector<nlohmann::json> merges;
    for (const auto& j : events) {
      if (j["kind"] == "merge") {
        merges.push_back(j);
        continue;
      }
      const int64_t n = j["merges"];
      merges.erase(std::remove_if(merges.begin(), merges.end(),
                                  [&](const nlohmann::json& m) { return m.value("merges", int64_t{0}) > n; }),
                   merges.end());
    }
    std::map<int64_t, int64_t> version;
    for (const auto& m : merges) {
      const int64_t f = m["fragment"], v = m["version"];
      EXPECT_EQ(v, version[f] + 1) << "shard " << k << ": " << m.dump();
      version[f] = v;
    }
    EXPECT_GT(merges.size(), 10u) << "shard " << k;
  }
}

TEST_F(RunCli, StreamingWithWaitingFinishes) {
  auto r = run("run " + tiny(200, true) +
               " --set sync.overlap=5 --set sync.wait_for_answer=true --set sync.quorum=2 --set sync.grace=false",
               dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  EXPECT_GE(s["outer_steps"].get<int64_t>(), 1);
  EXPECT_EQ(s["contributions_merged"].get<int64_t>(), 2 * s["outer_steps"].get<int64_t>()) << s.dump();
}

TEST_F(RunCli, UnknownChaosKeyIsAConfigError) {
  auto r = run("run " + tiny(60, true) + " --set chaos.kill_every=3", dir_ / "out.log");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("chaos.kill_every"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "run")) << "nothing is created for a bad config";
}

TEST_F(RunCli, ProcessFailingRepeatedlyStopsTheRunWithItsLog) {
  // A corpus path that does not exist: every child fails at start-up, again and again.
  auto r = run("run " + tiny(60, true) + " --set data.path=" + (dir_ / "no-such-corpus").string(),
               dir_ / "out.log");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(" times within "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no-such-corpus"), std::string::npos) << r.out;
}

// Issue 29 item 8: a learner process that exits 0 without its learner having finished (here `true`, which never
// joins) is a failure, not "done": it is restarted, said so, and its crash loop ends the run with an error naming
// it, where the run used to wait forever for a learner it counted as done.
TEST_F(RunCli, LearnerExitingZeroWithoutFinishingIsACrashLoopNotAHang) {
  auto r = run("run " + tiny(100000, true) + " --learner-command 1=true", dir_ / "out.log", 180);
  ASSERT_NE(r.code, 124) << "deloco run did not end by itself:\n" << r.out;
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("learner-1 exited 0 before finishing (it never joined the syncer); restarting it"), std::string::npos)
      << r.out;
  // The crash-loop policy ends it (3 failures within 10 s; 5 within 120 s on a machine slow enough to space them).
  const size_t failed = r.out.find("learner-1 failed ");
  ASSERT_NE(failed, std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" times within ", failed), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(last: exit status 0 before finishing: it never joined the syncer)", failed), std::string::npos)
      << r.out;
  const std::string log = read_file((dir_ / "run" / "logs" / "learner-1.log").string());
  EXPECT_NE(log.find("=== deloco run: start #3"), std::string::npos) << log;
}

}  // namespace
}  // namespace deloco
