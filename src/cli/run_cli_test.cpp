// End-to-end tests of `deloco run`: the orchestrator starts a real syncer and real learner processes of the
// `deloco` executable over ZeroMQ (ipc), in plaintext and with CURVE, with and without chaos. CTest passes
// DELOCO_BINARY and DELOCO_SOURCE_DIR; the corpus (data/sotu) comes from scripts/setup.sh.
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deloco/fs.h"
#include "support/proc.h"

namespace deloco {
namespace {
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
}

TEST_F(RunCli, SyncerKilledByChaosResumesFromItsCheckpoint) {
  auto r = run("run " + tiny(1500, true) +
               " --set chaos.enabled=true --set chaos.syncer_kill_at=4 --set chaos.restart_delay=0.5"
               " --set syncer.checkpoint_every=2", dir_ / "out.log");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary();
  expect_trained(s);
  EXPECT_EQ(s["syncer_kills"].get<int64_t>(), 1) << r.out;
  EXPECT_NE(r.out.find("restarted the syncer with --resume"), std::string::npos) << r.out;
}

// The hang of issue 10 with real processes: τ = 5 with waiting and a quorum of both learners. Each answer that
// comes within τ steps is applied at send + τ and clears the wait; the run finishes with every merge holding both.
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

}  // namespace
}  // namespace deloco
