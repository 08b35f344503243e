#include "run/live_view.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "records/record.h"

namespace deloco::run {
namespace live_view_cases {

StatusInput two_learners() {
  StatusInput in;
  in.elapsed = 118.7;
  in.steps = 1500;
  in.syncer.merges = 251;
  in.syncer.quorum = 1;
  in.syncer.val_loss = 1.50061;
  in.syncer.val_bpb = 2.16496;
  in.syncer.uptime = 0.9512;
  in.syncer_state.running = true;
  in.learners.resize(2);
  in.learners[0].step = 1500;
  in.learners[0].loss = 1.38;
  in.learner_states.resize(2);
  in.learner_states[0].done = true;
  in.learner_states[1].running = true;
  return in;
}

TEST(LiveView, StatusLines) {
  const auto lines = status_lines(two_learners());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "[ 1m58s] syncer up | merges 251 (last quorum 1) | val 1.5006 nats, 2.165 bpb | uptime 95% | rejects 0");
  EXPECT_EQ(lines[1], "  L0 1500/1500 1.380 done | L1 starting");
}

TEST(LiveView, ProcessStatesAndFourLearnersALine) {
  StatusInput in = two_learners();
  in.syncer_state.running = false;
  in.syncer.quorum = -1;
  in.syncer.uptime = NAN;
  in.learners.resize(5);
  in.learner_states.resize(5);
  in.learner_states[1].sigstopped = true;
  in.slow_learner = 4;
  auto lines = status_lines(in);
  EXPECT_EQ(lines[0], "[ 1m58s] syncer DOWN | merges 251 | val 1.5006 nats, 2.165 bpb | uptime - | rejects 0");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1], "  L0 1500/1500 1.380 done | L1 STOPPED | L2 DOWN | L3 DOWN");
  EXPECT_EQ(lines[2], "  L4 DOWN SLOW");
  in.stopping = true;
  lines = status_lines(in);
  EXPECT_NE(lines[0].find("syncer stopped |"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[2], "  L4 stopped SLOW");
}

TEST(LiveView, PlainOutputIsOneLinePerUpdateAndEventsAreStamped) {
  std::ostringstream out;
  LiveView view(out, /*tty=*/false, [] { return status_lines(two_learners()); }, [] { return 61.0; });
  view.event("learner-1 rejoined at step 40");
  view.draw();
  EXPECT_EQ(out.str(),
            "[ 1m01s] learner-1 rejoined at step 40\n"
            "[ 1m58s] syncer up | merges 251 (last quorum 1) | val 1.5006 nats, 2.165 bpb | uptime 95% | rejects 0 | "
            "L0 1500/1500 1.380 done | L1 starting\n");
}

// Every push accounted for under chaos: a learner process killed writes no learner_done, so its pushes are counted
// from its push and push_unsent records once it has exited; a process that wrote learner_done is counted from that
// alone (its records are not counted twice).
TEST(LiveView, AKilledProcessesPushesAreCountedFromItsRecords) {
  RejoinLog rejoins(1);
  RunRecords r(1, &rejoins, [](const std::string&) {});
  // Process 1: three pushes sent, one dropped while not joined, one superseded; then SIGKILL.
  for (int i = 0; i < 3; ++i) r.on_line(R"({"kind":"push","t":1,"fragment":0,"step":10})", 0);
  r.on_line(R"({"kind":"push_unsent","t":2,"fragment":1,"step":20,"reason":"not_joined"})", 0);
  r.on_line(R"({"kind":"push_unsent","t":2,"fragment":1,"step":30,"reason":"superseded","replaced_by":40})", 0);
  EXPECT_EQ(r.learners()[0].pushes.due, 0) << "nothing counted while the process runs";
  r.process_ended(0);
  // Process 2: two pushes and one left at the end, then its learner_done with its own counts.
  r.on_line(R"({"kind":"push","t":3,"fragment":0,"step":50})", 0);
  r.on_line(R"({"kind":"push","t":3,"fragment":1,"step":60})", 0);
  r.on_line(R"({"kind":"push_unsent","t":4,"fragment":0,"step":70,"reason":"at_end"})", 0);
  r.on_line(R"({"kind":"learner_done","step":70,"pushes_due":3,"pushes":2,"pushes_unsent_at_end":1})", 0);
  r.process_ended(0);
  const PushTally& p = r.learners()[0].pushes;
  EXPECT_EQ(p.due, 5 + 3);
  EXPECT_EQ(p.sent, 3 + 2);
  EXPECT_EQ(p.dropped, 1);
  EXPECT_EQ(p.superseded, 1);
  EXPECT_EQ(p.unsent_at_end, 1);
  EXPECT_EQ(p.processes, 2);
  EXPECT_EQ(p.from_records, 1);
}

TEST(LiveView, RecordsUpdateTheViewAndRaiseEvents) {
  std::vector<std::string> events;
  RejoinLog rejoins(2);
  RunRecords r(2, &rejoins, [&](const std::string& e) { events.push_back(e); });
  r.on_line(R"({"kind":"started","resumed":false})", -1);
  for (int m = 1; m <= 10; ++m) r.on_line(R"({"kind":"merge","merges":)" + std::to_string(m) + R"(,"quorum":2})", -1);
  r.on_line(R"({"kind":"learner","t":100,"step":50,"loss":2.5})", 1);
  rejoins.killed(1, 100.5);
  r.on_line(R"({"kind":"joined","t":103.0,"step":0,"resume_step":50})", 1);
  r.on_line(R"({"kind":"push","t":104.0})", 1);
  r.on_line(R"({"kind":"learner","step":"not a number"})", 0);  // ignored
  r.on_line("not json", 0);                                       // ignored
  r.on_line(R"({"kind":"learner_done","step":60})", 0);
  EXPECT_EQ(r.syncer().merges, 10);
  EXPECT_EQ(r.syncer().quorum, 2);
  EXPECT_EQ(r.syncer().starts, 1);
  EXPECT_EQ(r.learners()[1].step, 50);
  EXPECT_EQ(r.learners()[1].loss, 2.5);
  EXPECT_TRUE(r.learners()[0].finished);
  EXPECT_EQ(events, (std::vector<std::string>{"10 merges", "learner-1 rejoined 2.5 s after its kill, resuming at step 50",
                                              "learner-0 finished 60 steps"}));
  EXPECT_DOUBLE_EQ(rejoins.rejoin_seconds()["median"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(rejoins.recontribute_seconds()["max"].get<double>(), 3.5);
  EXPECT_EQ(next_milestone(10), 20);
  EXPECT_EQ(next_milestone(20), 50);
  EXPECT_EQ(next_milestone(50), 100);
}

TEST(LiveView, TailerReturnsOnlyCompleteLines) {
  const auto path = std::filesystem::temp_directory_path() / ("deloco_tailer_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  rec::RecordTailer t(path.string());
  std::vector<std::string> got;
  auto collect = [&](const std::string& l) { got.push_back(l); };
  t.poll(collect);  // no file yet
  std::ofstream(path, std::ios::app) << "one\ntw";
  t.poll(collect);
  EXPECT_EQ(got, (std::vector<std::string>{"one"}));
  std::ofstream(path, std::ios::app) << "o\nthree\n";
  t.poll(collect);
  EXPECT_EQ(got, (std::vector<std::string>{"one", "two", "three"}));
  std::filesystem::remove(path);
}

// Defect: the tailer held a whole record line however long (a 1 GB line: bad_alloc in `deloco run`). A line over
// its bound is skipped, also when it arrives over several polls, and the lines around it are read.
TEST(LiveView, TailerSkipsALineOverItsBound) {
  const auto path = std::filesystem::temp_directory_path() / ("deloco_tailer_long_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  rec::RecordTailer t(path.string(), /*max_line=*/16);
  std::vector<std::string> got;
  auto collect = [&](const std::string& l) { got.push_back(l); };
  std::ofstream(path, std::ios::app) << "short\n" << std::string(40, 'x') << "\nafter\n" << std::string(10, 'y');
  t.poll(collect);
  EXPECT_EQ(got, (std::vector<std::string>{"short", "after"}));
  EXPECT_EQ(t.skipped(), 1);
  std::ofstream(path, std::ios::app) << std::string(10, 'y');  // the unfinished line passes the bound
  t.poll(collect);
  std::ofstream(path, std::ios::app) << "yyy\n" << std::string(16, 'z') << "\n";  // exactly the bound: a line
  t.poll(collect);
  EXPECT_EQ(got, (std::vector<std::string>{"short", "after", std::string(16, 'z')}));
  EXPECT_EQ(t.skipped(), 2);
  std::filesystem::remove(path);
}

// Defect: the live view's own tailer read a record file on from its old offset after the file was cut short
// (nothing more was read until it grew past that offset) or replaced at its path (the new file's lines were read
// from the middle). `deloco run` tails with rec::RecordTailer, which reads such a file again from its start.
TEST(LiveView, TailerReadsATruncatedOrRotatedFileAgainFromItsStart) {
  const auto path = std::filesystem::temp_directory_path() / ("deloco_tailer_rot_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  rec::RecordTailer t(path.string());
  std::vector<std::string> got;
  auto collect = [&](const std::string& l) { got.push_back(l); };
  std::ofstream(path, std::ios::app) << "first\nsecond\n";
  t.poll(collect);
  std::ofstream(path, std::ios::trunc) << "new\n";  // truncated: shorter than what was read
  t.poll(collect);
  EXPECT_EQ(got, (std::vector<std::string>{"first", "second", "new"}));
  std::ofstream(path.string() + ".next") << "rotated one\nrotated two\n";  // longer than the file it replaces
  std::filesystem::rename(path.string() + ".next", path);
  t.poll(collect);
  EXPECT_EQ(got, (std::vector<std::string>{"first", "second", "new", "rotated one", "rotated two"}));
  EXPECT_EQ(t.restarts(), 2);
  std::filesystem::remove(path);
}

// Defect: event lines quote records (a reject reason) and went to the terminal as they were: an escape sequence
// in a record could clear or recolour it.
TEST(LiveView, EventLinesWriteControlCharactersAsQuestionMarks) {
  std::ostringstream out;
  LiveView view(out, /*tty=*/false, [] { return status_lines(two_learners()); }, [] { return 1.0; });
  view.event("learner-0 was rejected: \x1b[2J\x1b]0;title\x07 gone\nfake line");
  EXPECT_EQ(out.str(), "[    1s] learner-0 was rejected: ?[2J?]0;title? gone?fake line\n");
}

// A sharded syncer: the shards' records are summed — merges and rejects added, uptime the lowest, the validation
// loss shard 0's — and the status line says how many shards are up.
TEST(LiveView, ShardedSyncerRecordsAreSummed) {
  std::vector<std::string> events;
  RejoinLog rejoins(1);
  RunRecords r(1, &rejoins, [&](const std::string& e) { events.push_back(e); }, 2);
  r.on_line(R"({"kind":"merge","merges":6,"quorum":1,"t":1})", -1, 0);
  r.on_line(R"({"kind":"merge","merges":5,"quorum":2,"t":1})", -1, 1);
  r.on_line(R"({"kind":"status","uptime":0.9,"rejected":1,"t":1})", -1, 0);
  r.on_line(R"({"kind":"status","uptime":0.8,"rejected":2,"t":1})", -1, 1);
  r.on_line(R"({"kind":"eval","val_loss":2.5,"val_bpb":3.6,"merges":6,"t":1})", -1, 0);
  r.on_line(R"({"kind":"started","resumed":true,"merges":5,"t":1})", -1, 1);
  const SyncerView v = r.syncer();
  EXPECT_EQ(v.merges, 11);
  EXPECT_EQ(v.quorum, 2);
  EXPECT_EQ(v.rejected, 3);
  EXPECT_DOUBLE_EQ(v.uptime, 0.8);
  EXPECT_DOUBLE_EQ(v.val_loss, 2.5);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0], "11 merges");  // the first milestone (10) passed by the shards together
  EXPECT_EQ(events.back(), "syncer shard 1 resumed at 5 merges");
  // A learner joins both shards: one join, not a rejoin.
  r.on_line(R"({"kind":"joined","step":0,"t":2})", 0);
  r.on_line(R"({"kind":"joined","step":0,"shard":1,"t":2})", 0);
  EXPECT_EQ(r.learners()[0].joins, 1);
  // Killed and restarted: the first shard it joins announces the rejoin, the second says nothing more.
  rejoins.killed(0, 3);
  events.clear();
  r.on_line(R"({"kind":"joined","step":5,"shard":1,"t":4})", 0);
  r.on_line(R"({"kind":"joined","step":5,"t":4.5})", 0);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], "learner-0 rejoined 1.0 s after its kill, resuming at step 5");
  EXPECT_EQ(r.learners()[0].joins, 2);
  StatusInput in = two_learners();
  in.shards = 2;
  in.shards_up = 1;
  in.syncer_state.running = false;
  EXPECT_EQ(status_lines(in)[0].substr(0, 40), "[ 1m58s] syncer 1/2 shards up | merges 2");
}

// Issue 29: what the runtime now says reaches the live view — learners all blocked (the status line says so, not
// just "up"), a learner refused by a syncer's allow-list, a dropped drift, and a learner_done that is no finish.
TEST(LiveView, BlockedLearnersRefusedKeysAndUnfinishedEndsAreShown) {
  RejoinLog rejoins(2);
  std::vector<std::string> events;
  RunRecords r(2, &rejoins, [&](const std::string& e) { events.push_back(e); });
  // A loopback syncer's started record carries an empty warning: no WARNING line for it.
  r.on_line(R"({"kind":"started","metrics_port":9463,"metrics_warning":"","t":8})", -1);
  for (const auto& e : events) EXPECT_EQ(e.find("WARNING"), std::string::npos) << e;
  r.on_line(R"j({"kind":"started","metrics_port":9464,"metrics_warning":"the metrics server listens on every interface (0.0.0.0:9464)","t":9})j", -1);
  r.on_line(R"({"kind":"learners_blocked","learners":[0,1],"t":10})", -1);
  r.on_line(R"({"kind":"status","blocked":true,"uptime":0.9,"t":11})", -1);
  EXPECT_TRUE(r.syncer().blocked);
  StatusInput in = two_learners();
  in.syncer = r.syncer();
  EXPECT_NE(status_lines(in)[0].find("syncer up, LEARNERS BLOCKED |"), std::string::npos) << status_lines(in)[0];
  r.on_line(R"({"kind":"status","blocked":false,"uptime":0.9,"t":12})", -1);
  EXPECT_FALSE(r.syncer().blocked);
  r.on_line(R"({"kind":"auth_refused","refusals":4,"detail":"the syncer shard 1 refused this learner's CURVE key","t":13})", 1);
  r.on_line(R"({"kind":"drift_dropped","fragment":3,"t":14})", 0);
  r.on_line(R"({"kind":"learner_done","step":40,"finished":false,"error":"shard 1 refused it","t":15})", 1);
  EXPECT_FALSE(r.learners()[1].finished);
  r.on_line(R"({"kind":"learner_done","step":40,"finished":true,"t":16})", 0);
  EXPECT_TRUE(r.learners()[0].finished);
  const std::string all = [&] {
    std::string s;
    for (const auto& e : events) s += e + "\n";
    return s;
  }();
  EXPECT_NE(all.find("syncer: every connected learner stopped advancing"), std::string::npos) << all;
  EXPECT_NE(all.find("learner-1: the syncer shard 1 refused this learner's CURVE key (4 refusals)"), std::string::npos) << all;
  EXPECT_NE(all.find("learner-0 dropped its drift of fragment 3"), std::string::npos) << all;
  EXPECT_NE(all.find("learner-1 ended at step 40 without finishing: shard 1 refused it"), std::string::npos) << all;
  EXPECT_NE(all.find("learner-0 finished 40 steps"), std::string::npos) << all;
  EXPECT_NE(all.find("WARNING: the metrics server listens on every interface (0.0.0.0:9464)"), std::string::npos) << all;
}

// A standby pair (syncer.standby): the view follows who leads from the takeover records of either syncer, and says
// so in the status line and in events.
TEST(LiveView, AStandbyPairShowsWhichSyncerLeads) {
  std::vector<std::string> events;
  RejoinLog rejoins(2);
  RunRecords r(2, &rejoins, [&](const std::string& e) { events.push_back(e); });
  r.set_pairs();
  EXPECT_EQ(r.syncer().leader, "primary");
  r.on_line(R"({"kind":"merge","merges":7,"quorum":2,"t":1})", -1);
  r.on_line(R"({"kind":"started","resumed":false,"metrics_port":4321,"t":1})", -1, 0, true);  // no restart
  EXPECT_EQ(r.syncer().starts, 0);
  EXPECT_TRUE(events.empty());  // nor its dashboard, until it leads
  r.on_line(R"({"kind":"takeover","epoch":2,"merges":7,"silent_seconds":1.004,"rounds_checked":12,"mismatches":0,"t":2})",
            -1, 0, true);
  r.on_line(R"({"kind":"failover_merge","epoch":2,"seconds_after_takeover":0.05,"t":2.1})", -1, 0, true);
  r.on_line(R"({"kind":"merge","merges":8,"quorum":2,"t":2.1})", -1, 0, true);
  EXPECT_EQ(r.syncer().leader, "standby");
  EXPECT_EQ(r.syncer().epoch, 2);
  EXPECT_EQ(r.syncer().merges, 8);
  ASSERT_GE(events.size(), 3u);
  EXPECT_NE(events[events.size() - 3].find("syncer (standby) took over (epoch 2) after 1.00 s"), std::string::npos)
      << events[events.size() - 3];
  EXPECT_EQ(events[events.size() - 2], "dashboard: http://127.0.0.1:4321/");
  EXPECT_NE(events.back().find("first merge 0.05 s after the takeover"), std::string::npos) << events.back();
  r.on_line(R"({"kind":"step_down","epoch":2,"newer_epoch":3,"merges":9,"t":3})", -1, 0, true);
  EXPECT_NE(events.back().find("stepped down: a leader of epoch 3 exists"), std::string::npos) << events.back();
  StatusInput in;
  in.syncer = r.syncer();
  in.syncer_state = ProcessState{true, false, false};
  EXPECT_NE(status_lines(in)[0].find("syncer up (standby leads, epoch 2)"), std::string::npos) << status_lines(in)[0];
}

// Whether the other syncer of a pair follows the leader (chaos kills a pair's leader only then): after an image
// applied since the leader took over, until it stops following. The two syncers' files are read in turn, so an
// image read before the takeover it followed still counts, by the records' times.
TEST(LiveView, APairsReplicaIsReadyOnlyWhileTheOtherSyncerFollowsTheLeader) {
  RejoinLog rejoins(2);
  RunRecords r(2, &rejoins, [](const std::string&) {});
  r.set_pairs();
  EXPECT_FALSE(r.shard(0).replica_ready());  // the standby has no image yet
  r.on_line(R"({"kind":"standby","event":"image","epoch":1,"t":1.5})", -1, 0, true);
  EXPECT_TRUE(r.shard(0).replica_ready());
  r.on_line(R"({"kind":"standby","event":"gap","epoch":1,"t":2})", -1, 0, true);
  EXPECT_FALSE(r.shard(0).replica_ready());
  r.on_line(R"({"kind":"standby","event":"image","epoch":1,"t":2.5})", -1, 0, true);
  EXPECT_TRUE(r.shard(0).replica_ready());
  r.on_line(R"({"kind":"standby","event":"dropped","epoch":1,"t":3})", -1, 0, false);  // the leader dropped it
  EXPECT_FALSE(r.shard(0).replica_ready());
  r.on_line(R"({"kind":"standby","event":"image","epoch":1,"t":3.5})", -1, 0, true);
  EXPECT_TRUE(r.shard(0).replica_ready());
  // The leader is killed and the standby takes over: the restarted primary's image (t 6) is read before the
  // takeover record (t 5) that it followed.
  r.on_line(R"({"kind":"standby","event":"image","epoch":2,"t":6})", -1, 0, false);
  r.on_line(R"({"kind":"takeover","epoch":2,"merges":7,"silent_seconds":1,"rounds_checked":3,"mismatches":0,"t":5})",
            -1, 0, true);
  EXPECT_EQ(r.shard(0).leader, "standby");
  EXPECT_EQ(r.shard(0).epoch, 2);
  EXPECT_TRUE(r.shard(0).replica_ready());
  // A later takeover by the primary: its standby's image from before does not count.
  r.on_line(R"({"kind":"takeover","epoch":3,"merges":9,"silent_seconds":1,"rounds_checked":3,"mismatches":0,"t":8})",
            -1, 0, false);
  EXPECT_EQ(r.shard(0).leader, "primary");
  EXPECT_FALSE(r.shard(0).replica_ready());
  // An older takeover read late changes nobody's role.
  r.on_line(R"({"kind":"takeover","epoch":2,"merges":7,"silent_seconds":1,"rounds_checked":3,"mismatches":0,"t":5})",
            -1, 0, true);
  EXPECT_EQ(r.shard(0).leader, "primary");
  EXPECT_EQ(r.shard(0).epoch, 3);
  r.on_line(R"({"kind":"standby","event":"image","epoch":3,"t":9})", -1, 0, true);
  EXPECT_TRUE(r.shard(0).replica_ready());
}

}  // namespace
}  // namespace deloco::run
