// `deloco train --resume` through the real executable after a crash in the checkpoint commit window (issue 11
// item 8): the resume takes the newest committed checkpoint whatever "latest" says, removes uncommitted debris,
// and a run resumed from an older checkpoint that reaches an already checkpointed step writes a new folder instead
// of failing.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "util/checkpoint_store.h"
#include "util/fs.h"

namespace deloco {
namespace resume_cli_cases {
namespace fs = std::filesystem;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}
const std::string kSrc = env_or("DELOCO_SOURCE_DIR", ".");
const std::string kBin = env_or("DELOCO_BINARY", "./deloco");

std::pair<int, std::string> run(const std::string& args) {
  FILE* p = ::popen(("OMP_WAIT_POLICY=PASSIVE " + kBin + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Training losses by step, in the order they were logged.
std::vector<std::pair<int64_t, double>> losses(const fs::path& run) {
  std::vector<std::pair<int64_t, double>> out;
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
  }
  return out;
}

TEST(ResumeCli, TrainResumesFromTheNewestCommittedCheckpointAndNeverCollides) {
  ASSERT_TRUE(fs::exists(kSrc + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_resume_cli_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path a = dir / "a";
  const std::string tiny = "--config " + kSrc + "/configs/tiny.toml --set data.path=" + kSrc +
                           "/data/sotu --set train.out_dir=" + a.string() +
                           " --set train.steps=30 --set train.threads=1 --set train.log_every=1"
                           " --set train.eval_every=10 --set train.checkpoint_every=10";
  auto first = run("train " + tiny + " --stop-at-step 20");
  ASSERT_EQ(first.first, 0) << first.second;
  ASSERT_TRUE(fs::exists(a / "checkpoints" / "step_00000020"));

  // Killed after committing step_00000020 but before "latest" (it still names step_00000010), with the debris of
  // an interrupted checkpoint and of an interrupted "latest".
  write_file_atomic((a / "latest").string(), "step_00000010\n");
  fs::create_directories(a / "checkpoints" / ".step_00000030.tmp.999999999");
  std::ofstream(a / "checkpoints" / ".step_00000030.tmp.999999999" / "model.safetensors") << "torn";
  std::ofstream(a / "latest.tmp.999999999") << "step_00000030\n";

  auto second = run("train --resume " + a.string());
  ASSERT_EQ(second.first, 0) << second.second;
  EXPECT_NE(second.second.find("resumed at step 20"), std::string::npos) << second.second;
  EXPECT_FALSE(fs::exists(a / "checkpoints" / ".step_00000030.tmp.999999999"));
  EXPECT_FALSE(fs::exists(a / "latest.tmp.999999999"));
  EXPECT_EQ(read_file((a / "latest").string()), "step_00000030\n");
  const auto straight = losses(a);
  ASSERT_EQ(straight.size(), 30u) << "steps 11-20 were trained twice: the resume went back to step 10";
  // The records' time goes on across the resume from the checkpoint's elapsed_s (the report's time axis), not
  // again from 0.
  {
    std::vector<double> t;
    std::ifstream in(a / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line))
      if (auto j = nlohmann::json::parse(line); j["kind"] == "train") t.push_back(j["elapsed_s"].get<double>());
    ASSERT_EQ(t.size(), 30u);
    for (size_t i = 1; i < t.size(); ++i) EXPECT_GE(t[i], t[i - 1]) << "step " << i + 1;
    const auto m20 = nlohmann::json::parse(read_file((a / "checkpoints" / "step_00000020" / "manifest.json").string()));
    ASSERT_TRUE(m20.contains("elapsed_s")) << m20.dump();
    EXPECT_GT(m20["elapsed_s"].get<double>(), 0.0);
    EXPECT_GE(t[20], m20["elapsed_s"].get<double>());
  }

  // Resuming from the older checkpoint on purpose reaches steps 20 and 30 again: new folders, not a refusal.
  auto third = run("train --resume " + (a / "checkpoints" / "step_00000010").string());
  ASSERT_EQ(third.first, 0) << third.second;
  EXPECT_TRUE(fs::exists(a / "checkpoints" / "step_00000020-s4" / "manifest.json"));
  const auto newest = newest_checkpoint(a.string());
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->name, "step_00000030-s5");
  EXPECT_EQ(read_file((a / "latest").string()), "step_00000030-s5\n");
  // The replayed steps compute exactly the same losses (same data order, same state).
  const auto all = losses(a);
  ASSERT_EQ(all.size(), 50u);
  for (size_t i = 30; i < 50; ++i) {
    EXPECT_EQ(all[i].first, straight[i - 20].first);
    EXPECT_EQ(all[i].second, straight[i - 20].second) << "step " << all[i].first;
  }
  auto ev = run("eval --checkpoint " + a.string());
  ASSERT_EQ(ev.first, 0) << ev.second;
  EXPECT_NE(ev.second.find("step_00000030-s5 (step 30)"), std::string::npos) << ev.second;
  EXPECT_EQ(list_checkpoints(a.string()).size(), 3u);  // train.keep_checkpoints = 3, by commit order
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
