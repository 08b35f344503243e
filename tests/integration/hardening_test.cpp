// Issue 52 (hardening III), with real processes over the real transport.
//
// Attacker: an outside attacker who holds one learner key (plaintext
// here: under CURVE the same messages pass with any allow-listed learner key) replays what used to stop a standby
// pair and swamp a donor. Forged epochs in hellos change no leader (a learner's word about an epoch is a hint; only
// the other syncer's lease moves a leader), and a flood of state requests that are never read leaves a serving
// learner's memory within its bound (only requesters the syncer introduced are served, at the welcome's chunk size,
// kFetchWindow at a time). The learners keep applying merges throughout. The attacker's own id may join (a hello at
// the leader's epoch is a real join); when that connection closes, a new process with the id joins once the old
// connection has been quiet for net.dead_after, although the leader's checkpoints keep excusing its silence.
// PausedLeader: a paused leader of a pair holds learners' messages for two leases, no more of them per connection
// than the transport itself queues (a flood during the hold is dropped and counted, not kept).
// SlowDisk: with every fsync of the pair slowed (an LD_PRELOAD shim), checkpoints fill the leader's time and merges
// outrun the standby's acknowledgements: learners still get merges, and a restarted learner still joins.
// FastRestart: a learner process killed and started again at once joins, not refused as a duplicate of the old
// connection whose end the syncer's transport had not shown yet.
// Goodbye: a syncer whose last answer to a goodbye is still queued behind broadcasts (a learner that reads slowly, as
// on a slow link) does not exit until the transport has let go of that answer; the learner gets it when it reads.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include <poll.h>

#include "deloco/runtime.h"
#include "deloco/sync.h"
#include "deloco/transport.h"
#include "deloco/wire.h"
#include "roles/protocol.h"
#include "support/await_kind.h"
#include "support/jsonl.h"
#include "support/proc.h"
#include "support/raw_zmtp.h"

namespace deloco {
namespace hardening_cases {
namespace fs = std::filesystem;
using nlohmann::json;
using test::json_lines;
using test::of_kind;
using test::Proc;
using test::wait_for;

// Resident memory of a process (VmRSS, bytes; -1 when unknown).
int64_t rss_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// A hand-made client of a syncer: frames with the model's fingerprint, sent until the transport takes them.
struct Client {
  std::unique_ptr<ClientTransport> tx;
  uint64_t fp = 0;
  std::map<MessageKind, int> seen;
  Client(const std::string& endpoint, uint64_t fingerprint) : fp(fingerprint) {
    TransportOptions o;
    o.plaintext = true;
    tx = make_zmq_client(endpoint, o);
  }
  void send(MessageKind k, uint32_t id, const std::string& body) {
    MessageHeader h;
    h.kind = k;
    h.learner_id = id;
    h.fingerprint = fp;
    const auto f = proto::make_frame(h, body, WireLimits{});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!tx->send(f.header, f.payload) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
};

std::string hello_with_epoch(int64_t learner, uint64_t instance, const std::string& epoch) {
  proto::Hello h;
  h.learner = learner;
  h.instance = instance;
  h.want_state = false;
  json j = json::parse(proto::encode_hello(h));
  j["epoch"] = json::parse(epoch);  // the raw number, also one no encoder of ours would write
  return j.dump();
}

// What the pair and its learners say about roles (takeovers, step-downs, pauses, a dropped standby, failovers): the
// story behind a stalled merge count, printed with every failure.
std::string pair_story(const fs::path& a, const fs::path& b, const std::vector<fs::path>& learners) {
  std::string out;
  const auto add = [&](const std::string& who, const fs::path& f, std::initializer_list<const char*> kinds) {
    const auto all = json_lines(f);
    std::map<std::string, int> count;
    for (const auto& r : all) ++count[r.value("kind", "")];
    out += who + ": " + std::to_string(all.size()) + " records (" + std::to_string(count["merge"]) + " merge, " +
           std::to_string(count["apply"]) + " apply)\n";
    for (const char* k : kinds)
      for (const auto& r : of_kind(all, k)) out += "  " + r.dump().substr(0, 400) + "\n";
  };
  add("a", a / "syncer.jsonl", {"takeover", "step_down", "standby"});
  add("b", b / "syncer.jsonl", {"takeover", "step_down", "standby"});
  for (const auto& l : learners) add(l.filename().string(), l, {"syncer_failover", "syncer_lost", "rejected"});
  return out;
}

TEST(Attacker, ALearnerKeyChangesNoLeaderAndCannotSwampADonor) {
  // A lease long enough that a loaded CI machine (two tests at once, a checkpoint's fsync behind another test's
  // writes) does not stall the leader past it: a standby that takes over from a stalled leader is the pair working,
  // not what this test is about, and would end the leader's merges.
  constexpr int kLease = 3;
  const std::string src = test::source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_attack_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Three learner ids, two real learners: id 2 is the attacker's (a key that joins as nobody else).
  const std::vector<std::string> common = {
      "--config", src + "/configs/tiny.toml", "--set", "data.path=" + src + "/data/sotu", "--set", "net.plaintext=true",
      "--set", "net.address=ipc://" + (dir / "a.sock").string(), "--set", "net.standby=ipc://" + (dir / "b.sock").string(),
      "--set", "sync.learners=3", "--set", "sync.quorum=1", "--set", "sync.fragments=2", "--set", "sync.sync_every=20",
      "--set", "sync.wait_for_answer=false", "--set", "net.broadcast_encoding=fp32", "--set", "net.chunk_bytes=4096",
      "--set", "train.steps=100000", "--set", "train.threads=1", "--set", "syncer.eval_interval=0", "--set",
      "syncer.metrics=", "--set", "syncer.lease=" + std::to_string(kLease)};
  const auto args = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  const fs::path A = dir / "a", B = dir / "b";
  const std::string serve_sock = (dir / "serve-1.sock").string();
  Proc a(args({"syncer", "--out", A.string()}), (dir / "a.log").string());
  Proc b(args({"syncer", "--standby", "--out", B.string()}), (dir / "b.log").string());
  Proc l0(args({"learner", "--id", "0", "--out", dir.string()}), (dir / "l0.log").string());
  Proc l1(args({"learner", "--id", "1", "--out", dir.string(), "--set", "net.serve=ipc://" + serve_sock}),
          (dir / "l1.log").string());
  const auto recs = [](const fs::path& run) { return json_lines(run / "syncer.jsonl"); };
  const fs::path l0_file = dir / "learner-0.jsonl", l1_file = dir / "learner-1.jsonl";
  const auto story = [&] { return pair_story(A, B, {l0_file, l1_file}); };

  // The pair runs: a leads and merges, b follows from an image, and both learners have joined and applied merges
  // (learner 1 holds the state it serves).
  ASSERT_TRUE(wait_for(
      [&] {
        return !of_kind(recs(B), "standby").empty() && of_kind(recs(A), "merge").size() >= 4 &&
               of_kind(json_lines(l0_file), "apply").size() >= 2 && of_kind(json_lines(l1_file), "apply").size() >= 2;
      },
      120))
      << a.log() << b.log() << l0.log() << l1.log() << story();
  const auto started = of_kind(recs(A), "started");
  ASSERT_FALSE(started.empty());
  const uint64_t fp = parse_fingerprint_hex(started[0]["fingerprint"].get<std::string>());
  const size_t a_from = recs(A).size(), b_from = recs(B).size();

  // ---- (1) hellos with forged epochs, to the leader and to the standby ----
  // Epochs past 2^53 - 1 are malformed, newer ones are hints.
  {
    Client to_a("ipc://" + (dir / "a.sock").string(), fp), to_b("ipc://" + (dir / "b.sock").string(), fp);
    uint64_t instance = 0xa77ac0000;
    for (int round = 0; round < 5; ++round)
      for (const std::string epoch : {"9007199254740992", "9007199254740991", "3", "9223372036854775807"}) {
        to_a.send(MessageKind::kHello, 2, hello_with_epoch(2, ++instance, epoch));
        to_b.send(MessageKind::kHello, 2, hello_with_epoch(2, ++instance, epoch));
      }
    // The leader saw them (it records the hint) ...
    ASSERT_TRUE(wait_for(
        [&] {
          for (const auto& s : of_kind(recs(A), "standby", a_from))
            if (s.value("event", "") == "epoch_hint") return true;
          return false;
        },
        30))
        << a.log() << story();
  }
  // ... and merges on through more than two leases: no learner's word moved a leader.
  const size_t merges_after_hellos = of_kind(recs(A), "merge").size();
  const auto hellos_done = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_for(
      [&] {
        return of_kind(recs(A), "merge").size() >= merges_after_hellos + 4 &&
               std::chrono::steady_clock::now() - hellos_done > std::chrono::seconds(2 * kLease);
      },
      60))
      << a.log() << story();

  // ---- (2) a flood of state requests at the serving learner ----
  // A real welcome for the attacker's id 2 names learner 1 as a donor, with a ticket for id 2 alone. The hello comes
  // from another process (instance) on another connection than id 2's joins above: it waits until that connection
  // has been quiet for net.dead_after, then joins (the leader's checkpoint after every merge excuses its peers'
  // silence meanwhile: that once counted as the old connection speaking on, and the hello was refused duplicate_id).
  {  // id 2 joins (no epoch named: a real join), and its process goes
    Client old("ipc://" + (dir / "a.sock").string(), fp);
    proto::Hello h;
    h.learner = 2;
    h.instance = 0xa77ac1000;
    old.send(MessageKind::kHello, 2, proto::encode_hello(h));
    ASSERT_TRUE(testing::await_kind(*old.tx, MessageKind::kWelcome, 30, old.seen)) << a.log() << story();
  }
  Client joiner("ipc://" + (dir / "a.sock").string(), fp);
  {
    proto::Hello h;
    h.learner = 2;
    h.instance = 0xbad0001;
    h.want_state = true;
    joiner.send(MessageKind::kHello, 2, proto::encode_hello(h));
  }
  const auto wel = testing::await_kind(*joiner.tx, MessageKind::kWelcome, 30, joiner.seen);
  ASSERT_TRUE(wel) << a.log() << story();
  for (const auto& r : of_kind(recs(A), "reject", a_from))
    EXPECT_NE(r.value("reason", ""), "duplicate_id") << "id 2's new process was refused: " << r.dump();
  const proto::Welcome w = proto::parse_welcome(wel->second.data(), wel->second.size());
  ASSERT_TRUE(w.fetch);
  ASSERT_EQ(w.donors.size(), 1u);
  ASSERT_EQ(w.donors[0].learner, 1);
  ASSERT_GT(w.chunks, 4);
  const int64_t before = rss_bytes(l1.pid());
  ASSERT_GT(before, 0);
  // A client that never reads: every reply the donor sends stays queued on the donor's side of the connection.
  const int fd = testing::unix_connect(serve_sock);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(testing::write_all(fd, testing::zmtp_null_dealer_handshake()));
  ASSERT_TRUE(testing::zmtp_await_ready(fd));
  const auto request = [&](int64_t chunk, int64_t chunk_elements, std::optional<Digest> ticket) {
    MessageHeader h;
    h.kind = MessageKind::kStateRequest;
    h.learner_id = 2;
    h.fingerprint = fp;
    h.fragment_id = static_cast<uint32_t>(chunk);
    h.round = w.round;
    proto::StateRequest r;
    r.shard = 0;
    r.elements = w.elements;
    r.chunk_elements = chunk_elements;
    r.versions = w.versions;
    if (ticket) {
      r.learner = 2;
      r.ticket = ticket;
    }
    const auto f = proto::make_frame(h, proto::encode_state_request(r), WireLimits{});
    return testing::zmtp_frame(f.header.str(), true) + testing::zmtp_frame(f.payload.str(), false);
  };
  std::string flood;
  for (int i = 0; i < 500; ++i) flood += request(0, w.elements, std::nullopt);           // whole state, no ticket
  for (int i = 0; i < 500; ++i) flood += request(0, w.elements, w.donors[0].ticket);     // whole state: another ticket
  for (int i = 0; i < 500; ++i) flood += request(i % w.chunks, w.chunk_elements, w.donors[0].ticket);  // valid
  ASSERT_TRUE(testing::write_all(fd, flood));
  // Every kind of refusal is counted and named (records at the 1st, 2nd, 4th, ... of each reason).
  const auto refused = [&](const std::string& reason, int64_t at_least) {
    for (const auto& r : of_kind(json_lines(l1_file), "serve_refused"))
      if (r.value("reason", "") == reason && r.value("count", int64_t{0}) >= at_least) return true;
    return false;
  };
  ASSERT_TRUE(wait_for([&] { return refused("stranger", 256) && refused("bad_ticket", 256) && refused("busy", 64); }, 60))
      << l1.log() << story();
  const int64_t after = rss_bytes(l1.pid());
  ::close(fd);
  ::testing::Test::RecordProperty("donor_rss_before_bytes", std::to_string(before));
  ::testing::Test::RecordProperty("donor_rss_after_bytes", std::to_string(after));
  // Before the fix the donor copied the whole state (282 KB) for each of the 1000 whole-state requests, about 280 MB
  // held for a reader that never reads. Its bound now: a few chunks of 4 KB per requester and two pinned copies.
  EXPECT_LT(after - before, int64_t{48} << 20) << "donor RSS " << before << " -> " << after;

  // ---- training went on: both learners applied merges after the attacks, and nobody changed roles ----
  const size_t l0_applies = of_kind(json_lines(l0_file), "apply").size(), l1_applies = of_kind(json_lines(l1_file), "apply").size();
  ASSERT_TRUE(wait_for(
      [&] {
        return of_kind(json_lines(l0_file), "apply").size() >= l0_applies + 3 &&
               of_kind(json_lines(l1_file), "apply").size() >= l1_applies + 3;
      },
      90))
      << l0.log() << l1.log() << story();
  for (const char* kind : {"takeover", "step_down"}) {
    EXPECT_TRUE(of_kind(recs(A), kind, a_from).empty()) << kind << " on a after the attack: " << a.log() << story();
    EXPECT_TRUE(of_kind(recs(B), kind, b_from).empty()) << kind << " on b after the attack: " << b.log() << story();
  }
  for (const auto& l : {l0_file, l1_file}) EXPECT_TRUE(of_kind(json_lines(l), "syncer_failover").empty()) << l;
  for (Proc* p : {&l0, &l1, &a, &b}) p->kill9();  // before the folder goes: they still write into it
  std::error_code ec;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir, ec);
}

TEST(PausedLeader, HoldsNoMorePerConnectionThanTheTransportQueues) {
  const std::string src = test::source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_hold_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // A leader of a pair whose other syncer never comes: after a pause it holds every message for two leases.
  Proc a({"syncer", "--config", src + "/configs/tiny.toml", "--set", "data.path=" + src + "/data/sotu", "--set",
          "net.plaintext=true", "--set", "net.address=ipc://" + (dir / "a.sock").string(), "--set",
          "net.standby=ipc://" + (dir / "b.sock").string(), "--set", "sync.learners=1", "--set", "sync.quorum=1", "--set", "syncer.eval_interval=0",
          "--set", "syncer.metrics=", "--set", "syncer.lease=3", "--out", (dir / "a").string()},
         (dir / "a.log").string());
  const fs::path rec = dir / "a" / "syncer.jsonl";
  ASSERT_TRUE(wait_for([&] { return !of_kind(json_lines(rec), "started").empty(); }, 60)) << a.log();
  const uint64_t fp = parse_fingerprint_hex(of_kind(json_lines(rec), "started")[0]["fingerprint"].get<std::string>());
  Client c("ipc://" + (dir / "a.sock").string(), fp);
  proto::Beat beat;
  const std::string body = proto::encode_beat(beat);
  c.send(MessageKind::kHeartbeat, 0, body);  // connected; its refusal (say hello first) shows the loop has run
  ASSERT_TRUE(wait_for([&] { return !of_kind(json_lines(rec), "reject").empty(); }, 30)) << a.log();
  // The pause (what a SIGSTOP of a whole VM does to a leader): longer than half a lease. The hold that follows lasts
  // two leases (6 s), longer than the flood below takes to arrive, even on a loaded machine.
  a.signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  a.signal(SIGCONT);
  // One connection floods while the leader holds: it keeps at most 4 P + 16 of them, and says so.
  for (int i = 0; i < 3000; ++i) c.send(MessageKind::kHeartbeat, 0, body);
  ASSERT_TRUE(wait_for(
      [&] {
        for (const auto& s : of_kind(json_lines(rec), "standby"))
          if (s.value("event", "") == "held_dropped") return true;
        return false;
      },
      30))
      << a.log();
  a.signal(SIGTERM);
  ASSERT_EQ(a.wait(60), 0) << a.log();
  const auto done = of_kind(json_lines(rec), "done");
  ASSERT_EQ(done.size(), 1u);
  // What was held was handled after the hold (refused: this connection never said hello), the rest dropped. How many
  // of the 3000 reach the leader at all depends on ZeroMQ's queues and how fast the leader reads them (840 to 1,155
  // seen, so a bound of 1000 dropped failed now and then): what is fixed is that the leader kept at most
  // syncer_receive_limit of this connection's messages (it handled at most those and the first one) and dropped
  // every other it read while holding.
  const int64_t dropped = done[0]["rejects"].value("held_dropped", int64_t{0});
  const int64_t refused = done[0].value("joins_refused", int64_t{-1});
  EXPECT_GE(dropped, 1) << done[0].dump();
  EXPECT_GE(refused, 1) << done[0].dump();  // the heartbeat before the pause
  EXPECT_LE(refused, syncer_receive_limit(SyncOptions().fragments) + 1) << done[0].dump();
  EXPECT_GE(dropped + refused, syncer_receive_limit(SyncOptions().fragments) + 2) << done[0].dump();
  std::error_code ec;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir, ec);
}

TEST(FastRestart, ANewProcessJoinsWhileTheOldConnectionsEndIsPending) {
  const std::string src = test::source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_restart_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Heartbeats every 5 s: the old rule counted the old connection live for 2 heartbeats (10 s) after its last message,
  // longer than a restart takes; now the new hello waits until the old one is quiet for net.dead_after (12 s).
  const std::vector<std::string> common = {
      "--config", src + "/configs/tiny.toml", "--set", "data.path=" + src + "/data/sotu", "--set", "net.plaintext=true",
      "--set", "net.address=ipc://" + (dir / "s.sock").string(), "--set", "sync.learners=1", "--set", "sync.quorum=1",
      "--set", "sync.fragments=2", "--set", "sync.sync_every=10", "--set", "train.steps=100000", "--set",
      "train.threads=1", "--set", "syncer.eval_interval=0", "--set", "syncer.metrics=", "--set", "net.heartbeat=5",
      "--set", "net.dead_after=12"};
  const auto args = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  Proc s(args({"syncer", "--out", (dir / "s").string()}), (dir / "s.log").string());
  auto l = std::make_unique<Proc>(args({"learner", "--id", "0", "--out", dir.string()}), (dir / "l.log").string());
  const fs::path srec = dir / "s" / "syncer.jsonl", lrec = dir / "learner-0.jsonl";
  ASSERT_TRUE(wait_for([&] { return of_kind(json_lines(srec), "merge").size() >= 2; }, 120)) << s.log() << l->log();
  const size_t l_from = json_lines(lrec).size();
  l->kill9();
  l = std::make_unique<Proc>(args({"learner", "--id", "0", "--out", dir.string()}), (dir / "l2.log").string());
  ASSERT_TRUE(wait_for([&] { return !of_kind(json_lines(lrec), "joined", l_from).empty(); }, 60)) << l->log() << s.log();
  for (const auto& r : of_kind(json_lines(srec), "reject"))
    EXPECT_NE(r.value("reason", ""), "duplicate_id") << "the restart was refused: " << r.dump();
  for (const auto& r : of_kind(json_lines(lrec), "rejected", l_from))
    EXPECT_EQ(r.value("code", "").find("duplicate_id"), std::string::npos) << r.dump();
  // And it trains on: a merge after the restart.
  const size_t merges = of_kind(json_lines(srec), "merge").size();
  EXPECT_TRUE(wait_for([&] { return of_kind(json_lines(srec), "merge").size() > merges; }, 60)) << s.log();
  l->kill9();
  s.kill9();
  std::error_code ec;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir, ec);
}

TEST(SlowDisk, LearnersGetMergesAndARestartJoinsWhileCheckpointsFillTheLeadersTime) {
  // Both syncers of a pair on a disk whose every fsync takes 40 ms: a checkpoint after every merge (the default) then
  // takes the leader most of its time, and merges come faster than the standby's acknowledgements return. Three bugs
  // showed here: the newest merge of a fragment, always still waiting for the standby, replaced the one that had
  // been acknowledged, so learners got no merge at all (1 in 120 s); the unbounded excuse for the syncer's busy
  // time kept a dead learner's connection live, so its restarted process waited for it without end; and with one
  // checkpoint per merge the leader fell ever further behind the pushes (CI: 316 merges, 19 applies).
  const std::string src = test::source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_slowdisk_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::string> common = {
      "--config", src + "/configs/tiny.toml", "--set", "data.path=" + src + "/data/sotu", "--set", "net.plaintext=true",
      "--set", "net.address=ipc://" + (dir / "a.sock").string(), "--set", "net.standby=ipc://" + (dir / "b.sock").string(),
      "--set", "sync.learners=2", "--set", "sync.quorum=1", "--set", "sync.fragments=2", "--set", "sync.sync_every=10",
      "--set", "sync.wait_for_answer=false", "--set", "train.steps=100000", "--set", "train.threads=1", "--set",
      "syncer.eval_interval=0", "--set", "syncer.metrics=", "--set", "syncer.lease=3"};
  const auto args = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  const std::vector<std::string> slow = {std::string("LD_PRELOAD=") + DELOCO_SLOW_FSYNC_LIB,
                                         "DELOCO_TEST_FSYNC_DELAY_US=40000"};
  const fs::path A = dir / "a", B = dir / "b";
  Proc a(args({"syncer", "--out", A.string()}), (dir / "a.log").string(), slow);
  Proc b(args({"syncer", "--standby", "--out", B.string()}), (dir / "b.log").string(), slow);
  Proc l0(args({"learner", "--id", "0", "--out", dir.string()}), (dir / "l0.log").string());
  auto l1 = std::make_unique<Proc>(args({"learner", "--id", "1", "--out", dir.string()}), (dir / "l1.log").string());
  const fs::path arec = A / "syncer.jsonl", l0_file = dir / "learner-0.jsonl", l1_file = dir / "learner-1.jsonl";
  const auto story = [&] { return pair_story(A, B, {l0_file, l1_file}); };
  const auto applies = [&](const fs::path& f, size_t from = 0) { return of_kind(json_lines(f), "apply", from).size(); };

  // The slow disk is real: a checkpoint takes at least its fsyncs' 40 ms each.
  ASSERT_TRUE(wait_for([&] { return of_kind(json_lines(arec), "checkpoint").size() >= 3; }, 120)) << a.log() << story();
  // Both learners apply merges, again and again, although every newest merge waits for the standby.
  ASSERT_TRUE(wait_for([&] { return applies(l0_file) >= 8 && applies(l1_file) >= 8; }, 90))
      << a.log() << b.log() << story();

  // Learner 1's process dies; a new one starts at once. It joins once the old connection has been quiet for
  // net.dead_after (3 s, excused by at most a few checkpoints' time), not refused, not kept waiting.
  const size_t l1_from = json_lines(l1_file).size();
  l1->kill9();
  l1 = std::make_unique<Proc>(args({"learner", "--id", "1", "--out", dir.string()}), (dir / "l1b.log").string());
  ASSERT_TRUE(wait_for([&] { return !of_kind(json_lines(l1_file), "joined", l1_from).empty(); }, 45))
      << l1->log() << a.log() << story();
  for (const auto& r : of_kind(json_lines(arec), "reject"))
    EXPECT_NE(r.value("reason", ""), "duplicate_id") << "the restart was refused: " << r.dump();
  // And it gets merges again.
  EXPECT_TRUE(wait_for([&] { return applies(l1_file, l1_from) >= 2; }, 60)) << a.log() << story();
  // No learner sees a merge long after it was made. One checkpoint per merge fell behind without bound here (merges
  // arrive faster than 40 ms fsyncs commit them): applies 15 s after the merge, then a minute; with a group commit
  // a merge waits about two checkpoints (under a second here).
  std::map<std::pair<int64_t, int64_t>, double> merged_at;
  for (const auto& r : of_kind(json_lines(arec), "merge"))
    merged_at[{r["fragment"].get<int64_t>(), r["version"].get<int64_t>()}] = r["t"].get<double>();
  for (const fs::path& f : {l0_file, l1_file})
    for (const auto& r : of_kind(json_lines(f), "apply")) {
      const auto it = merged_at.find({r["fragment"].get<int64_t>(), r["version"].get<int64_t>()});
      if (it != merged_at.end())
        EXPECT_LT(r["t"].get<double>() - it->second, 10.0) << f.filename() << " applied it late: " << r.dump();
    }
  l0.kill9();
  l1->kill9();
  a.kill9();
  b.kill9();
  std::error_code ec;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir, ec);
}

// Reads what a raw ZMTP connection received (the server's greeting, READY, then messages): the messages whose
// frames arrived whole, as (header, payload), appended to `out`; `buf` keeps the unparsed rest.
void read_messages(int fd, std::string& buf, std::vector<std::pair<MessageHeader, std::string>>& out, bool& greeted) {
  char tmp[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (n <= 0) break;
    buf.append(tmp, static_cast<size_t>(n));
  }
  size_t at = 0;
  if (!greeted) {
    if (buf.size() < 64) return;
    at = 64;
    greeted = true;
  }
  bool first = true;  // the frame is a message's first (its header) when the one before had no MORE flag
  size_t done = at;   // the end of the last whole message
  for (;;) {
    if (buf.size() - at < 2) break;
    const unsigned char flags = static_cast<unsigned char>(buf[at]);
    size_t len = 0, head = 2;
    if (flags & 0x02) {
      if (buf.size() - at < 9) break;
      for (int i = 1; i <= 8; ++i) len = len << 8 | static_cast<unsigned char>(buf[at + static_cast<size_t>(i)]);
      head = 9;
    } else {
      len = static_cast<unsigned char>(buf[at + 1]);
    }
    if (buf.size() - at < head + len) break;
    if (!(flags & 0x04)) {
      if (first && len == kWireHeaderBytes) out.push_back({decode_header(buf.data() + at + head, len), ""});
      else if (!first && !out.empty()) out.back().second.assign(buf, at + head, len);
      first = !(flags & 0x01);
    }
    at += head + len;
    if (first) done = at;
  }
  buf.erase(0, done);  // a message cut by the buffer's end is parsed again whole next time
}

TEST(Goodbye, TheSyncerWaitsUntilItsLastAnswerHasLeft) {
  const std::string src = test::source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_goodbye_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // One fragment: each broadcast is the whole tiny model (282 KB), more than a Unix socket buffers for a reader
  // that does not read, so the answer to the goodbye stays queued behind it in the syncer.
  Proc s({"syncer", "--config", src + "/configs/tiny.toml", "--set", "data.path=" + src + "/data/sotu", "--set",
          "net.plaintext=true", "--set", "net.address=ipc://" + (dir / "s.sock").string(), "--set", "sync.learners=1",
          "--set", "sync.quorum=1", "--set", "sync.fragments=1", "--set", "sync.sync_every=10", "--set",
          "net.broadcast_encoding=fp32", "--set", "syncer.eval_interval=0", "--set", "syncer.metrics=", "--set",
          "net.join_timeout=60", "--out", (dir / "s").string()},
         (dir / "s.log").string());
  const fs::path rec = dir / "s" / "syncer.jsonl";
  ASSERT_TRUE(wait_for([&] { return !of_kind(json_lines(rec), "started").empty(); }, 60)) << s.log();
  const uint64_t fp = parse_fingerprint_hex(of_kind(json_lines(rec), "started")[0]["fingerprint"].get<std::string>());
  const int fd = testing::unix_connect((dir / "s.sock").string());
  ASSERT_GE(fd, 0);
  const auto message = [&](MessageHeader h, const std::string& body) {
    h.learner_id = 0;
    h.fingerprint = fp;
    const auto f = proto::make_frame(h, body, WireLimits{});
    return testing::zmtp_frame(f.header.str(), true) + testing::zmtp_frame(f.payload.str(), false);
  };
  ASSERT_TRUE(testing::write_all(fd, testing::zmtp_null_dealer_handshake()));
  ASSERT_TRUE(testing::zmtp_await_ready(fd));
  std::string out;
  {
    proto::Hello hello;
    hello.learner = 0;
    hello.instance = 0x900db7e;
    hello.want_state = false;
    MessageHeader h;
    h.kind = MessageKind::kHello;
    out += message(h, proto::encode_hello(hello));
  }
  ASSERT_TRUE(testing::write_all(fd, out));
  // The welcome says the model's size (one fragment: all of it). From here on we read nothing.
  std::string buf;
  std::vector<std::pair<MessageHeader, std::string>> got;
  bool greeted = true;  // zmtp_await_ready read the greeting and READY
  int64_t elements = 0;
  ASSERT_TRUE(wait_for(
      [&] {
        read_messages(fd, buf, got, greeted);
        for (const auto& [h, body] : got)
          if (h.kind == MessageKind::kWelcome) elements = proto::parse_welcome(body.data(), body.size()).elements;
        return elements > 0;
      },
      30))
      << s.log();
  got.clear();
  // Two pushes of Δ = 0 (each merged at once: one learner, quorum 1), so two whole-model broadcasts queue for us.
  for (int k = 0; k < 2; ++k) {
    MessageHeader h;
    h.kind = MessageKind::kFragmentPush;
    h.encoding = Encoding::kFp32;
    h.fragment_id = 0;
    h.round = static_cast<uint64_t>(k);  // the version this learner holds: the one the previous merge made
    h.c_steps = 10;
    h.c_tokens = 10 * 32 * 8;
    h.element_count = static_cast<uint64_t>(elements);
    ASSERT_TRUE(testing::write_all(fd, message(h, std::string(static_cast<size_t>(elements) * 4, '\0'))));
    ASSERT_TRUE(wait_for([&] { return of_kind(json_lines(rec), "merge").size() >= static_cast<size_t>(k + 1); }, 60))
        << s.log();
  }
  {
    MessageHeader h;
    h.kind = MessageKind::kLeave;
    ASSERT_TRUE(testing::write_all(fd, message(h, proto::encode_leave("done"))));
  }
  // Like a learner, we repeat the goodbye every net.heartbeat (0.5 s) until answered, reading nothing meanwhile.
  const auto repeat_for = [&](double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int code = -1;
    while (std::chrono::steady_clock::now() < end && (code = s.wait(0)) < 0) {
      MessageHeader h;
      h.kind = MessageKind::kLeave;
      testing::write_all(fd, message(h, proto::encode_leave("done")));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return code;
  };
  ASSERT_TRUE(wait_for([&] { return !of_kind(json_lines(rec), "done").empty(); }, 60)) << s.log();
  // The run is over, but the answer to our goodbye has not left: the syncer waits (it used to exit within its 1 s
  // linger, and the answer was lost with it).
  EXPECT_EQ(repeat_for(3), -1) << "the syncer exited with its answer to the goodbye still queued: " << s.log();
  // We read: the broadcasts, then the answer, arrive; the syncer, its answer gone, ends.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int code = -1;
  while (std::chrono::steady_clock::now() < until && (code = s.wait(0)) < 0) {
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 50);
    read_messages(fd, buf, got, greeted);
  }
  read_messages(fd, buf, got, greeted);
  ::close(fd);
  EXPECT_EQ(code, 0) << s.log();
  size_t broadcasts = 0, leaves = 0;
  for (const auto& [h, body] : got) {
    broadcasts += h.kind == MessageKind::kFragmentBroadcast;
    leaves += h.kind == MessageKind::kLeave;
  }
  EXPECT_GE(broadcasts, 1u);
  EXPECT_GE(leaves, 1u) << "the answer to the goodbye never arrived";
  std::error_code ec;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace deloco
