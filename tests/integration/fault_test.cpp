// Fault tests of the distributed runtime with real processes over the real transport ("Bad input and
// faults"): `deloco syncer` and `deloco learner` are started from DELOCO_BINARY, killed with real signals, and
// attacked from this test process with raw ZeroMQ and TCP peers. Every wait polls a file or socket with a deadline.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <zmq.hpp>

#include "deloco/checkpoint.h"
#include "deloco/gpt/model.h"
#include "deloco/transport.h"
#include "deloco/wire.h"
#include "roles/protocol.h"
#include "support/await_kind.h"
#include "support/jsonl.h"
#include "support/proc.h"
#include "train/run_checkpoint.h"
#include "util/fs.h"
#include "wire/quantize.h"

namespace deloco {
namespace fault_cases {
namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}
const std::string kSrc = env_or("DELOCO_SOURCE_DIR", ".");
using test::json_lines;
// A child process running the deloco binary (DELOCO_BINARY), output to a log file.
using test::Proc;

// Waits until a record of `kind` satisfying `pred` appears in the JSON-lines file; returns it.
nlohmann::json wait_record(const fs::path& p, const std::string& kind, double seconds,
                           const std::function<bool(const nlohmann::json&)>& pred = nullptr) {
  const auto deadline = clk::now() + std::chrono::duration<double>(seconds);
  while (clk::now() < deadline) {
    for (const auto& j : json_lines(p))
      if (j.value("kind", "") == kind && (!pred || pred(j))) return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return nullptr;
}
size_t count_records(const fs::path& p, const std::string& kind) { return test::records(p, kind).size(); }

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("deloco_faults_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::exists(kSrc + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // Common flags: the tiny model, 2 learners, K = 1, two fragments, a run folder in dir_/run.
  std::vector<std::string> base(int steps, bool plaintext) {
    std::vector<std::string> a{"--config", kSrc + "/configs/tiny.toml", "--set", "data.path=" + kSrc + "/data/sotu",
                               "--set", "train.steps=" + std::to_string(steps), "--set", "train.threads=1",
                               "--set", "train.log_every=5", "--set", "train.eval_tokens=2048",
                               "--set", "sync.learners=2", "--set", "sync.quorum=1", "--set", "sync.fragments=2",
                               "--set", "sync.sync_every=5", "--set", "sync.wait_for_answer=false",
                               "--set", "merge.preset=decoupled", "--set", "syncer.eval_interval=0",
                               "--set", "net.heartbeat=0.2", "--set", "net.dead_after=1.5",
                               "--set", "net.join_timeout=20"};
    if (plaintext) {
      a.insert(a.end(), {"--set", "net.plaintext=true"});
    } else {
      a.insert(a.end(), {"--set", "net.secret_key=" + (dir_ / "keys/syncer.key").string(), "--set",
                         "net.allow=" + (dir_ / "keys/allow").string()});
    }
    return a;
  }
  std::vector<std::string> learner_args(int id, int steps, bool plaintext, const std::string& key = "",
                                        const std::string& out = "") {
    auto a = base(steps, plaintext);
    a.insert(a.begin(), "learner");
    a.insert(a.end(), {"--id", std::to_string(id), "--connect", endpoint_, "--out", out.empty() ? run_.string() : out});
    if (!plaintext) {
      a.insert(a.end(), {"--set", "net.secret_key=" + (key.empty() ? (dir_ / ("keys/learner-" + std::to_string(id) + ".key")).string() : key),
                         "--set", "net.server_key=" + (dir_ / "keys/syncer.pub").string()});
    }
    return a;
  }
  void make_keys() {
    fs::create_directories(dir_ / "keys/allow");
    write_keypair((dir_ / "keys/syncer").string(), generate_keypair());
    for (int m = 0; m < 2; ++m) {
      write_keypair((dir_ / ("keys/learner-" + std::to_string(m))).string(), generate_keypair());
      fs::copy_file(dir_ / ("keys/learner-" + std::to_string(m) + ".pub"),
                    dir_ / ("keys/allow/learner-" + std::to_string(m) + ".pub"));
    }
    write_keypair((dir_ / "keys/stranger").string(), generate_keypair());
  }
  // Starts the syncer and waits for its "started" record; sets endpoint_.
  // same_endpoint: bind the endpoint of the previous syncer (a fresh syncer in its place, not resumed).
  std::unique_ptr<Proc> start_syncer(int steps, bool plaintext, bool resume = false,
                                     std::vector<std::string> extra = {}, bool same_endpoint = false) {
    auto a = base(steps, plaintext);
    a.insert(a.begin(), "syncer");
    a.insert(a.end(), {"--out", run_.string(), "--set", "syncer.metrics=127.0.0.1:0"});
    if (!endpoint_.empty() && (resume || same_endpoint)) a.insert(a.end(), {"--bind", endpoint_});
    else a.insert(a.end(), {"--bind", "tcp://127.0.0.1:0"});
    if (resume) a.push_back("--resume");
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.end(), {"--summary", (dir_ / "syncer-summary.json").string()});
    auto p = std::make_unique<Proc>(a, (dir_ / "syncer.log").string());
    const size_t before = count_records(run_ / "syncer.jsonl", "started");
    const auto deadline = clk::now() + std::chrono::seconds(60);
    while (clk::now() < deadline && count_records(run_ / "syncer.jsonl", "started") == before) {
      if (p->wait(0) >= 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    auto recs = json_lines(run_ / "syncer.jsonl");
    for (auto it = recs.rbegin(); it != recs.rend(); ++it)
      if (it->value("kind", "") == "started") {
        endpoint_ = (*it)["endpoint"];
        metrics_port_ = (*it)["metrics_port"];
        break;
      }
    return p;
  }
  nlohmann::json summary() {
    return nlohmann::json::parse(read_file((dir_ / "syncer-summary.json").string()));
  }

  fs::path dir_;
  fs::path run_ = fs::temp_directory_path() / "unset";
  std::string endpoint_;
  int metrics_port_ = 0;
};

// encode_message for control kinds: kRaw payloads carry element_count == payload size.
std::string control(MessageHeader h, const std::string& body) {
  h.element_count = body.size();
  return encode_message(h, body);
}

uint64_t tiny_fingerprint() {
  // The fingerprint of configs/tiny.toml's model: computed the way every node does.
  ModelConfig mc;
  mc.block_size = 32;
  mc.n_layer = 2;
  mc.n_head = 2;
  mc.n_embd = 48;
  GPT g(mc, 1);
  auto p = named_parameters(*g);
  return parse_fingerprint_hex(model_fingerprint(p));
}

// How every node cuts the tiny model (configs/tiny.toml, P = 2, H = 5): the fragments' sizes for hand-made pushes.
ModelPlan tiny_plan() {
  ModelConfig mc;
  mc.block_size = 32;
  mc.n_layer = 2;
  mc.n_head = 2;
  mc.n_embd = 48;
  GPT g(mc, 1);
  return plan_model(named_parameters(*g), 2, 5);
}

// A learner made by hand over the real transport (CURVE when given key files): sends what it is told, reads what
// comes back.
struct RawLearner {
  std::unique_ptr<ClientTransport> tx;
  uint64_t fp = tiny_fingerprint();
  RawLearner(const std::string& endpoint, const std::string& secret_key = "", const std::string& server_key = "") {
    TransportOptions o;
    o.plaintext = secret_key.empty();
    o.secret_key_file = secret_key;
    o.server_public_key_file = server_key;
    tx = make_zmq_client(endpoint, o);
  }
  // Sends until the transport takes it (it refuses while not yet connected).
  void send(MessageHeader h, const std::string& body) {
    h.fingerprint = fp;
    auto f = proto::make_frame(h, body, WireLimits{});
    const auto deadline = clk::now() + std::chrono::seconds(20);
    while (!tx->send(f.header, f.payload) && clk::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  void control(MessageKind k, uint32_t id, const std::string& body) {
    MessageHeader h;
    h.kind = k;
    h.learner_id = id;
    send(h, body);
  }
  void hello(uint32_t header_id, int64_t body_id, uint64_t instance, bool want_state,
             const std::string& instance_text = "") {
    proto::Hello h;
    h.learner = body_id;
    h.instance = instance;
    h.want_state = want_state;
    std::string body = proto::encode_hello(h);
    if (!instance_text.empty()) {
      auto j = nlohmann::json::parse(body);
      j["instance"] = instance_text;
      body = j.dump();
    }
    control(MessageKind::kHello, header_id, body);
  }
  void leave(uint32_t id, const std::string& reason) { control(MessageKind::kLeave, id, proto::encode_leave(reason)); }
  // The next message of `kind` within `seconds`, as (header, payload); others are counted in `seen`.
  std::optional<std::pair<MessageHeader, std::string>> next(MessageKind kind, double seconds) {
    return testing::await_kind(*tx, kind, seconds, seen);
  }
  std::map<MessageKind, int> seen;
};

// The value of a Prometheus counter or gauge (-1 when absent).
double prom_value(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

std::string http_get(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
    (void)::write(fd, req.data(), req.size());
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// Random bytes, truncated and oversized frames, a wrong fingerprint, a push before hello, a NaN contribution and a
// duplicate id, all thrown at a live syncer while a real learner trains: the syncer rejects and counts each one,
// merges only the real learner's fragments, keeps bounded memory, and finishes normally.
TEST_F(Faults, SyncerSurvivesBadPeersAndCountsEachRejection) {
  run_ = dir_ / "run";
  // 300 steps: learner 0's own (below); a syncer told 60 refuses its later pushes as counter_out_of_range.
  auto syncer = start_syncer(300, /*plaintext=*/true);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  const long rss0 = syncer->rss_kib();

  // 1. Raw TCP garbage on the port (not even ZMTP).
  const int port = std::stoi(endpoint_.substr(endpoint_.rfind(':') + 1));
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    std::string junk(4096, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    (void)::write(fd, junk.data(), junk.size());
    ::close(fd);
  }

  // 2. Malformed ZeroMQ messages from a raw DEALER.
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(endpoint_);
  const uint64_t fp = tiny_fingerprint();
  auto send2 = [&](const std::string& h, const std::string& p) {
    raw.send(zmq::buffer(h), zmq::send_flags::sndmore);
    raw.send(zmq::buffer(p), zmq::send_flags::none);
  };
  raw.send(zmq::str_buffer("one frame only"), zmq::send_flags::none);                  // 1 frame
  send2(std::string(30, 'x'), "");                                                      // truncated header
  MessageHeader big;
  big.kind = MessageKind::kFragmentPush;
  big.encoding = Encoding::kFp32;
  big.fingerprint = fp;
  big.element_count = 1;
  std::string hb = encode_message(big, std::string(4, '\0'));
  hb = hb.substr(0, kWireHeaderBytes);
  for (int i = 0; i < 8; ++i) hb[56 + i] = static_cast<char>(0xff);                 // payload_bytes = 2^64-1
  send2(hb, "");
  // 2000 garbage frames of 64 KiB (128 MiB in all): memory must not grow with them.
  for (int i = 0; i < 2000; ++i) send2(std::string(kWireHeaderBytes, static_cast<char>(i)), std::string(65536, 'z'));
  MessageHeader wrong;
  wrong.kind = MessageKind::kHello;
  wrong.fingerprint = fp ^ 1;
  proto::Hello hello;
  hello.learner = 1;
  hello.instance = 42;
  {
    auto f = control(wrong, proto::encode_hello(hello));
    send2(f.substr(0, kWireHeaderBytes), f.substr(kWireHeaderBytes));                 // wrong fingerprint
  }
  MessageHeader push;
  push.kind = MessageKind::kFragmentPush;
  push.encoding = Encoding::kFp32;
  push.fingerprint = fp;
  push.learner_id = 1;
  push.element_count = 4;
  {
    auto f = encode_message(push, std::string(16, '\0'));
    send2(f.substr(0, kWireHeaderBytes), f.substr(kWireHeaderBytes));                 // push before hello
  }

  // 3. A real learner 0 process.
  // Slowed down so it is still training when the duplicate below claims its id: 60 plain steps of the tiny model
  // took 0.2 s, and once it had finished and left, the duplicate's hello was a real join (refused nothing).
  auto l0_args = learner_args(0, 300, true);
  l0_args.insert(l0_args.end(), {"--set", "learner.slowdown=10"});
  Proc l0(l0_args, (dir_ / "l0.log").string());
  ASSERT_FALSE(wait_record(run_ / "learner-0.jsonl", "joined", 60).is_null()) << l0.log();

  // 4. Learner 1 joins by hand, then pushes NaN; a second connection claims id 0 (duplicate).
  MessageHeader hh;
  hh.kind = MessageKind::kHello;
  hh.fingerprint = fp;
  hh.learner_id = 1;
  hello.want_state = false;
  {
    auto f = control(hh, proto::encode_hello(hello));
    send2(f.substr(0, kWireHeaderBytes), f.substr(kWireHeaderBytes));
  }
  ASSERT_FALSE(wait_record(run_ / "syncer.jsonl", "join", 20, [](const nlohmann::json& j) { return j["learner"] == 1; }).is_null());
  // Fragment sizes from the welcome are not needed: a NaN payload of the right size for fragment 0 is found by
  // trying the learner's pushes' sizes — simpler: read them from learner 0's push records.
  auto push_rec = wait_record(run_ / "learner-0.jsonl", "push", 60, [](const nlohmann::json& j) { return j["fragment"] == 0; });
  ASSERT_FALSE(push_rec.is_null());
  const size_t n0 = (push_rec["bytes"].get<size_t>() - kWireHeaderBytes) / 4;
  std::vector<float> nan(n0, 0.0f);
  nan[n0 / 2] = std::nanf("");
  push.element_count = n0;
  push.fragment_id = 0;
  push.c_steps = 5;
  push.c_tokens = 1280;
  {
    auto f = encode_message(push, nan.data(), nan.size() * 4);
    send2(f.substr(0, kWireHeaderBytes), f.substr(kWireHeaderBytes));
  }
  zmq::socket_t dup(ctx, zmq::socket_type::dealer);
  dup.set(zmq::sockopt::linger, 0);
  dup.connect(endpoint_);
  proto::Hello h0;
  h0.learner = 0;
  h0.instance = 99;
  MessageHeader hd;
  hd.kind = MessageKind::kHello;
  hd.fingerprint = fp;
  hd.learner_id = 0;
  {
    auto f = control(hd, proto::encode_hello(h0));
    dup.send(zmq::buffer(f.substr(0, kWireHeaderBytes)), zmq::send_flags::sndmore);
    dup.send(zmq::buffer(f.substr(kWireHeaderBytes)), zmq::send_flags::none);
  }
  ASSERT_FALSE(wait_record(run_ / "syncer.jsonl", "reject", 20, [](const nlohmann::json& j) { return j["reason"] == "duplicate_id"; }).is_null());
  ASSERT_FALSE(wait_record(run_ / "syncer.jsonl", "reject", 20, [](const nlohmann::json& j) { return j["reason"] == "non_finite"; }).is_null());

  // Memory stayed bounded: 128 MiB of garbage frames went through and were dropped, not kept.
  const long rss1 = syncer->rss_kib();
  EXPECT_LT(rss1 - rss0, 64 * 1024) << "syncer RSS grew from " << rss0 << " to " << rss1 << " KiB";

  // Prometheus shows the rejections by reason.
  const std::string prom = http_get(metrics_port_, "/metrics");
  EXPECT_NE(prom.find("deloco_rejects_total{reason=\"non_finite\"} 1"), std::string::npos) << prom;
  EXPECT_NE(prom.find("deloco_learners_alive"), std::string::npos);

  // Learner 1 (by hand) retires; learner 0 finishes; the syncer ends by itself.
  {
    MessageHeader lv;
    lv.kind = MessageKind::kLeave;
    lv.fingerprint = fp;
    lv.learner_id = 1;
    auto f = control(lv, proto::encode_leave("done"));
    send2(f.substr(0, kWireHeaderBytes), f.substr(kWireHeaderBytes));
  }
  ASSERT_EQ(l0.wait(120), 0) << l0.log();
  ASSERT_EQ(syncer->wait(60), 0) << syncer->log();
  auto s = summary();
  const auto& r = s["rejects"];
  for (const char* why : {"malformed_frame", "fingerprint_mismatch", "not_joined", "non_finite", "duplicate_id"})
    EXPECT_GE(r.value(why, 0), 1) << why << " in " << r.dump();
  EXPECT_GE(r.value("malformed_frame", 0), 2000);
  // A refused hello is not a refused contribution: the summary counts it apart (the duplicate id above).
  int64_t all = 0;
  for (const auto& [why, n] : r.items()) all += n.get<int64_t>();
  EXPECT_GE(s["joins_refused"].get<int64_t>(), r.value("duplicate_id", 0)) << s.dump();
  EXPECT_EQ(s["contributions_rejected"].get<int64_t>(), all - s["joins_refused"].get<int64_t>()) << s.dump();
  // ... all counted, but the log is rate-limited: the flood cannot fill the disk.
  size_t logged = 0;
  for (const auto& j : json_lines(run_ / "syncer.jsonl"))
    if (j.value("kind", "") == "reject" && j["reason"] == "malformed_frame") ++logged;
  EXPECT_LT(logged, 200u);
  EXPECT_GE(count_records(run_ / "syncer.jsonl", "reject_suppressed"), 1u);
  EXPECT_GT(s["outer_steps"].get<int>(), 0);
  // Only learner 0's contributions were merged: every merge record lists learner 0 alone.
  for (const auto& j : json_lines(run_ / "syncer.jsonl"))
    if (j.value("kind", "") == "merge") EXPECT_EQ(j["learners"], nlohmann::json::array({0})) << j.dump();
}

// CURVE: a learner whose key is not in the allow-list never gets in (counted as auth_denied); a learner using
// another learner's allowed key is refused (key_id_mismatch) and exits 1; the real learners train on.
TEST_F(Faults, CurveRefusesStrangersAndStolenIds) {
  run_ = dir_ / "run";
  make_keys();
  auto syncer = start_syncer(40, /*plaintext=*/false);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  auto stranger_args = learner_args(1, 40, false, (dir_ / "keys/stranger.key").string(), (dir_ / "stranger").string());
  stranger_args.insert(stranger_args.end(), {"--set", "net.join_timeout=3"});
  Proc stranger(stranger_args, (dir_ / "stranger.log").string());
  auto thief_args = learner_args(1, 40, false, (dir_ / "keys/learner-0.key").string(), (dir_ / "thief").string());
  Proc thief(thief_args, (dir_ / "thief.log").string());
  EXPECT_EQ(thief.wait(60), 1) << thief.log();
  EXPECT_NE(thief.log().find("key_id_mismatch"), std::string::npos) << thief.log();
  // The stranger's handshakes are refused until we stop it.
  const auto deadline = clk::now() + std::chrono::seconds(30);
  std::string prom;
  while (clk::now() < deadline) {
    prom = http_get(metrics_port_, "/metrics");
    if (prom.find("deloco_auth_denied_total 0\n") == std::string::npos && prom.find("deloco_auth_denied_total") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(prom.find("deloco_auth_denied_total 0\n"), std::string::npos) << prom;
  stranger.kill9();
  EXPECT_EQ(count_records(dir_ / "stranger/learner-1.jsonl", "joined"), 0u);
  Proc l0(learner_args(0, 40, false), (dir_ / "l0.log").string());
  Proc l1(learner_args(1, 40, false), (dir_ / "l1.log").string());
  EXPECT_EQ(l0.wait(120), 0) << l0.log();
  EXPECT_EQ(l1.wait(120), 0) << l1.log();
  ASSERT_EQ(syncer->wait(60), 0) << syncer->log();
  auto s = summary();
  EXPECT_GT(s["contributions_merged"].get<int>(), 0);
  EXPECT_GE(s["rejects"].value("key_id_mismatch", 0), 1);
}

// Issue 29, defect 7: a learner whose key the syncer refuses says so (auth_refused, with the reason) while it
// retries, and does not count as finished: its summary says finished = false and it exits non-zero naming the
// refusal. The syncer records the refusals too (auth_denied), not only its counter.
TEST_F(Faults, RefusedKeyIsReportedByBothSidesAndIsNotAFinish) {
  run_ = dir_ / "run";
  make_keys();
  auto syncer = start_syncer(20, /*plaintext=*/false);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  auto a = learner_args(1, 20, false, (dir_ / "keys/stranger.key").string(), (dir_ / "stranger").string());
  a.insert(a.end(), {"--set", "net.join_timeout=2", "--summary", (dir_ / "stranger-summary.json").string()});
  Proc stranger(a, (dir_ / "stranger.log").string());
  EXPECT_EQ(stranger.wait(120), 1) << stranger.log();
  EXPECT_NE(stranger.log().find("refused this learner's CURVE key"), std::string::npos) << stranger.log();
  const auto refused = wait_record(dir_ / "stranger/learner-1.jsonl", "auth_refused", 1);
  ASSERT_FALSE(refused.is_null());
  EXPECT_NE(refused["detail"].get<std::string>().find("net.allow"), std::string::npos) << refused.dump();
  const auto done = wait_record(dir_ / "stranger/learner-1.jsonl", "learner_done", 1);
  ASSERT_FALSE(done.is_null());
  EXPECT_FALSE(done["finished"].get<bool>()) << done.dump();
  EXPECT_EQ(done["step"].get<int>(), 20) << "it trained on alone meanwhile";
  EXPECT_FALSE(wait_record(run_ / "syncer.jsonl", "auth_denied", 10).is_null());
  syncer->signal(SIGTERM);
  EXPECT_EQ(syncer->wait(30), 0) << syncer->log();
}

// Issue 29, defect 0: with sync.wait_for_answer, a learner whose push was in flight when the syncer died waited
// forever for its answer once it had joined the new syncer (which never got that push). Here the push is held by a
// syncer waiting for a quorum of 2 that never comes, the syncer is SIGKILLed and a fresh one takes its endpoint: the
// learner (which does not notice the silence: net.dead_after 30 s) is told not_joined, joins again, settles that
// push as refused, and trains on to its next push. A push refused for not being joined names its fragment.
TEST_F(Faults, SyncerRestartSettlesThePushInFlight) {
  run_ = dir_ / "run";
  const std::vector<std::string> sync{"--set", "sync.quorum=2", "--set", "sync.wait_for_answer=true",
                                      "--set", "net.dead_after=30", "--set", "syncer.checkpoint_every=0"};
  auto syncer = start_syncer(400, true, false, sync);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  auto la = learner_args(0, 400, true);
  la.insert(la.end(), sync.begin(), sync.end());
  Proc l0(la, (dir_ / "l0.log").string());
  const auto first = wait_record(run_ / "learner-0.jsonl", "push", 60);
  ASSERT_FALSE(first.is_null()) << l0.log();
  // Blocked: the syncer holds the push below its quorum, so no answer comes.
  ASSERT_FALSE(wait_record(run_ / "syncer.jsonl", "status", 10, [](const nlohmann::json& j) {
                 return j["alive"] == 1;
               }).is_null());
  const int64_t s0 = first["step"].get<int64_t>();
  syncer->kill9();
  syncer->wait(10);
  auto fresh = start_syncer(400, true, false, sync, /*same_endpoint=*/true);
  const auto settled = wait_record(run_ / "learner-0.jsonl", "pushes_settled", 60);
  ASSERT_FALSE(settled.is_null()) << l0.log();
  const auto later = wait_record(run_ / "learner-0.jsonl", "push", 60,
                                 [&](const nlohmann::json& j) { return j["step"].get<int64_t>() > s0; });
  EXPECT_FALSE(later.is_null()) << "the learner stayed blocked on the push the dead syncer took with it\n" << l0.log();
  l0.kill9();
  fresh->kill9();
}

// Issue 29, defect 0: a joined learner that stopped advancing (here a hand-made one beating the same step) makes
// the syncer report the run blocked (learners_blocked, status.blocked, counted as stalled), not "up".
TEST_F(Faults, SyncerReportsLearnersThatAllStoppedAdvancing) {
  run_ = dir_ / "run";
  auto syncer = start_syncer(400, true);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  RawLearner l(endpoint_);
  l.hello(0, 0, 7, false);
  ASSERT_TRUE(l.next(MessageKind::kWelcome, 20)) << syncer->log();
  // A push from a connection that never joined is refused naming the pushed fragment.
  RawLearner stranger(endpoint_);
  MessageHeader h;
  h.kind = MessageKind::kFragmentPush;
  h.learner_id = 1;
  h.fragment_id = 1;
  h.encoding = Encoding::kFp32;
  h.element_count = 4;
  stranger.send(h, std::string(16, '\0'));
  const auto rej = stranger.next(MessageKind::kReject, 20);
  ASSERT_TRUE(rej);
  EXPECT_EQ(proto::reject_reason_of(rej->first), proto::RejectReason::kNotJoined);
  EXPECT_EQ(rej->first.fragment_id, 1u);
  // Heartbeats at the same step for longer than the patience (4 · net.dead_after = 6 s).
  proto::Beat b;
  b.step = 3;
  const auto deadline = clk::now() + std::chrono::seconds(20);
  nlohmann::json blocked;
  while (clk::now() < deadline && blocked.is_null()) {
    l.control(MessageKind::kHeartbeat, 0, proto::encode_beat(b));
    blocked = wait_record(run_ / "syncer.jsonl", "learners_blocked", 0.2);
  }
  ASSERT_FALSE(blocked.is_null()) << syncer->log();
  EXPECT_EQ(blocked["learners"], nlohmann::json::array({0}));
  l.control(MessageKind::kHeartbeat, 0, proto::encode_beat(b));
  EXPECT_FALSE(wait_record(run_ / "syncer.jsonl", "status", 5, [](const nlohmann::json& j) {
                 return j.value("blocked", false) && j.value("stalled", false);
               }).is_null());
  // It advances again: no longer blocked.
  b.step = 4;
  nlohmann::json advancing;
  const auto deadline2 = clk::now() + std::chrono::seconds(10);
  while (clk::now() < deadline2 && advancing.is_null()) {
    l.control(MessageKind::kHeartbeat, 0, proto::encode_beat(b));
    advancing = wait_record(run_ / "syncer.jsonl", "learners_advancing", 0.2);
  }
  EXPECT_FALSE(advancing.is_null());
  syncer->signal(SIGTERM);
  EXPECT_EQ(syncer->wait(30), 0) << syncer->log();
}

// A learner whose model differs (another n_embd) is refused with the fingerprints named and exits 1.
TEST_F(Faults, LearnerWithAnotherModelIsRefused) {
  run_ = dir_ / "run";
  auto syncer = start_syncer(30, true);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  auto a = learner_args(0, 30, true);
  a.insert(a.end(), {"--set", "model.n_embd=64"});
  Proc bad(a, (dir_ / "bad.log").string());
  EXPECT_EQ(bad.wait(60), 1) << bad.log();
  EXPECT_NE(bad.log().find("fingerprint_mismatch"), std::string::npos) << bad.log();
  syncer->signal(SIGTERM);
  EXPECT_EQ(syncer->wait(30), 0) << syncer->log();
  EXPECT_GE(summary()["rejects"].value("fingerprint_mismatch", 0), 1);
}

// SIGKILL a learner while it downloads the global state (tiny chunks make the transfer long), restart it, then
// SIGKILL the syncer after some merges and resume it: the learners notice, re-join by themselves and finish; the
// resumed syncer starts from every merge it had announced (checkpoint_every = 1 writes before broadcasting).
TEST_F(Faults, LearnerKilledMidTransferAndSyncerKilledAndResumed) {
  run_ = dir_ / "run";
  make_keys();
  // Tiny chunks make the download long; slowed-down steps (~50 ms) keep the learners busy through the syncer kill.
  const std::vector<std::string> slow_download{"--set", "net.chunk_bytes=4096", "--set", "learner.slowdown=15"};
  auto syncer = start_syncer(200, false, false, slow_download);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  auto la = learner_args(0, 200, false);
  la.insert(la.end(), slow_download.begin(), slow_download.end());
  auto first = std::make_unique<Proc>(la, (dir_ / "l0.log").string());
  ASSERT_FALSE(wait_record(run_ / "syncer.jsonl", "join", 60, [](const nlohmann::json& j) { return j["learner"] == 0; }).is_null());
  first->kill9();  // the syncer is sending ~100 chunks to it right now
  auto lb = learner_args(1, 200, false);
  lb.insert(lb.end(), slow_download.begin(), slow_download.end());
  Proc l1(lb, (dir_ / "l1.log").string());
  Proc l0(la, (dir_ / "l0b.log").string());
  ASSERT_FALSE(wait_record(run_ / "learner-0.jsonl", "joined", 60).is_null()) << l0.log();
  ASSERT_FALSE(wait_record(run_ / "syncer.jsonl", "merge", 120, [](const nlohmann::json& j) { return j["merges"].get<int>() >= 6; }).is_null());
  syncer->kill9();
  const size_t merges_seen = count_records(run_ / "syncer.jsonl", "merge");
  auto resumed = start_syncer(200, false, /*resume=*/true, slow_download);
  auto started = wait_record(run_ / "syncer.jsonl", "started", 10, [](const nlohmann::json& j) { return j["resumed"] == true; });
  ASSERT_FALSE(started.is_null()) << resumed->log();
  EXPECT_GE(started["merges"].get<size_t>(), merges_seen) << "an announced merge was lost";
  EXPECT_EQ(l0.wait(180), 0) << l0.log();
  EXPECT_EQ(l1.wait(180), 0) << l1.log();
  ASSERT_EQ(resumed->wait(60), 0) << resumed->log();
  auto s = summary();
  EXPECT_TRUE(s["resumed"].get<bool>());
  EXPECT_GT(s["outer_steps"].get<size_t>(), merges_seen);
  // The learners re-joined the resumed syncer by themselves (it answered their pushes with not_joined, or they
  // noticed the silence first).
  size_t rejoins = 0;
  for (const auto& j : json_lines(run_ / "syncer.jsonl"))
    if (j.value("kind", "") == "join" && j["t"].get<double>() > started["t"].get<double>()) ++rejoins;
  EXPECT_GE(rejoins, 1u);
  // The restarted learner 0 continued at the step the syncer remembered, not from 0.
  EXPECT_GE(s["joins"][0].get<int>(), 2);
}

// Issue 11 items 2, 13b, 13c, and a connection's fixed id: a hand-made learner sends messages that used to kill the
// syncer or were misreported. A leave whose reason's 40-byte quote split a UTF-8 character made the reject record
// throw and the syncer exit without its final checkpoint. Now each is refused and counted, the syncer keeps
// merging learner 0's contributions, and it ends with its final checkpoint and summary.
TEST_F(Faults, PeerTextAndOddMessagesNeverEndTheSyncer) {
  run_ = dir_ / "run";
  auto syncer = start_syncer(60, /*plaintext=*/true);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  Proc l0(learner_args(0, 60, true), (dir_ / "l0.log").string());
  ASSERT_FALSE(wait_record(run_ / "learner-0.jsonl", "joined", 60).is_null()) << l0.log();

  RawLearner raw(endpoint_);
  // 13b: header and body disagree on the id: the reject says so (it said "learner id 0 is not in [0, 2)").
  raw.hello(/*header_id=*/1, /*body_id=*/0, 42, false);
  auto r = raw.next(MessageKind::kReject, 20);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(proto::reject_reason_of(r->first), proto::RejectReason::kLearnerIdMismatch);
  EXPECT_NE(r->second.find("header says learner 1 but its body says learner 0"), std::string::npos) << r->second;

  raw.hello(1, 1, 42, false);
  ASSERT_TRUE(raw.next(MessageKind::kWelcome, 20).has_value());
  const double attack = unix_now();
  // 2: leave reasons whose quote splits a 2-, 3- and 4-byte character at byte 40.
  for (const std::string reason : {std::string(39, 'x') + "\xc3\xa9", std::string(38, 'x') + "\xe2\x82\xac",
                                   std::string(37, 'x') + "\xf0\x9f\x98\x80"}) {
    raw.leave(1, reason);
    auto lr = raw.next(MessageKind::kReject, 20);
    ASSERT_TRUE(lr.has_value()) << "no answer to a leave: the syncer died? " << syncer->log();
    EXPECT_EQ(proto::reject_reason_of(lr->first), proto::RejectReason::kMalformedFrame) << lr->second;
  }
  // A hello whose instance is 600 bytes of two-byte characters (quoted in the error, cut to 400 bytes).
  std::string wide;
  for (int i = 0; i < 300; ++i) wide += "\xc3\xa9";
  raw.hello(1, 1, 42, false, wide);
  ASSERT_TRUE(raw.next(MessageKind::kReject, 20).has_value());
  // 13c: an int8 push whose block scale is NaN is non_finite, not malformed_frame.
  const ModelPlan plan = tiny_plan();
  const int64_t n0 = plan.fragment_layouts[0].elements;
  std::vector<float> zeros(static_cast<size_t>(n0), 0.f);
  std::string payload = encode_floats(zeros.data(), zeros.size(), Encoding::kInt8);
  const float nan = std::nanf("");
  std::memcpy(payload.data(), &nan, 4);  // block 0's scale
  MessageHeader push;
  push.kind = MessageKind::kFragmentPush;
  push.encoding = Encoding::kInt8;
  push.learner_id = 1;
  push.fragment_id = 0;
  push.element_count = static_cast<uint64_t>(n0);
  push.c_steps = 5;
  push.c_tokens = 1280;
  raw.send(push, payload);
  auto pr = raw.next(MessageKind::kReject, 20);
  ASSERT_TRUE(pr.has_value());
  EXPECT_EQ(proto::reject_reason_of(pr->first), proto::RejectReason::kNonFinite) << pr->second;
  EXPECT_NE(pr->second.find("non-finite scale"), std::string::npos) << pr->second;
  // A connection that joined as learner 1 may not become learner 0.
  raw.hello(0, 0, 42, false);
  auto ir = raw.next(MessageKind::kReject, 20);
  ASSERT_TRUE(ir.has_value());
  EXPECT_EQ(proto::reject_reason_of(ir->first), proto::RejectReason::kLearnerIdMismatch);
  EXPECT_NE(ir->second.find("never changes"), std::string::npos) << ir->second;

  // The syncer lives on and keeps merging learner 0's fragments.
  EXPECT_LT(syncer->wait(0), 0) << syncer->log();
  ASSERT_FALSE(wait_record(run_ / "syncer.jsonl", "merge", 60, [&](const nlohmann::json& j) {
                 return j["t"].get<double>() > attack;
               }).is_null()) << syncer->log();
  raw.leave(1, "done");
  ASSERT_EQ(l0.wait(120), 0) << l0.log();
  ASSERT_EQ(syncer->wait(60), 0) << syncer->log();
  auto s = summary();
  EXPECT_EQ(s["rejects"].value("malformed_frame", 0), 4) << s.dump();
  EXPECT_GE(s["rejects"].value("learner_id_mismatch", 0), 2) << s.dump();
  EXPECT_EQ(s["rejects"].value("non_finite", 0), 1) << s.dump();
  EXPECT_EQ(s["rejects"].value("handler_error", 0), 0) << s.dump();
  EXPECT_EQ(s["record_errors"].get<int>(), 0);
  // It ended the normal way: its final state checkpointed (every merge), a final evaluation, its summary record.
  auto recs = json_lines(run_ / "syncer.jsonl");
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.back()["kind"], "done");
  nlohmann::json last_checkpoint;
  for (const auto& j : recs)
    if (j["kind"] == "checkpoint") last_checkpoint = j;
  ASSERT_FALSE(last_checkpoint.is_null());
  EXPECT_EQ(last_checkpoint["merges"], s["outer_steps"]);
  EXPECT_EQ(count_records(run_ / "syncer.jsonl", "final_eval"), 1u);
  EXPECT_TRUE(fs::exists(run_ / "latest"));
  // Every record (quotes of the peer included) is valid JSON: read_jsonl skips none.
  std::ifstream in(run_ / "syncer.jsonl");
  std::string line;
  size_t lines = 0;
  while (std::getline(in, line)) ++lines;
  EXPECT_EQ(lines, recs.size());
}

// Issue 11 item 4: 6,000 hellos asking for the model from one authenticated learner (CURVE) used to queue a
// full copy each. Now: one download while it is outstanding, every download cut from one snapshot per set of
// versions, and a learner joining after the flood (a new process, like a restart after a crash) still gets the
// state at once.
TEST_F(Faults, HelloFloodGetsOneDownloadFromOneSnapshot) {
  run_ = dir_ / "run";
  make_keys();
  auto syncer = start_syncer(60, /*plaintext=*/false);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  const std::string server_pub = (dir_ / "keys/syncer.pub").string();
  auto wait_alive = [&](double want) {
    const auto deadline = clk::now() + std::chrono::seconds(30);
    while (clk::now() < deadline && prom_value(http_get(metrics_port_, "/metrics"), "deloco_learners_alive") != want)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return prom_value(http_get(metrics_port_, "/metrics"), "deloco_learners_alive") == want;
  };
  constexpr int kFlood = 6000;  // the figure: 6,000 hellos added 1.37 GB before
  int64_t elements = 0;          // the model's, from the flood's welcome
  {
    RawLearner flood(endpoint_, (dir_ / "keys/learner-1.key").string(), server_pub);
    const long rss0 = syncer->rss_kib();
    for (int i = 0; i < kFlood; ++i) flood.hello(1, 1, 7, /*want_state=*/true);
    const auto deadline = clk::now() + std::chrono::seconds(60);
    while (clk::now() < deadline &&
           prom_value(http_get(metrics_port_, "/metrics"), "deloco_state_requests_dropped_total") < kFlood - 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string prom = http_get(metrics_port_, "/metrics");
    // A figure for docs/reliability.md, not a test threshold.
    std::cout << "hello flood: " << kFlood << " hellos, syncer RSS " << rss0 << " -> " << syncer->rss_kib() << " KiB\n";
    EXPECT_EQ(prom_value(prom, "deloco_state_requests_dropped_total"), kFlood - 1) << prom;
    EXPECT_EQ(prom_value(prom, "deloco_state_downloads_total"), 1) << prom;
    EXPECT_EQ(prom_value(prom, "deloco_state_snapshots_total"), 1) << prom;
    auto w = flood.next(MessageKind::kWelcome, 20);
    ASSERT_TRUE(w.has_value());
    const proto::Welcome wel = proto::parse_welcome(w->second.data(), w->second.size());
    EXPECT_GT(wel.chunks, 0);
    elements = wel.elements;
    EXPECT_FALSE(flood.next(MessageKind::kWelcome, 1.0).has_value()) << "a second download for the flood";
    EXPECT_EQ(flood.seen[MessageKind::kStateChunk], wel.chunks);
  }
  // Another connection with the same key and a new instance, once the flood's connection went quiet: a download
  // again (the first is moot), from the same snapshot (nobody pushed, so the versions did not change).
  ASSERT_TRUE(wait_alive(0));
  {
    RawLearner again(endpoint_, (dir_ / "keys/learner-1.key").string(), server_pub);
    again.hello(1, 1, 8, true);
    ASSERT_TRUE(again.next(MessageKind::kWelcome, 20).has_value());
    std::string prom;
    const auto deadline = clk::now() + std::chrono::seconds(20);  // the counters are published after the send
    while (clk::now() < deadline && prom_value(prom = http_get(metrics_port_, "/metrics"), "deloco_state_downloads_total") < 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(prom_value(prom, "deloco_state_downloads_total"), 2) << prom;
    EXPECT_EQ(prom_value(prom, "deloco_state_snapshots_total"), 1) << prom;
  }
  ASSERT_TRUE(wait_alive(0));
  // The honest run: both learners join, train and finish. Until the first merge the syncer's state is the seeded
  // initialisation the learners start from: a learner joining then offers its hash and downloads nothing
  // (state_held); one joining after a merge downloads. The first to join cannot come after a merge.
  Proc l0(learner_args(0, 60, false), (dir_ / "l0.log").string());
  Proc l1(learner_args(1, 60, false), (dir_ / "l1.log").string());
  EXPECT_EQ(l0.wait(120), 0) << l0.log();
  EXPECT_EQ(l1.wait(120), 0) << l1.log();
  ASSERT_EQ(syncer->wait(60), 0) << syncer->log();
  for (const char* f : {"learner-0.jsonl", "learner-1.jsonl"}) {
    auto j = wait_record(run_ / f, "joined", 1);
    ASSERT_FALSE(j.is_null()) << f << " never joined";
    if (j.value("state_held", false))
      EXPECT_EQ(j.value("download_bytes", -1), 0) << j.dump();
    else
      EXPECT_EQ(j.value("download_bytes", 0), 4 * elements) << f << ": neither held nor downloaded: " << j.dump();
    EXPECT_EQ(count_records(run_ / f, "alone"), 0u) << f;
  }
  auto s = summary();
  EXPECT_GE(s["state_requests_dropped"].get<int>(), kFlood - 1);  // + any hello a real learner repeated meanwhile
  // The flood's and the second connection's downloads, and one join per real learner (held or downloaded).
  EXPECT_EQ(s["state_downloads"].get<int>() + s["states_held"].get<int>(), 4) << s.dump();
  EXPECT_GE(s["states_held"].get<int>(), 1) << s.dump();
  EXPECT_LE(s["state_snapshots"].get<int>(), 3) << s.dump();
  EXPECT_GT(s["outer_steps"].get<int>(), 0);
}

// Issue 11 item 6: an allow-listed key whose name is not learner-N joined as learner 0 and as learner 1 and ended
// the run with two `leave done`. Every key is now bound to the one learner its name says; other names join as
// nobody (unbound_key, naming the key), so their leaves retire nobody.
TEST_F(Faults, CurveBindsEveryKeyToOneLearner) {
  run_ = dir_ / "run";
  make_keys();
  write_keypair((dir_ / "keys/ops").string(), generate_keypair());
  fs::copy_file(dir_ / "keys/ops.pub", dir_ / "keys/allow/ops.pub");
  auto syncer = start_syncer(40, /*plaintext=*/false);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  const std::string server_pub = (dir_ / "keys/syncer.pub").string();
  // A learner process with the unbound key stops at once, saying why.
  Proc ops(learner_args(0, 40, false, (dir_ / "keys/ops.key").string(), (dir_ / "ops").string()),
           (dir_ / "ops.log").string());
  EXPECT_EQ(ops.wait(60), 1) << ops.log();
  EXPECT_NE(ops.log().find("unbound_key"), std::string::npos) << ops.log();
  EXPECT_NE(ops.log().find("'ops'"), std::string::npos) << ops.log();
  {
    // By hand: hello as 0 and as 1, then leave done for both: nobody joined, nobody retires (the leaves are
    // answered, as every leave is, and move nobody).
    RawLearner raw(endpoint_, (dir_ / "keys/ops.key").string(), server_pub);
    for (uint32_t id : {0u, 1u}) {
      raw.hello(id, id, 5, false);
      auto r = raw.next(MessageKind::kReject, 20);
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(proto::reject_reason_of(r->first), proto::RejectReason::kUnboundKey) << r->second;
      EXPECT_NE(r->second.find("'ops'"), std::string::npos) << r->second;
    }
    const int rejects = raw.seen[MessageKind::kReject];
    for (uint32_t id : {0u, 1u}) {
      raw.leave(id, "done");
      ASSERT_TRUE(raw.next(MessageKind::kLeave, 20).has_value());
    }
    EXPECT_EQ(raw.seen[MessageKind::kReject], rejects);
    // learner-1's key may join as 1 only.
    RawLearner one(endpoint_, (dir_ / "keys/learner-1.key").string(), server_pub);
    one.hello(0, 0, 6, false);
    auto r = one.next(MessageKind::kReject, 20);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(proto::reject_reason_of(r->first), proto::RejectReason::kKeyIdMismatch) << r->second;
    EXPECT_NE(r->second.find("may only join as learner 1"), std::string::npos) << r->second;
  }
  EXPECT_EQ(count_records(run_ / "syncer.jsonl", "retired"), 0u);
  EXPECT_EQ(count_records(run_ / "syncer.jsonl", "join"), 0u);
  // The real learners train to the end: the run was not ended by anyone else's goodbye.
  Proc l0(learner_args(0, 40, false), (dir_ / "l0.log").string());
  Proc l1(learner_args(1, 40, false), (dir_ / "l1.log").string());
  EXPECT_EQ(l0.wait(120), 0) << l0.log();
  EXPECT_EQ(l1.wait(120), 0) << l1.log();
  ASSERT_EQ(syncer->wait(60), 0) << syncer->log();
  auto s = summary();
  EXPECT_GE(s["rejects"].value("unbound_key", 0), 3) << s.dump();
  EXPECT_GE(s["rejects"].value("key_id_mismatch", 0), 1) << s.dump();
  size_t retired = 0;
  for (const auto& j : json_lines(run_ / "syncer.jsonl"))
    if (j.value("kind", "") == "retired") {
      ++retired;
      EXPECT_EQ(j["how"], "leave") << j.dump();
    }
  EXPECT_EQ(retired, 2u);
  for (const char* f : {"learner-0.jsonl", "learner-1.jsonl"}) {
    auto done = wait_record(run_ / f, "learner_done", 1);
    ASSERT_FALSE(done.is_null()) << f;
    EXPECT_EQ(done["step"].get<int>(), 40) << f;
  }
}

// ---- Issue 11: what a learner's contribution can do to the merge ----------------------------------------------

// A hand-made learner on a raw DEALER socket: hello, pushes with any counters and values, leave; reads the syncer's
// reject frames.
class RawPusher {
 public:
  RawPusher(zmq::context_t& ctx, const std::string& endpoint, int id, uint64_t fingerprint)
      : sock_(ctx, zmq::socket_type::dealer), id_(id), fp_(fingerprint) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.set(zmq::sockopt::rcvtimeo, 100);
    sock_.connect(endpoint);
  }
  void hello() {
    proto::Hello h;
    h.learner = id_;
    h.instance = 4242;
    h.want_state = false;
    send(MessageKind::kHello, proto::encode_hello(h));
  }
  void leave() { send(MessageKind::kLeave, proto::encode_leave("done")); }
  void push(int fragment, const std::vector<float>& values, uint64_t base, uint64_t c_steps, uint64_t c_tokens) {
    MessageHeader h;
    h.kind = MessageKind::kFragmentPush;
    h.encoding = Encoding::kFp32;
    h.fingerprint = fp_;
    h.learner_id = static_cast<uint32_t>(id_);
    h.fragment_id = static_cast<uint32_t>(fragment);
    h.round = base;
    h.c_steps = c_steps;
    h.c_tokens = c_tokens;
    h.element_count = values.size();
    auto f = encode_message(h, values.data(), values.size() * 4);
    sock_.send(zmq::buffer(f.substr(0, kWireHeaderBytes)), zmq::send_flags::sndmore);
    sock_.send(zmq::buffer(f.substr(kWireHeaderBytes)), zmq::send_flags::none);
  }
  // The text of the next reject frame ("reason: detail"), skipping everything else; "" after `seconds`.
  std::string next_reject(double seconds) {
    const auto deadline = clk::now() + std::chrono::duration<double>(seconds);
    while (clk::now() < deadline) {
      zmq::message_t h;
      if (!sock_.recv(h)) continue;
      std::string payload;
      while (h.more()) {
        zmq::message_t part;
        if (!sock_.recv(part)) break;
        payload = part.to_string();
        if (!part.more()) break;
      }
      if (h.size() != kWireHeaderBytes) continue;
      try {
        if (decode_header(h.data(), h.size(), WireLimits{}).kind == MessageKind::kReject) return payload;
      } catch (const WireError&) {
      }
    }
    return "";
  }

 private:
  void send(MessageKind kind, const std::string& body) {
    MessageHeader h;
    h.kind = kind;
    h.fingerprint = fp_;
    h.learner_id = static_cast<uint32_t>(id_);
    auto f = control(h, body);
    sock_.send(zmq::buffer(f.substr(0, kWireHeaderBytes)), zmq::send_flags::sndmore);
    sock_.send(zmq::buffer(f.substr(kWireHeaderBytes)), zmq::send_flags::none);
  }
  zmq::socket_t sock_;
  int id_;
  uint64_t fp_;
};

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Says hello as `l` once a second until the syncer logs its join at or after unix time `after` (a DEALER that
// just lost its peer may still be reconnecting to a restarted syncer).
bool join_by_hand(RawPusher& l, int id, const fs::path& syncer_log, double after, double seconds = 30) {
  const auto deadline = clk::now() + std::chrono::duration<double>(seconds);
  while (clk::now() < deadline) {
    l.hello();
    if (!wait_record(syncer_log, "join", 1.0, [&](const nlohmann::json& j) {
           return j["learner"] == id && j["t"].get<double>() >= after;
         }).is_null())
      return true;
  }
  return false;
}

// Issue 11 item 7: a learner that assigns itself the weight of the whole merge (c_tokens = 2^62, c_steps = 1) or
// claims a million steps is refused (counter_out_of_range) and told so; its honest pushes still merge, and the
// real learner trains on.
TEST_F(Faults, SelfAssignedWeightIsRefused) {
  run_ = dir_ / "run";
  auto syncer = start_syncer(60, /*plaintext=*/true);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  Proc l0(learner_args(0, 60, true), (dir_ / "l0.log").string());
  ASSERT_FALSE(wait_record(run_ / "learner-0.jsonl", "joined", 60).is_null()) << l0.log();
  zmq::context_t ctx;
  RawPusher l1(ctx, endpoint_, 1, tiny_fingerprint());
  ASSERT_TRUE(join_by_hand(l1, 1, run_ / "syncer.jsonl", 0)) << syncer->log();
  auto push_rec = wait_record(run_ / "learner-0.jsonl", "push", 60, [](const nlohmann::json& j) { return j["fragment"] == 0; });
  ASSERT_FALSE(push_rec.is_null());
  const std::vector<float> zeros((push_rec["bytes"].get<size_t>() - kWireHeaderBytes) / 4, 0.0f);
  const uint64_t tokens_per_step = 8 * 32;  // tiny.toml: batch 8 × block 32
  l1.push(0, zeros, 0, 1, uint64_t{1} << 62);
  std::string why = l1.next_reject(20);
  EXPECT_TRUE(starts_with(why, "counter_out_of_range")) << why;
  l1.push(0, zeros, 0, 1000000, 1000000 * tokens_per_step);  // tokens consistent, steps impossible
  why = l1.next_reject(20);
  EXPECT_TRUE(starts_with(why, "counter_out_of_range")) << why;
  l1.push(0, zeros, 0, 5, 5 * tokens_per_step);  // what an honest learner at step ≤ 5 + H may claim: merged
  ASSERT_FALSE(wait_record(run_ / "syncer.jsonl", "merge", 20, [](const nlohmann::json& j) {
                 return j["learners"] == nlohmann::json::array({1});
               }).is_null());
  l1.leave();
  ASSERT_EQ(l0.wait(120), 0) << l0.log();
  ASSERT_EQ(syncer->wait(60), 0) << syncer->log();
  auto s = summary();
  EXPECT_EQ(s["rejects"].value("counter_out_of_range", 0), 2) << s["rejects"].dump();
  EXPECT_GT(s["outer_steps"].get<int>(), 1);
}

// Every tensor of the checkpoint a run folder's `latest` names is finite.
bool checkpoint_finite(const fs::path& run, std::string* bad) {
  Checkpoint ck = read_checkpoint(run.string(), /*with_optimizer=*/true);
  for (const auto* file : {&ck.model, &ck.optimizer})
    for (const auto& [name, t] : file->tensors)
      if (!torch::isfinite(t).all().item<bool>()) {
        *bad = ck.dir + ": " + name;
        return false;
      }
  return true;
}

// Issue 11 item 3: a learner pushes finite but enormous values (all 3e38). With the default bounds it is refused
// (norm_ratio). With the bounds switched off it reaches the merge, whose Nesterov step overflows: the round is
// rolled back (merge_non_finite, told to the pusher), nothing non-finite is checkpointed or broadcast, the real
// learner keeps merging, and --resume works. A checkpoint holding NaN (from an older build) is refused on resume,
// naming the checkpoint and the tensor.
TEST_F(Faults, PoisonedPushNeverReachesACheckpoint) {
  run_ = dir_ / "run";
  // Slowed-down steps (about 0.1 s) keep the real learner training through three syncer lives (about 70 steps).
  const std::vector<std::string> slow{"--set", "learner.slowdown=12", "--set", "merge.preset=diloco"};
  const std::vector<std::string> bounds_off{"--set", "learner.slowdown=12", "--set", "merge.preset=diloco",
                                            "--set", "sync.max_delta_ratio=0", "--set", "sync.max_delta_outlier=0"};
  auto syncer = start_syncer(200, true, false, slow);
  ASSERT_FALSE(endpoint_.empty()) << syncer->log();
  auto la = learner_args(0, 200, true);
  la.insert(la.end(), slow.begin(), slow.end());
  Proc l0(la, (dir_ / "l0.log").string());
  ASSERT_FALSE(wait_record(run_ / "learner-0.jsonl", "joined", 60).is_null()) << l0.log();
  zmq::context_t ctx;
  RawPusher l1(ctx, endpoint_, 1, tiny_fingerprint());
  ASSERT_TRUE(join_by_hand(l1, 1, run_ / "syncer.jsonl", 0)) << syncer->log();
  auto push_rec = wait_record(run_ / "learner-0.jsonl", "push", 60, [](const nlohmann::json& j) { return j["fragment"] == 0; });
  ASSERT_FALSE(push_rec.is_null());
  const std::vector<float> poison((push_rec["bytes"].get<size_t>() - kWireHeaderBytes) / 4, 3e38f);

  // 1. Default bounds: refused on arrival.
  l1.push(0, poison, 0, 5, 5 * 256);
  std::string why = l1.next_reject(20);
  EXPECT_TRUE(starts_with(why, "norm_ratio")) << why;
  ASSERT_FALSE(wait_record(run_ / "syncer.jsonl", "checkpoint", 60, [](const nlohmann::json& j) { return j["merges"].get<int>() >= 3; }).is_null());
  syncer->kill9();

  // 2. Resumed with the bounds off: the poison reaches the merge, which is rolled back.
  syncer = start_syncer(200, true, /*resume=*/true, bounds_off);
  auto started = wait_record(run_ / "syncer.jsonl", "started", 10, [](const nlohmann::json& j) { return j["resumed"] == true; });
  ASSERT_FALSE(started.is_null()) << syncer->log();
  const double t_resumed = started["t"].get<double>();
  ASSERT_TRUE(join_by_hand(l1, 1, run_ / "syncer.jsonl", t_resumed)) << syncer->log();
  l1.push(0, poison, 0, 5, 5 * 256);
  why = l1.next_reject(20);
  EXPECT_TRUE(starts_with(why, "merge_non_finite")) << why;
  auto rolled = wait_record(run_ / "syncer.jsonl", "merge_rolled_back", 20);
  ASSERT_FALSE(rolled.is_null()) << syncer->log();
  EXPECT_EQ(rolled["learners"], nlohmann::json::array({1}));
  // The real learner keeps merging on the untouched model, and every checkpoint stays finite.
  const int version_then = rolled["version"].get<int>();
  ASSERT_FALSE(wait_record(run_ / "syncer.jsonl", "merge", 60, [&](const nlohmann::json& j) {
                 return j["fragment"] == 0 && j["version"].get<int>() > version_then;
               }).is_null()) << l0.log();
  syncer->kill9();
  std::string bad;
  EXPECT_TRUE(checkpoint_finite(run_, &bad)) << bad;

  // 3. Resumed again (default bounds): one honest push no longer crashes it; the run finishes.
  syncer = start_syncer(200, true, /*resume=*/true, slow);
  started = wait_record(run_ / "syncer.jsonl", "started", 10, [&](const nlohmann::json& j) {
    return j["resumed"] == true && j["t"].get<double>() > t_resumed;
  });
  ASSERT_FALSE(started.is_null()) << syncer->log();
  ASSERT_TRUE(join_by_hand(l1, 1, run_ / "syncer.jsonl", started["t"].get<double>())) << syncer->log();
  l1.leave();
  EXPECT_EQ(l0.wait(180), 0) << l0.log();
  ASSERT_EQ(syncer->wait(60), 0) << syncer->log();
  EXPECT_TRUE(checkpoint_finite(run_, &bad)) << bad;
  size_t merges_after = 0;
  for (const auto& j : json_lines(run_ / "syncer.jsonl"))
    if (j.value("kind", "") == "merge" && j["t"].get<double>() > started["t"].get<double>()) ++merges_after;
  EXPECT_GT(merges_after, 0u);
  // The real learner's pushes were never refused for what they carried (not_joined after a restart is expected).
  for (const auto& j : json_lines(run_ / "syncer.jsonl"))
    if (j.value("kind", "") == "reject" && j["learner"] == 0) EXPECT_EQ(j["reason"], "not_joined") << j.dump();

  // 4. A checkpoint holding NaN (as an older build could write) is refused on resume, naming it and the tensor.
  Checkpoint ck = read_checkpoint(run_.string(), true);
  const std::string victim = ck.model.tensors.begin()->first;
  ck.model.tensors[victim] = ck.model.tensors[victim].clone();
  ck.model.tensors[victim].view(-1)[0] = std::nanf("");
  // Committed like any checkpoint (the newest by commit sequence), so the resume picks it.
  const std::string name =
      save_run_checkpoint(run_.string(), "merges_99999999-r0002", ck.manifest, ck.model, &ck.optimizer, 0).name;
  auto refused = start_syncer(200, true, /*resume=*/true, slow);
  EXPECT_EQ(refused->wait(60), 1) << refused->log();
  EXPECT_NE(refused->log().find(name + "': checkpoint tensor '" + victim + "' holds NaN or Inf"), std::string::npos)
      << refused->log();
}

}  // namespace
}  // namespace deloco
