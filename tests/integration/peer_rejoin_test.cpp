// Rejoin from peers (issue 34, docs/reliability.md) with real processes over the real transport: a restarted learner
// fetches its download from the learners that serve the state (net.serve) and from the syncer, each chunk checked
// against the syncer's hash of it. A donor that serves corrupted chunks (learner.serve_corrupt, the fault drill) is
// caught, reported and used no more; the download still verifies and training goes on.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "support/jsonl.h"
#include "support/proc.h"

namespace deloco {
namespace peer_rejoin_cases {
namespace fs = std::filesystem;
using nlohmann::json;
using test::Proc;
using test::records;
using test::wait_for;

TEST(PeerRejoin, ARestartedLearnerFetchesFromDonorsAndCatchesALiar) {
  const std::string src = test::source_dir();
  ASSERT_TRUE(fs::exists(src + "/data/sotu")) << "run scripts/setup.sh first: the corpus is missing";
  const fs::path dir = fs::temp_directory_path() / ("deloco_peers_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::string> common = {
      "--config", src + "/configs/tiny.toml", "--set", "data.path=" + src + "/data/sotu", "--set", "net.plaintext=true",
      "--set", "net.address=ipc://" + (dir / "s.sock").string(), "--set", "sync.learners=4", "--set", "sync.quorum=4",
      "--set", "sync.fragments=2", "--set", "sync.sync_every=60", "--set", "sync.wait_for_answer=false",
      "--set", "net.broadcast_encoding=fp32", "--set", "net.chunk_bytes=4096", "--set", "train.steps=2500",
      "--set", "train.threads=1", "--set", "syncer.eval_interval=0", "--set", "syncer.metrics=", "--set",
      "learner.slowdown=2"};
  // K = M = 4: no merge happens while learner 3 is down, so at its restart every donor holds the versions of the
  // syncer's welcome (with K = 3 a merge just before the restart left donors a broadcast behind; one waiting for it
  // served nothing before the download ended, and the liar was, once, never asked in time to be caught).
  const auto args = [&](std::vector<std::string> a, int id) {
    a.insert(a.end(), common.begin(), common.end());
    a.insert(a.end(), {"--set", "net.serve=ipc://" + (dir / ("serve-" + std::to_string(id) + ".sock")).string()});
    return a;
  };
  // The syncer sends its share of a download at 0.1 Mbit/s (the uplink a real syncer keeps for merging, scaled to
  // the tiny model: alone it would take about 20 s for the 282 KB); the donors are unbounded, so they serve most of
  // it, also when one waits the up to 5 s a donor gives a broadcast it has not yet received (at 2 Mbit/s, under a
  // loaded machine, the syncer once answered first for more than half the chunks).
  Proc syncer(args({"syncer", "--out", (dir / "syncer").string(), "--set", "net.serve_rate=0.1"}, 9),
              (dir / "syncer.log").string());
  std::vector<std::unique_ptr<Proc>> l;
  for (int n = 0; n < 4; ++n) {
    std::vector<std::string> a = args({"learner", "--id", std::to_string(n), "--out", dir.string()}, n);
    if (n == 1) a.insert(a.end(), {"--set", "learner.serve_corrupt=true"});  // the liar
    l.push_back(std::make_unique<Proc>(a, (dir / ("l" + std::to_string(n) + ".log")).string()));
  }
  const fs::path l3 = dir / "learner-3.jsonl";
  ASSERT_TRUE(wait_for([&] { return records(dir / "syncer" / "syncer.jsonl", "merge").size() >= 6; }, 120)) << syncer.log();
  l[3]->kill9();
  l[3] = std::make_unique<Proc>(args({"learner", "--id", "3", "--out", dir.string()}, 3), (dir / "l3b.log").string());
  ASSERT_TRUE(wait_for([&] { return records(l3, "joined").size() >= 2; }, 60)) << l[3]->log();
  const json joined = records(l3, "joined").back();
  std::printf("the restarted learner's download: %s\n", joined.dump().c_str());
  EXPECT_GT(joined.value("download_bytes", int64_t{0}), 0) << joined.dump();
  EXPECT_EQ(joined.value("donors", int64_t{0}), 3) << joined.dump();  // learners 0, 1 and 2
  EXPECT_GT(joined.value("peer_bytes", int64_t{0}), 0) << joined.dump();
  EXPECT_GT(joined.value("peer_bytes", int64_t{0}), joined.value("download_bytes", int64_t{0}) / 2) << joined.dump();
  EXPECT_EQ(joined.value("donors_lied", int64_t{-1}), 1) << joined.dump();
  // Where the time went: each chunk counted once, at the source whose answer came first (the syncer, then donors).
  const auto per_source = joined.value("source_chunks", std::vector<int64_t>{});
  ASSERT_EQ(per_source.size(), 4u) << joined.dump();
  int64_t chunks = 0;
  for (int64_t c : per_source) chunks += c;
  EXPECT_EQ(chunks, (joined.value("download_bytes", int64_t{0}) + 4095) / 4096) << joined.dump();
  EXPECT_EQ(joined.value("source_first_seconds", std::vector<double>{}).size(), 4u) << joined.dump();
  // Caught by this download (and by the first process's, which fetched from the liar too), always learner 1.
  const auto lies = records(l3, "peer_lied");
  ASSERT_GE(lies.size(), 1u);
  for (const auto& lie : lies) EXPECT_EQ(lie["donor"], 1) << lie.dump();
  EXPECT_GT(lies.back()["t"].get<double>(), records(l3, "joined").front()["t"].get<double>());

  for (auto& p : l) EXPECT_EQ(p->wait(240), 0) << p->log();
  EXPECT_EQ(syncer.wait(60), 0) << syncer.log();
  // The donors that told the truth served chunks; the liar's were refused at the joiner.
  int64_t served = 0;
  for (int n : {0, 2}) {
    const auto done = records(dir / ("learner-" + std::to_string(n) + ".jsonl"), "learner_done");
    ASSERT_EQ(done.size(), 1u);
    served += done[0].value("served_chunks", int64_t{0});
  }
  EXPECT_GT(served, 0);
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
