// The send windows (issue 31): what the syncer and a learner hand to a link that does not drain.
//  * Syncer → learner: with learner 1's link held (nothing it is sent arrives, as on a cut or saturated link), the
//    syncer hands it at most its window of broadcasts while learner 0 keeps merging; the rest are superseded by
//    newer merges. Once the link drains and learner 1 acknowledges, it gets each fragment's newest version, not the
//    backlog.
//  * Learner → syncer: with the syncer's receipts held from learner 0, the learner hands the link at most two pushes
//    and replaces a waiting push with its newer one; once receipts flow again it finishes normally.
// A link that is held is a transport wrapper that keeps (does not forward) the frames it is told to keep, in order,
// and releases them on demand: the real syncer and learner nodes run unchanged over the in-process transport.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "deloco/runtime.h"
#include "protocol.h"
#include "support/await_kind.h"
#include "support/roles_fixture.h"

namespace deloco {
namespace flow_control_cases {
namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

std::shared_ptr<const Corpus> corpus() { return testing::letters_corpus(); }

RuntimeConfig config(const fs::path& dir) {
  RuntimeConfig cfg = testing::tiny_runtime_config(dir);
  cfg.run.train.steps = 400;
  cfg.net.dead_after = 60.0;  // a held link must not make anyone count the other side gone
  cfg.net.join_timeout = 60.0;
  return cfg;
}

using testing::JoinOnExit;
using testing::StopOnExit;

// The syncer's side of the links: frames for which `keep` says true are held, in order, until release().
class HeldLinks final : public ServerTransport {
 public:
  using Keep = std::function<bool(const std::string& peer, const MessageHeader& h, const Bytes& payload)>;
  HeldLinks(std::unique_ptr<ServerTransport> inner, Keep keep) : inner_(std::move(inner)), keep_(std::move(keep)) {}
  std::string endpoint() const override { return inner_->endpoint(); }
  bool receive(Envelope* out, std::chrono::milliseconds timeout) override {
    if (!inner_->receive(out, timeout)) return false;
    const MessageHeader h = decode_header(out->header.data(), out->header.size());
    std::lock_guard<std::mutex> lock(mu_);
    ++received_[{h.learner_id, h.kind}];
    ++received_all_[h.learner_id];
    if (h.kind == MessageKind::kHeartbeat && !out->payload.empty()) {
      const int64_t step = proto::parse_beat(out->payload.data(), out->payload.size()).step;
      if (step > beat_step_[h.learner_id]) {
        beat_step_[h.learner_id] = step;
        beat_step_at_[h.learner_id] = received_all_[h.learner_id];
      }
    }
    return true;
  }
  bool send(const std::string& peer, const Bytes& header, const Bytes& payload) override {
    const MessageHeader h = decode_header(header.data(), header.size());
    std::lock_guard<std::mutex> lock(mu_);
    if (holding_ && keep_(peer, h, payload)) {
      held_.push_back({peer, header, payload});
      ++held_kinds_[h.kind];
      return true;  // taken: as a socket whose kernel buffer still has room
    }
    return inner_->send(peer, header, payload);
  }
  TransportStats stats() const override { return inner_->stats(); }
  // Stops holding and forwards what was held, in order.
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    holding_ = false;
    for (auto& f : held_) inner_->send(f.peer, f.header, f.payload);
    held_.clear();
  }
  int held(MessageKind k) {
    std::lock_guard<std::mutex> lock(mu_);
    return held_kinds_[k];
  }
  int received(uint32_t learner, MessageKind k) {
    std::lock_guard<std::mutex> lock(mu_);
    return received_[{learner, k}];
  }
  // Whether the syncer has handled a heartbeat of `learner` that said `step` or later: one was received and so was
  // a message after it (the syncer handles one message before it receives the next).
  bool handled_beat_of(uint32_t learner, int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    return beat_step_[learner] >= step && received_all_[learner] > beat_step_at_[learner];
  }

 private:
  struct Frame {
    std::string peer;
    Bytes header, payload;
  };
  std::unique_ptr<ServerTransport> inner_;
  Keep keep_;
  std::mutex mu_;
  bool holding_ = true;
  std::deque<Frame> held_;
  std::map<MessageKind, int> held_kinds_;
  std::map<std::pair<uint32_t, MessageKind>, int> received_;
  std::map<uint32_t, int64_t> received_all_, beat_step_, beat_step_at_;
};

// Waits up to `seconds` for pred(); true when it held.
bool eventually(double seconds, const std::function<bool()>& pred) {
  const auto deadline = clk::now() + std::chrono::duration<double>(seconds);
  while (clk::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

int64_t merges_in(const std::string& prom) {
  const auto at = prom.find("\ndeloco_merges_total ");
  return at == std::string::npos ? -1 : std::stoll(prom.substr(at + 21));
}

TEST(FlowControl, ASyncerSupersedesBroadcastsALinkCannotTakeAndSendsTheNewestWhenItDrains) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_flow_syncer_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RuntimeConfig cfg = config(dir);
  cfg.learner.state_dir = (dir / "learners").string();
  const uint64_t fp = parse_fingerprint_hex(gpt_workloads(cfg.run, corpus())(0, 1)->fingerprint());
  auto hub = make_inproc_hub();
  // Learner 1's link holds every broadcast the syncer hands it.
  auto held = std::make_unique<HeldLinks>(make_inproc_server(hub), [](const std::string&, const MessageHeader& h,
                                                                       const Bytes&) {
    return h.learner_id == 1 && h.kind == MessageKind::kFragmentBroadcast;
  });
  HeldLinks* link = held.get();
  SyncerNode syncer(cfg, std::move(held), corpus(), /*resume=*/false, nullptr);
  std::atomic<bool> stop{false};
  nlohmann::json summary;
  std::thread st([&] { summary = syncer.run(stop); });
  StopOnExit stop_on_exit{&stop, &st};

  // Learner 1, by hand: joins without a download and says it acknowledges broadcasts (none received yet).
  std::unique_ptr<ClientTransport> c1 = make_inproc_client(hub, "learner-1");
  std::map<MessageKind, int> seen;
  auto send1 = [&](MessageKind k, const std::string& body) {
    MessageHeader h;
    h.kind = k;
    h.learner_id = 1;
    h.fingerprint = fp;
    auto f = proto::make_frame(h, body, WireLimits{});
    ASSERT_TRUE(c1->send(f.header, f.payload));
  };
  proto::Hello hello;
  hello.learner = 1;
  hello.instance = 7;
  hello.want_state = false;
  send1(MessageKind::kHello, proto::encode_hello(hello));
  ASSERT_TRUE(testing::await_kind(*c1, MessageKind::kWelcome, 30, seen).has_value());
  proto::Beat beat;
  beat.broadcasts = 0;
  send1(MessageKind::kHeartbeat, proto::encode_beat(beat));

  // Learner 0, a real node, trains and pushes; with quorum 1 every push merges.
  nlohmann::json s0;
  std::thread l0([&] {
    std::atomic<bool> never{false};
    LearnerNode node(cfg, 0, make_inproc_client(hub, "learner-0"), corpus(), nullptr);
    s0 = node.run(never);
  });
  JoinOnExit join_l0{&l0};
  // Learner 0 trains its whole run (every push merged) while learner 1's link drains nothing.
  l0.join();
  ASSERT_TRUE(s0["finished"].get<bool>()) << s0.dump();
  const int64_t merges = merges_in(syncer.prometheus());
  ASSERT_GE(merges, 100) << syncer.prometheus();
  // Learner 1's link took at most its window: two broadcasts of the larger fragment's size (three of a smaller).
  const int handed = link->held(MessageKind::kFragmentBroadcast);
  EXPECT_GE(handed, 1);
  EXPECT_LE(handed, 3) << "the syncer queued a broadcast of every merge for a link that drains nothing";

  // The link drains: learner 1 reads what was held and acknowledges each broadcast as it arrives; the syncer then
  // sends what waited: one per fragment, the newest.
  link->release();
  std::map<uint32_t, int64_t> newest;  // fragment → newest version received
  int64_t highest_seq = 0;
  int broadcasts = 0;
  for (;;) {
    auto b = testing::await_kind(*c1, MessageKind::kFragmentBroadcast, 2.0, seen);
    if (!b) break;  // nothing more within 2 s (each is acknowledged at once, so nothing waits on us)
    ++broadcasts;
    EXPECT_GT(static_cast<int64_t>(b->first.c_steps), highest_seq) << "sequence numbers go up";
    highest_seq = static_cast<int64_t>(b->first.c_steps);
    newest[b->first.fragment_id] = std::max(newest[b->first.fragment_id], static_cast<int64_t>(b->first.round));
    beat.broadcasts = highest_seq;
    send1(MessageKind::kHeartbeat, proto::encode_beat(beat));
  }
  EXPECT_GT(broadcasts, handed) << "nothing was sent after the held broadcasts were acknowledged";
  EXPECT_LE(broadcasts, handed + 2) << "after the held ones, one broadcast per fragment: the newest";
  // With one contributor every merge makes one fragment one version newer: the newest versions add up to the merges.
  EXPECT_EQ(newest[0] + newest[1], merges) << "learner 1 did not end with the newest of each fragment";
  send1(MessageKind::kLeave, proto::encode_leave("done"));
  st.join();
  EXPECT_GT(summary["broadcasts_superseded"].get<int64_t>(), 0) << summary.dump();
  EXPECT_GT(summary["broadcasts_acked"].get<int64_t>(), 0) << summary.dump();
  EXPECT_TRUE(summary["broadcast_seconds"].is_number()) << summary.dump();
  EXPECT_TRUE(summary["upload_seconds"].is_number()) << summary.dump();
  fs::remove_all(dir);
}

TEST(FlowControl, ALearnerHoldsPushesWhileTwoAreUnacknowledgedAndSendsTheNewest) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_flow_learner_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RuntimeConfig cfg = config(dir);
  cfg.sync.learners = 1;
  cfg.sync.wait_for_answer = false;  // Decoupled DiLoCo's learners never wait for an answer
  cfg.run.train.steps = 200;
  cfg.learner.state_dir = (dir / "learners").string();
  auto hub = make_inproc_hub();
  // The syncer's receipts to learner 0 (heartbeats with a body) are held after the first one, so the learner
  // knows this syncer acknowledges pushes and then hears of none.
  std::atomic<int> receipts{0};
  auto held = std::make_unique<HeldLinks>(make_inproc_server(hub), [&](const std::string&, const MessageHeader& h,
                                                                       const Bytes& payload) {
    return h.kind == MessageKind::kHeartbeat && !payload.empty() && receipts.fetch_add(1) >= 1;
  });
  HeldLinks* link = held.get();
  SyncerNode syncer(cfg, std::move(held), corpus(), /*resume=*/false, nullptr);
  std::atomic<bool> stop{false};
  nlohmann::json summary;
  std::thread st([&] { summary = syncer.run(stop); });
  StopOnExit stop_on_exit{&stop, &st};
  std::atomic<int64_t> step{0};
  nlohmann::json s0;
  std::mutex unsent_mu;
  std::vector<nlohmann::json> unsent;  // push_unsent records
  std::thread l0([&] {
    std::atomic<bool> never{false};
    LearnerNode node(cfg, 0, make_inproc_client(hub, "learner-0"), corpus(),
                     [&](const nlohmann::json& j) {
                       if (getenv("FLOW_DEBUG")) fprintf(stderr, "%s\n", j.dump().c_str());
                       if (j.value("kind", "") == "learner") step = j.value("step", int64_t{0});
                       if (j.value("kind", "") == "push_unsent") {
                         std::lock_guard<std::mutex> lock(unsent_mu);
                         unsent.push_back(j);
                       }
                     });
    s0 = node.run(never);
  });
  JoinOnExit join_l0{&l0};
  // The learner trains on to its last step (it never waits for answers) while its pushes wait.
  ASSERT_TRUE(eventually(120, [&] { return step.load() >= cfg.run.train.steps; }));
  EXPECT_LE(link->received(0, MessageKind::kFragmentPush), 2 + 1)
      << "the learner kept pushing although the syncer acknowledged none (the first receipt may cover one)";
  // Receipts flow again: the waiting pushes go, the learner says goodbye and the run ends.
  link->release();
  l0.join();
  st.join();
  EXPECT_TRUE(s0["finished"].get<bool>()) << s0.dump();
  EXPECT_GT(s0["pushes_superseded"].get<int64_t>(), 0) << s0.dump();
  EXPECT_EQ(summary["contributions_rejected"].get<int64_t>(), 0) << summary.dump();
  // Every push accounted for (issue 56): the schedule's 200 / H × P pushes are sent or superseded, each superseded
  // one a push_unsent record naming the newer push that replaced it; every push sent was merged (quorum 1).
  const int64_t due = s0["pushes_due"].get<int64_t>(), sent = s0["pushes"].get<int64_t>(),
                superseded = s0["pushes_superseded"].get<int64_t>();
  EXPECT_EQ(due, cfg.run.train.steps / cfg.sync.sync_every * cfg.sync.fragments) << s0.dump();
  EXPECT_EQ(due, sent + superseded + s0["pushes_dropped"].get<int64_t>() + s0["pushes_unsent_at_end"].get<int64_t>())
      << s0.dump();
  EXPECT_EQ(link->received(0, MessageKind::kFragmentPush), sent);
  {
    std::lock_guard<std::mutex> lock(unsent_mu);
    ASSERT_EQ(static_cast<int64_t>(unsent.size()), superseded);
    for (const auto& u : unsent) {
      EXPECT_EQ(u["reason"], "superseded") << u.dump();
      EXPECT_GT(u["replaced_by"].get<int64_t>(), u["step"].get<int64_t>()) << u.dump();
    }
  }
  EXPECT_EQ(summary["contributions_merged"].get<int64_t>(), sent) << summary.dump();
  EXPECT_EQ(summary["contributions_replaced"].get<int64_t>(), 0) << summary.dump();
  EXPECT_EQ(summary["contributions_pending_at_end"].get<int64_t>(), 0) << summary.dump();
  fs::remove_all(dir);
}

// Defect: a state chunk lost on the way (a send the link took and never delivered) left the learner joined with no
// state for the rest of the run: the syncer's heartbeats kept the link alive, so no silence ended the download, and
// the syncer sends no second copy on its own. A download with no progress for max(join_timeout, dead_after) is now
// dropped and asked for again.
TEST(FlowControl, AStateDownloadThatLostAChunkIsAskedForAgain) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_flow_stalled_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RuntimeConfig cfg = config(dir);
  cfg.sync.learners = 1;
  cfg.run.train.steps = 40;
  cfg.net.chunk_bytes = 4096;  // several chunks
  cfg.net.join_timeout = 1.5;
  cfg.net.dead_after = 1.5;
  auto hub = make_inproc_hub();
  std::atomic<int> chunk1{0};  // the first copy of chunk 1 is lost
  auto held = std::make_unique<HeldLinks>(make_inproc_server(hub), [&](const std::string&, const MessageHeader& h,
                                                                       const Bytes&) {
    return h.kind == MessageKind::kStateChunk && h.fragment_id == 1 && chunk1.fetch_add(1) == 0;
  });
  HeldLinks* link = held.get();
  SyncerNode syncer(cfg, std::move(held), corpus(), /*resume=*/false, nullptr);
  std::atomic<bool> stop{false};
  nlohmann::json summary;
  std::thread st([&] { summary = syncer.run(stop); });
  StopOnExit stop_on_exit{&stop, &st};
  RuntimeConfig own = cfg;
  own.run.train.seed += 1;  // another initialisation than the syncer's: the join downloads the state
  std::mutex mu;
  std::vector<nlohmann::json> stalled, joined;
  nlohmann::json s0;
  std::thread l0([&] {
    std::atomic<bool> never{false};
    LearnerNode node(own, 0, make_inproc_client(hub, "learner-0"), corpus(), [&](const nlohmann::json& j) {
      std::lock_guard<std::mutex> lock(mu);
      if (j.value("kind", "") == "download_stalled") stalled.push_back(j);
      if (j.value("kind", "") == "joined") joined.push_back(j);
    });
    s0 = node.run(never);
  });
  JoinOnExit join_l0{&l0};
  l0.join();
  st.join();
  EXPECT_EQ(link->held(MessageKind::kStateChunk), 1);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_LT(stalled[0]["chunks_held"].get<int64_t>(), stalled[0]["chunks"].get<int64_t>()) << stalled[0].dump();
  EXPECT_GE(stalled[0]["idle_seconds"].get<double>(), 1.5);
  ASSERT_EQ(joined.size(), 1u);  // the second download arrived and verified
  EXPECT_GT(joined[0].value("download_bytes", int64_t{0}), 0) << joined[0].dump();
  EXPECT_TRUE(s0["finished"].get<bool>()) << s0.dump();
  EXPECT_GT(summary["contributions_merged"].get<int64_t>(), 0) << summary.dump();
  fs::remove_all(dir);
}

// sync.final_round: a learner's heartbeat of its last step can go out while pushes still wait in its outbox (its
// window is full, as on a slow link). The syncer marks it past its last step (no round waits for its push) only on a
// heartbeat with none left to come: before, it marked it on the first heartbeat of that step, and the pushes that
// came after merged alone, each in a round of its own.
TEST(FlowControl, UnderTheFinalRoundALearnerIsMarkedFinishedOnlyOnceItsPushesAreOut) {
  torch::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_flow_finished_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RuntimeConfig cfg = config(dir);
  cfg.sync.learners = 1;
  cfg.sync.wait_for_answer = false;
  cfg.sync.final_round = true;
  cfg.run.train.steps = 60;
  cfg.learner.state_dir = (dir / "learners").string();
  auto hub = make_inproc_hub();
  std::atomic<int> receipts{0};  // the receipts are held after the first one, as above
  auto held = std::make_unique<HeldLinks>(make_inproc_server(hub), [&](const std::string&, const MessageHeader& h,
                                                                       const Bytes& payload) {
    return h.kind == MessageKind::kHeartbeat && !payload.empty() && receipts.fetch_add(1) >= 1;
  });
  HeldLinks* link = held.get();
  std::mutex mu;
  std::vector<nlohmann::json> marks;  // learner_finished records
  std::vector<int> pushes_at_mark;     // the pushes the syncer had received from the learner when it marked it
  SyncerNode syncer(cfg, std::move(held), corpus(), /*resume=*/false, [&](const nlohmann::json& j) {
    if (j.value("kind", "") != "learner_finished") return;
    std::lock_guard<std::mutex> lock(mu);
    marks.push_back(j);
    pushes_at_mark.push_back(link->received(0, MessageKind::kFragmentPush));
  });
  std::atomic<bool> stop{false};
  nlohmann::json summary;
  std::thread st([&] { summary = syncer.run(stop); });
  StopOnExit stop_on_exit{&stop, &st};
  nlohmann::json s0;
  std::thread l0([&] {
    std::atomic<bool> never{false};
    LearnerNode node(cfg, 0, make_inproc_client(hub, "learner-0"), corpus(), nullptr);
    s0 = node.run(never);
  });
  JoinOnExit join_l0{&l0};
  // The learner reached its last step and the syncer handled a heartbeat saying so, while pushes wait behind it.
  ASSERT_TRUE(eventually(120, [&] { return link->handled_beat_of(0, cfg.run.train.steps); }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(marks.empty()) << "marked past its last step with pushes still to come: " << marks[0].dump();
  }
  link->release();
  l0.join();
  st.join();
  ASSERT_TRUE(s0["finished"].get<bool>()) << s0.dump();
  const int64_t sent = s0["pushes"].get<int64_t>();  // its final states included
  const int64_t finals = link->received(0, MessageKind::kFinalState), pushed = sent - finals;
  EXPECT_GT(s0["pushes_superseded"].get<int64_t>(), 0) << "no push waited in the outbox: nothing was tested";
  EXPECT_EQ(finals, cfg.sync.fragments);
  EXPECT_EQ(link->received(0, MessageKind::kFragmentPush), pushed);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(marks.size(), 1u);
  EXPECT_TRUE(marks[0]["finished"].get<bool>()) << marks[0].dump();
  EXPECT_EQ(marks[0]["step"].get<int64_t>(), cfg.run.train.steps) << marks[0].dump();
  EXPECT_EQ(pushes_at_mark[0], pushed) << "marked before every push it sent had arrived";
  EXPECT_EQ(summary["final_round"]["states_merged"].get<int64_t>(), cfg.sync.fragments) << summary.dump();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
