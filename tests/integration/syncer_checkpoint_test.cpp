// The syncer's checkpoints through the real `deloco syncer` (issue 11 item 8): a resume takes the newest committed
// checkpoint even when "latest" is stale, removes what a crash left, and a checkpoint at a merge count that is
// already on disk is written as a new folder, never skipped.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/jsonl.h"
#include "support/proc.h"
#include "util/checkpoint_store.h"
#include "util/fs.h"

namespace deloco {
namespace syncer_checkpoint_cases {
namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;
using test::records;

std::string source_dir() {
  const char* v = std::getenv("DELOCO_SOURCE_DIR");
  return v ? v : ".";
}

std::vector<std::string> flags(const std::string& src) {
  return {"--config", src + "/configs/tiny.toml", "--set", "data.path=" + src + "/data/sotu", "--set", "train.steps=20",
          "--set", "train.threads=1", "--set", "train.eval_tokens=2048", "--set", "sync.learners=2", "--set",
          "sync.quorum=1", "--set", "sync.fragments=2", "--set", "sync.sync_every=5", "--set",
          "merge.preset=decoupled", "--set", "syncer.eval_interval=0", "--set", "net.heartbeat=0.2", "--set",
          "net.join_timeout=30", "--set", "net.plaintext=true"};
}

// Runs `deloco syncer` (syncer_flags, plus --out RUN) and two learners (learner_flags) to the end of their run;
// the logs go to DIR. Fails the calling test (ASSERT) when a process does not start or exits with an error.
void run_to_the_end(const fs::path& dir, const fs::path& run, const std::vector<std::string>& syncer_flags,
                    const std::vector<std::string>& learner_flags) {
  auto a = syncer_flags;
  a.insert(a.begin(), "syncer");
  a.insert(a.end(), {"--out", run.string(), "--bind", "tcp://127.0.0.1:0"});
  test::Proc syncer(a, (dir / "syncer.log").string());
  std::string endpoint;
  for (auto deadline = clk::now() + std::chrono::seconds(60); endpoint.empty() && clk::now() < deadline;) {
    auto s = records(run / "syncer.jsonl", "started");
    if (!s.empty()) endpoint = s[0]["endpoint"];
    else if (syncer.wait(0) >= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(endpoint.empty()) << syncer.log();
  std::vector<std::unique_ptr<test::Proc>> learners;
  for (int m = 0; m < 2; ++m) {
    auto l = learner_flags;
    l.insert(l.begin(), "learner");
    l.insert(l.end(), {"--id", std::to_string(m), "--connect", endpoint, "--out", run.string()});
    learners.push_back(std::make_unique<test::Proc>(l, (dir / ("l" + std::to_string(m) + ".log")).string()));
  }
  for (auto& l : learners) ASSERT_EQ(l->wait(180), 0) << l->log();
  ASSERT_EQ(syncer.wait(60), 0) << syncer.log();
}

TEST(SyncerCheckpoints, ResumeTakesTheNewestCommittedCheckpointCleansUpAndNeverSkips) {
  const std::string src = source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_syncer_ck_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path run = dir / "run";
  auto syncer_args = [&](bool resume) {
    auto a = flags(src);
    a.insert(a.begin(), "syncer");
    a.insert(a.end(), {"--out", run.string(), "--bind", "tcp://127.0.0.1:0"});
    if (resume) a.push_back("--resume");
    return a;
  };

  // A short run to its end: periodic checkpoints, then the final one.
  fs::create_directories(dir);
  ASSERT_NO_FATAL_FAILURE(run_to_the_end(dir, run, flags(src), flags(src)));
  const auto before = list_checkpoints(run.string());
  ASSERT_GE(before.size(), 2u);
  const CommittedCheckpoint newest = before.back();
  const auto newest_manifest = nlohmann::json::parse(read_file(newest.dir + "/manifest.json"));
  const int64_t merges = newest_manifest["counters"]["merges"].get<int64_t>();
  ASSERT_GT(merges, 0);

  // What a SIGKILL between the commit rename and "latest" leaves, plus the debris of an interrupted write.
  write_file_atomic((run / "latest").string(), before.front().name + "\n");
  const fs::path debris = run / "checkpoints" / ".merges_99999999-r0000.tmp.999999999";
  fs::create_directories(debris);
  std::ofstream(debris / "model.safetensors") << "half a file";
  std::ofstream(run / "latest.tmp.999999999") << "merges_99999999-r0000\n";

  test::Proc resumed(syncer_args(true), (dir / "syncer2.log").string());
  ASSERT_EQ(resumed.wait(120), 0) << resumed.log();  // every learner had retired: it checkpoints and ends
  const auto started = records(run / "syncer.jsonl", "started");
  ASSERT_EQ(started.size(), 2u);
  EXPECT_TRUE(started[1]["resumed"].get<bool>());
  EXPECT_EQ(started[1]["merges"].get<int64_t>(), merges) << "resumed from an older checkpoint than the newest";
  EXPECT_FALSE(fs::exists(debris));
  EXPECT_FALSE(fs::exists(run / "latest.tmp.999999999"));

  // Its final checkpoint has the merge count and retirements of the newest one: a new folder, not a skip.
  const auto after = newest_checkpoint(run.string());
  ASSERT_TRUE(after.has_value());
  // (The first run's final checkpoint already had one: the last retirement's checkpoint had its merge count.)
  const std::string base_name = newest.name.substr(0, newest.name.find("-s"));
  EXPECT_EQ(after->name, base_name + "-s" + std::to_string(newest.sequence + 1));
  EXPECT_EQ(read_file((run / "latest").string()), after->name + "\n");
  const auto ckpts = records(run / "syncer.jsonl", "checkpoint");
  ASSERT_FALSE(ckpts.empty());
  EXPECT_EQ(ckpts.back()["path"].get<std::string>(), after->dir);
  EXPECT_EQ(list_checkpoints(run.string()).size(), 3u);  // keeps the three newest
  for (const auto& e : fs::directory_iterator(run / "checkpoints"))
    EXPECT_NE(e.path().filename().string()[0], '.') << e.path();

  // `deloco train --resume` refuses a syncer's checkpoint (found by review: it restarted AdamW from nothing at
  // step = the merge count and wrote train checkpoints into the syncer's folder, which the syncer then refused).
  test::Proc wrong({"train", "--resume", run.string()}, (dir / "train.log").string());
  EXPECT_NE(wrong.wait(60), 0);
  EXPECT_NE(wrong.log().find("is a syncer checkpoint"), std::string::npos) << wrong.log();
  EXPECT_EQ(list_checkpoints(run.string()).size(), 3u);
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// sync.final_round: the final states are merged after every learner retired and exist nowhere else. Found by review:
// they were checkpointed only with the final checkpoint, after the final evaluation, so a syncer killed during it
// resumed from the last retirement's checkpoint and ended without them. The final round is now checkpointed before
// the evaluation: with the final checkpoint removed (the kill), the resume ends with the same model.
TEST(SyncerCheckpoints, TheFinalRoundIsDurableBeforeTheFinalEvaluation) {
  const std::string src = source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_syncer_final_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path run = dir / "run";
  auto with_final = [&](std::vector<std::string> a) {
    a.insert(a.end(), {"--set", "sync.final_round=true"});
    return a;
  };
  auto syncer_args = [&](bool resume) {
    auto a = with_final(flags(src));
    a.insert(a.begin(), "syncer");
    a.insert(a.end(), {"--out", run.string(), "--bind", "tcp://127.0.0.1:0"});
    if (resume) a.push_back("--resume");
    return a;
  };
  ASSERT_NO_FATAL_FAILURE(run_to_the_end(dir, run, with_final(flags(src)), with_final(flags(src))));
  ASSERT_FALSE(records(run / "syncer.jsonl", "final_merge").empty()) << "no final round ran: nothing was tested";
  auto manifest = [](const std::string& d) { return nlohmann::json::parse(read_file(d + "/manifest.json")); };
  auto cks = list_checkpoints(run.string());
  ASSERT_GE(cks.size(), 2u);
  const nlohmann::json last = manifest(cks.back().dir), before = manifest(cks[cks.size() - 2].dir);
  ASSERT_TRUE(last["final"].get<bool>());
  // The one before the final checkpoint already holds the final round's model (its versions, its contributions).
  EXPECT_FALSE(before["final"].get<bool>());
  EXPECT_EQ(before["versions"], last["versions"]);
  EXPECT_EQ(before["contributions_merged"], last["contributions_merged"]);
  // The kill during the final evaluation: the final checkpoint never came. The resume ends with the same model.
  fs::remove_all(cks.back().dir);
  test::Proc resumed(syncer_args(true), (dir / "syncer2.log").string());
  ASSERT_EQ(resumed.wait(120), 0) << resumed.log();
  const auto after = newest_checkpoint(run.string());
  ASSERT_TRUE(after.has_value());
  const nlohmann::json again = manifest(after->dir);
  EXPECT_TRUE(again["final"].get<bool>());
  EXPECT_EQ(again["versions"], last["versions"]);
  EXPECT_EQ(again["contributions_merged"], last["contributions_merged"]);
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
