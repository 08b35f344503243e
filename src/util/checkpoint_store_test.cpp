// The checkpoint commit protocol under a crash after every file operation (tests/support/fault_file_ops.h), and
// the regressions of issue 11 item 8: a checkpoint is never skipped, stale temporaries are removed, a stale or
// missing "latest" does not send a resume to an older checkpoint.
#include "util/checkpoint_store.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "support/fault_file_ops.h"

namespace deloco {
namespace checkpoint_store_cases {
namespace fs = std::filesystem;
using test::FaultFileOps;
using test::SimulatedCrash;

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(g() & 0xff);
  return s;
}

CheckpointFiles files_of(uint32_t seed) {
  return {{"model.safetensors", random_bytes(4096 + seed, seed)}, {"optimizer.safetensors", random_bytes(777, seed + 1)}};
}

// Every entry under `dir` that is a temporary of the commit protocol.
std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp.") != std::string::npos || (n[0] == '.' && e.path().parent_path().filename() == "checkpoints"))
      out.push_back(e.path().string());
  }
  return out;
}

// The checkpoint `c` holds exactly `files`, bit-exact, and verifies against its manifest.
void expect_holds(const CommittedCheckpoint& c, const CheckpointFiles& files) {
  const auto m = parse_checkpoint_manifest(read_file(c.dir + "/manifest.json"), c.dir);
  EXPECT_EQ(m.sequence, c.sequence);
  ASSERT_EQ(m.files.size(), files.size()) << c.dir;
  for (const auto& [name, bytes] : files) {
    const std::string got = read_file(c.dir + "/" + name);
    EXPECT_TRUE(got == bytes) << c.dir << "/" << name << " is not bit-exact (" << got.size() << " bytes)";
    EXPECT_NO_THROW(verify_checkpoint_file(m.files.at(name), got, c.dir + "/" + name));
  }
}

std::string latest_of(const fs::path& run) {
  std::string s = read_file((run / "latest").string());
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

fs::path fresh_dir(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / ("deloco_ckstore_" + std::to_string(::getpid()) + "_" + tag + "_" +
                                                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

struct Style {
  const char* what;
  std::vector<std::string> names;  // committed before (oldest first), then the new one
  int64_t keep;
};
const Style kTrain{"train", {"step_00000010", "step_00000020", "step_00000030", "step_00000040"}, 3};
const Style kSyncer{"syncer", {"merges_00000004-r0000", "merges_00000008-r0000", "merges_00000008-r0001",
                               "merges_00000012-r0001"}, 3};

// For every k, the commit of the new checkpoint crashes after k operations; the restart's recovery then finds the
// previous newest checkpoint or the new one (the new one once the commit rename is done, unless power was lost),
// bit-exact, with "latest" naming it and no temporaries left; and the next checkpoint, under the very same name
// (the resumed run reaching the same step or merge count again), is written, not skipped.
void crash_at_every_operation(const Style& style, bool power_loss) {
  const fs::path root = fresh_dir(std::string(style.what) + (power_loss ? "_pl" : ""));
  const fs::path base = root / "base";
  std::map<std::string, CheckpointFiles> content;
  for (size_t i = 0; i + 1 < style.names.size(); ++i) {
    content[style.names[i]] = files_of(static_cast<uint32_t>(10 * i + 1));
    commit_run_checkpoint(base.string(), style.names[i], {{"step", i}}, content[style.names[i]], style.keep);
  }
  const std::string prev = style.names[style.names.size() - 2], next = style.names.back();
  const CheckpointFiles fresh = files_of(99);
  const nlohmann::json manifest = {{"step", 1000}, {"kind", style.what}};

  // The sequence's length N, and where its commit rename is.
  const fs::path probe = root / "probe";
  fs::copy(base, probe, fs::copy_options::recursive);
  FaultFileOps counting(-1);
  commit_run_checkpoint(probe.string(), next, manifest, fresh, style.keep, counting);
  const int64_t N = counting.ops();
  const std::string commit_op = "rename " + (probe / "checkpoints" / ("." + next)).string();
  int64_t commit_at = -1;
  for (size_t i = 0; i < counting.log().size(); ++i)
    if (counting.log()[i].rfind(commit_op, 0) == 0) commit_at = static_cast<int64_t>(i);
  ASSERT_GE(commit_at, 0) << "no commit rename in the log";
  ASSERT_GE(N, 13) << "mkdir, 3 × (write, fsync), fsync, rename, fsync, latest (4), prune (2)";

  for (int64_t k = 0; k <= N; ++k) {
    SCOPED_TRACE(std::string(style.what) + (power_loss ? ": power loss" : ": crash") + " after " + std::to_string(k) +
                 " of " + std::to_string(N) + " operations" +
                 (k < N ? " (next: " + counting.log()[static_cast<size_t>(k)] + ")" : ""));
    const fs::path run = root / ("k" + std::to_string(k));
    const fs::path scratch = root / "scratch";
    fs::copy(base, run, fs::copy_options::recursive);
    fs::create_directories(scratch);
    FaultFileOps faulty(k, power_loss, scratch.string());
    bool crashed = false;
    try {
      commit_run_checkpoint(run.string(), next, manifest, fresh, style.keep, faulty);
    } catch (const SimulatedCrash&) {
      crashed = true;
    }
    EXPECT_EQ(crashed, k < N);

    auto newest = recover_run_folder(run.string());  // the restart
    ASSERT_TRUE(newest.has_value());
    if (!power_loss && k > commit_at) EXPECT_EQ(newest->name, next) << "a committed checkpoint was lost";
    ASSERT_TRUE(newest->name == prev || newest->name == next) << newest->name;
    expect_holds(*newest, newest->name == next ? fresh : content[prev]);
    EXPECT_EQ(latest_of(run), newest->name);
    EXPECT_EQ(temporaries(run), std::vector<std::string>{});
    auto all = list_checkpoints(run.string());  // every checkpoint left is whole; at most one beyond `keep`
    EXPECT_LE(static_cast<int64_t>(all.size()), style.keep + 1);
    for (const auto& c : all) expect_holds(c, c.name == next ? fresh : content[c.name]);

    const CheckpointFiles again = files_of(static_cast<uint32_t>(500 + k));
    const auto made = commit_run_checkpoint(run.string(), next, manifest, again, style.keep);
    const auto after = newest_checkpoint(run.string());
    ASSERT_TRUE(after.has_value());
    EXPECT_EQ(after->name, made.name);
    EXPECT_GT(after->sequence, newest->sequence);
    expect_holds(*after, again);
    EXPECT_EQ(latest_of(run), made.name);
    EXPECT_EQ(static_cast<int64_t>(list_checkpoints(run.string()).size()), style.keep);
    fs::remove_all(run);
    fs::remove_all(scratch);
  }
  fs::remove_all(root);
}

TEST(CheckpointStore, TrainCommitSurvivesACrashAfterEveryOperation) { crash_at_every_operation(kTrain, false); }
TEST(CheckpointStore, SyncerCommitSurvivesACrashAfterEveryOperation) { crash_at_every_operation(kSyncer, false); }
TEST(CheckpointStore, TrainCommitSurvivesAPowerLossAfterEveryOperation) { crash_at_every_operation(kTrain, true); }
TEST(CheckpointStore, SyncerCommitSurvivesAPowerLossAfterEveryOperation) { crash_at_every_operation(kSyncer, true); }

// Issue 11 item 8 as reported: killed between the commit rename and "latest". The restart resumes from the new
// checkpoint (not the one "latest" names), and reaching the same merge count writes a checkpoint, not a skip.
TEST(CheckpointStore, KilledBetweenRenameAndLatestResumesFromTheNewestAndNeverSkips) {
  const fs::path run = fresh_dir("run");
  commit_run_checkpoint(run.string(), "merges_00000005-r0000", {}, files_of(1), 3);
  FaultFileOps probe(-1);
  const fs::path other = fresh_dir("probe");
  commit_run_checkpoint(other.string(), "merges_00000010-r0000", {}, files_of(2), 3, probe);
  int64_t before_latest = -1;  // the first operation on "latest"'s temporary
  for (size_t i = 0; i < probe.log().size(); ++i)
    if (before_latest < 0 && probe.log()[i].find("latest.tmp.") != std::string::npos) before_latest = static_cast<int64_t>(i);
  ASSERT_GT(before_latest, 0);
  FaultFileOps dies(before_latest);
  EXPECT_THROW(commit_run_checkpoint(run.string(), "merges_00000010-r0000", {}, files_of(2), 3, dies), SimulatedCrash);
  EXPECT_EQ(latest_of(run), "merges_00000005-r0000") << "the crash should leave the stale hint";
  // Readers already see the committed checkpoint, whatever "latest" says.
  ASSERT_TRUE(newest_checkpoint(run.string()).has_value());
  EXPECT_EQ(newest_checkpoint(run.string())->name, "merges_00000010-r0000");
  auto resumed = recover_run_folder(run.string());
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->name, "merges_00000010-r0000");
  EXPECT_EQ(latest_of(run), "merges_00000010-r0000");
  // The same merge count again, with other state (say a resume from an older copy): a new folder, the newest.
  auto again = commit_run_checkpoint(run.string(), "merges_00000010-r0000", {}, files_of(3), 3);
  EXPECT_EQ(again.name, "merges_00000010-r0000-s3");
  EXPECT_EQ(newest_checkpoint(run.string())->name, again.name);
  expect_holds(again, files_of(3));
  expect_holds(*resumed, files_of(2));  // the earlier one is untouched
  fs::remove_all(run);
  fs::remove_all(other);
}

// A crash during the recovery that starts the next commit (removing the debris of a first crash, fixing "latest")
// is survived too: recovery is idempotent.
TEST(CheckpointStore, ACrashDuringRecoveryIsSurvivedToo) {
  const fs::path root = fresh_dir("root");
  const fs::path base = root / "base";
  commit_run_checkpoint(base.string(), "step_00000010", {}, files_of(1), 3);
  FaultFileOps first(12);  // dies after committing step_00000020 (rename + fsync), before "latest"
  EXPECT_THROW(commit_run_checkpoint(base.string(), "step_00000020", {}, files_of(2), 3, first), SimulatedCrash);
  ASSERT_EQ(first.log().back().rfind("sync_dir", 0), 0u) << first.log().back();
  fs::create_directories(base / "checkpoints" / ".step_00000030.tmp.999999999");  // and a torn write
  std::ofstream(base / "latest.tmp.999999999") << "x";
  const fs::path probe = root / "probe";
  fs::copy(base, probe, fs::copy_options::recursive);
  FaultFileOps counting(-1);
  commit_run_checkpoint(probe.string(), "step_00000030", {}, files_of(3), 3, counting);
  ASSERT_EQ(counting.log()[0].rfind("remove_all", 0), 0u) << "recovery comes first";
  for (int64_t k = 0; k <= counting.ops(); ++k) {
    SCOPED_TRACE("crash after " + std::to_string(k) + " operations");
    const fs::path run = root / ("k" + std::to_string(k));
    fs::copy(base, run, fs::copy_options::recursive);
    FaultFileOps faulty(k);
    try {
      commit_run_checkpoint(run.string(), "step_00000030", {}, files_of(3), 3, faulty);
    } catch (const SimulatedCrash&) {
    }
    auto newest = recover_run_folder(run.string());
    ASSERT_TRUE(newest.has_value());
    ASSERT_TRUE(newest->name == "step_00000020" || newest->name == "step_00000030") << newest->name;
    expect_holds(*newest, newest->name == "step_00000020" ? files_of(2) : files_of(3));
    EXPECT_EQ(latest_of(run), newest->name);
    EXPECT_EQ(temporaries(run), std::vector<std::string>{});
    fs::remove_all(run);
  }
  fs::remove_all(root);
}

TEST(CheckpointStore, RecoveryRemovesStaleTemporariesAndFixesLatest) {
  const fs::path run = fresh_dir("run");
  commit_run_checkpoint(run.string(), "step_00000010", {}, files_of(1), 3);
  commit_run_checkpoint(run.string(), "step_00000020", {}, files_of(2), 3);
  const std::string dead = "999999999";  // above any pid_max: no such process
  fs::create_directories(run / "checkpoints" / (".step_00000030.tmp." + dead));
  std::ofstream(run / "checkpoints" / (".step_00000030.tmp." + dead) / "model.safetensors") << "half";
  fs::create_directories(run / "checkpoints" / (".step_00000010.pruned.tmp." + dead));
  std::ofstream(run / ("latest.tmp." + dead)) << "step_00000030\n";
  // A temporary of a live process (our parent) may still be in use: left alone.
  const std::string live = ".step_00000040.tmp." + std::to_string(::getppid());
  fs::create_directories(run / "checkpoints" / live);
  fs::remove(run / "latest");  // and the hint is missing altogether

  auto newest = recover_run_folder(run.string());
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->name, "step_00000020");
  EXPECT_EQ(latest_of(run), "step_00000020");
  EXPECT_EQ(temporaries(run), std::vector<std::string>{(run / "checkpoints" / live).string()});
  // Readers were never confused by the temporaries either.
  EXPECT_EQ(list_checkpoints(run.string()).size(), 2u);
  fs::remove_all(run);
}

TEST(CheckpointStore, NewestIsTheLastCommittedNotTheLargestName) {
  // A run resumed from an older checkpoint continues a new line: its checkpoints are newer than larger names.
  const fs::path run = fresh_dir("run");
  commit_run_checkpoint(run.string(), "step_00000010", {}, files_of(1), 3);
  commit_run_checkpoint(run.string(), "step_00000020", {}, files_of(2), 3);
  auto c15 = commit_run_checkpoint(run.string(), "step_00000015", {}, files_of(3), 3);
  EXPECT_EQ(newest_checkpoint(run.string())->name, "step_00000015");
  EXPECT_EQ(c15.sequence, 3);
  // Pruning keeps the three newest by commit order: step_10 goes when the fourth arrives.
  commit_run_checkpoint(run.string(), "step_00000016", {}, files_of(4), 3);
  std::vector<std::string> names;
  for (const auto& c : list_checkpoints(run.string())) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000020", "step_00000015", "step_00000016"}));
  fs::remove_all(run);
}

TEST(CheckpointStore, ManifestsWithoutSequenceCountAsOldest) {
  // Run folders of deloco before issue 11: no sequence; ordered by name, older than anything committed now.
  const fs::path run = fresh_dir("run");
  for (const char* n : {"step_00000010", "step_00000020"}) {
    fs::create_directories(run / "checkpoints" / n);
    std::ofstream(run / "checkpoints" / n / "manifest.json")
        << R"({"format":"deloco-checkpoint","version":1,"files":{"model.safetensors":{"bytes":0,"fnv1a64":"cbf29ce484222325"}}})";
  }
  std::ofstream(run / "latest") << "step_00000010\n";  // stale
  EXPECT_EQ(newest_checkpoint(run.string())->name, "step_00000020");
  auto c = commit_run_checkpoint(run.string(), "step_00000005", {}, files_of(1), 2);
  EXPECT_EQ(c.sequence, 1);
  EXPECT_EQ(newest_checkpoint(run.string())->name, "step_00000005");
  EXPECT_EQ(list_checkpoints(run.string()).size(), 2u);  // step_00000010 pruned first
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "step_00000010"));
  fs::remove_all(run);
}

TEST(CheckpointStore, CorruptManifestOfACommittedCheckpointIsAnErrorNotASkip) {
  const fs::path run = fresh_dir("run");
  commit_run_checkpoint(run.string(), "step_00000010", {}, files_of(1), 3);
  commit_run_checkpoint(run.string(), "step_00000020", {}, files_of(2), 3);
  std::ofstream(run / "checkpoints" / "step_00000020" / "manifest.json") << "{\"format\": ";
  try {
    newest_checkpoint(run.string());
    ADD_FAILURE() << "a corrupt newest checkpoint was passed over";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("step_00000020/manifest.json"), std::string::npos) << e.what();
  }
  fs::remove_all(run);
}

TEST(CheckpointStore, WriteCheckpointFolderRefusesAnExistingFolderAndCleansUpOnError) {
  const fs::path dir = fresh_dir("dir");
  write_checkpoint_folder((dir / "ck").string(), {}, files_of(1), 0);
  EXPECT_THROW(write_checkpoint_folder((dir / "ck").string(), {}, files_of(1), 0), CheckpointError);
  EXPECT_THROW(write_checkpoint_folder((dir / "ck2").string(), {}, {{"../evil", "x"}}, 0), CheckpointError);
  EXPECT_FALSE(fs::exists(dir / "ck2"));
  EXPECT_EQ(temporaries(dir), std::vector<std::string>{});
  EXPECT_THROW(commit_run_checkpoint(dir.string(), ".hidden", {}, files_of(1), 3), CheckpointError);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
