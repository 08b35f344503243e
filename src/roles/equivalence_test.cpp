// Cross-driver equivalence: one scripted schedule of arrivals and a failure, run by the simulator (virtual clock,
// one thread) and by real syncer and learner nodes over the in-process transport (wall clock, three threads). Both
// must produce the same sequence of merges (fragment, version, contributors, weights) and bit-identical global
// parameters, because both drive the same algorithm core (deloco/sync.h, deloco/learner.h).
//
// The schedule: M = 2 learners, quorum K = 2, P = 2 fragments every H = 4 steps, τ = 1 with waiting (streaming
// DiLoCo), int8 pushes with error feedback and bf16 broadcasts, token weights from per-learner batch sizes 4 and
// 6. Learner 1 fails right after step 10 (its push of step 10 is out) and comes back with the global model, its
// step and its AdamW moments. With K = M, every merge waits for both learners, so the order of events is fixed by
// the protocol, not by timing: the comparison is exact.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "deloco/runtime.h"
#include "deloco/sim.h"

namespace deloco {
namespace equivalence_cases {
namespace fs = std::filesystem;

std::shared_ptr<const Corpus> corpus() {
  static std::shared_ptr<const Corpus> c = [] {
    std::vector<std::string> docs;
    for (int i = 0; i < 30; ++i) {
      std::string d;
      for (int k = 0; k < 50; ++k) d += "four score and seven " + std::to_string(i * 7 + k) + " years ago, our fathers. ";
      docs.push_back(d);
    }
    return std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.05));
  }();
  return c;
}

constexpr int64_t kSteps = 24, kFailAfter = 10;

RunConfig run_config() {
  RunConfig r;
  r.model.block_size = 16;
  r.model.n_layer = 1;
  r.model.n_head = 2;
  r.model.n_embd = 32;
  r.train.batch_size = 4;
  r.train.learner_batch_sizes = {4, 6};
  r.train.steps = kSteps;
  r.train.warmup_steps = 2;
  r.train.lr = 3e-3;
  r.train.eval_tokens = 256;
  r.train.log_every = 1;
  r.train.precision = "fp32";  // not auto: the references are float32 on every machine
  r.train.threads = 1;
  return r;
}

void algorithm(AlgorithmConfig& a) {
  a.sync.learners = 2;
  a.sync.quorum = 2;
  a.sync.fragments = 2;
  a.sync.sync_every = 4;
  a.sync.overlap = 1;
  a.sync.wait_for_answer = true;
  a.sync.grace = false;
  a.merge.preset = "decoupled";
  a.encoding = "int8";
  a.broadcast_encoding = "bf16";
}

struct MergeRecord {
  int64_t fragment, version;
  std::vector<int64_t> learners;
  std::vector<double> weights;
  bool operator==(const MergeRecord& o) const {
    return fragment == o.fragment && version == o.version && learners == o.learners && weights == o.weights;
  }
};
std::ostream& operator<<(std::ostream& os, const MergeRecord& m) {
  os << "{fragment " << m.fragment << " v" << m.version << " learners";
  for (auto l : m.learners) os << " " << l;
  os << " weights";
  for (auto w : m.weights) os << " " << w;
  return os << "}";
}
MergeRecord from_json(const nlohmann::json& j) {
  return {j.at("fragment").get<int64_t>(), j.at("version").get<int64_t>(),
          j.at("learners").get<std::vector<int64_t>>(), j.at("weights").get<std::vector<double>>()};
}

struct Outcome {
  std::vector<MergeRecord> merges;
  std::map<std::string, at::Tensor> global;
};

Outcome simulate() {
  torch::set_num_threads(1);
  SimConfig cfg;
  algorithm(cfg);
  cfg.sim.step_time = 1.0;  // step k ends at virtual time k (nobody waits: answers are instantaneous)
  cfg.sim.fail_times = {kFailAfter + 0.5};
  cfg.sim.fail_learners = {1};
  cfg.sim.downtime = 2.0;
  Simulator sim(run_config(), cfg, corpus());
  Outcome o;
  auto res = sim.run([&](const nlohmann::json& j) {
    if (j["kind"] == "merge") o.merges.push_back(from_json(j));
  });
  EXPECT_EQ(res.summary["failures"].get<int64_t>(), 1);
  for (const auto& [n, t] : sim.global()) o.global[n] = t.clone();
  return o;
}

Outcome run_nodes(const fs::path& dir) {
  torch::set_num_threads(1);
  RuntimeConfig cfg;
  cfg.run = run_config();
  algorithm(cfg);
  cfg.net.plaintext = true;
  cfg.net.heartbeat = 0.2;
  cfg.net.dead_after = 30.0;  // a loaded test machine must not make anyone look dead
  cfg.net.join_timeout = 60.0;
  cfg.syncer.out_dir = (dir / "syncer").string();
  cfg.syncer.checkpoint_every = 0;
  cfg.syncer.eval_interval = 0;
  cfg.syncer.metrics = "";
  cfg.learner.state_dir = (dir / "learners").string();
  auto hub = make_inproc_hub();
  Outcome o;
  std::mutex mu;
  std::condition_variable merged;
  SyncerNode syncer(cfg, make_inproc_server(hub), corpus(), /*resume=*/false, [&](const nlohmann::json& j) {
    std::lock_guard<std::mutex> lock(mu);
    if (j["kind"] == "merge") {
      o.merges.push_back(from_json(j));
      merged.notify_all();
    }
  });
  // The merge that takes learner 1's last push before its failure: its step-10 push of fragment 1 (steps 2, 6, 10).
  const int64_t last_fragment = 1, last_version = (kFailAfter - 2) / 4 + 1;
  auto downtime_over = [&] {
    std::unique_lock<std::mutex> lock(mu);
    return merged.wait_for(lock, std::chrono::seconds(120), [&] {
      for (const auto& m : o.merges)
        if (m.fragment == last_fragment && m.version >= last_version) return true;
      return false;
    });
  };
  std::atomic<bool> stop_syncer{false};
  std::thread st([&] { syncer.run(stop_syncer); });

  auto learner = [&](int64_t id, int64_t stop_after, nlohmann::json* summary) {
    std::atomic<bool> stop{false};
    LearnerNode node(cfg, id, make_inproc_client(hub, "learner-" + std::to_string(id)), corpus(),
                     [&](const nlohmann::json& j) {
                       if (stop_after > 0 && j["kind"] == "learner" && j["step"].get<int64_t>() >= stop_after)
                         stop.store(true);  // "fails" right after this step's pushes are queued
                     });
    *summary = node.run(stop);
  };
  nlohmann::json s0, s1a, s1b;
  std::thread l0([&] { learner(0, 0, &s0); });
  learner(1, kFailAfter, &s1a);  // the first life of learner 1
  const bool restart_after_merge = downtime_over();
  EXPECT_TRUE(restart_after_merge) << "no merge of fragment 1 v" << last_version << " within 120 s";
  learner(1, 0, &s1b);  // the restarted process: downloads Θ, resumes its step and AdamW moments
  l0.join();
  st.join();  // the syncer stops once both learners retired
  EXPECT_EQ(s1a["step"].get<int64_t>(), kFailAfter);
  EXPECT_EQ(s1b["step"].get<int64_t>(), kSteps);
  EXPECT_EQ(s1b["steps_trained"].get<int64_t>(), kSteps - kFailAfter);
  EXPECT_EQ(s0["step"].get<int64_t>(), kSteps);
  Checkpoint ck = read_checkpoint(cfg.syncer.out_dir, /*with_optimizer=*/false);
  for (const auto& [n, t] : ck.model.tensors) o.global[n] = t;
  return o;
}

TEST(Equivalence, SimulatorAndNodesMergeTheSameAndEndBitIdentical) {
  const fs::path dir = fs::temp_directory_path() / ("deloco_equivalence_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Outcome sim = simulate();
  Outcome nodes = run_nodes(dir);
  ASSERT_FALSE(sim.merges.empty());
  // Fragments 1 and 0 alternate every 2 steps, each merge with both learners: 24 / 2 = 12 merges.
  EXPECT_EQ(sim.merges.size(), static_cast<size_t>(kSteps / 2));
  EXPECT_EQ(sim.merges, nodes.merges);
  // Token weights: learner 1 trains 6 × 16 tokens per step against 4 × 16: weight ratio (6/4)² over equal steps.
  EXPECT_NEAR(sim.merges.front().weights[1] / sim.merges.front().weights[0], 2.25, 1e-12);
  ASSERT_EQ(sim.global.size(), nodes.global.size());
  for (const auto& [n, t] : sim.global) {
    ASSERT_TRUE(nodes.global.count(n)) << n;
    EXPECT_TRUE(torch::equal(t, nodes.global.at(n))) << n << " differs by "
                                                     << (t - nodes.global.at(n)).abs().max().item<double>();
  }
  fs::remove_all(dir);
}

// The comparison can fail: another failure step changes the merges and the parameters.
TEST(Equivalence, TheComparisonCanFail) {
  Outcome a = simulate();
  SimConfig cfg;
  algorithm(cfg);
  cfg.sim.fail_times = {kFailAfter + 2.5};
  cfg.sim.fail_learners = {1};
  cfg.sim.downtime = 2.0;
  Simulator sim(run_config(), cfg, corpus());
  sim.run();
  double diff = 0;
  for (const auto& [n, t] : sim.global()) diff = std::max(diff, (t - a.global.at(n)).abs().max().item<double>());
  EXPECT_GT(diff, 0.0);
}

}  // namespace
}  // namespace deloco
