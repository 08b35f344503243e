// Tests of the virtual-clock simulator: DiLoCo reduces to plain training, rejoin, determinism, failures.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "deloco/runtime.h"
#include "deloco/sim.h"

namespace deloco {
namespace sim_cases {

std::shared_ptr<const Corpus> sim_corpus() {
  static std::shared_ptr<const Corpus> c = [] {
    std::vector<std::string> docs;
    for (int i = 0; i < 40; ++i) {
      std::string d;
      for (int k = 0; k < 60; ++k) d += "the quick brown fox " + std::to_string(i * k) + " jumps over the lazy dog. ";
      docs.push_back(d);
    }
    return std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.05));
  }();
  return c;
}

RunConfig sim_run(int64_t steps) {
  torch::set_num_threads(1);
  RunConfig c;
  c.model.block_size = 16;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.train.batch_size = 4;
  c.train.steps = steps;
  c.train.warmup_steps = 2;
  c.train.lr = 3e-3;
  c.train.eval_tokens = 512;
  c.train.precision = "fp32";  // not auto: the references are float32 on every machine
  return c;
}

double max_diff(const NamedTensors& a, const std::vector<std::pair<std::string, at::Tensor>>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i].second - b[i].second).abs().max().item<double>());
  return d;
}

TEST(SimDiLoCo, OneLearnerEveryStepSgdOneEqualsPlainTraining) {
  RunConfig run = sim_run(6);
  SimConfig cfg;
  cfg.sync.learners = 1;
  cfg.sync.quorum = 1;
  cfg.sync.sync_every = 1;
  cfg.outer = OuterOptions{"sgd", 1.0, 0.0};
  Simulator sim(run, cfg, sim_corpus());
  auto res = sim.run();
  Trainer plain(run, sim_corpus());
  for (int i = 0; i < 6; ++i) plain.train_step();
  EXPECT_EQ(res.summary["outer_steps"].get<int64_t>(), 6);
  EXPECT_LT(max_diff(plain.parameters(), sim.global()), 1e-5);
  EXPECT_LT(max_diff(sim.learner(0).parameters(), sim.global()), 1e-12);
  EXPECT_DOUBLE_EQ(res.summary["uptime"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(res.summary["goodput"].get<double>(), 1.0);

  // The comparison can fail: a different outer learning rate gives a different model.
  cfg.outer.lr = 0.5;
  Simulator other(run, cfg, sim_corpus());
  other.run();
  EXPECT_GT(max_diff(plain.parameters(), other.global()), 1e-4);
}

SimConfig decoupled(int64_t M) {
  SimConfig cfg;
  cfg.sync.learners = M;
  cfg.sync.quorum = 1;
  cfg.sync.sync_every = 4;
  cfg.sync.overlap = 2;
  cfg.sync.fragments = 2;
  cfg.sync.wait_for_answer = false;
  cfg.sync.grace = true;
  cfg.merge.preset = "decoupled";
  cfg.sim.jitter = 0.1;
  cfg.sim.latency = 0.05;
  cfg.sim.merge_time = 0.05;
  return cfg;
}

TEST(SimChaos, RejoiningLearnerReceivesTheCurrentGlobalModel) {
  RunConfig run = sim_run(16);
  SimConfig cfg = decoupled(2);
  cfg.sim.fail_times = {6.5};
  cfg.sim.fail_learners = {1};
  cfg.sim.downtime = 3.0;
  Simulator sim(run, cfg, sim_corpus());
  Trainer fresh(run, sim_corpus());
  int calls = 0;
  sim.on_rejoin = [&](int64_t m, NamedTensors& local, const std::vector<std::pair<std::string, at::Tensor>>& global) {
    ++calls;
    EXPECT_EQ(m, 1);
    EXPECT_EQ(max_diff(local, global), 0.0);
    EXPECT_EQ(max_diff(local, sim.global()), 0.0);  // the newest Θ
    EXPECT_GT(max_diff(fresh.parameters(), global), 1e-4);  // and Θ has moved since the start
  };
  auto res = sim.run();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(res.summary["failures"].get<int64_t>(), 1);
  EXPECT_GT(res.summary["lost_seconds"].get<double>(), 0.0);
  EXPECT_EQ(sim.learner(1).step(), 16);
}

TEST(SimDeterminism, SameSeedSameBits) {
  RunConfig run = sim_run(12);
  SimConfig cfg = decoupled(3);
  cfg.sim.mtbf = 6.0;
  cfg.sim.downtime = 2.0;
  std::vector<std::string> logs[2];
  std::vector<at::Tensor> finals[2];
  nlohmann::json sums[2];
  for (int k = 0; k < 2; ++k) {
    Simulator sim(run, cfg, sim_corpus());
    sums[k] = sim.run([&](const nlohmann::json& j) { logs[k].push_back(j.dump()); }).summary;
    for (const auto& [n, t] : sim.global()) finals[k].push_back(t.clone());
  }
  EXPECT_EQ(sums[0].dump(), sums[1].dump());
  EXPECT_EQ(logs[0], logs[1]);
  ASSERT_EQ(finals[0].size(), finals[1].size());
  for (size_t i = 0; i < finals[0].size(); ++i) EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i]));
  // A different chaos seed changes the run (so the comparison above can fail).
  cfg.sim.seed = 2;
  Simulator other(run, cfg, sim_corpus());
  EXPECT_NE(other.run().summary.dump(), sums[0].dump());
}

// train.precision = auto would time fp32 against bf16 matmuls, and where they are close two runs of one simulation
// would train in different precisions now and then: the simulator takes auto as fp32, bitwise, and says so.
TEST(SimDeterminism, AutoPrecisionTrainsInFp32) {
  SimConfig cfg = decoupled(2);
  auto run_with = [&](const std::string& precision) {
    RunConfig run = sim_run(8);
    run.train.precision = precision;
    Simulator sim(run, cfg, sim_corpus());
    EXPECT_EQ(sim.precision(), precision == "auto" ? "fp32" : precision);
    nlohmann::json summary = sim.run().summary;
    std::vector<at::Tensor> out;
    for (const auto& [n, t] : sim.global()) out.push_back(t.clone());
    return std::make_pair(summary, out);
  };
  const auto [s_auto, auto_params] = run_with("auto");
  const auto [s_fp32, fp32_params] = run_with("fp32");
  const auto [s_bf16, bf16_params] = run_with("bf16");
  EXPECT_EQ(s_auto["precision"], "fp32");
  EXPECT_EQ(s_bf16["precision"], "bf16");
  EXPECT_EQ(s_auto["final_val_loss"], s_fp32["final_val_loss"]);
  ASSERT_EQ(auto_params.size(), fp32_params.size());
  bool bf16_differs = false;
  for (size_t i = 0; i < auto_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(auto_params[i], fp32_params[i])) << i;
    bf16_differs |= !torch::equal(bf16_params[i], fp32_params[i]);
  }
  EXPECT_TRUE(bf16_differs);  // the precisions do train differently, so the equality above can fail
}

TEST(SimDecoupled, FailuresKeepUptimeOneAndLossFalls) {
  RunConfig run = sim_run(40);
  SimConfig cfg = decoupled(3);
  cfg.sim.mtbf = 10.0;  // a failure every 2-3 outer rounds per learner on average
  cfg.sim.downtime = 2.0;
  Simulator sim(run, cfg, sim_corpus());
  auto s = sim.run().summary;
  EXPECT_GT(s["failures"].get<int64_t>(), 0);
  EXPECT_DOUBLE_EQ(s["uptime"].get<double>(), 1.0);
  EXPECT_LT(s["final_val_loss"].get<double>(), s["initial_val_loss"].get<double>() - 0.3);
  EXPECT_LT(s["goodput"].get<double>(), 1.0);
  EXPECT_GT(s["contributions_merged"].get<int64_t>(), 0);
}

// merge.preset = muloco: the learners train with Muon (train.optimizer = auto resolves to it; their optimizer state
// holds Muon's momentum), and the run learns through failures and rejoins like DiLoCo's.
TEST(SimMuLoCo, ThePresetTrainsWithMuonAndLearnsThroughFailures) {
  RunConfig run = sim_run(40);
  SimConfig cfg = decoupled(3);
  cfg.merge.preset = "muloco";
  cfg.sim.mtbf = 10.0;
  cfg.sim.downtime = 2.0;
  Simulator sim(run, cfg, sim_corpus());
  auto s = sim.run().summary;
  bool muon_state = false;
  for (const auto& [name, t] : sim.learner(0).optimizer_state()) muon_state |= name.rfind("muon_momentum/", 0) == 0;
  EXPECT_TRUE(muon_state) << "learner 0 does not train with Muon";
  EXPECT_GT(s["failures"].get<int64_t>(), 0);
  EXPECT_LT(s["final_val_loss"].get<double>(), s["initial_val_loss"].get<double>() - 0.3);
  // An explicit train.optimizer wins over the preset's.
  run.train.optimizer = "adamw";
  Simulator plain(run, cfg, sim_corpus());
  for (const auto& [name, t] : plain.learner(0).optimizer_state())
    EXPECT_NE(name.rfind("muon_momentum/", 0), 0u) << name;
}

TEST(SimDiLoCo, SynchronousDiLoCoStallsOnAFailure) {
  RunConfig run = sim_run(12);
  SimConfig cfg;
  cfg.sync.learners = 2;
  cfg.sync.quorum = 2;
  cfg.sync.sync_every = 4;
  cfg.sim.fail_times = {2.5};
  cfg.sim.fail_learners = {0};
  cfg.sim.downtime = 10.0;
  Simulator sim(run, cfg, sim_corpus());
  auto s = sim.run().summary;
  EXPECT_LT(s["uptime"].get<double>(), 0.8);
  EXPECT_GT(s["waited_seconds"].get<double>(), 5.0);
}

// Defect: the pause state was a flag, so the end of the first of two overlapping pauses resumed the syncer while
// the second still lasted (and wrote two resumes).
TEST(SimChaos, OverlappingPausesLastUntilTheLastOneEnds) {
  RunConfig run = sim_run(16);
  SimConfig cfg;
  cfg.sync.learners = 2;
  cfg.sync.quorum = 1;
  cfg.sync.sync_every = 2;
  cfg.sim.pause_times = {3.0, 5.0};
  cfg.sim.pause_duration = 4.0;  // [3, 7] and [5, 9]: paused from 3 to 9
  Simulator sim(run, cfg, sim_corpus());
  std::vector<std::pair<std::string, double>> got;
  sim.run([&](const nlohmann::json& j) {
    const std::string kind = j.value("kind", std::string());
    if (kind == "syncer_pause" || kind == "syncer_resume") got.emplace_back(kind, j.value("t", -1.0));
  });
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], (std::pair<std::string, double>{"syncer_pause", 3.0}));
  EXPECT_EQ(got[1], (std::pair<std::string, double>{"syncer_resume", 9.0}));
}

TEST(SimConfigCheck, BadConfigsFailBeforeTraining) {
  RunConfig run = sim_run(10);
  auto expect_error = [&](SimConfig cfg, const std::string& needle) {
    try {
      Simulator sim(run, cfg, sim_corpus());
      ADD_FAILURE() << "no error for " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  SimConfig c;
  c.sync.learners = 2;
  c.sync.quorum = 3;
  c.sync.sync_every = 5;
  expect_error(c, "sync.quorum");
  c.sync.quorum = 2;
  c.sync.overlap = 5;
  expect_error(c, "sync.overlap");
  c.sync.overlap = 0;
  c.sync.fragments = 1000;
  expect_error(c, "number of parameter tensors");
  c.sync.fragments = 1;
  c.sim.fail_times = {1.0};
  expect_error(c, "sim.fail_learners");
  c.sim.fail_times.clear();
  c.sim.pause_times = {-2.0};  // would move the virtual clock backwards
  expect_error(c, "sim.pause_times must be finite and ≥ 0");
  c.sim.pause_times.clear();
  c.sim.straggler_times = {std::nan("")};
  c.sim.straggler_learners = {0};
  expect_error(c, "sim.straggler_times must be finite and ≥ 0");
  c.sim.straggler_times.clear();
  c.sim.straggler_learners.clear();
  c.outer.lr = -1;
  expect_error(c, "lr");
  // Negative rates are caught by the config schema's checks.
  SimConfig d;
  ConfigSchema schema;
  d.bind(schema);
  schema.apply_override("sim.bandwidth=-5");
  EXPECT_THROW(schema.validate(), ConfigError);
  for (const char* bad : {"net.error_feedback_decay=0", "net.error_feedback_decay=1.5"}) {
    SimConfig e;
    ConfigSchema es;
    e.bind(es);
    es.apply_override(bad);
    try {
      es.validate();
      ADD_FAILURE() << "no error for " << bad;
    } catch (const ConfigError& err) {
      EXPECT_NE(std::string(err.what()).find("net.error_feedback_decay must be in (0, 1]"), std::string::npos)
          << err.what();
    }
  }
}

// sim.queued_links: both learners push their one fragment at step 8; over the syncer's shared link the second push
// arrives one transfer after the first, so the merge that waits for both (quorum 2) comes one transfer later than
// with independent transfers, which both take one transfer from step 8.
// Two learners of equal speed that push their one fragment together every 8 steps (of 1 s) and merge both (quorum
// 2), over links of `bandwidth` bytes/s and 0.5 s latency; sim.queued_links = `queued`, the syncer's shared link
// `syncer_bandwidth` (0: none).
SimConfig pushing_together(double bandwidth, bool queued, double syncer_bandwidth, double merge_time) {
  SimConfig cfg = decoupled(2);
  cfg.sync.quorum = 2;
  cfg.sync.fragments = 1;
  cfg.sync.sync_every = 8;
  cfg.sync.overlap = 0;
  cfg.sync.grace = false;
  cfg.sim.jitter = 0;
  cfg.sim.latency = 0.5;
  cfg.sim.merge_time = merge_time;
  cfg.sim.bandwidth = bandwidth;
  cfg.sim.queued_links = queued;
  cfg.sim.syncer_bandwidth = syncer_bandwidth;
  return cfg;
}

TEST(SimLinks, QueuedLinksCarryOneTransferAtATimeOnTheSyncersSharedLink) {
  auto first_merge = [](bool queued, double syncer_bandwidth) {
    RunConfig run = sim_run(16);  // not 8: a learner that finished is retired, and the quorum would not wait
    Simulator sim(run, pushing_together(1000, queued, syncer_bandwidth, 0), sim_corpus());
    double t = -1;
    sim.run([&](const nlohmann::json& j) {
      if (j["kind"] == "merge" && t < 0) t = j["t"].get<double>();
    });
    return t;
  };
  const double independent = first_merge(false, 0), own_links = first_merge(true, 0), shared = first_merge(true, 1000);
  const double one = independent - 8.0 - 0.5;  // bytes / bandwidth of one push
  ASSERT_GT(one, 1.0);
  EXPECT_NEAR(own_links, independent, 1e-9);  // each learner on its own queue: nothing waits
  EXPECT_NEAR(shared - 8.0 - 0.5, 2 * one, 1e-6);
  // The shared link is a queue: refused without sim.queued_links, naming both keys.
  SimConfig c;
  ConfigSchema schema;
  c.bind(schema);
  schema.apply_override("sim.syncer_bandwidth=1000");
  try {
    schema.validate();
    ADD_FAILURE() << "sim.syncer_bandwidth without sim.queued_links accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sim.queued_links"), std::string::npos) << e.what();
  }
}

// ξ_sync under sim.queued_links is what the syncer node would measure: a push that waited for the shared link took
// longer than bytes / bandwidth, and the grace window must be sized by that. Two learners push together
// (pushing_together) over the syncer's shared link: the first push takes one transfer, the second waits for it
// and takes two, so the moving average of the uploads lies above one transfer and ξ_sync above the independent
// links' (where every transfer takes its own time and ξ_sync = upload + merge + broadcast of one each).
TEST(SimLinks, UnderQueuedLinksTheSyncTimeIsTheMeasuredOneWaitsIncluded) {
  auto summary = [](bool queued, double syncer_bandwidth) {
    Simulator sim(sim_run(96), pushing_together(50000, queued, syncer_bandwidth, 0.25), sim_corpus());
    return sim.run().summary;
  };
  const auto independent = summary(false, 0), own_links = summary(true, 0), shared = summary(true, 50000);
  for (const auto* s : {&independent, &own_links, &shared}) {
    ASSERT_TRUE((*s)["sync_seconds"].is_number()) << s->dump();
    ASSERT_TRUE((*s)["upload_seconds"].is_number()) << s->dump();
    ASSERT_TRUE((*s)["broadcast_seconds"].is_number()) << s->dump();
  }
  const double up = independent["upload_seconds"].get<double>(), down = independent["broadcast_seconds"].get<double>();
  ASSERT_GT(up, 1.5);  // latency 0.5 + at least a second of bytes (a fragment of fp32 parameters at 50 KB/s)
  // Independent links: ξ_sync is one upload, the merge and one broadcast.
  EXPECT_NEAR(independent["sync_seconds"].get<double>(), up + 0.25 + down, 1e-9);
  // Each learner on its own queue (pushes 8 steps apart never overlap): the same times.
  EXPECT_NEAR(own_links["upload_seconds"].get<double>(), up, 1e-9);
  EXPECT_NEAR(own_links["sync_seconds"].get<double>(), independent["sync_seconds"].get<double>(), 1e-9);
  // The shared link: every round's second push waits one transfer, so the uploads average above one transfer, and
  // ξ_sync follows the measured times, not bytes / bandwidth.
  const double bytes_time = up - 0.5;
  EXPECT_GT(shared["upload_seconds"].get<double>(), up + 0.25 * bytes_time) << shared.dump();
  EXPECT_GT(shared["sync_seconds"].get<double>(), independent["sync_seconds"].get<double>() + 0.25 * bytes_time)
      << shared.dump();
}

// sim.eval_learners: in synchronous DiLoCo (K = M, every learner waits for the merge) each learner ends holding the
// global model, so its own loss and the mean's are the global model's, exactly; learners that never wait end on
// their own parameters, which differ from it.
TEST(SimEvalLearners, SynchronousLearnersEndOnTheGlobalModelDecoupledOnesDoNot) {
  auto run_sim = [](bool wait) {
    RunConfig run = sim_run(8);
    SimConfig cfg = wait ? SimConfig() : decoupled(2);
    cfg.sync.learners = 2;
    cfg.sync.quorum = wait ? 2 : 1;
    cfg.sync.fragments = 1;
    cfg.sync.sync_every = 4;
    cfg.sync.overlap = 0;
    cfg.sync.wait_for_answer = wait;
    cfg.sim.jitter = 0;
    cfg.sim.eval_learners = true;
    Simulator sim(run, cfg, sim_corpus());
    return sim.run();
  };
  const nlohmann::json sync = run_sim(true).summary, dec = run_sim(false).summary;
  const double g = sync["final_val_loss"].get<double>();
  ASSERT_EQ(sync["learners_val_loss"].size(), 2u);
  for (const auto& l : sync["learners_val_loss"]) EXPECT_EQ(l.get<double>(), g);
  EXPECT_EQ(sync["learners_mean_val_loss"].get<double>(), g);
  ASSERT_EQ(dec["learners_val_loss"].size(), 2u);
  EXPECT_NE(dec["learners_val_loss"][0].get<double>(), dec["final_val_loss"].get<double>());
  EXPECT_TRUE(std::isfinite(dec["learners_mean_val_loss"].get<double>()));
}

// sync.final_round: the final model is the learners' final states' mean. With fp32 pushes the final states arrive
// exactly and every state is reconstructed from the version its learner held, so the final model's loss is the
// learners' mean's (sim.eval_learners) up to float rounding; without it the final model is the last merge's.
TEST(SimFinalRound, TheFinalModelIsTheLearnersMean) {
  auto run_sim = [](bool final_round) {
    RunConfig run = sim_run(24);
    SimConfig cfg = decoupled(2);
    cfg.sync.apply = "rebase";
    cfg.sync.final_round = final_round;
    cfg.sim.eval_learners = true;
    Simulator sim(run, cfg, sim_corpus());
    return sim.run().summary;
  };
  const nlohmann::json on = run_sim(true), off = run_sim(false);
  EXPECT_NEAR(on["final_val_loss"].get<double>(), on["learners_mean_val_loss"].get<double>(), 1e-4) << on.dump();
  ASSERT_TRUE(on.contains("final_round"));
  EXPECT_EQ(on["final_round"]["states_sent"].get<int64_t>(), 4);  // 2 learners × 2 fragments
  EXPECT_EQ(on["final_round"]["states_merged"].get<int64_t>(), 4);
  EXPECT_EQ(on["final_round"]["fragments"].get<int64_t>(), 2);
  EXPECT_EQ(on["final_round"]["states_unsent"].get<int64_t>(), 0);
  EXPECT_FALSE(off.contains("final_round"));
  EXPECT_GT(std::fabs(off["final_val_loss"].get<double>() - off["learners_mean_val_loss"].get<double>()), 1e-3)
      << off.dump();
}

// sync.final_round: once a learner's last step (which pushes nothing) reaches the syncer, no round waits for it. Learner
// 0 finishes first (learner 1 steps 1.5 times slower); until its final states and goodbye are in, learner 1's rounds
// merge as soon as its push is there instead of holding a grace window open for learner 0.
TEST(SimFinalRound, NoRoundWaitsForALearnerPastItsLastStep) {
  RunConfig run = sim_run(40);
  SimConfig cfg = decoupled(2);
  cfg.sync.final_round = true;
  cfg.sync.sync_every = 10;
  cfg.sync.overlap = 8;       // a window of about 0.8 · (8 ξ_step − ξ_sync) stays open on this link
  cfg.sim.jitter = 0;
  cfg.sim.bandwidth = 20000;  // a push of one fragment takes about 2 s: learner 0 waits for its answers at its end
  cfg.sim.speed_factors = {1.0, 1.1};
  Simulator sim(run, cfg, sim_corpus());
  double last_step = -1, done = -1;
  struct Merge {
    double t, wait, grace;
    bool only_1;
  };
  std::vector<Merge> merges;
  sim.run([&](const nlohmann::json& j) {
    if (j["kind"] == "learner" && j["learner"] == 0 && j["step"] == 40) last_step = j["t"].get<double>();
    if (j["kind"] == "learner_done" && j["learner"] == 0) done = j["t"].get<double>();
    if (j["kind"] == "merge")
      merges.push_back({j["t"].get<double>(), j["grace_wait"].get<double>(), j["grace"].get<double>(),
                        j["learners"] == nlohmann::json{1}});
  });
  ASSERT_GT(last_step, 0);
  ASSERT_GT(done, last_step);
  // A round holding only learner 1's push can wait only for learner 0's. Once learner 0's last step reached the
  // syncer none does, although learner 0 is still connected (waiting for its answers) and the window is open (without
  // the mark this round waited 3.2 s).
  int64_t after = 0;
  for (const Merge& mg : merges) {
    if (!mg.only_1 || mg.t - mg.wait <= last_step + cfg.sim.latency || mg.t >= done) continue;
    ++after;
    EXPECT_GT(mg.grace, 1.0) << "the window was not open at t = " << mg.t << ": nothing to wait in";
    EXPECT_NEAR(mg.wait, 0.0, 1e-9) << "learner 1's round at t = " << mg.t << " waited for learner 0, past its last step";
  }
  EXPECT_GT(after, 0) << "no round of learner 1 alone between learner 0's last step and its goodbye: nothing was tested";
}

// A learner that fails no longer holds a round open: the round that waited in its grace window for that learner's
// push merges at the failure, as the syncer node merges when it counts a learner gone (syncer_timers.cpp). Before,
// the simulator only marked it disconnected, and the round waited out its window.
TEST(SimDecoupled, ARoundWaitingForALearnerThatFailsMergesAtTheFailure) {
  RunConfig run = sim_run(40);
  SimConfig cfg = decoupled(2);
  cfg.sync.sync_every = 10;
  cfg.sync.overlap = 8;  // a window of about 0.8 · (8 ξ_step − ξ_sync) stays open
  cfg.sim.jitter = 0;
  cfg.sim.speed_factors = {1.0, 1.3};  // learner 0's rounds wait for learner 1's pushes
  cfg.sim.fail_times = {6.3, 14.1, 22.7, 31.9};
  cfg.sim.fail_learners = {1, 1, 1, 1};
  cfg.sim.downtime = 1.0;
  Simulator sim(run, cfg, sim_corpus());
  std::vector<double> fails;
  struct Merge {
    double t, wait;
    bool only_0;
  };
  std::vector<Merge> merges;
  sim.run([&](const nlohmann::json& j) {
    if (j["kind"] == "fail") fails.push_back(j["t"].get<double>());
    if (j["kind"] == "merge")
      merges.push_back({j["t"].get<double>(), j["grace_wait"].get<double>(), j["learners"] == nlohmann::json{0}});
  });
  ASSERT_FALSE(fails.empty());
  int64_t held = 0;
  for (const Merge& mg : merges)
    for (double f : fails)
      if (mg.only_0 && mg.wait > 0 && mg.t - mg.wait < f && f <= mg.t + 1e-9) {
        ++held;
        EXPECT_NEAR(mg.t, f, 1e-9) << "the round that waited for learner 1 from t = " << mg.t - mg.wait
                                   << " outlived its failure at t = " << f;
      }
  EXPECT_GT(held, 0) << "no round was waiting in its window when learner 1 failed: nothing was tested";
}

// The same when the learner waits at its last step for an answer due there (sync.wait_for_answer): its beat of that
// step goes out while it waits, as the node's heartbeat does, so the syncer hears it behind its last push, before
// that push's answer is back. (Before, the simulator scheduled the beat only once the answer had arrived, so the
// other learner's rounds held grace windows open for learner 0 where the node's did not.)
TEST(SimFinalRound, TheLastStepIsHeardWhileTheLearnerWaitsForAnAnswerDueThere) {
  RunConfig run = sim_run(40);
  SimConfig cfg = decoupled(2);
  cfg.sync.final_round = true;
  cfg.sync.wait_for_answer = true;
  cfg.sync.sync_every = 10;  // fragment 1 pushes at steps 5, 15, 25, 35; its last answer is due at step 40
  cfg.sync.overlap = 5;
  cfg.sim.jitter = 0;
  cfg.sim.bandwidth = 1500;  // a push and its answer take longer than the 5 steps of overlap: the learner waits
  Simulator sim(run, cfg, sim_corpus());
  double last_step = -1, heard = -1, applied_last = -1;
  sim.run([&](const nlohmann::json& j) {
    if (j.value("learner", -1) != 0) return;
    if (j["kind"] == "learner" && j["step"] == 40) last_step = j["t"].get<double>();
    if (j["kind"] == "learner_finished") {
      EXPECT_LT(heard, 0) << "heard twice";
      EXPECT_TRUE(j["finished"].get<bool>());
      EXPECT_EQ(j["step"].get<int64_t>(), 40);
      heard = j["t"].get<double>();
    }
    if (j["kind"] == "apply" && j["step"] == 40) applied_last = j["t"].get<double>();
  });
  ASSERT_GT(last_step, 0);
  ASSERT_GT(applied_last, last_step) << "learner 0 did not wait at its last step for an answer: nothing was tested";
  ASSERT_GT(heard, 0) << "the syncer never heard learner 0's last step";
  EXPECT_GE(heard, last_step + cfg.sim.latency - 1e-9);
  EXPECT_LT(heard, applied_last) << "the last step was heard only after the answer it waited for";
}

// net.broadcast_topk_bits sets the broadcast's value width apart from the pushes' (SparseLoCo's exchange: 2-bit pushes,
// an 8-bit broadcast of every entry the merge changed); 0 keeps net.topk_bits; other widths are refused by name.
TEST(SimCompression, TheBroadcastHasItsOwnTopkBits) {
  SimConfig c;
  c.encoding = "topk";
  c.broadcast_encoding = "topk";
  c.topk_bits = 2;
  EXPECT_EQ(c.push_codec().encoding, Encoding::kTopk2);
  EXPECT_EQ(c.answer_codec().encoding, Encoding::kTopk2);
  c.broadcast_topk_bits = 8;
  c.broadcast_topk_density = 0.06;
  EXPECT_EQ(c.push_codec().encoding, Encoding::kTopk2);
  EXPECT_EQ(c.answer_codec().encoding, Encoding::kTopk8);
  EXPECT_DOUBLE_EQ(c.answer_codec().topk.density, 0.06);
  SimConfig e;
  ConfigSchema es;
  e.bind(es);
  es.apply_override("net.broadcast_topk_bits=3");
  try {
    es.validate();
    ADD_FAILURE() << "no error for net.broadcast_topk_bits=3";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("net.broadcast_topk_bits must be 0, 2, 4 or 8"), std::string::npos) << err.what();
  }
}

// net.error_feedback_decay reaches every learner's pushes: under top-k 3% pushes, β = 1 is the default bit for bit
// and β = 0.5 trains a different model.
TEST(SimCompression, ErrorFeedbackDecayReachesThePushes) {
  RunConfig run = sim_run(20);
  auto global_after = [&](double beta, bool set) {
    SimConfig cfg;
    cfg.sync.learners = 2;
    cfg.sync.quorum = 2;
    cfg.sync.sync_every = 5;
    cfg.outer = OuterOptions{"sgd", 1.0, 0.0};
    cfg.encoding = "topk";
    cfg.topk_density = 0.03;
    if (set) cfg.error_feedback_decay = beta;
    Simulator sim(run, cfg, sim_corpus());
    sim.run();
    NamedTensors g;
    for (const auto& [n, t] : sim.global()) g.emplace_back(n, t.clone());
    return g;
  };
  const NamedTensors def = global_after(1.0, false), one = global_after(1.0, true), half = global_after(0.5, true);
  EXPECT_EQ(max_diff(def, one), 0.0);
  EXPECT_GT(max_diff(def, half), 0.0);
}

// The runtime's hang of issue 10 under the simulator: τ = 5 with waiting and K = 2 of 2. Every answer that comes
// within τ steps clears its send; the run reaches train.steps with every fragment merged at each of its sends.
// The syncer node retires a learner on its goodbye, which follows its last pushes on the same link: a finishing
// learner's final pushes, still on their way, merge with its peers' inside the grace window, not one by one as
// they arrive after everybody stopped (on a slow link one outer step per learner's push at the very end).
TEST(SimDecoupled, FinalPushesInFlightMergeWithTheirPeers) {
  RunConfig run = sim_run(24);
  SimConfig cfg = decoupled(2);
  cfg.sync.sync_every = 8;
  cfg.sync.apply = "rebase";  // the window spans H: it stays open for pushes slower than τ steps
  cfg.sync.grace_cap = 100;
  cfg.sim.jitter = 0;
  cfg.sim.latency = 1.5;  // a push travels 1.5 steps: the last ones are in flight when the learners finish
  Simulator sim(run, cfg, sim_corpus());
  int64_t done = 0, after = 0, after_both = 0;
  sim.run([&](const nlohmann::json& j) {
    if (j["kind"] == "learner_done") ++done;
    if (j["kind"] != "merge" || done < 2) return;
    ++after;
    after_both += j["learners"].size() == 2 ? 1 : 0;
  });
  EXPECT_EQ(sim.learner(0).step(), 24);
  EXPECT_EQ(after, 1);  // fragment 0's final pushes (fragment 1's went at step 20): one merge of both, not two
  EXPECT_EQ(after_both, 1);
}

TEST(SimStreaming, TauWithWaitingFinishesWithEveryRoundMerged) {
  RunConfig run = sim_run(60);
  SimConfig cfg;
  cfg.sync.learners = 2;
  cfg.sync.quorum = 2;
  cfg.sync.fragments = 2;
  cfg.sync.sync_every = 10;
  cfg.sync.overlap = 5;
  cfg.sync.wait_for_answer = true;
  cfg.sim.latency = 0.3;  // answers take 2 × 0.3 s + merge: they arrive within τ steps
  cfg.sim.merge_time = 0.1;
  cfg.sim.speed_factors = {1.0, 1.1};
  Simulator sim(run, cfg, sim_corpus());
  int64_t merges = 0, both = 0;
  auto res = sim.run([&](const nlohmann::json& j) {
    if (j["kind"] != "merge") return;
    ++merges;
    both += j["quorum"].get<int64_t>() == 2 ? 1 : 0;
  });
  EXPECT_EQ(sim.learner(0).step(), 60);
  EXPECT_EQ(sim.learner(1).step(), 60);
  EXPECT_EQ(merges, 12);  // 60 / 10 sends of each of 2 fragments
  EXPECT_EQ(both, 12);
  EXPECT_GT(res.summary["waited_seconds"].get<double>(), 0.0);  // the fast learner waited for the slow one
}

// `deloco sim` and `deloco run` bind the same algorithm keys with the same defaults (one AlgorithmConfig).
TEST(SimConfigCheck, SimAndRunShareTheAlgorithmDefaults) {
  SimConfig sim;
  RuntimeConfig rt;
  RunConfig run;
  ConfigSchema a, b;
  run.bind(a);
  sim.bind(a);
  rt.bind(b);
  a.validate();
  b.validate();
  const auto ja = a.to_json(), jb = b.to_json();
  for (const char* section : {"sync", "merge", "outer"}) EXPECT_EQ(ja[section], jb[section]) << section;
  for (const char* key : {"encoding", "broadcast_encoding", "error_feedback", "error_feedback_decay"})
    EXPECT_EQ(ja["net"][key], jb["net"][key]);
  EXPECT_EQ(ja["merge"]["preset"], "diloco");
  EXPECT_EQ(ja["outer"]["lr"], 0.7);
}

}  // namespace
}  // namespace deloco
