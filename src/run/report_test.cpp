// ReportRunReader: a folder read as it grows gives exactly what one whole read gives, at every moment.
// report_data's thinning of long series (what the live dashboard serves).
#include "run/report.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deloco/fs.h"

namespace deloco {
namespace {
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
  append("syncer.jsonl", R"({"kind":"status","t":10,"connected":[0,2,3]})" "\n");
  append("learner-0.jsonl", R"({"kind":"learner","t":9,"loss":5.0})" "\n" R"({"kind":"welcome"})" "\n");
  append("learner-1.jsonl", R"({"kind":"learner","t":9,"loss":5.0})" "\n");
  append("learner-2.jsonl", R"({"kind":"learner","t":8,"loss":5.0})" "\n" R"({"kind":"welc)");
  append("learner-3.jsonl", R"({"kind":"welcome","t":8})" "\n" R"({"kind":"learner","t":9,"loss":5.0})" "\n");
  append("learner-4.jsonl", R"({"kind":"learner","t":9,"loss":5.0})" "\n");
  expect_same(reader, "learner 2's welcome torn");
  ReportRun r = reader.load();
  EXPECT_EQ(r.learner_now.at(2).state, "training");
  // The welcome completes and a push follows (pushes and applies do not change a learner's state); learner 4
  // finishes.
  append("learner-2.jsonl", R"(ome","t":11})" "\n" R"({"kind":"push","t":12})" "\n");
  append("learner-4.jsonl", R"({"kind":"learner_done","t":10})" "\n");
  expect_same(reader, "learner 2 rejoining");
  r = reader.load();
  EXPECT_EQ(r.learner_now.at(0).state, "training");  // a record without a time changes nothing
  EXPECT_EQ(r.learner_now.at(1).state, "down");      // not in the status's connected list
  EXPECT_EQ(r.learner_now.at(2).state, "rejoining");
  EXPECT_EQ(r.learner_now.at(3).state, "training");  // a training record after its welcome
  EXPECT_EQ(r.learner_now.at(4).state, "done");
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

}  // namespace
}  // namespace deloco
