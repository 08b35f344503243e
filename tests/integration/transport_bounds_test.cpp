// Transport bounds sized to the model (deloco/runtime.h: legit_frame_bytes, node_transport_options), and a real
// `deloco syncer` refusing what a peer without a key sends beyond them (issue 11, item 1).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/runtime.h"
#include "deloco/transport.h"
#include "deloco/wire.h"
#include "roles/protocol.h"
#include "support/jsonl.h"
#include "support/proc.h"
#include "support/raw_zmtp.h"

namespace deloco {
namespace transport_bounds_cases {
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(TransportBounds, LegitFrameBytesFollowTheModel) {
  constexpr uint64_t kSlack = 4096, kControl = proto::kMaxControlBytes;
  // Syncer: the largest fragment's push in fp32 (int8 costs more for a handful of elements only).
  EXPECT_EQ(legit_frame_bytes(NodeRole::kSyncer, 1'000'000, 3'000'000), 4'000'000u + kSlack);
  EXPECT_EQ(legit_frame_bytes(NodeRole::kSyncer, 1, 10), kControl + kSlack);  // control messages still fit
  // Learner: the whole model (state chunks and broadcasts never exceed it, whatever the syncer's chunk size).
  EXPECT_EQ(legit_frame_bytes(NodeRole::kLearner, 1'000'000, 3'000'000), 12'000'000u + kSlack);
  EXPECT_THROW(legit_frame_bytes(NodeRole::kSyncer, 5, 4), ConfigError);
  EXPECT_THROW(legit_frame_bytes(NodeRole::kLearner, 1, int64_t{1} << 62), ConfigError);
}

// A workload with fixed parameters: only parameters() is used to size the transport.
class FixedParams final : public Workload {
 public:
  explicit FixedParams(std::vector<int64_t> sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) params_.emplace_back("w" + std::to_string(i), torch::zeros({sizes[i]}));
  }
  std::vector<std::pair<std::string, at::Tensor>>& parameters() override { return params_; }
  StepResult inner_step() override { return {}; }
  EvalResult evaluate() override { return {}; }
  int64_t step() const override { return 0; }
  void set_step(int64_t) override {}
  std::map<std::string, at::Tensor> optimizer_state() const override { return {}; }
  void load_optimizer_state(const std::map<std::string, at::Tensor>&) override {}
  std::string fingerprint() const override { return "0000000000000000"; }

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
};

TEST(TransportBounds, NodeOptionsAreSizedToTheModel) {
  FixedParams model({300'000, 200'000, 100'000});  // two fragments: {300k} and {200k, 100k}
  RuntimeConfig cfg;
  cfg.sync.fragments = 2;
  cfg.net.secret_key = "s.key";
  cfg.net.allow = "allow";
  const TransportOptions s = node_transport_options(cfg, model, NodeRole::kSyncer);
  EXPECT_EQ(s.max_frame_bytes, 300'000u * 4 + 4096);
  EXPECT_EQ(s.receive_limit, 4 * 2 + 16);
  EXPECT_EQ(s.secret_key_file, "s.key");  // the net.* keys carried over
  EXPECT_EQ(s.allow, "allow");
  const TransportOptions l = node_transport_options(cfg, model, NodeRole::kLearner);
  EXPECT_EQ(l.max_frame_bytes, 600'000u * 4 + 4096);
  EXPECT_EQ(l.receive_limit, 0);  // clients: queue_limit
  cfg.net.max_frame_bytes = 1 << 20;  // the override wins for both roles
  EXPECT_EQ(node_transport_options(cfg, model, NodeRole::kSyncer).max_frame_bytes, 1u << 20);
  EXPECT_EQ(node_transport_options(cfg, model, NodeRole::kLearner).max_frame_bytes, 1u << 20);
  // The key is bound and checked.
  ConfigSchema schema;
  RuntimeConfig bound;
  bound.bind(schema);
  schema.apply_override("net.max_frame_bytes=-1");
  EXPECT_THROW(schema.validate(), ConfigError);
}

// ---------------------------------------------------------------------------------------------------------------
// A real syncer (tiny model, CURVE on) and peers without a key declaring huge handshake frames.

TEST(TransportBounds, SyncerDropsHandshakeFramesOverTheModelBoundAndServesOn) {
  const std::string src = test::source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_bounds_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "keys/allow");
  write_keypair((dir / "keys/syncer").string(), generate_keypair());
  write_keypair((dir / "keys/allow/learner-0").string(), generate_keypair());
  test::Proc syncer({"syncer", "--config", src + "/configs/tiny.toml", "--set", "data.path=" + src + "/data/sotu",
                     "--set", "train.threads=1", "--set", "sync.learners=2", "--set", "sync.quorum=1", "--set", "sync.fragments=2",
                     "--set", "syncer.eval_interval=0", "--set", "syncer.metrics=127.0.0.1:0", "--set",
                     "net.secret_key=" + (dir / "keys/syncer.key").string(), "--set",
                     "net.allow=" + (dir / "keys/allow").string(), "--bind", "tcp://127.0.0.1:0", "--out",
                     (dir / "run").string()},
                    (dir / "syncer.log").string());
  nlohmann::json started;
  for (auto end = Clock::now() + 60s; Clock::now() < end && started.is_null() && syncer.wait(0) < 0;) {
    const auto s = test::records(dir / "run/syncer.jsonl", "started");
    if (!s.empty()) started = s[0];
    if (started.is_null()) std::this_thread::sleep_for(50ms);
  }
  ASSERT_FALSE(started.is_null()) << syncer.log();
  const std::string endpoint = started["endpoint"];
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));

  // Three peers without a key each declare a 64 MiB handshake frame (the tiny model's bound is a few hundred KB;
  // the old bound was 1 GiB) and stream it: each is dropped right after the header.
  const uint64_t declared = 64u << 20;
  for (int i = 0; i < 3; ++i) {
    const long long sent = testing::oversized_handshake(port, declared, 30s);
    ASSERT_NE(sent, -2) << "connection " << i << " could not be made";
    EXPECT_GE(sent, 0) << "connection " << i << " still open after 30 s";
    EXPECT_LT(sent, static_cast<long long>(declared) / 2) << "connection " << i;
  }

  // A learner with an allowed key is still welcomed, with the model's state.
  TransportOptions o;
  o.secret_key_file = (dir / "keys/allow/learner-0.key").string();
  o.server_public_key_file = (dir / "keys/syncer.pub").string();
  auto client = make_zmq_client(endpoint, o);
  MessageHeader h;
  h.kind = MessageKind::kHello;
  h.fingerprint = parse_fingerprint_hex(started["fingerprint"]);
  h.learner_id = 0;
  proto::Hello hello;
  hello.learner = 0;
  hello.instance = 7;
  hello.want_state = true;
  const proto::Frame f = proto::make_frame(h, proto::encode_hello(hello), WireLimits{});
  bool welcomed = false;
  for (auto end = Clock::now() + 30s; Clock::now() < end && !welcomed;) {
    client->send(f.header, f.payload);  // false until the connection is up
    Envelope e;
    while (client->receive(&e, 200ms))
      if (decode_header(e.header.data(), e.header.size()).kind == MessageKind::kWelcome) welcomed = true;
  }
  EXPECT_TRUE(welcomed) << syncer.log();
  syncer.signal(SIGTERM);
  EXPECT_EQ(syncer.wait(60), 0) << syncer.log();
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
