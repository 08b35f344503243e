// A standby syncer pair with real processes (issue 34, docs/reliability.md): the leader is SIGKILLed and its
// standby takes over holding every merge the learners saw, bit for bit; the killed leader, restarted as a leader
// from its checkpoint by mistake, is fenced by the learners' newer epoch and follows; then the new leader is killed
// and the old one takes over in turn. A learner restarted while its first endpoint only follows finds the leader
// through the other. Merge versions never repeat nor skip across the three terms.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <csignal>
#include <thread>

#include "deloco/safetensors.h"
#include "deloco/wire.h"
#include "support/jsonl.h"
#include "support/proc.h"
#include "util/checkpoint_store.h"
#include "util/fs.h"

namespace deloco {
namespace standby_cases {
namespace fs = std::filesystem;
using nlohmann::json;
using test::json_lines;
using test::of_kind;
using test::Proc;
using test::wait_for;

// FNV-1a-64 (decimal) of the model of the checkpoint in `run` whose manifest says `merges`, over each tensor's fp32
// bytes in name order, as the takeover record's model_hash ("" : no such checkpoint).
std::string checkpoint_hash(const fs::path& run, int64_t merges) {
  if (!fs::exists(run / "checkpoints")) return "";
  for (const auto& d : fs::directory_iterator(run / "checkpoints")) {
    if (!fs::exists(d.path() / "manifest.json")) continue;
    const json man = json::parse(read_file((d.path() / "manifest.json").string()), nullptr, false);
    if (man.is_discarded() || man.value("step", int64_t{-1}) != merges) continue;
    const TensorFile tf = load_safetensors((d.path() / "model.safetensors").string());
    uint64_t h = kFnvOffset;
    for (const auto& [n, t] : tf.tensors) {
      const at::Tensor c = t.to(at::kFloat).contiguous();
      h = fnv1a64(c.data_ptr<float>(), static_cast<size_t>(c.numel()) * sizeof(float), h);
    }
    return std::to_string(h);
  }
  return "";
}

// The (fragment, version) pairs learner n applied, each expected once; returns how many.
size_t versions_applied_once(const std::vector<json>& learner_records, int n) {
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const auto& r : of_kind(learner_records, "apply")) {
    const std::pair<int64_t, int64_t> key{r["fragment"].get<int64_t>(), r["version"].get<int64_t>()};
    EXPECT_TRUE(seen.insert(key).second) << "learner " << n << " applied fragment " << key.first << " version "
                                         << key.second << " twice";
  }
  return seen.size();
}

// `a` (a command and its flags) followed by the settings of a pair of syncers in `dir` (ipc sockets a.sock and
// b.sock, plaintext) for two Decoupled DiLoCo learners of the tiny model, quorum 1, 3000 steps, lease 1 s.
std::vector<std::string> with_quorum_one_settings(std::vector<std::string> a, const std::string& src, const fs::path& dir) {
  a.insert(a.end(), {"--config", src + "/configs/tiny.toml", "--set", "data.path=" + src + "/data/sotu", "--set",
                     "net.plaintext=true", "--set", "net.address=ipc://" + (dir / "a.sock").string(), "--set",
                     "net.standby=ipc://" + (dir / "b.sock").string(), "--set", "sync.learners=2", "--set",
                     "sync.quorum=1", "--set", "sync.fragments=2", "--set", "sync.sync_every=10", "--set",
                     "sync.wait_for_answer=false", "--set", "train.steps=3000", "--set", "train.threads=1", "--set",
                     "syncer.eval_interval=0", "--set", "syncer.metrics=", "--set", "syncer.lease=1"});
  return a;
}

TEST(Standby, TakesOverFromAKilledLeaderAndFencesItWhenItComesBack) {
  const std::string src = test::source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_standby_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::string> common = {
      "--config", src + "/configs/tiny.toml", "--set", "data.path=" + src + "/data/sotu", "--set", "net.plaintext=true",
      "--set", "net.address=ipc://" + (dir / "a.sock").string(), "--set", "net.standby=ipc://" + (dir / "b.sock").string(),
      "--set", "sync.learners=2", "--set", "sync.quorum=2", "--set", "sync.fragments=2", "--set", "sync.sync_every=10",
      // Decoupled DiLoCo: learners never wait for an answer (with sync.wait_for_answer, K = M and P > 1, learners
      // that trained on at different paces while no syncer answered can wait on each other's fragments for good).
      "--set", "sync.wait_for_answer=false",
      "--set", "train.steps=4000", "--set", "train.threads=1", "--set", "syncer.eval_interval=0", "--set",
      "syncer.metrics=", "--set", "syncer.lease=1"};
  const auto args = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  const fs::path A = dir / "a", B = dir / "b";
  auto a = std::make_unique<Proc>(args({"syncer", "--out", A.string()}), (dir / "a.log").string());
  auto b = std::make_unique<Proc>(args({"syncer", "--standby", "--out", B.string()}), (dir / "b.log").string());
  Proc l0(args({"learner", "--id", "0", "--out", dir.string()}), (dir / "l0.log").string());
  auto l1 = std::make_unique<Proc>(args({"learner", "--id", "1", "--out", dir.string()}), (dir / "l1.log").string());
  const auto recs = [](const fs::path& run) { return json_lines(run / "syncer.jsonl"); };

  // ---- term 1: a leads, b follows; a is killed ----
  // b follows from an image (taken at some merge count), and a merges 4 more after it.
  ASSERT_TRUE(wait_for(
      [&] {
        const auto img = of_kind(recs(B), "standby");
        return !img.empty() && static_cast<int64_t>(of_kind(recs(A), "merge").size()) >= img[0].value("merges", 0) + 4;
      },
      90))
      << a->log() << b->log();
  a->kill9();
  ASSERT_TRUE(wait_for([&] { return !of_kind(recs(B), "failover_merge").empty(); }, 30)) << b->log();
  const json take1 = of_kind(recs(B), "takeover").at(0);
  EXPECT_EQ(take1["epoch"], 2);
  EXPECT_EQ(take1["mismatches"], 0);
  EXPECT_GE(take1["rounds_checked"].get<int64_t>(), 4);
  EXPECT_EQ(take1["learners_told"], 2);
  // The state b took over with is the one a had checkpointed after the same merges, bit for bit.
  const int64_t n1 = take1["merges"].get<int64_t>();
  const std::string a_hash = checkpoint_hash(A, n1);
  ASSERT_FALSE(a_hash.empty()) << "a kept no checkpoint at " << n1 << " merges";
  EXPECT_EQ(take1["model_hash"], a_hash) << "the standby's model differs from the leader's at " << n1 << " merges";

  // ---- a comes back as a leader (a misconfigured restart): the learners' epoch fences it ----
  const size_t a_lines = recs(A).size();
  a = std::make_unique<Proc>(args({"syncer", "--resume", "--out", A.string()}), (dir / "a2.log").string());
  ASSERT_TRUE(wait_for(
      [&] {
        const auto r = recs(A);
        return !of_kind(std::vector<json>(r.begin() + static_cast<long>(std::min(a_lines, r.size())), r.end()), "standby").empty() &&
               of_kind(r, "standby").back().value("event", "") == "image";
      },
      60))
      << a->log();
  const auto a_after = recs(A);
  const std::vector<json> restarted(a_after.begin() + static_cast<long>(a_lines), a_after.end());
  const auto downs = of_kind(restarted, "step_down");
  ASSERT_EQ(downs.size(), 1u) << a->log();
  EXPECT_EQ(downs[0]["epoch"], 1);
  EXPECT_EQ(downs[0]["newer_epoch"], 2);

  // ---- a learner restarted now dials a first (its net.address), which only follows: b, the leader, answers the
  // hello the learner sends the other syncer of the pair, with the state it needs, and the learner moves there ----
  const fs::path l1_file = dir / "learner-1.jsonl";
  const size_t l1_lines = json_lines(l1_file).size();
  l1->kill9();
  l1 = std::make_unique<Proc>(args({"learner", "--id", "1", "--out", dir.string()}), (dir / "l1b.log").string());
  ASSERT_TRUE(wait_for(
      [&] {
        const auto l = json_lines(l1_file);
        return !of_kind(std::vector<json>(l.begin() + static_cast<long>(std::min(l1_lines, l.size())), l.end()), "joined").empty();
      },
      60))
      << l1->log();
  {
    const auto l = json_lines(l1_file);
    const std::vector<json> second(l.begin() + static_cast<long>(l1_lines), l.end());
    const auto moves = of_kind(second, "syncer_failover");
    ASSERT_EQ(moves.size(), 1u) << l1->log();
    EXPECT_EQ(moves[0]["epoch"], 2);
    const json joined = of_kind(second, "joined").at(0);
    EXPECT_GT(joined.value("download_bytes", int64_t{0}), 0) << joined.dump();  // b's state, not its own initial one
  }

  // ---- term 2: b leads, a follows; b is killed and a takes over ----
  const size_t b_merges = of_kind(recs(B), "merge").size();
  ASSERT_TRUE(wait_for([&] { return of_kind(recs(B), "merge").size() >= b_merges + 3; }, 60)) << b->log();
  b->kill9();
  ASSERT_TRUE(wait_for([&] { return of_kind(recs(A), "failover_merge").size() >= 1; }, 30)) << a->log();
  const json take2 = of_kind(recs(A), "takeover").at(0);
  EXPECT_EQ(take2["epoch"], 3);
  EXPECT_EQ(take2["mismatches"], 0);
  EXPECT_GE(take2["rounds_checked"].get<int64_t>(), 3);
  const int64_t n2 = take2["merges"].get<int64_t>();
  const std::string b_hash = checkpoint_hash(B, n2);
  ASSERT_FALSE(b_hash.empty()) << "b kept no checkpoint at " << n2 << " merges";
  EXPECT_EQ(take2["model_hash"], b_hash) << "the second takeover's model differs from the leader's at " << n2 << " merges";

  // ---- the run ends under term 3 ----
  EXPECT_EQ(l0.wait(240), 0) << l0.log();
  EXPECT_EQ(l1->wait(60), 0) << l1->log();
  EXPECT_EQ(a->wait(60), 0) << a->log();

  // Every merge of a fragment has the next version: none lost, none applied twice, across the three terms (a's
  // first term, b's term after its takeover, a's term after its own). The fenced a merged nothing.
  // A leader killed between a merge's checkpoint and its replication wrote a merge record no learner saw (broadcasts
  // wait for the standby's acknowledgement): the takeover's merge count says which, and those are left out.
  std::vector<json> merges;
  for (const auto& j : std::vector<json>(a_after.begin(), a_after.begin() + static_cast<long>(a_lines)))
    if (j.value("kind", "") == "merge" && j.value("merges", int64_t{0}) <= n1) merges.push_back(j);
  bool led = false;
  for (const auto& j : recs(B)) {
    if (j.value("kind", "") == "takeover") led = true;
    if (led && j.value("kind", "") == "merge" && j.value("merges", int64_t{0}) <= n2) merges.push_back(j);
  }
  led = false;
  const auto a_final = recs(A);
  for (size_t i = a_lines; i < a_final.size(); ++i) {
    const json& j = a_final[i];
    if (j.value("kind", "") == "takeover") led = true;
    if (j.value("kind", "") == "merge") EXPECT_TRUE(led) << "the fenced syncer merged: " << j.dump();
    if (led && j.value("kind", "") == "merge") merges.push_back(j);
  }
  std::map<int64_t, int64_t> version;
  for (const auto& m : merges) {
    const int64_t f = m["fragment"], v = m["version"];
    EXPECT_EQ(v, version[f] + 1) << "fragment " << f << ": " << m.dump();
    version[f] = v;
  }
  EXPECT_GE(merges.size(), 10u);
  // Both learners followed both takeovers (learner 1's second process: b on its start, then a) and finished.
  for (int n = 0; n < 2; ++n) {
    const auto l = json_lines(dir / ("learner-" + std::to_string(n) + ".jsonl"));
    EXPECT_EQ(of_kind(l, "syncer_failover").size(), n == 0 ? 2u : 3u) << "learner " << n;
    const auto done = of_kind(l, "learner_done");
    ASSERT_EQ(done.size(), 1u);  // learner 1's first process was SIGKILLed: no goodbye
    EXPECT_EQ(done[0].value("finished", false), true) << done[0].dump();
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// A syncer of the pair paused (SIGSTOP) past the lease never leads beside a live one. The standby paused: the
// leader drops it and merges on alone; when it runs again it sees that the silence was its own, and the leader
// answers its next acknowledgement with a fresh image, so it follows again and never takes over. The leader paused:
// the standby takes over (it cannot tell a pause from a death); the old leader, when it runs again, holds the
// broadcasts its standby never acknowledged and steps down on the new leader's epoch. No learner applies a
// fragment version twice and none finds its syncer behind it.
TEST(Standby, APausedSyncerNeverLeadsBesideALiveOne) {
  const std::string src = test::source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_pause_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto args = [&](std::vector<std::string> a) { return with_quorum_one_settings(std::move(a), src, dir); };
  const fs::path A = dir / "a", B = dir / "b";
  Proc a(args({"syncer", "--out", A.string()}), (dir / "a.log").string());
  Proc b(args({"syncer", "--standby", "--out", B.string()}), (dir / "b.log").string());
  Proc l0(args({"learner", "--id", "0", "--out", dir.string()}), (dir / "l0.log").string());
  Proc l1(args({"learner", "--id", "1", "--out", dir.string()}), (dir / "l1.log").string());
  const auto recs = [](const fs::path& run) { return json_lines(run / "syncer.jsonl"); };
  const auto events = [&](const fs::path& run, const std::string& event) {
    size_t n = 0;
    for (const auto& j : of_kind(recs(run), "standby")) n += j.value("event", "") == event;
    return n;
  };
  const auto merges_of = [&](const fs::path& run) { return of_kind(recs(run), "merge").size(); };
  const auto pause = [](Proc& p, double seconds) {
    p.signal(SIGSTOP);
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    p.signal(SIGCONT);
  };

  // ---- the standby pauses for 3 leases ----
  ASSERT_TRUE(wait_for([&] { return events(B, "image") >= 1 && merges_of(A) >= 6; }, 90)) << a.log() << b.log();
  pause(b, 3);
  ASSERT_TRUE(wait_for([&] { return events(B, "image") >= 2; }, 20)) << a.log() << b.log();
  const size_t merged = merges_of(A);
  ASSERT_TRUE(wait_for([&] { return merges_of(A) >= merged + 4; }, 60)) << a.log();  // several leases later
  EXPECT_GE(events(A, "dropped"), 1u);
  EXPECT_GE(events(A, "dropped_standby_heard"), 1u);
  EXPECT_GE(events(B, "paused"), 1u);
  EXPECT_TRUE(of_kind(recs(B), "takeover").empty()) << "the paused standby took over beside a live leader";

  // ---- the leader pauses for 3 leases ----
  pause(a, 3);
  ASSERT_EQ(of_kind(recs(B), "takeover").size(), 1u) << b.log();
  ASSERT_TRUE(wait_for([&] { return !of_kind(recs(A), "step_down").empty(); }, 20)) << a.log();
  const json down = of_kind(recs(A), "step_down").at(0);
  EXPECT_EQ(down["epoch"], 1);
  EXPECT_EQ(down["newer_epoch"], 2);
  ASSERT_TRUE(wait_for([&] { return events(A, "image") >= 1; }, 20)) << a.log();  // a follows b now

  EXPECT_EQ(l0.wait(240), 0) << l0.log();
  EXPECT_EQ(l1.wait(60), 0) << l1.log();
  EXPECT_EQ(b.wait(60), 0) << b.log();
  EXPECT_EQ(a.wait(60), 0) << a.log();

  for (int n = 0; n < 2; ++n) {
    const auto l = json_lines(dir / ("learner-" + std::to_string(n) + ".jsonl"));
    EXPECT_GE(versions_applied_once(l, n), 10u) << "learner " << n;
    EXPECT_TRUE(of_kind(l, "syncer_behind").empty()) << "learner " << n;
    EXPECT_EQ(of_kind(l, "syncer_failover").size(), 1u) << "learner " << n;
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// The leader dies before its standby ever held an image (here: before the standby started; in CI's run it was a
// standby still starting on a loaded machine). Alone the standby could never take over: it holds nothing the
// learners trained on. The killed leader comes back as a standby with its own checkpoint (`--follow --resume`, as
// `deloco run` restarts it), so neither leads: each asks the other to be followed. The pair elects the one with
// the newer state — the restarted leader, whose checkpoint holds every merge (checkpoint_every = 1) — which takes
// over with epoch 2 and says why; the fresh standby follows it from an image and never leads. No learner finds its
// syncer behind it or applies a version twice, and merge versions run on across both terms.
TEST(Standby, APairWithNoLeaderElectsTheSyncerWithTheNewerState) {
  const std::string src = test::source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_leaderless_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto args = [&](std::vector<std::string> a) {
    a = with_quorum_one_settings(std::move(a), src, dir);
    a.insert(a.end(), {"--set", "syncer.checkpoint_every=1"});  // every merge a learner saw is on disk
    return a;
  };
  const fs::path A = dir / "a", B = dir / "b";
  const auto recs = [](const fs::path& run) { return json_lines(run / "syncer.jsonl"); };
  auto a = std::make_unique<Proc>(args({"syncer", "--out", A.string()}), (dir / "a.log").string());
  Proc l0(args({"learner", "--id", "0", "--out", dir.string()}), (dir / "l0.log").string());
  Proc l1(args({"learner", "--id", "1", "--out", dir.string()}), (dir / "l1.log").string());

  // ---- term 1: a leads alone (its standby is not up yet) and is killed ----
  ASSERT_TRUE(wait_for([&] { return of_kind(recs(A), "merge").size() >= 6; }, 90)) << a->log();
  a->kill9();
  const auto first = recs(A);
  const size_t a_lines = first.size();
  // The newest checkpoint a committed holds every merge it made (each is written before its broadcast). Its
  // records may lag it: a kill between a checkpoint and its merge record loses nothing.
  const std::optional<CommittedCheckpoint> ck = newest_checkpoint(A.string());
  ASSERT_TRUE(ck.has_value()) << a->log();
  const json newest = json::parse(read_file(ck->dir + "/manifest.json"));
  const int64_t n1 = newest.at("step").get<int64_t>();
  ASSERT_GE(n1, static_cast<int64_t>(of_kind(first, "merge").size())) << "a recorded merges its checkpoint lacks";
  ASSERT_GE(n1, 6);
  // Its hash now: once a leads again it checkpoints and prunes, and that checkpoint may be gone by the comparison.
  const std::string n1_hash = checkpoint_hash(A, n1);
  ASSERT_FALSE(n1_hash.empty());

  // ---- both come up as standbys: b fresh, a from its checkpoint ----
  Proc b(args({"syncer", "--standby", "--out", B.string()}), (dir / "b.log").string());
  a = std::make_unique<Proc>(args({"syncer", "--follow", "--resume", "--out", A.string()}), (dir / "a2.log").string());
  ASSERT_TRUE(wait_for([&] { return !of_kind(recs(A), "failover_merge").empty(); }, 60)) << a->log() << b.log();
  const auto took = of_kind(recs(A), "takeover");
  ASSERT_EQ(took.size(), 1u) << a->log();

  EXPECT_EQ(took[0]["epoch"], 2);
  EXPECT_EQ(took[0]["merges"], n1) << "a led from another state than its newest checkpoint";
  EXPECT_NE(took[0].value("detail", "").find("the pair had no leader"), std::string::npos) << took[0].dump();
  EXPECT_EQ(took[0]["model_hash"], n1_hash) << "a's model at its takeover is not its checkpoint's";
  ASSERT_TRUE(wait_for(
      [&] {
        for (const auto& j : of_kind(recs(B), "standby"))
          if (j.value("event", "") == "image") return true;
        return false;
      },
      30))
      << b.log();

  EXPECT_EQ(l0.wait(240), 0) << l0.log();
  EXPECT_EQ(l1.wait(60), 0) << l1.log();
  EXPECT_EQ(a->wait(60), 0) << a->log();
  EXPECT_EQ(b.wait(60), 0) << b.log();
  EXPECT_TRUE(of_kind(recs(B), "takeover").empty()) << "b, which held no state, led";
  EXPECT_TRUE(of_kind(recs(B), "merge").empty()) << b.log();

  // Merge versions run on across a's two terms: none lost, none repeated. The first term's records run on to at
  // most the checkpoint's versions; the second term continues from the checkpoint's.
  std::map<int64_t, int64_t> version;
  const auto ckpt_versions = newest.at("versions").get<std::vector<int64_t>>();
  const auto all = recs(A);
  bool led = false;
  size_t second_term = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const json& j = all[i];
    if (i >= a_lines && j.value("kind", "") == "takeover") {
      led = true;
      for (size_t f = 0; f < ckpt_versions.size(); ++f) {
        EXPECT_LE(version[static_cast<int64_t>(f)], ckpt_versions[f]) << "fragment " << f;
        version[static_cast<int64_t>(f)] = ckpt_versions[f];
      }
    }
    if (j.value("kind", "") != "merge") continue;
    if (i >= a_lines) EXPECT_TRUE(led) << "a merged before it took over: " << j.dump();
    second_term += i >= a_lines;
    const int64_t f = j["fragment"], v = j["version"];
    EXPECT_EQ(v, version[f] + 1) << "fragment " << f << ": " << j.dump();
    version[f] = v;
  }
  EXPECT_GE(second_term, 4u);
  for (int n = 0; n < 2; ++n) {
    const auto l = json_lines(dir / ("learner-" + std::to_string(n) + ".jsonl"));
    versions_applied_once(l, n);
    EXPECT_TRUE(of_kind(l, "syncer_behind").empty()) << "learner " << n;
    const auto done = of_kind(l, "learner_done");
    ASSERT_EQ(done.size(), 1u) << "learner " << n;
    EXPECT_EQ(done[0].value("finished", false), true) << done[0].dump();
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
