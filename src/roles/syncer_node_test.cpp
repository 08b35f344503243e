// The syncer node over the in-process transport, driven by hand-made learner messages: what one peer's messages can
// do to it (issue 11). Deterministic: no pushes, so no merges, so the fragment versions never change.
//  * An exception thrown while handling a message (here: injected into the transport's send of a welcome) is
//    contained, counted as handler_error and answered; the same hello then succeeds and the run ends normally.
//  * State downloads: every learner's download is cut from one snapshot per set of versions (encoded once), and a
//    flood of hellos asking for the state while one download is outstanding gets no further copy.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "deloco/runtime.h"
#include "deloco/workload.h"
#include "protocol.h"
#include "support/await_kind.h"
#include "support/roles_fixture.h"

namespace deloco {
namespace syncer_node_cases {
namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

std::shared_ptr<const Corpus> corpus() { return testing::letters_corpus(); }

RuntimeConfig config(const fs::path& dir) {
  RuntimeConfig cfg = testing::tiny_runtime_config(dir);
  cfg.run.train.steps = 8;
  cfg.net.dead_after = 60.0;  // the hand-made learners send no heartbeats of their own unless told to
  cfg.net.join_timeout = 60.0;
  cfg.net.chunk_bytes = 4096;  // several chunks per download
  return cfg;
}

using testing::StopOnExit;

// A server transport that throws from send() for the first `throws` messages of kind `kind`: an unexpected
// exception in the middle of handling a message (a transport must not throw; a bad_alloc or a bug could).
class ThrowingServer final : public ServerTransport {
 public:
  ThrowingServer(std::unique_ptr<ServerTransport> inner, MessageKind kind, int throws)
      : inner_(std::move(inner)), kind_(kind), throws_(throws) {}
  std::string endpoint() const override { return inner_->endpoint(); }
  bool receive(Envelope* out, std::chrono::milliseconds timeout) override { return inner_->receive(out, timeout); }
  bool send(const std::string& peer, const Bytes& header, const Bytes& payload) override {
    if (decode_header(header.data(), header.size()).kind == kind_ && throws_ > 0) {
      --throws_;
      throw std::runtime_error("injected failure while sending");
    }
    return inner_->send(peer, header, payload);
  }
  TransportStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<ServerTransport> inner_;
  MessageKind kind_;
  int throws_;
};

// Loses the first goodbye learner `lose_leave_of` sends, the way the close of either end could before (see
// EveryGoodbyeIsAnsweredAndRepeatedUntilItIs), and counts the leaves that did arrive, per learner id.
class LossyLeaves final : public ServerTransport {
 public:
  LossyLeaves(std::unique_ptr<ServerTransport> inner, uint32_t lose_leave_of)
      : inner_(std::move(inner)), lose_leave_of_(lose_leave_of) {}
  std::string endpoint() const override { return inner_->endpoint(); }
  bool receive(Envelope* out, std::chrono::milliseconds timeout) override {
    if (!inner_->receive(out, timeout)) return false;
    const MessageHeader h = decode_header(out->header.data(), out->header.size());
    if (h.kind != MessageKind::kLeave) return true;
    if (h.learner_id == lose_leave_of_ && !leave_lost_) {
      leave_lost_ = true;
      return false;  // as if nothing came
    }
    ++leaves_arrived[h.learner_id];
    return true;
  }
  bool send(const std::string& peer, const Bytes& header, const Bytes& payload) override {
    return inner_->send(peer, header, payload);
  }
  TransportStats stats() const override { return inner_->stats(); }
  std::map<uint32_t, int> leaves_arrived;  // read once the syncer's run() returned

 private:
  std::unique_ptr<ServerTransport> inner_;
  uint32_t lose_leave_of_;
  bool leave_lost_ = false;
};

struct Client {
  std::unique_ptr<ClientTransport> tx;
  uint64_t fingerprint;
  uint32_t id;
  void send(MessageKind k, const std::string& body) {
    MessageHeader h;
    h.kind = k;
    h.learner_id = id;
    h.fingerprint = fingerprint;
    auto f = proto::make_frame(h, body, WireLimits{});
    ASSERT_TRUE(tx->send(f.header, f.payload));
  }
  void hello(uint64_t instance, bool want_state) {
    proto::Hello h;
    h.learner = id;
    h.instance = instance;
    h.want_state = want_state;
    send(MessageKind::kHello, proto::encode_hello(h));
  }
  // The next message of `kind` within `seconds` (others skipped and counted in `seen`).
  std::optional<std::pair<MessageHeader, std::string>> next(MessageKind kind, double seconds) {
    return testing::await_kind(*tx, kind, seconds, seen);
  }
  std::map<MessageKind, int> seen;
};

TEST(SyncerNode, ContainsHandlerExceptionsAndServesStateFromOneSnapshot) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_syncer_node_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const RuntimeConfig cfg = config(dir);
  const uint64_t fp = parse_fingerprint_hex(gpt_workloads(cfg.run, corpus())(0, 1)->fingerprint());
  auto hub = make_inproc_hub();
  std::mutex mu;
  std::vector<nlohmann::json> records;
  SyncerNode syncer(cfg, std::make_unique<ThrowingServer>(make_inproc_server(hub), MessageKind::kWelcome, 1), corpus(),
                    /*resume=*/false, [&](const nlohmann::json& j) {
                      std::lock_guard<std::mutex> lock(mu);
                      records.push_back(j);
                    });
  std::atomic<bool> stop{false};
  nlohmann::json summary;
  std::thread st([&] { summary = syncer.run(stop); });
  StopOnExit stop_on_exit{&stop, &st};

  // 1. Learner 0's first hello: the welcome's send throws inside on_hello. Contained: a handler_error reject.
  Client c0{make_inproc_client(hub, "learner-0"), fp, 0};
  c0.hello(/*instance=*/11, /*want_state=*/true);
  auto rej = c0.next(MessageKind::kReject, 30);
  ASSERT_TRUE(rej.has_value()) << "no answer: did the exception end the syncer?";
  EXPECT_EQ(proto::reject_reason_of(rej->first), proto::RejectReason::kHandlerError);
  EXPECT_NE(rej->second.find("injected failure"), std::string::npos) << rej->second;
  // The same hello again: the failed one left nothing half-done, so this is an ordinary first join.
  c0.hello(11, true);
  auto wel = c0.next(MessageKind::kWelcome, 30);
  ASSERT_TRUE(wel.has_value());
  const proto::Welcome w0 = proto::parse_welcome(wel->second.data(), wel->second.size());
  ASSERT_GT(w0.chunks, 1);
  for (int64_t k = 0; k < w0.chunks; ++k) ASSERT_TRUE(c0.next(MessageKind::kStateChunk, 30).has_value()) << k;

  // 2. Learner 1 floods 500 hellos asking for the state: one download, from the same snapshot as learner 0's.
  Client c1{make_inproc_client(hub, "learner-1"), fp, 1};
  for (int i = 0; i < 500; ++i) c1.hello(22, true);
  const auto deadline = clk::now() + std::chrono::seconds(60);
  while (clk::now() < deadline && syncer.prometheus().find("deloco_state_requests_dropped_total 499\n") == std::string::npos)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_NE(syncer.prometheus().find("deloco_state_requests_dropped_total 499\n"), std::string::npos) << syncer.prometheus();
  auto wel1 = c1.next(MessageKind::kWelcome, 30);
  ASSERT_TRUE(wel1.has_value());
  const proto::Welcome w1 = proto::parse_welcome(wel1->second.data(), wel1->second.size());
  EXPECT_EQ(w1.state_hash, w0.state_hash);
  EXPECT_EQ(w1.round, w0.round);
  for (int64_t k = 0; k < w1.chunks; ++k) ASSERT_TRUE(c1.next(MessageKind::kStateChunk, 30).has_value()) << k;
  EXPECT_FALSE(c1.next(MessageKind::kWelcome, 0.5).has_value()) << "a second welcome for the flood";
  EXPECT_EQ(c1.seen[MessageKind::kStateChunk], w1.chunks);

  // 3. Learner 1 reports the download verified; then a new request is served again (still one snapshot).
  proto::Beat b;
  b.state_round = static_cast<int64_t>(w1.round);
  c1.send(MessageKind::kHeartbeat, proto::encode_beat(b));
  c1.hello(22, true);
  ASSERT_TRUE(c1.next(MessageKind::kWelcome, 30).has_value());

  // 4. Both leave; the syncer ends with its final checkpoint and summary.
  c0.send(MessageKind::kLeave, proto::encode_leave("done"));
  c1.send(MessageKind::kLeave, proto::encode_leave("done"));
  st.join();
  EXPECT_EQ(summary["rejects"].value("handler_error", 0), 1) << summary.dump();
  EXPECT_EQ(summary["state_snapshots"].get<int64_t>(), 1) << "one encoding for one set of versions";
  EXPECT_EQ(summary["state_downloads"].get<int64_t>(), 3);
  EXPECT_EQ(summary["state_requests_dropped"].get<int64_t>(), 499);
  EXPECT_NO_THROW(read_checkpoint(cfg.syncer.out_dir, /*with_optimizer=*/false));
  std::lock_guard<std::mutex> lock(mu);
  int joins = 0, handler_records = 0, done = 0;
  for (const auto& j : records) {
    joins += j["kind"] == "join";
    handler_records += j["kind"] == "reject" && j["reason"] == "handler_error";
    done += j["kind"] == "done";
  }
  EXPECT_EQ(joins, 2);  // learner 0 once (its failed hello joined nobody), learner 1 once (the rest were repeats)
  EXPECT_EQ(handler_records, 1);
  EXPECT_EQ(done, 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco

namespace deloco {
namespace syncer_node_cases {

// The CI failure of 2026-11-30: a learner counted its goodbye delivered once it was queued and closed its socket;
// what the syncer had not read by then was discarded (the syncer's LINGER 0), and it waited for that learner
// forever. Now a learner is gone only once the syncer answers its leave, repeating the leave every heartbeat until
// then; the syncer answers every leave, a repeated one included. Two real learner nodes, the first goodbye of
// learner 0 lost; learner 2 is hand-made and says goodbye twice; a stranger that never joined says it once.
TEST(SyncerNode, EveryGoodbyeIsAnsweredAndRepeatedUntilItIs) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_syncer_leave_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RuntimeConfig cfg = config(dir);
  cfg.sync.learners = 3;
  cfg.net.join_timeout = 20.0;  // the learner's patience for an answer to its goodbye
  cfg.learner.state_dir = (dir / "learners").string();
  const uint64_t fp = parse_fingerprint_hex(gpt_workloads(cfg.run, corpus())(0, 1)->fingerprint());
  auto hub = make_inproc_hub();
  auto lossy = std::make_unique<LossyLeaves>(make_inproc_server(hub), /*lose_leave_of=*/0);
  LossyLeaves* tap = lossy.get();
  std::mutex mu;
  std::vector<nlohmann::json> records;
  auto sink = [&](const nlohmann::json& j) {
    std::lock_guard<std::mutex> lock(mu);
    records.push_back(j);
  };
  SyncerNode syncer(cfg, std::move(lossy), corpus(), /*resume=*/false, sink);
  std::atomic<bool> stop{false}, ended{false};
  nlohmann::json summary;
  std::thread st([&] {
    summary = syncer.run(stop);
    ended = true;
  });
  StopOnExit stop_on_exit{&stop, &st};

  // A goodbye from a connection that never joined moves nobody, and is answered all the same.
  Client stranger{make_inproc_client(hub, "stranger"), fp, 5};
  stranger.send(MessageKind::kLeave, proto::encode_leave("done"));
  ASSERT_TRUE(stranger.next(MessageKind::kLeave, 30).has_value());
  // ... and a malformed one is refused as malformed, not as a failure of the syncer's handler.
  stranger.send(MessageKind::kLeave, R"({"reason":"explode"})");
  auto bad = stranger.next(MessageKind::kReject, 30);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(proto::reject_reason_of(bad->first), proto::RejectReason::kMalformedFrame) << bad->second;
  // A learner whose answer got lost says goodbye again on the same connection: answered again, retired once.
  Client c2{make_inproc_client(hub, "learner-2"), fp, 2};
  c2.hello(/*instance=*/21, /*want_state=*/false);
  ASSERT_TRUE(c2.next(MessageKind::kWelcome, 30).has_value());
  for (int i = 0; i < 2; ++i) {
    c2.send(MessageKind::kLeave, proto::encode_leave("done"));
    ASSERT_TRUE(c2.next(MessageKind::kLeave, 30).has_value()) << "goodbye " << i;
  }
  EXPECT_EQ(c2.seen[MessageKind::kReject], 0);

  auto learner = [&](int64_t id, nlohmann::json* s) {
    std::atomic<bool> never{false};
    LearnerNode node(cfg, id, make_inproc_client(hub, "learner-" + std::to_string(id)), corpus(), sink);
    *s = node.run(never);
  };
  nlohmann::json s0, s1;
  std::thread l0([&] { learner(0, &s0); });
  learner(1, &s1);
  l0.join();
  const auto deadline = clk::now() + std::chrono::seconds(30);
  while (!ended && clk::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(ended.load()) << "the syncer still waits for a learner that has left";
  st.join();
  EXPECT_EQ(s0["step"], cfg.run.train.steps);
  EXPECT_EQ(s1["step"], cfg.run.train.steps);
  EXPECT_GE(tap->leaves_arrived[0], 1) << "learner 0 never repeated its lost goodbye";
  EXPECT_GE(tap->leaves_arrived[1], 1);
  EXPECT_EQ(tap->leaves_arrived[2], 2);
  std::lock_guard<std::mutex> lock(mu);
  std::map<int64_t, int> retired;
  int undelivered = 0;
  for (const auto& j : records) {
    if (j["kind"] == "retired") ++retired[j["learner"].get<int64_t>()];
    undelivered += j["kind"] == "leave_undelivered";
  }
  for (int64_t m = 0; m < 3; ++m) EXPECT_EQ(retired[m], 1) << "learner " << m;
  EXPECT_EQ(undelivered, 0);
  EXPECT_EQ(summary["rejects"].value("not_joined", 0), 0) << summary.dump();
  EXPECT_EQ(summary["rejects"].value("handler_error", 0), 0) << summary.dump();
  fs::remove_all(dir);
}


// A workload whose parameters jump by +50 after inner step `at` (a loss spike, a bad batch): the next push of every
// fragment is far over sync.max_delta_ratio. Everything else is the built-in GPT's.
class SpikeWorkload final : public Workload {
 public:
  SpikeWorkload(std::unique_ptr<Workload> inner, int64_t at) : inner_(std::move(inner)), at_(at) {}
  std::vector<std::pair<std::string, at::Tensor>>& parameters() override { return inner_->parameters(); }
  StepResult inner_step() override {
    StepResult r = inner_->inner_step();
    if (inner_->step() == at_) {
      torch::NoGradGuard ng;
      for (auto& [n, t] : inner_->parameters()) t.add_(50.0);
    }
    return r;
  }
  EvalResult evaluate() override { return inner_->evaluate(); }
  int64_t step() const override { return inner_->step(); }
  void set_step(int64_t step) override { inner_->set_step(step); }
  std::map<std::string, at::Tensor> optimizer_state() const override { return inner_->optimizer_state(); }
  void load_optimizer_state(const std::map<std::string, at::Tensor>& s) override { inner_->load_optimizer_state(s); }
  std::string fingerprint() const override { return inner_->fingerprint(); }

 private:
  std::unique_ptr<Workload> inner_;
  int64_t at_;
};

// Issue 29, defect 10: a push refused by the norm bound used to leave its progress in θ, so every later push of that
// fragment was refused again and the fragment never merged again for that learner. Now the syncer's reject
// (delta_too_large, naming the fragment) makes the learner drop its drift of it: each fragment's first push after
// the spike is refused, and the next one (one round later) is merged.
// One syncer (`cfg`) and one real learner node (`learner_cfg`, training `work`) over the in-process transport, run
// to the end: both sides' records and summaries.
struct OneLearnerRun {
  std::vector<nlohmann::json> syncer_records, learner_records;
  nlohmann::json syncer_summary, learner_summary;
};
OneLearnerRun run_one_learner(const RuntimeConfig& cfg, const RuntimeConfig& learner_cfg, std::unique_ptr<Workload> work) {
  OneLearnerRun out;
  auto hub = make_inproc_hub();
  std::mutex mu;
  SyncerNode syncer(cfg, make_inproc_server(hub), corpus(), /*resume=*/false, [&](const nlohmann::json& j) {
    std::lock_guard<std::mutex> lock(mu);
    out.syncer_records.push_back(j);
  });
  std::atomic<bool> stop{false};
  std::thread st([&] { out.syncer_summary = syncer.run(stop); });
  StopOnExit stop_on_exit{&stop, &st};
  {
    std::atomic<bool> never{false};
    LearnerNode node(learner_cfg, 0, make_inproc_client(hub, "learner-0"), std::move(work), [&](const nlohmann::json& j) {
      std::lock_guard<std::mutex> lock(mu);
      out.learner_records.push_back(j);
    });
    out.learner_summary = node.run(never);
  }
  st.join();
  return out;
}

TEST(SyncerNode, ANormRefusedFragmentMergesAgainWithinTwoRounds) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_norm_wedge_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RuntimeConfig cfg = config(dir);
  cfg.sync.learners = 1;
  cfg.run.train.steps = 24;
  cfg.sync.sync_every = 4;
  cfg.sync.max_delta_ratio = 10.0;
  cfg.sync.wait_for_answer = true;  // each push's answer (or refusal) arrives before the learner trains on
  const OneLearnerRun run =
      run_one_learner(cfg, cfg, std::make_unique<SpikeWorkload>(gpt_workloads(cfg.run, corpus())(0, 1), /*at=*/1));
  EXPECT_EQ(run.learner_summary["step"].get<int64_t>(), 24);
  const auto& learner_records = run.learner_records;
  const auto& syncer_records = run.syncer_records;
  const auto& summary = run.syncer_summary;
  // Per fragment: the step of its first refused push and of its merges.
  std::map<int64_t, int64_t> dropped_at;
  for (const auto& j : learner_records)
    if (j["kind"] == "drift_dropped") dropped_at.emplace(j["fragment"].get<int64_t>(), j["step"].get<int64_t>());
  ASSERT_EQ(dropped_at.size(), 2u) << "each fragment's first push after the spike is refused once";
  std::map<int64_t, int64_t> merges;
  for (const auto& j : syncer_records) {
    if (j["kind"] == "merge") ++merges[j["fragment"].get<int64_t>()];
    if (j["kind"] == "reject") EXPECT_EQ(j["reason"], "norm_ratio") << j.dump();
  }
  // 24 steps, H = 4: 6 pushes per fragment; the first is refused, the other 5 merge (the second one included).
  for (int64_t p = 0; p < 2; ++p) EXPECT_EQ(merges[p], 5) << "fragment " << p;
  EXPECT_EQ(summary["drift_resets"].get<int64_t>(), 2);
  EXPECT_EQ(summary["rejects"].value("norm_ratio", 0), 2);
  fs::remove_all(dir);
}

// sync.final_round set on the learner but not on its syncer: each final state is refused naming the option (never
// held, never merged), and the run ends as usual.
TEST(SyncerNode, AFinalStateToASyncerWithoutTheFinalRoundIsRefusedNamingIt) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_final_mismatch_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RuntimeConfig cfg = config(dir);
  cfg.sync.learners = 1;
  cfg.sync.quorum = 1;
  cfg.run.train.steps = 8;
  cfg.sync.sync_every = 4;
  cfg.sync.wait_for_answer = false;
  cfg.sync.apply = "rebase";
  RuntimeConfig lcfg = cfg;
  lcfg.sync.final_round = true;
  const OneLearnerRun run = run_one_learner(cfg, lcfg, gpt_workloads(cfg.run, corpus())(0, 1));
  EXPECT_EQ(run.learner_summary["step"].get<int64_t>(), 8);
  const auto& learner_records = run.learner_records;
  const auto& syncer_records = run.syncer_records;
  const auto& summary = run.syncer_summary;
  int finals = 0, refused = 0;
  for (const auto& j : learner_records) finals += j["kind"] == "push" && j.value("final", false) ? 1 : 0;
  for (const auto& j : syncer_records)
    if (j["kind"] == "reject" && j.value("reason", "") == "unexpected_kind") {
      ++refused;
      EXPECT_NE(j.value("detail", "").find("sync.final_round"), std::string::npos) << j.dump();
    }
  EXPECT_EQ(finals, 2);  // both fragments, once their answers came
  EXPECT_EQ(refused, 2);
  EXPECT_FALSE(summary.contains("final_round")) << summary.dump();
  for (const auto& j : syncer_records) EXPECT_NE(j["kind"], "final_merge") << j.dump();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco

namespace deloco {
namespace syncer_node_cases {

// Stop 66's testbed run at 1 Mbit/s: the larger model's first merge broadcast to learner 0 before that learner's
// first push had arrived (nothing measured on its link, so the syncer announced no patience); the heartbeat queued
// behind the broadcast arrived 3 s late, the learner counted the syncer gone and rejoined for 18 s. Now, before the
// first broadcast on a link none of whose broadcasts was measured, the learner hears the patience cap (20
// net.dead_after); once it acknowledges one, the patience follows the measured time. Learner 0 is a real learner
// node that pushes; learner 1 is hand-made: it joins without a download and never pushes, so nothing seeds its link.
TEST(SyncerNode, AnUnmeasuredLinkHearsThePatienceCapBeforeItsFirstBroadcast) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_first_patience_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RuntimeConfig cfg = config(dir);
  cfg.net.dead_after = 5.0;  // learner 1 is read continuously; its cap is 100 s
  cfg.run.train.steps = 8;
  const uint64_t fp = parse_fingerprint_hex(gpt_workloads(cfg.run, corpus())(0, 1)->fingerprint());
  auto hub = make_inproc_hub();
  SyncerNode syncer(cfg, make_inproc_server(hub), corpus(), /*resume=*/false, [](const nlohmann::json&) {});
  std::atomic<bool> stop{false};
  nlohmann::json summary;
  std::thread st([&] { summary = syncer.run(stop); });
  StopOnExit stop_on_exit{&stop, &st};

  Client c1{make_inproc_client(hub, "learner-1"), fp, 1};
  c1.hello(/*instance=*/7, /*want_state=*/false);
  ASSERT_TRUE(c1.next(MessageKind::kWelcome, 30).has_value());
  proto::Beat beat;
  beat.broadcasts = 0;  // it acknowledges broadcasts (none received yet)
  c1.send(MessageKind::kHeartbeat, proto::encode_beat(beat));

  nlohmann::json s0;
  std::thread l0([&] {
    std::atomic<bool> never{false};
    LearnerNode node(cfg, 0, make_inproc_client(hub, "learner-0"), corpus(), [](const nlohmann::json&) {});
    s0 = node.run(never);
  });
  testing::JoinOnExit join_l0{&l0};

  // Learner 1's link, in order: the heartbeats' patience up to its first broadcast; then, once it acknowledged
  // that broadcast, the first heartbeat whose patience is below the cap (the measured time's).
  double before_first = -1, after_ack = -1;
  int64_t acked = -1;
  const auto deadline = clk::now() + std::chrono::seconds(60);
  double last = -1;
  while (clk::now() < deadline && after_ack < 0) {
    Envelope env;
    if (!c1.tx->receive(&env, std::chrono::milliseconds(20))) continue;
    const MessageHeader h = decode_header(env.header.data(), env.header.size());
    if (h.kind == MessageKind::kHeartbeat && !env.payload.empty()) {
      last = proto::parse_syncer_beat(env.payload.data(), env.payload.size()).patience;
      // (a heartbeat the syncer sent before it read the acknowledgement may still carry the cap)
      if (acked >= 0 && last < 20 * cfg.net.dead_after) after_ack = last;
    }
    if ((h.kind == MessageKind::kFragmentBroadcast || h.kind == MessageKind::kFragmentDelta) && acked < 0) {
      before_first = last;
      acked = static_cast<int64_t>(h.c_steps);
      beat.broadcasts = acked;
      c1.send(MessageKind::kHeartbeat, proto::encode_beat(beat));
    }
  }
  ASSERT_GE(acked, 0) << "learner 1 got no broadcast";
  EXPECT_EQ(before_first, 20 * cfg.net.dead_after)
      << "the heartbeat right before the first broadcast on an unmeasured link carries the patience cap";
  EXPECT_GE(after_ack, 0) << "after the acknowledgement, no heartbeat within 60 s followed the measured time";

  c1.send(MessageKind::kLeave, proto::encode_leave("done"));
  l0.join();
  st.join();
  EXPECT_EQ(s0["step"].get<int64_t>(), 8);
  fs::remove_all(dir);
}

// sync.final_round: a syncer that resumes (or takes over) while a learner is past its last step but has not said
// goodbye. That learner may still be finishing (waiting for answers, sending its final states): it is awaited, as long
// as a live learner's silence is allowed (net.dead_after + the patience cap), and retired as finished silently only
// then. Before, it was retired at once, so a syncer whose learners were all finishing stopped before their final
// states came (and refused them).
// Found by review: a syncer resumed from its checkpoint sent a learner that came back without a download nothing
// until the next merge of each fragment, though the broadcasts of the last merges before the crash may never have
// left (queued when it was killed). Like a standby's takeover, a resume now sends such a learner every merged
// fragment as the checkpoint holds it.
TEST(SyncerNode, AResumedSyncerCatchesUpALearnerThatComesBackWithoutADownload) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_syncer_resume_catch_up_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RuntimeConfig cfg = config(dir);
  cfg.sync.learners = 2;  // learner 1 never runs in the first syncer's life: the run is not over when it stops
  cfg.run.train.steps = 16;
  cfg.learner.state_dir = (dir / "learners").string();
  const uint64_t fp = parse_fingerprint_hex(gpt_workloads(cfg.run, corpus())(0, 1)->fingerprint());
  {
    auto hub = make_inproc_hub();
    SyncerNode syncer(cfg, make_inproc_server(hub), corpus(), /*resume=*/false, nullptr);
    std::atomic<bool> stop{false};
    std::thread st([&] { syncer.run(stop); });
    StopOnExit stop_on_exit{&stop, &st};
    std::atomic<bool> never{false};
    LearnerNode node(cfg, 0, make_inproc_client(hub, "learner-0"), corpus(), nullptr);
    const nlohmann::json s0 = node.run(never);  // trains its 16 steps, its pushes merged (quorum 1)
    ASSERT_TRUE(s0["finished"].get<bool>()) << s0.dump();
  }  // stopped: its last checkpoint holds the merged versions
  const auto ck = read_checkpoint(cfg.syncer.out_dir, /*with_optimizer=*/false);
  const auto versions = ck.manifest.at("versions").get<std::vector<int64_t>>();
  ASSERT_EQ(versions.size(), 2u);
  ASSERT_GT(versions[0], 0);
  ASSERT_GT(versions[1], 0);

  auto hub = make_inproc_hub();
  SyncerNode syncer(cfg, make_inproc_server(hub), corpus(), /*resume=*/true, nullptr);
  std::atomic<bool> stop{false};
  std::thread st([&] { syncer.run(stop); });
  StopOnExit stop_on_exit{&stop, &st};
  Client c{make_inproc_client(hub, "learner-1"), fp, 1};
  c.hello(/*instance=*/7, /*want_state=*/false);
  ASSERT_TRUE(c.next(MessageKind::kWelcome, 30).has_value());
  std::map<int64_t, int64_t> got;  // fragment -> version broadcast
  for (int i = 0; i < 2; ++i) {
    auto b = c.next(MessageKind::kFragmentBroadcast, 10);
    ASSERT_TRUE(b.has_value()) << "no broadcast of every merged fragment after the resume (got " << got.size() << ")";
    got[b->first.fragment_id] = static_cast<int64_t>(b->first.round);
  }
  EXPECT_EQ(got, (std::map<int64_t, int64_t>{{0, versions[0]}, {1, versions[1]}}));
  fs::remove_all(dir);
}

TEST(SyncerNode, UnderTheFinalRoundAResumedSyncerAwaitsALearnerPastItsLastStep) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_syncer_finishing_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RuntimeConfig cfg = config(dir);
  cfg.sync.learners = 1;
  cfg.sync.final_round = true;
  const uint64_t fp = parse_fingerprint_hex(gpt_workloads(cfg.run, corpus())(0, 1)->fingerprint());
  // The first syncer: learner 0 joins, beats its last step with nothing left to push, and the syncer stops (killed
  // in effect: its checkpoint holds the learner's step, not retired).
  {
    auto hub = make_inproc_hub();
    std::atomic<bool> marked{false};
    SyncerNode syncer(cfg, make_inproc_server(hub), corpus(), /*resume=*/false, [&](const nlohmann::json& j) {
      if (j.value("kind", "") == "learner_finished") marked = true;
    });
    std::atomic<bool> stop{false};
    std::thread st([&] { syncer.run(stop); });
    StopOnExit stop_on_exit{&stop, &st};
    Client c{make_inproc_client(hub, "learner-0"), fp, 0};
    c.hello(/*instance=*/3, /*want_state=*/false);
    ASSERT_TRUE(c.next(MessageKind::kWelcome, 30).has_value());
    proto::Beat beat;
    beat.step = cfg.run.train.steps;
    beat.unsent = 0;
    c.send(MessageKind::kHeartbeat, proto::encode_beat(beat));
    const auto deadline = clk::now() + std::chrono::seconds(30);
    while (!marked && clk::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(marked.load()) << "the syncer never marked learner 0 past its last step";
  }
  fs::copy(dir / "syncer", dir / "syncer-copy", fs::copy_options::recursive);
  cfg.net.dead_after = 0.25;  // the resumed syncers wait 0.25 + 20 · 0.25 s for it
  // A syncer resumed from `out`; learner 0 comes back (`come_back`) or not. The seconds until it ended.
  const auto resumed = [&](const fs::path& out, std::vector<nlohmann::json>* records, bool come_back) {
    RuntimeConfig c2 = cfg;
    c2.syncer.out_dir = out.string();
    auto hub = make_inproc_hub();
    std::mutex mu;
    SyncerNode syncer(c2, make_inproc_server(hub), corpus(), /*resume=*/true, [&](const nlohmann::json& j) {
      std::lock_guard<std::mutex> lock(mu);
      records->push_back(j);
    });
    std::atomic<bool> stop{false}, ended{false};
    const auto t0 = clk::now();
    std::thread st([&] {
      syncer.run(stop);
      ended = true;
    });
    StopOnExit stop_on_exit{&stop, &st};
    if (come_back) {  // it is back: welcomed, its goodbye answered, and only then does the syncer end
      Client c{make_inproc_client(hub, "learner-0"), fp, 0};
      c.hello(/*instance=*/3, /*want_state=*/false);
      EXPECT_TRUE(c.next(MessageKind::kWelcome, 30).has_value()) << "the resumed syncer did not await learner 0";
      EXPECT_FALSE(ended.load());
      c.send(MessageKind::kLeave, proto::encode_leave("done"));
      EXPECT_TRUE(c.next(MessageKind::kLeave, 30).has_value());
    }
    const auto deadline = clk::now() + std::chrono::seconds(60);
    while (!ended && clk::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(ended.load()) << "the resumed syncer did not end";
    const double took = std::chrono::duration<double>(clk::now() - t0).count();
    st.join();
    std::lock_guard<std::mutex> lock(mu);
    return took;
  };
  const auto retired_how = [](const std::vector<nlohmann::json>& records) {
    std::vector<std::string> how;
    for (const auto& j : records)
      if (j.value("kind", "") == "retired") how.push_back(j.value("how", ""));
    return how;
  };
  std::vector<nlohmann::json> back, silent;
  resumed(dir / "syncer", &back, /*come_back=*/true);
  EXPECT_EQ(retired_how(back), (std::vector<std::string>{"leave"}));
  // Nobody comes back: the resumed syncer retires it as finished silently once its allowance has passed, and ends.
  const double waited = resumed(dir / "syncer-copy", &silent, /*come_back=*/false);
  EXPECT_EQ(retired_how(silent), (std::vector<std::string>{"finished_silently"}));
  EXPECT_GE(waited, cfg.net.dead_after * 21) << "retired before its allowance had passed";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
