// End to end: `deloco config keys|presets` print what the bindings hold, and a training run takes every merge.* key
// (from --set and DELOCO_SET) into the config it records. CTest passes DELOCO_BINARY and DELOCO_SOURCE_DIR.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deloco/algorithm.h"

namespace deloco {
namespace config_cli_cases {
namespace fs = std::filesystem;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}
const std::string kSrc = env_or("DELOCO_SOURCE_DIR", ".");
const std::string kBin = env_or("DELOCO_BINARY", "./deloco");

struct Result {
  int code;
  std::string out;
};
// `env`: VAR=value words for this one command. stderr joins stdout only when `merge_stderr`.
Result run(const std::string& args, const std::string& env = "", bool merge_stderr = true) {
  const std::string cmd =
      "env -u DELOCO_SET " + env + " OMP_WAIT_POLICY=PASSIVE " + kBin + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = ::popen(cmd.c_str(), "r");
  Result r{-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(ConfigCli, PresetsAreTheAlgorithmsTable) {
  const Result r = run("config presets --json", "", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["presets"].size(), algorithm_presets().size());
  for (size_t i = 0; i < algorithm_presets().size(); ++i) {
    const AlgorithmPreset& p = algorithm_presets()[i];
    const nlohmann::json& q = j["presets"][i];
    EXPECT_EQ(q["name"], p.name);
    EXPECT_EQ(q["merge"]["method"], p.plan.method);
    EXPECT_EQ(q["merge"]["rules"].size(), p.plan.rules.size());
    EXPECT_EQ(q["outer"]["kind"], p.outer.kind);
    EXPECT_EQ(q["outer"]["lr"].get<double>(), p.outer.lr);  // exactly: scripts read these instead of copying them
    EXPECT_EQ(q["outer"]["momentum"].get<double>(), p.outer.momentum);
    EXPECT_EQ(q["inner"], p.inner);
  }
  EXPECT_EQ(j["merge_plans"], nlohmann::json({"diloco", "decoupled", "isoloco"}));
  const Result text = run("config presets");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("isoloco    adamw  nesterov  1.8   0.8  iso_c"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("muloco     muon   nesterov  0.7   0.9  mean"), std::string::npos) << text.out;
}

TEST(ConfigCli, KeysListEachCommandsBindings) {
  auto keys = [](const std::string& which) {
    const Result r = run("config keys --json" + (which.empty() ? "" : " --for " + which), "", false);
    EXPECT_EQ(r.code, 0) << r.out;
    std::map<std::string, nlohmann::json> m;
    for (const auto& k : nlohmann::json::parse(r.out)) m[k["key"]] = k;
    return m;
  };
  auto sim = keys("sim"), merge = keys("merge"), all = keys("");
  ASSERT_TRUE(sim.count("merge.ties_keep"));
  EXPECT_EQ(sim["merge.ties_keep"]["type"], "number");
  EXPECT_EQ(sim["merge.ties_keep"]["default"].get<double>(), 0.9);
  EXPECT_TRUE(sim.count("sim.mtbf") && sim.count("train.lr") && sim.count("outer.lr"));
  EXPECT_FALSE(sim.count("merge.alpha"));
  EXPECT_TRUE(merge.count("merge.alpha") && merge.count("merge.preset"));
  EXPECT_FALSE(merge.count("train.lr"));
  EXPECT_EQ(all["merge.ties_keep"]["commands"], nlohmann::json({"sim", "run", "merge"}));
  EXPECT_EQ(all["goodput.chips"]["commands"], nlohmann::json({"goodput"}));
  EXPECT_EQ(all["goodput.chips"]["type"], "integer list");
  EXPECT_NE(run("config keys --for nope").code, 0);
}

TEST(ConfigCli, ATrainingRunTakesTheMergeKeysFromSetAndTheEnvironment) {
  const fs::path dir = fs::temp_directory_path() / ("deloco_config_cli_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string base = "sim --config " + kSrc + "/configs/tiny.toml --set data.path=" + kSrc +
                           "/data/sotu --set train.steps=20 --set sync.learners=2 --set sync.quorum=1"
                           " --set sync.sync_every=10 --set train.eval_tokens=512 --set train.threads=1";
  Result r = run(base + " --set merge.method=ties --set merge.ties_keep=0.3 --set sim.out_dir=" + (dir / "a").string(),
                 "DELOCO_SET='merge.dare_drop=0.25\nmerge.ties_keep=0.5'");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "a" / "config.json"));
  EXPECT_EQ(cfg["merge"]["method"], "ties");
  EXPECT_EQ(cfg["merge"]["ties_keep"].get<double>(), 0.3);  // --set beats DELOCO_SET
  EXPECT_EQ(cfg["merge"]["dare_drop"].get<double>(), 0.25);
  const nlohmann::json s = nlohmann::json::parse(std::ifstream(dir / "a" / "summary.json"));
  EXPECT_EQ(s["config"]["merge"]["ties_keep"].get<double>(), 0.3);
  EXPECT_GT(s["contributions_merged"].get<int64_t>(), 0);
  // Refused before anything runs, naming the key and where it came from.
  r = run(base + " --set merge.alpha=2 --set sim.out_dir=" + (dir / "b").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--set: unknown key 'merge.alpha'"), std::string::npos) << r.out;
  r = run(base + " --set sim.out_dir=" + (dir / "c").string(), "DELOCO_SET=merge.ties_keep=2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("'merge.ties_keep': ties_keep must be in (0, 1]"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "b") || fs::exists(dir / "c"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
