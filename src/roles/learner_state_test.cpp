// A learner's local state (learner_state.h): committed like a checkpoint, so that a crash after any file operation
// of a save (or a power loss there) leaves the previous state or the new one, readable, never a torn one; and a
// real learner node writes it that way and a restarted one reads it back.
#include "learner_state.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "deloco/config.h"
#include "deloco/gpt/data.h"
#include "deloco/gpt/train.h"
#include "deloco/runtime.h"
#include "support/fault_file_ops.h"
#include "util/checkpoint_store.h"

namespace deloco {
namespace learner_state_cases {
namespace fs = std::filesystem;
using test::FaultFileOps;
using test::SimulatedCrash;

class LearnerState : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("deloco_learner_state_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

// The moments of step `step`: every value is `step`, so a state read back names the save it came from.
TensorFile moments(int64_t step) {
  TensorFile f;
  f.tensors["exp_avg.w"] = torch::full({64}, static_cast<float>(step));
  f.tensors["exp_avg_sq.w"] = torch::full({8, 8}, static_cast<float>(step) * 2);
  return f;
}
nlohmann::json manifest(int64_t step) { return {{"kind", "learner"}, {"learner", 0}, {"step", step}}; }

// The state read back is the save of `step`, whole.
void expect_state(const std::optional<Checkpoint>& ck, int64_t step) {
  ASSERT_TRUE(ck.has_value());
  EXPECT_EQ(ck->manifest.value("step", int64_t{-1}), step);
  const TensorFile want = moments(step);
  ASSERT_EQ(ck->optimizer.tensors.size(), want.tensors.size());
  for (const auto& [name, t] : want.tensors) {
    ASSERT_TRUE(ck->optimizer.tensors.count(name)) << name;
    EXPECT_TRUE(torch::equal(ck->optimizer.tensors.at(name), t)) << name;
  }
}

TEST_F(LearnerState, ASaveIsACommittedCheckpointAndOnlyTheNewestIsKept) {
  const std::string dir = learner_state_dir(root_.string(), 3);
  EXPECT_EQ(dir, (root_ / "learner-3" / "state").string());
  EXPECT_FALSE(load_learner_state(dir).has_value());  // nothing yet: no state, no error
  save_learner_state(dir, 40, manifest(40), moments(40));
  save_learner_state(dir, 80, manifest(80), moments(80));
  expect_state(load_learner_state(dir), 80);
  const auto all = list_checkpoints(dir);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].name, "step_00000080");
  EXPECT_EQ(all[0].sequence, 2);  // the store's commit order
  EXPECT_EQ(read_file((fs::path(dir) / "latest").string()), "step_00000080\n");
  // The same step saved again (a learner stopped right after a periodic save) is a new commit, not an overwrite.
  save_learner_state(dir, 80, manifest(80), moments(80));
  ASSERT_EQ(list_checkpoints(dir).size(), 1u);
  EXPECT_EQ(list_checkpoints(dir)[0].sequence, 3);
}

// After state 10 was saved, the save of state 20 crashes after its k-th file operation, for every k (and as a power
// loss: what was not fsynced is lost). The folder then holds state 10 or state 20, whole; the next save (30)
// succeeds, clears what the crash left, and is what a restart reads.
TEST_F(LearnerState, ACrashAtAnyPointOfASaveLeavesTheOldOrTheNewState) {
  const fs::path scratch = root_ / "scratch";
  fs::create_directories(scratch);
  int64_t n = 0;
  {
    const std::string dir = (root_ / "count").string();
    save_learner_state(dir, 10, manifest(10), moments(10));
    FaultFileOps counting(-1);
    save_learner_state(dir, 20, manifest(20), moments(20), counting);
    n = counting.ops();
  }
  ASSERT_GT(n, 8);  // files, fsyncs, the rename, the directory fsync, latest, pruning
  for (bool power_loss : {false, true}) {
    bool saw_old = false, saw_new = false;
    for (int64_t k = 0; k <= n; ++k) {
      SCOPED_TRACE((power_loss ? "power loss after " : "crash after ") + std::to_string(k) + " of " +
                   std::to_string(n) + " operations");
      const std::string dir = (root_ / ("k" + std::to_string(k) + (power_loss ? "p" : "c"))).string();
      save_learner_state(dir, 10, manifest(10), moments(10));
      FaultFileOps faulty(k, power_loss, scratch.string());
      bool crashed = false;
      try {
        save_learner_state(dir, 20, manifest(20), moments(20), faulty);
      } catch (const SimulatedCrash&) {
        crashed = true;
      }
      EXPECT_EQ(crashed, k < n);
      const auto after = load_learner_state(dir);
      ASSERT_TRUE(after.has_value());
      const int64_t step = after->manifest.value("step", int64_t{-1});
      ASSERT_TRUE(step == 10 || step == 20) << step;
      expect_state(after, step);
      (step == 10 ? saw_old : saw_new) = true;
      save_learner_state(dir, 30, manifest(30), moments(30));
      expect_state(load_learner_state(dir), 30);
      EXPECT_EQ(list_checkpoints(dir).size(), 1u);
      for (const auto& e : fs::directory_iterator(fs::path(dir) / "checkpoints"))
        EXPECT_NE(e.path().filename().string()[0], '.') << "a temporary was left: " << e.path();
      fs::remove_all(dir);
    }
    EXPECT_TRUE(saw_old && saw_new);  // the sweep crossed the commit
  }
}

// A real learner node (one learner, a syncer over the in-process transport) writes its state through the commit
// above; a second run of the same learner restores it from the committed folder, never from a crashed save's
// temporary beside it; a state that cannot be read costs the moments (state_unusable), and the next save works.
TEST_F(LearnerState, ALearnerNodeCommitsItsStateAndARestartReadsIt) {
  torch::set_num_threads(1);
  std::shared_ptr<const Corpus> corpus = [] {
    std::vector<std::string> docs;
    for (int i = 0; i < 20; ++i) docs.push_back(std::string(2000, static_cast<char>('a' + i % 26)) + " words and more");
    return std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.1));
  }();
  RuntimeConfig cfg;
  cfg.run.model.block_size = 16;
  cfg.run.model.n_layer = 1;
  cfg.run.model.n_head = 2;
  cfg.run.model.n_embd = 32;
  cfg.run.train.batch_size = 2;
  cfg.run.train.precision = "fp32";  // not auto: the references are float32 on every machine
  cfg.run.train.steps = 6;
  cfg.run.train.eval_tokens = 128;
  cfg.run.train.threads = 1;
  cfg.sync.learners = 1;
  cfg.sync.quorum = 1;
  cfg.sync.fragments = 2;
  cfg.sync.sync_every = 3;
  cfg.net.plaintext = true;
  cfg.net.heartbeat = 0.2;
  cfg.net.join_timeout = 60.0;
  cfg.syncer.checkpoint_every = 0;
  cfg.syncer.eval_interval = 0;
  cfg.syncer.metrics = "";
  cfg.learner.state_dir = (root_ / "learners").string();
  cfg.learner.state_every = 2;
  auto run_once = [&](int attempt) {
    cfg.syncer.out_dir = (root_ / ("syncer-" + std::to_string(attempt))).string();
    std::vector<nlohmann::json> records;
    std::mutex mu;
    auto sink = [&](const nlohmann::json& j) {
      std::lock_guard<std::mutex> lock(mu);
      records.push_back(j);
    };
    auto hub = make_inproc_hub();
    SyncerNode syncer(cfg, make_inproc_server(hub), corpus, /*resume=*/false, sink);
    std::atomic<bool> stop{false};
    std::thread st([&] { syncer.run(stop); });
    {
      std::atomic<bool> never{false};
      LearnerNode node(cfg, 0, make_inproc_client(hub, "learner-0"), corpus, sink);
      node.run(never);
    }
    st.join();
    return records;
  };
  auto kinds = [](const std::vector<nlohmann::json>& records, const char* kind) {
    std::vector<nlohmann::json> out;
    for (const auto& j : records)
      if (j.value("kind", "") == kind) out.push_back(j);
    return out;
  };
  const std::string dir = learner_state_dir(cfg.learner.state_dir, 0);

  auto first = run_once(1);
  EXPECT_TRUE(kinds(first, "state_restored").empty());
  auto all = list_checkpoints(dir);
  ASSERT_EQ(all.size(), 1u);  // saves at steps 2, 4, 6 and at the stop: the newest kept
  EXPECT_EQ(all[0].name.rfind("step_00000006", 0), 0u) << all[0].name;
  EXPECT_GE(all[0].sequence, 3);
  auto ck = load_learner_state(dir);
  ASSERT_TRUE(ck.has_value());
  EXPECT_EQ(ck->manifest.value("kind", ""), "learner");
  EXPECT_FALSE(ck->optimizer.tensors.empty());
  EXPECT_TRUE(ck->model.tensors.empty());

  // A crashed save's temporary beside the committed state (this process's pid: garbage to the store).
  const fs::path torn = fs::path(dir) / "checkpoints" / (".step_00000099.tmp." + std::to_string(::getpid()));
  fs::create_directories(torn);
  std::ofstream(torn / "optimizer.safetensors") << "torn";
  auto second = run_once(2);
  auto restored = kinds(second, "state_restored");
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0]["path"], all[0].dir);
  EXPECT_TRUE(kinds(second, "state_unusable").empty());
  EXPECT_FALSE(fs::exists(torn));  // the next save's recovery removed it
  ASSERT_EQ(list_checkpoints(dir).size(), 1u);

  // A damaged committed state: the moments are lost, the run is not, and the next saves commit a readable one.
  const CommittedCheckpoint now = list_checkpoints(dir).at(0);
  fs::resize_file(fs::path(now.dir) / "optimizer.safetensors", 10);
  auto third = run_once(3);
  EXPECT_TRUE(kinds(third, "state_restored").empty());
  ASSERT_EQ(kinds(third, "state_unusable").size(), 1u);
  // Nothing was deleted: the unreadable state was moved aside, where the record says.
  EXPECT_EQ(kinds(third, "state_unusable")[0]["kept_at"], dir + ".unusable");
  EXPECT_TRUE(fs::exists(fs::path(dir + ".unusable") / "checkpoints"));
  auto again = load_learner_state(dir);
  ASSERT_TRUE(again.has_value());
  EXPECT_FALSE(again->optimizer.tensors.empty());
}

}  // namespace
}  // namespace deloco
