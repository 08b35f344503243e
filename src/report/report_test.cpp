// ReportRunReader: a folder read as it grows gives exactly what one whole read gives, at every moment; hostile
// records (long lines, absurd times, mistyped summaries) are skipped by name and bound nothing.
// report_data's thinning of long series (what the live dashboard serves); the page's data block; the gnuplot
// scripts of write_report_pngs.
#include "report/report.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "util/fs.h"
#include "util/shell.h"

namespace deloco {
namespace report_cases {
namespace fs = std::filesystem;

class ReportReader : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("deloco-report-reader-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "shard-1");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void append(const std::string& file, const std::string& text) {
    std::ofstream(dir_ / file, std::ios::app | std::ios::binary) << text;
  }
  // The reader's view and a whole read's, as the JSON the dashboard serves.
  void expect_same(ReportRunReader& reader, const char* when) {
    const nlohmann::json incremental = report_data({reader.load()});
    const nlohmann::json whole = report_data({load_report_run(dir_.string())});
    EXPECT_EQ(incremental, whole) << when;
  }
  fs::path dir_;
};

TEST_F(ReportReader, AGrowingFolderReadsAsAWholeReadAtEveryStep) {
  ReportRunReader reader(dir_.string());
  append("syncer.jsonl", R"({"kind":"started","t":100.0,"resumed":false})" "\n"
                         R"({"kind":"status","t":101.0,"connected":[0,1],"merges":0,"uptime":1.0})" "\n");
  append("learner-0.jsonl", R"({"kind":"learner","t":100.5,"step":10,"loss":5.5,"tokens":1000})" "\n");
  expect_same(reader, "first records");
  // New lines in old files, a new learner file, a shard's syncer, a garbage line and a torn last line.
  append("syncer.jsonl", R"({"kind":"merge","t":102.0,"learners":[0,1],"grace_wait":0.25})" "\n"
                         R"({"kind":"eval","t":102.5,"val_loss":4.9,"val_bpb":1.7,"tokens":2000})" "\n"
                         "not json\n");
  append("learner-0.jsonl", R"({"kind":"learner","t":101.5,"step":20,"loss":5.1,"tokens":2000})" "\n");
  append("learner-1.jsonl", R"({"kind":"learner","t":101.7,"step":20,"loss":5.2,"tokens":2000})" "\n"
                            R"({"kind":"learner","t":102.7,"step":30,"lo)");
  append("shard-1/syncer.jsonl", R"({"kind":"chaos","t":102.2,"what":"chaos: SIGKILL learner 1"})" "\n");
  expect_same(reader, "after appends, with a torn last line");
  const ReportRun mid = reader.load();
  EXPECT_EQ(mid.bad_lines, 2);  // the garbage line and the torn one, as it stands
  EXPECT_EQ(mid.merges.size(), 1u);
  EXPECT_EQ(mid.learners.at(1).size(), 1u);
  // The torn line completes; a record that was whole but had no newline yet counts once it has one.
  append("learner-1.jsonl", R"(ss":5.0,"tokens":3000})" "\n" R"({"kind":"learner_done","t":103.0})");
  expect_same(reader, "the torn line completed, a last record without its newline");
  const ReportRun late = reader.load();
  EXPECT_EQ(late.learners.at(1).size(), 2u);
  EXPECT_EQ(late.learner_now.at(1).state, "done");
  EXPECT_EQ(late.bad_lines, 1);
  append("learner-1.jsonl", "\n");
  append("summary.json", R"({"command":"run","final_val_loss":4.8,"uptime":0.9})");
  expect_same(reader, "finished");
}

// A standby pair (syncer.standby): the standby's records (RUN/standby, RUN/shard-s/standby) are the run's too — its
// merges after a takeover, and the takeover itself as an event, so the report and the dashboard say who leads.
TEST_F(ReportReader, AStandbySyncersRecordsAreTheRunsToo) {
  append("syncer.jsonl", R"({"kind":"merge","t":1.0,"learners":[0,1],"quorum":2})" "\n");
  fs::create_directories(dir_ / "standby");
  fs::create_directories(dir_ / "shard-1" / "standby");
  append("standby/syncer.jsonl",
         R"({"kind":"takeover","t":3.0,"epoch":2,"merges":1,"rounds_checked":4,"mismatches":0,"silent_seconds":1.0})" "\n"
         R"({"kind":"merge","t":3.1,"learners":[0,1],"quorum":2})" "\n");
  append("shard-1/standby/syncer.jsonl", R"({"kind":"merge","t":3.2,"learners":[1],"quorum":1})" "\n"
                                         R"({"kind":"step_down","t":3.3,"epoch":1,"newer_epoch":2,"merges":0})" "\n");
  const ReportRun r = load_report_run(dir_.string());
  EXPECT_EQ(r.merges.size(), 3u);
  std::vector<std::string> texts;
  for (const auto& [t, text] : r.events) texts.push_back(text);
  EXPECT_NE(std::find(texts.begin(), texts.end(), "standby syncer took over: epoch 2 (4 rounds checked, 0 differed)"),
            texts.end())
      << nlohmann::json(texts).dump();
  EXPECT_NE(std::find(texts.begin(), texts.end(), "a syncer of epoch 1 stepped down (fenced by epoch 2)"), texts.end())
      << nlohmann::json(texts).dump();
}

// net.encoding = auto: every codec change is an event of the report and the dashboard.
TEST_F(ReportReader, CodecChangesAreEvents) {
  append("syncer.jsonl",
         R"({"kind":"codec_changed","t":1.0,"scope":"learner","learner":1,"push":"int8","broadcast":"int4","period":40,"fits":true})" "\n"
         R"({"kind":"codec_changed","t":1.5,"scope":"broadcast","push":"","broadcast":"int4","previous":"topk2"})" "\n"
         R"({"kind":"codec_changed","t":2.0,"scope":"learner","learner":0,"push":"topk2","broadcast":"topk2","period":90,"fits":false})" "\n");
  const ReportRun r = load_report_run(dir_.string());
  std::vector<std::string> texts;
  for (const auto& [t, text] : r.events) texts.push_back(text);
  EXPECT_EQ(texts, (std::vector<std::string>{"learner 1 codecs int8/int4", "broadcast codec topk2 -> int4",
                                             "learner 0 codecs topk2/topk2, period stretched to 90"}))
      << nlohmann::json(texts).dump();
}

TEST_F(ReportReader, AFileThatShrankIsReadAgainFromItsStart) {
  ReportRunReader reader(dir_.string());
  append("syncer.jsonl", R"({"kind":"merge","t":1.0,"learners":[0]})" "\n" R"({"kind":"merge","t":2.0,"learners":[0]})" "\n");
  EXPECT_EQ(reader.load().merges.size(), 2u);
  std::ofstream(dir_ / "syncer.jsonl", std::ios::trunc) << R"({"kind":"merge","t":5.0,"learners":[0,1]})" "\n";
  const ReportRun r = reader.load();
  ASSERT_EQ(r.merges.size(), 1u);
  EXPECT_EQ(r.merges[0][1], 2.0);
  expect_same(reader, "after the rewrite");
}

// Defect: a record file replaced by another at its path (rotated: written to a new file, renamed over the old one)
// was read on from the old file's offset, in the middle of the new file's lines, as long as it was not shorter. It
// is read again from its start, as a whole read reads it.
TEST_F(ReportReader, AFileReplacedAtItsPathIsReadAgainFromItsStart) {
  ReportRunReader reader(dir_.string());
  append("syncer.jsonl", R"({"kind":"merge","t":1.0,"learners":[0]})" "\n" R"({"kind":"merge","t":2.0,"learners":[0]})" "\n");
  EXPECT_EQ(reader.load().merges.size(), 2u);
  {
    std::ofstream out(dir_ / "syncer.jsonl.new", std::ios::binary);
    for (int i = 0; i < 3; ++i) out << R"({"kind":"merge","t":)" << 5 + i << R"(,"quorum":2,"learners":[0,1]})" "\n";
  }
  fs::rename(dir_ / "syncer.jsonl.new", dir_ / "syncer.jsonl");
  const ReportRun r = reader.load();
  EXPECT_EQ(r.bad_lines, 0);
  ASSERT_EQ(r.merges.size(), 3u);
  for (const auto& m : r.merges) EXPECT_EQ(m[1], 2.0);
  expect_same(reader, "after the rotation");
}

TEST_F(ReportReader, AFolderWithoutRecordsOrSummaryIsRefusedByName) {
  ReportRunReader reader(dir_.string());
  try {
    reader.load();
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no summary.json and no records"), std::string::npos) << e.what();
  }
}

TEST_F(ReportReader, EachLearnersStateFollowsItsLastRecordsAndTheSyncersStatus) {
  ReportRunReader reader(dir_.string());
  append("syncer.jsonl", R"({"kind":"status","t":10,"connected":[0,2,3,5]})" "\n");
  append("learner-0.jsonl", R"({"kind":"learner","t":9,"loss":5.0})" "\n" R"({"kind":"joined"})" "\n");
  append("learner-1.jsonl", R"({"kind":"learner","t":9,"loss":5.0})" "\n");
  append("learner-2.jsonl", R"({"kind":"learner","t":8,"loss":5.0})" "\n" R"({"kind":"joi)");
  append("learner-3.jsonl", R"({"kind":"joined","t":8})" "\n" R"({"kind":"learner","t":9,"loss":5.0})" "\n");
  append("learner-4.jsonl", R"({"kind":"learner","t":9,"loss":5.0})" "\n");
  append("learner-5.jsonl", R"({"kind":"learner","t":9,"loss":5.0})" "\n" R"({"kind":"welcome","t":10})" "\n");
  expect_same(reader, "learner 2's joined record torn");
  ReportRun r = reader.load();
  EXPECT_EQ(r.learner_now.at(2).state, "training");
  // The joined record completes and a push follows (pushes and applies do not change a learner's state); learner 4
  // finishes.
  append("learner-2.jsonl", R"(ned","t":11})" "\n" R"({"kind":"push","t":12})" "\n");
  append("learner-4.jsonl", R"({"kind":"learner_done","t":10})" "\n");
  expect_same(reader, "learner 2 rejoining");
  r = reader.load();
  EXPECT_EQ(r.learner_now.at(0).state, "training");  // a record without a time changes nothing
  EXPECT_EQ(r.learner_now.at(1).state, "down");      // not in the status's connected list
  EXPECT_EQ(r.learner_now.at(2).state, "rejoining");
  EXPECT_EQ(r.learner_now.at(3).state, "training");  // a training record after its joined record
  EXPECT_EQ(r.learner_now.at(4).state, "done");
  EXPECT_EQ(r.learner_now.at(5).state, "rejoining");  // welcomed: its state download is under way
  EXPECT_EQ(r.learners.at(0)[0][0], 1.0);  // time from the run's first record (t = 8), of whatever kind
}

TEST_F(ReportReader, AFolderWhoseRecordsHaveNoTimeIsAFolderOfRecords) {
  append("syncer.jsonl", R"({"kind":"hello"})" "\n");
  const ReportRun r = ReportRunReader(dir_.string()).load();
  EXPECT_TRUE(r.learners.empty());
  EXPECT_EQ(r.bad_lines, 0);
}

TEST_F(ReportReader, AFieldOfAnUnexpectedTypeIsReadAsMissingNotAnError) {
  append("syncer.jsonl", R"({"kind":"started","t":1,"resumed":"yes"})" "\n"
                         R"({"kind":"started","t":1.5,"resumed":true,"shard":1,"shards":"two"})" "\n"
                         R"({"kind":"merge","t":2,"learners":[0],"grace_wait":"long"})" "\n"
                         R"({"kind":"status","t":3,"shard":"x","connected":[0,"one",1],"uptime":"high"})" "\n"
                         R"({"kind":"fail","t":4,"learner":"z"})" "\n"
                         R"({"kind":"reject","t":5,"reason":7})" "\n"
                         R"({"kind":"eval","t":6,"val_loss":"low"})" "\n"
                         R"({"kind":"eval","t":7,"val_loss":4.5,"tokens":"many"})" "\n");
  append("learner-1.jsonl", R"({"kind":"learner","t":2,"learner":"me","step":"ten","loss":5.0})" "\n");
  ReportRunReader reader(dir_.string());
  ReportRun r;
  ASSERT_NO_THROW(r = reader.load());
  EXPECT_EQ(r.bad_lines, 0);
  ASSERT_EQ(r.events.size(), 2u);  // the resumed syncer (shards unreadable: no shard named) and the failure
  EXPECT_EQ(r.events[0].second, "syncer resumed");
  EXPECT_EQ(r.events[1].second, "fail learner -1");
  ASSERT_EQ(r.merges.size(), 1u);
  EXPECT_EQ(r.merges[0][1], 1.0);
  EXPECT_EQ(r.merges[0][2], 0.0);
  EXPECT_TRUE(r.rejects.empty());
  ASSERT_EQ(r.evals.size(), 1u);
  EXPECT_EQ(r.evals[0][1], 0.0);
  ASSERT_EQ(r.learners.at(1).size(), 1u);  // the file's learner, step read as 0
  EXPECT_EQ(r.learners.at(1)[0][1], 0.0);
  EXPECT_EQ(r.learner_now.at(1).state, "training");  // learner 1 is in the status's connected list
  EXPECT_EQ(r.summary["uptime"], 1.0);
}

// Defect: a merge at t = 1e8 after an eval at t = 100 made a bucket per minute of the span (441 MB); t = 1e300
// converted an out-of-range double to size_t. Absurd times are now skipped by name; the buckets stay bounded.
TEST_F(ReportReader, AnAbsurdTimeIsSkippedByNameAndTheSpanBoundsNothing) {
  append("syncer.jsonl", R"({"kind":"eval","t":100,"val_loss":5.0,"val_bpb":1.5})" "\n"
                         R"({"kind":"merge","t":1e8,"learners":[0]})" "\n"
                         R"({"kind":"merge","t":1e300,"learners":[0]})" "\n"
                         R"({"kind":"merge","t":-5,"learners":[0]})" "\n"
                         R"({"kind":"merge","t":1e999,"learners":[0]})" "\n"
                         R"({"kind":"merge","t":200,"learners":[0]})" "\n");
  ReportRunReader reader(dir_.string());
  const ReportRun r = reader.load();
  EXPECT_EQ(r.bad_times, 2);
  EXPECT_EQ(r.bad_lines, 1);       // 1e999 is no JSON number (out of a double's range): not a record
  ASSERT_EQ(r.merges.size(), 2u);  // t = 1e8 is a possible time; only the span is odd
  ASSERT_GE(r.notes.size(), 3u);
  EXPECT_EQ(r.notes[0], "syncer.jsonl line 3: time 1e+300 is not a finite time in [0, 1e+10] s; record skipped");
  EXPECT_NE(r.notes[1].find("line 4: time -5 is not"), std::string::npos) << r.notes[1];
  EXPECT_EQ(r.notes[2], "syncer.jsonl line 5: not a JSON object with a string \"kind\"; skipped");
  for (size_t max_points : {size_t{100}, size_t{2000}}) {
    const nlohmann::json d = report_data({r}, max_points)[0];
    EXPECT_LE(d["merge_rate"].size(), max_points);
    EXPECT_LT(d.dump().size(), 200u * max_points);
    EXPECT_EQ(d["bad_times"], 2);
  }
  EXPECT_LE(report_data({r}, 0)[0]["merge_rate"].size(), 20u);  // 0: at most max(20, merges) buckets
  expect_same(reader, "after the absurd times");
}

// Defect: a 200 MB record line cost 1.65 GB (whole chunk, line copy and parse). A line over kMaxRecordLine is now
// skipped as it is read, in pieces over several polls too, and counted by name; the records around it are read.
TEST_F(ReportReader, ALineOverTheBoundIsSkippedAndCountedNotHeld) {
  ReportRunReader reader(dir_.string());
  append("learner-0.jsonl", R"({"kind":"learner","t":1,"step":1,"loss":5.0})" "\n");
  const std::string what(kMaxRecordLine + 100, 'x');
  const std::string line = R"({"kind":"chaos","t":2,"what":")" + what + "\"}";
  append("learner-0.jsonl", line.substr(0, kMaxRecordLine / 2));
  expect_same(reader, "half of the long line");
  EXPECT_EQ(reader.load().long_lines, 0);
  append("learner-0.jsonl", line.substr(kMaxRecordLine / 2, kMaxRecordLine / 2 + 50));
  expect_same(reader, "the long line past the bound, unfinished");
  ReportRun r = reader.load();
  EXPECT_EQ(r.long_lines, 1);  // counted as it stands, like a torn line
  EXPECT_EQ(r.bad_lines, 0);
  append("learner-0.jsonl", line.substr(kMaxRecordLine + 50) + "\n" R"({"kind":"learner","t":3,"step":2,"loss":4.0})" "\n");
  expect_same(reader, "the long line finished");
  r = reader.load();
  EXPECT_EQ(r.long_lines, 1);
  EXPECT_TRUE(r.events.empty());  // the chaos record was never read
  ASSERT_EQ(r.learners.at(0).size(), 2u);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0], "learner-0.jsonl line 2: " + std::to_string(line.size()) +
                            " bytes, over the 1 MiB bound of a record line; skipped");
  // A line of exactly the bound is still a record.
  std::string fits = R"({"kind":"chaos","t":4,"what":"y"})";
  fits.insert(fits.size() - 1, std::string(kMaxRecordLine - fits.size(), ' '));
  ASSERT_EQ(fits.size(), kMaxRecordLine);
  append("learner-0.jsonl", fits + "\n");
  r = reader.load();
  EXPECT_EQ(r.long_lines, 1);
  ASSERT_EQ(r.events.size(), 1u);
  expect_same(reader, "a line of exactly the bound");
}

// Defect: a string where a number is expected in summary.json reached the page's innerHTML; a "command" that is not
// a string threw nlohmann's type_error out of the reader. Such fields are dropped with a note.
TEST_F(ReportReader, ASummaryFieldOfTheWrongTypeIsDroppedWithANote) {
  append("summary.json", R"({"final_val_loss":"<img src=x onerror=alert(1)>","command":5,"uptime":0.5,)"
                         R"("loss_unit":"nats/byte","learners":[{"steps":3}]})");
  const ReportRun r = ReportRunReader(dir_.string()).load();
  EXPECT_EQ(r.kind, "train");
  const nlohmann::json s = report_data({r})[0]["summary"];
  EXPECT_FALSE(s.contains("final_val_loss"));
  EXPECT_FALSE(s.contains("command"));
  EXPECT_EQ(s["uptime"], 0.5);
  EXPECT_EQ(s["loss_unit"], "nats/byte");
  EXPECT_TRUE(s["learners"].is_array());  // sim's per-learner list passes (the page does not show it)
  ASSERT_EQ(r.notes.size(), 2u);
  EXPECT_EQ(r.notes[0], "summary.json: \"final_val_loss\" is a string, not a number; not shown");
  EXPECT_EQ(r.notes[1], "summary.json: \"command\" is a number, not a string; not shown");
  // report_data checks types itself too (a ReportRun can be made by hand).
  ReportRun by_hand;
  by_hand.summary = {{"wall_seconds", "<b>"}, {"goodput", 0.5}};
  const nlohmann::json h = report_data({by_hand})[0]["summary"];
  EXPECT_FALSE(h.contains("wall_seconds"));
  EXPECT_EQ(h["goodput"], 0.5);
}

TEST_F(ReportReader, ASummaryOverItsBoundIsRefusedByName) {
  append("summary.json", "{\"x\":\"" + std::string(kMaxSummaryBytes, 'a') + "\"}");
  try {
    ReportRunReader(dir_.string()).load();
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("over the 16 MiB bound of a summary"), std::string::npos) << e.what();
  }
}

TEST_F(ReportReader, RefusedJoinsAreNotShownAsRejectedContributions) {
  // Records: two refused hellos (a wrong key) and one refused push.
  append("syncer.jsonl", R"({"kind":"reject","t":1,"reason":"fingerprint","join":true})" "\n"
                         R"({"kind":"reject","t":2,"reason":"fingerprint","join":true})" "\n"
                         R"({"kind":"reject","t":3,"fragment":0,"reason":"norm_ratio","learner":1})" "\n");
  ReportRun r = ReportRunReader(dir_.string()).load();
  EXPECT_EQ(r.rejects, (std::map<std::string, int64_t>{{"norm_ratio", 1}}));
  // The summary: every refusal by reason, the joins among them apart; 1 contribution rejected.
  append("summary.json", R"({"rejects":{"fingerprint":50,"norm_ratio":1},"joins_refused":50,)"
                         R"("joins_refused_by":{"fingerprint":50},"contributions_rejected":1})");
  r = ReportRunReader(dir_.string()).load();
  EXPECT_EQ(r.rejects, (std::map<std::string, int64_t>{{"norm_ratio", 1}}));
}

TEST_F(ReportReader, TextsAreCutAndRejectReasonsBounded) {
  std::string recs;
  for (size_t i = 0; i < kMaxRejectReasons + 10; ++i)
    recs += R"({"kind":"reject","t":1,"reason":"r)" + std::to_string(i) + "\"}\n";
  recs += R"({"kind":"chaos","t":2,"what":")" + std::string(5000, 'w') + "\"}\n";
  append("syncer.jsonl", recs);
  const ReportRun r = ReportRunReader(dir_.string()).load();
  EXPECT_EQ(r.rejects.size(), kMaxRejectReasons + 1);
  EXPECT_EQ(r.rejects.at("(other reasons)"), 10);
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_LE(r.events[0].second.size(), kMaxRecordText);
}

// A run with long series, as a week of records would give.
ReportRun long_run() {
  ReportRun r;
  r.name = "long";
  for (int i = 0; i < 10007; ++i) r.learners[0].push_back({i * 1.0, i * 10.0, 8.0 - i * 1e-4, i * 4096.0});
  for (int i = 0; i < 3; ++i) r.learners[1].push_back({i * 1.0, i * 10.0, 7.0, i * 4096.0});
  for (int i = 0; i < 2501; ++i) r.merges.push_back({i * 4.0, 8.0, 0.25});
  for (int i = 0; i < 250; ++i) r.evals.push_back({i * 40.0, i * 1e6, 6.0 - i * 1e-3, 1.5});
  r.learner_now[0].step = 100060;
  return r;
}

TEST(ReportData, ThinsEachLongSeriesToEvenlySpacedRecordsKeepingTheFirstAndTheLast) {
  const ReportRun r = long_run();
  const nlohmann::json d = report_data({r}, 100)[0];
  EXPECT_EQ(d["thinned_to"], 100);
  const auto& l0 = d["learners"]["0"];
  ASSERT_EQ(l0.size(), 100u);
  EXPECT_EQ(l0.front()[0], 0.0);
  EXPECT_EQ(l0.back()[0], 10006.0);
  // Evenly spaced: consecutive kept records are 101 or 102 records apart (10006 / 99 = 101.07).
  for (size_t k = 1; k < l0.size(); ++k) {
    const double gap = l0[k][0].get<double>() - l0[k - 1][0].get<double>();
    EXPECT_TRUE(gap == 101.0 || gap == 102.0) << "gap " << gap << " at " << k;
  }
  EXPECT_EQ(d["learners"]["1"].size(), 3u);  // a short series is served whole
  ASSERT_EQ(d["merges"].size(), 100u);
  EXPECT_EQ(d["merges"].back()[0], 10000.0);
  EXPECT_EQ(d["evals"].size(), 100u);
  EXPECT_EQ(d["learner_now"]["0"]["step"], 100060.0);  // never thinned
}

TEST(ReportData, KeepsEveryRecordWithoutALimitOrWhenTheSeriesFit) {
  const ReportRun r = long_run();
  for (size_t limit : {size_t{0}, size_t{10007}}) {
    const nlohmann::json d = report_data({r}, limit)[0];
    EXPECT_FALSE(d.contains("thinned_to")) << limit;
    EXPECT_EQ(d["learners"]["0"].size(), 10007u) << limit;
    EXPECT_EQ(d["merges"].size(), 2501u) << limit;
  }
  const nlohmann::json one = report_data({r}, 1)[0];
  ASSERT_EQ(one["learners"]["0"].size(), 1u);
  EXPECT_EQ(one["learners"]["0"][0][0], 10006.0);  // the latest record
}

// Defect: with a 1e9 s span and no thinning the merge rate had a bucket per minute of it; with thinning, the event
// list was served whole.
TEST(ReportData, TheMergeRateAndTheEventsAreBoundedByMaxPoints) {
  ReportRun r;
  r.name = "span";
  r.merges = {{0, 1, 0}, {1e9, 1, 0}};
  for (int i = 0; i < 500; ++i) r.events.push_back({i * 1.0, "chaos: SIGKILL learner 0"});
  for (size_t max_points : {size_t{1}, size_t{7}, size_t{100}}) {
    const nlohmann::json d = report_data({r}, max_points)[0];
    EXPECT_LE(d["merge_rate"].size(), max_points) << max_points;
    EXPECT_EQ(d["events"].size(), max_points) << max_points;
    EXPECT_EQ(d["events"].back()[0], 499.0);  // the latest kept
  }
  const nlohmann::json all = report_data({r}, 0)[0];
  EXPECT_LE(all["merge_rate"].size(), 20u);
  EXPECT_EQ(all["events"].size(), 500u);
  // Times only a ReportRun made by hand can hold are not counted, and do not throw.
  r.merges.push_back({std::numeric_limits<double>::quiet_NaN(), 1, 0});
  r.merges.push_back({-1e300, 1, 0});
  r.merges.push_back({1e300, 1, 0});
  EXPECT_LE(report_data({r}, 50)[0]["merge_rate"].size(), 50u);
}

// Defect: the buckets did not end at the last merge, so the chart always ended with a sliver holding the merge at
// the end alone: 2 merges/min after twenty buckets of 60.
TEST(ReportData, TheMergeRateOfASteadyRunIsSteadyToItsEnd) {
  for (const auto& [span, every] : std::vector<std::pair<double, double>>{{600, 1}, {3650, 1}, {10, 0.02}}) {
    ReportRun r;
    r.name = "steady";
    for (int i = 0; i * every <= span + 1e-9; ++i) r.merges.push_back({i * every, 1, 0});
    const nlohmann::json rate = report_data({r}, 0)[0]["merge_rate"];
    ASSERT_GE(rate.size(), 2u) << span;
    const double per_minute = 60.0 / every;
    for (const auto& b : rate)
      EXPECT_NEAR(b[1].get<double>(), per_minute, 0.1 * per_minute) << "span " << span << ", bucket at " << b[0];
  }
  ReportRun at_zero;  // every merge at t = 0: one bucket, no division by a zero width
  at_zero.merges = {{0, 1, 0}, {0, 1, 0}};
  const nlohmann::json rate = report_data({at_zero}, 0)[0]["merge_rate"];
  ASSERT_EQ(rate.size(), 1u);
  EXPECT_EQ(rate[0][1].get<double>(), 120.0);
}

// Defect: every distinct learner id opened a series, and each kept max_points points: a few thousand records with
// distinct ids (or a run of a few hundred learners) made the page, and the dashboard's answer, grow without bound
// (past the 16 MiB a dashboard answer may be, which then failed from that moment on).
TEST_F(ReportReader, LearnerSeriesAreBoundedInNumberAndInPoints) {
  std::string recs;
  for (size_t id = 0; id < kMaxLearnerSeries + 100; ++id)
    recs += R"({"kind":"learner","t":1,"step":1,"loss":5.0,"learner":)" + std::to_string(id) + "}\n";
  append("syncer.jsonl", recs);
  const ReportRun r = ReportRunReader(dir_.string()).load();
  EXPECT_EQ(r.learners.size(), kMaxLearnerSeries);
  bool noted = false;
  for (const auto& n : r.notes) noted = noted || n.find("100 records of learners past the first") == 0;
  EXPECT_TRUE(noted);

  ReportRun many;  // 300 learners of 2,000 records each, served thinned to 2,000 points per series
  for (int64_t id = 0; id < 300; ++id)
    for (int k = 0; k < 2000; ++k) many.learners[id].push_back({k * 1.0, k * 1.0, 4.0, k * 100.0});
  const nlohmann::json d = report_data({many}, 2000)[0];
  size_t points = 0;
  for (const auto& [id, pts] : d["learners"].items()) {
    points += pts.size();
    EXPECT_EQ(pts.back()[0], 1999.0);  // the latest record is kept
  }
  EXPECT_LE(points, kLearnerPointBudget);
  EXPECT_EQ(d["learners"].size(), 300u);
  EXPECT_TRUE(d.contains("thinned_to"));
  EXPECT_EQ(report_data({many}, 0)[0]["learners"]["7"].size(), 2000u);  // 0 keeps every record
}

// The data block between <script id="deloco-data" type="application/json"> and the next </script>.
std::string data_block(const std::string& html) {
  const std::string open = R"(<script id="deloco-data" type="application/json">)";
  const size_t a = html.find(open);
  if (a == std::string::npos) return "";
  const size_t b = html.find("</script>", a);
  return html.substr(a + open.size(), b - a - open.size());
}

// Defect: "<!--<script>" in a record put the HTML parser into its double-escaped state, so the page's own
// </script> no longer closed the data block: 0 charts, empty tables. Every <, >, & and U+2028/9 is now \uXXXX.
TEST(ReportHtml, RecordTextCannotEndOrBreakTheDataBlock) {
  ReportRun r;
  r.name = "run \xe2\x80\xa8 <img src=x onerror=alert(1)>";
  r.kind = "run";
  r.evals = {{0, 100, 5.0, 1.5}, {1, 200, 4.0, 1.4}};
  r.events = {{0.5, "<!--<script>"}, {0.7, "</script><script>document.title='pwned'</script>"},
              {0.8, "a & b > c \xe2\x80\xa9"}};
  r.rejects["</SCRIPT>"] = 2;
  const std::string html = report_html({r}, "t", "", "", false, 100);
  const std::string block = data_block(html);
  ASSERT_FALSE(block.empty());
  for (const char* bad : {"<", ">", "&", "\xe2\x80\xa8", "\xe2\x80\xa9"})
    EXPECT_EQ(block.find(bad), std::string::npos) << "the data block holds " << bad;
  // The escapes read back as the same data.
  EXPECT_EQ(nlohmann::json::parse(block), report_data({r}, 100));
  // Nothing after the block was swallowed: the page's script follows it.
  EXPECT_NE(html.find("JSON.parse(document.getElementById('deloco-data').textContent)"), std::string::npos);
}

// A name that is not valid UTF-8 (a folder name is bytes) does not make the page throw.
TEST(ReportHtml, ANameThatIsNotUtf8StillRenders) {
  ReportRun r;
  r.name = "bad \xff\xfe name";
  r.dir = "/tmp/\xff";
  r.evals = {{0, 100, 5.0, 1.5}};
  std::string html;
  ASSERT_NO_THROW(html = report_html({r}, "t", "", "", false, 10));
  EXPECT_NE(data_block(html).find("bad \xef\xbf\xbd"), std::string::npos);  // U+FFFD
}

// The page is built from src/report/web/ (template, script, style compiled in): every field of the template is filled,
// none of its comment lines ships, and the embedded script and style cannot end their element early: a page
// holds exactly the <script> and <style> elements the template opens, with a title or data that try to add more.
TEST(ReportHtml, ThePageIsTheTemplateWithEveryFieldFilledOnce) {
  ReportRun r;
  r.name = "@@DATA@@";
  r.kind = "run";
  r.evals = {{0, 100, 5.0, 1.5}};
  const std::string title = "@@PAGE_JS@@ </script><!-- @@!";
  auto count = [](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  };
  for (bool live : {false, true}) {
    const std::string html = report_html({r}, title, "/*uplot js*/", "/*uplot css*/", live, 10);
    SCOPED_TRACE(live ? "live" : "static");
    // Each field filled once, its text never scanned again: what remains of @@ is the title's and the name's.
    for (const char* field : {"TITLE", "INTRO", "UPLOT_CSS", "PAGE_CSS", "LIVE", "UPLOT_JS"})
      EXPECT_EQ(html.find(std::string("@@") + field + "@@"), std::string::npos) << field;
    EXPECT_EQ(count(html, "@@PAGE_JS@@"), 2u);
    EXPECT_EQ(count(html, "@@DATA@@"), live ? 0u : 1u);
    EXPECT_EQ(count(html, "@@"), live ? 6u : 8u);
    EXPECT_EQ(html.find("Lines like these are dropped"), std::string::npos);
    EXPECT_EQ(count(html, "<title>@@PAGE_JS@@ &lt;/script&gt;&lt;!-- @@!</title>"), 1u);
    EXPECT_EQ(count(html, "<h1>@@PAGE_JS@@ &lt;/script&gt;&lt;!-- @@!</h1>"), 1u);
    EXPECT_EQ(count(html, "<script"), live ? 4u : 3u);  // the data, (LIVE,) uPlot, the page's script
    EXPECT_EQ(count(html, "</script"), live ? 4u : 3u);
    EXPECT_EQ(count(html, "<style"), 1u);
    EXPECT_EQ(count(html, "</style"), 1u);
    EXPECT_EQ(html.find("<!--"), std::string::npos);
    EXPECT_NE(html.find("/*uplot js*/"), std::string::npos);
    EXPECT_NE(html.find("/*uplot css*/"), std::string::npos);
    EXPECT_NE(html.find(".state-training{color:#080}"), std::string::npos);  // report.css
    EXPECT_NE(html.find("function chart(id, title"), std::string::npos);      // report.js
    EXPECT_EQ(html.rfind("</body></html>\n"), html.size() - 15);
    EXPECT_EQ(html.find("<!DOCTYPE html>"), 0u);
    EXPECT_EQ(html.find("const LIVE = true;") != std::string::npos, live);
  }
}

// Defect: the gnuplot script escaped only ': a run named "x<newline>!touch pwned #" ran touch. Names now reach the
// script as single-quoted strings with no control character; the data file's comment stays one line.
TEST(ReportPngs, ARunNameRunsNoCommandThroughGnuplot) {
  const fs::path dir = fs::temp_directory_path() / ("deloco-report-png-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ReportRun r;
  r.name = "x\n!touch pwned #\r\n!touch pwned2\n'`touch pwned3`'@x\n\n\n1 2";
  r.evals = {{0, 100, 5.0, 1.5}, {1, 200, 4.0, 1.4}};
  r.merges = {{0, 1, 0}, {1, 1, 0}};
  write_report_pngs({r}, dir.string());
  for (const char* stem : {"val_loss_time", "val_loss_tokens", "merges_per_minute"}) {
    std::ifstream gp(dir / (std::string(stem) + ".gp"));
    ASSERT_TRUE(gp) << stem;
    std::string line;
    int plot_lines = 0;
    while (std::getline(gp, line)) {
      EXPECT_NE(line.rfind("!", 0), 0u) << stem << ": " << line;
      for (char c : line) EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20) << stem << ": " << line;
      if (line.find(".dat' index") != std::string::npos) ++plot_lines;
    }
    EXPECT_EQ(plot_lines, 1) << stem;
    std::ifstream dat(dir / (std::string(stem) + ".dat"));
    std::stringstream text;
    text << dat.rdbuf();
    EXPECT_EQ(text.str().rfind("# x?!touch pwned #?" "?!touch pwned2?'`touch pwned3`'@x?" "?" "?1 2\n", 0), 0u) << text.str();
    EXPECT_EQ(text.str().find("\n1 2\n"), std::string::npos);  // the name's digits are no data point
  }
  if (have_program("gnuplot")) {
    for (const char* marker : {"pwned", "pwned2", "pwned3"}) EXPECT_FALSE(fs::exists(dir / marker)) << marker;
    EXPECT_TRUE(fs::exists(dir / "val_loss_time.png"));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
