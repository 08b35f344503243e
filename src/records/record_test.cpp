// The record schema's framework (records/record.h, records/summary.h): typed records to JSON and back, the lenient
// reading of untrusted lines, the writer's UTF-8 replacement, the tailer's bounds and its restarts after a
// truncation or a rotation, and RunSummary.
#include "records/record.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deloco/error.h"
#include "records/kinds.h"
#include "records/summary.h"

namespace deloco::rec {
namespace record_cases {
namespace fs = std::filesystem;
using nlohmann::json;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("deloco_record_test_" + name + "_" + std::to_string(::getpid()));
}

TEST(RecordSchema, ToJsonAndFromJsonRoundTripAFewKinds) {
  Merge m;
  m.t = 12.5;
  m.fragment = 2;
  m.version = 7;
  m.quorum = 2;
  m.learners = {0, 3};
  m.weights = {0.25, 0.75};
  m.grace_wait = 0.5;
  m.tokens = 4096;
  m.merges = 11;
  const json mj = to_json(m);
  EXPECT_EQ(mj["kind"], "merge");
  EXPECT_FALSE(mj.contains("learner"));  // an unset optional is left out
  const auto m2 = from_json<Merge>(mj);
  ASSERT_TRUE(m2);
  EXPECT_EQ(m2->t, 12.5);
  EXPECT_EQ(m2->fragment, 2);
  EXPECT_EQ(m2->version, 7);
  EXPECT_EQ(m2->learners, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(m2->weights, (std::vector<double>{0.25, 0.75}));
  EXPECT_EQ(m2->merges, 11);
  EXPECT_EQ(to_json(*m2), mj);

  FinalEval e;
  e.val_loss = 3.5;
  e.loss_unit = "nats/byte";
  e.step = 100;
  const json ej = to_json(e);
  EXPECT_EQ(ej["kind"], "final_eval");
  EXPECT_FALSE(from_json<Eval>(ej));  // another kind
  const auto e2 = from_json<FinalEval>(ej);
  ASSERT_TRUE(e2);
  EXPECT_EQ(e2->val_loss, 3.5);
  EXPECT_EQ(e2->step, 100);
  EXPECT_FALSE(e2->merges);

  Started s;
  s.resumed = true;
  s.shard = 1;
  s.shards = 2;
  s.versions = {4, 5};
  s.metrics_warning = "listens on 0.0.0.0";
  const auto s2 = from_json<Started>(json::parse(to_json(s).dump()));
  ASSERT_TRUE(s2);
  EXPECT_TRUE(s2->resumed);
  EXPECT_EQ(s2->shard, 1);
  EXPECT_EQ(s2->shards, 2);
  EXPECT_EQ(s2->versions, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(s2->metrics_warning, "listens on 0.0.0.0");

  LearnerDone d;
  d.learner = 3;
  d.step = 40;
  d.finished = false;
  d.error = "shard 1 refused it";
  const auto d2 = from_json<LearnerDone>(to_json(d));
  ASSERT_TRUE(d2);
  EXPECT_EQ(d2->learner, 3);
  EXPECT_EQ(d2->finished, false);
  EXPECT_EQ(d2->error, "shard 1 refused it");
}

TEST(RecordSchema, NonFiniteNumbersAreWrittenAsNullAndReadAsMissing) {
  Learner l;
  l.step = 5;
  l.loss = std::nan("");
  Eval e;
  e.val_loss = INFINITY;
  const json lj = to_json(l), ej = to_json(e);
  EXPECT_TRUE(lj["loss"].is_null());
  EXPECT_TRUE(ej["val_loss"].is_null());
  EXPECT_FALSE(from_json<Learner>(lj)->loss);
  EXPECT_EQ(from_json<Eval>(ej)->val_loss, 0.0);
}

TEST(RecordSchema, AMistypedFieldKeepsItsDefaultAndIsNamed) {
  const json j = json::parse(R"({"kind":"merge","t":"noon","learner":1.5,"fragment":"two","version":3.0,)"
                             R"("learners":[0,"one"],"weights":{"a":1},"grace_wait":true,"merges":"many"})");
  std::vector<std::string> wrong;
  const auto m = from_json<Merge>(j, &wrong);
  ASSERT_TRUE(m);  // never throws, never refuses the record for its fields
  EXPECT_FALSE(m->t);
  EXPECT_FALSE(m->learner);         // not an integral number
  EXPECT_EQ(m->fragment, -1);       // the default
  EXPECT_EQ(m->version, 3);         // an integral number written as a float reads as an integer
  EXPECT_TRUE(m->learners.empty());  // one element of another type: the list is missing
  EXPECT_TRUE(m->weights.empty());
  EXPECT_EQ(m->grace_wait, 0.0);
  EXPECT_FALSE(m->merges);
  EXPECT_EQ(wrong, (std::vector<std::string>{"t", "learner", "fragment", "learners", "weights", "grace_wait",
                                             "merges"}));
  // Not a record of that kind: nothing.
  EXPECT_FALSE(from_json<Merge>(json::parse(R"({"kind":"eval"})")));
  EXPECT_FALSE(from_json<Merge>(json::parse(R"({"kind":7})")));
  EXPECT_FALSE(from_json<Merge>(json::parse(R"([{"kind":"merge"}])")));
  EXPECT_EQ(record_kind(json::parse(R"({"kind":"merge"})")), "merge");
  EXPECT_EQ(record_kind(json::parse(R"({"kind":["merge"]})")), "");
  EXPECT_EQ(record_kind(json::parse("3")), "");
}

TEST(RecordSchema, TextsAreCutToValidUtf8OfTheBound) {
  json j = {{"kind", "reject"}, {"reason", std::string(100000, 'r')}, {"detail", "ok \xff\xfe end"}};
  const auto r = from_json<Reject>(j);
  ASSERT_TRUE(r);
  EXPECT_LE(r->reason.size(), kMaxRecordText);  // cut, with a marker that says so
  EXPECT_GT(r->reason.size(), kMaxRecordText / 2);
  EXPECT_EQ(r->reason.rfind("rrrr", 0), 0u);
  ASSERT_TRUE(r->detail);
  EXPECT_EQ(r->detail->find('\xff'), std::string::npos);
  EXPECT_NE(r->detail->find("\xef\xbf\xbd"), std::string::npos);  // U+FFFD
  EXPECT_EQ(r->detail->substr(r->detail->size() - 4), " end");
  // A cut never splits a character: what is read is valid UTF-8 (a strict dump does not throw).
  for (size_t pad = kMaxRecordText - 8; pad <= kMaxRecordText; ++pad) {
    j["reason"] = std::string(pad, 'a') + "\xc3\xa9\xe2\x82\xac";
    const std::string reason = from_json<Reject>(j)->reason;
    EXPECT_LE(reason.size(), kMaxRecordText);
    EXPECT_NO_THROW(json(reason).dump()) << pad;
  }
}

TEST(RecordWriter, WritesBytesThatAreNotUtf8AsTheReplacementCharacter) {
  const fs::path path = temp_path("writer");
  fs::remove(path);
  {
    RecordWriter w(path.string());
    Chaos c;
    c.what = "SIGKILL \xc0\x80 learner";
    w.write(c);
    w.write_json({{"kind", "note"}, {"detail", "\xff"}});
  }
  std::ifstream in(path);
  std::string a, b;
  std::getline(in, a);
  std::getline(in, b);
  const json ja = json::parse(a), jb = json::parse(b);  // valid JSON, so valid UTF-8
  EXPECT_EQ(from_json<Chaos>(ja)->what.find("\xef\xbf\xbd") != std::string::npos, true);
  EXPECT_EQ(jb["detail"], "\xef\xbf\xbd");
  fs::remove(path);
}

TEST(RecordWriter, AFailedWriteThrowsInsteadOfDroppingTheRecordSilently) {
  // /dev/full takes the open and fails every write with ENOSPC: a full disk.
  RecordWriter w("/dev/full");
  try {
    w.write_json({{"kind", "note"}});
    FAIL() << "a record the disk did not take was reported as written";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
  }
  EXPECT_THROW(w.write_json({{"kind", "note"}}), IoError);  // and every later one, not only the first
}

TEST(RecordWriter, ARestartedWriterEndsTheLineAKilledOneLeftUnfinished) {
  const fs::path path = temp_path("cut");
  fs::remove(path);
  {
    std::ofstream out(path);
    out << "{\"kind\":\"note\"}\n{\"kind\":\"done\",\"merges\":4";  // killed mid-record
  }
  {
    RecordWriter w(path.string());
    w.write_json({{"kind", "started"}, {"resumed", true}});
  }
  std::vector<std::string> lines;
  RecordTailer t(path.string());
  t.poll([&](const std::string& l) { lines.push_back(l); });
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(record_kind(json::parse(lines[0])), "note");
  EXPECT_FALSE(json::accept(lines[1]));  // the cut line stays cut
  EXPECT_EQ(record_kind(json::parse(lines[2])), "started");  // not glued to it and lost with it
  {
    RecordWriter again(path.string());  // a file that ends in a newline gets no empty line
    again.write_json({{"kind", "note"}});
  }
  std::ifstream in(path);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all.find("\n\n"), std::string::npos);
  fs::remove(path);
}

TEST(RecordTailer, ReadsCompleteLinesAndKeepsAnUnfinishedOne) {
  const fs::path path = temp_path("tail");
  fs::remove(path);
  RecordTailer t(path.string());
  std::vector<std::string> got;
  auto collect = [&](const std::string& l) { got.push_back(l); };
  t.poll(collect);  // no file yet
  std::ofstream(path, std::ios::app) << "one\ntw";
  t.poll(collect);
  EXPECT_EQ(got, (std::vector<std::string>{"one"}));
  EXPECT_EQ(t.partial(), "tw");
  std::ofstream(path, std::ios::app) << "o\nthree\n";
  t.poll(collect);
  EXPECT_EQ(got, (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_EQ(t.partial(), "");
  EXPECT_EQ(t.restarts(), 0);
  fs::remove(path);
}

TEST(RecordTailer, SkipsALineOverItsBoundInItsPlace) {
  const fs::path path = temp_path("long");
  fs::remove(path);
  RecordTailer t(path.string(), /*max_line=*/16);
  std::vector<std::string> got;
  auto collect = [&](const std::string& l) { got.push_back(l); };
  auto skip = [&](uint64_t bytes) { got.push_back("skipped " + std::to_string(bytes)); };
  std::ofstream(path, std::ios::app) << "short\n" << std::string(40, 'x') << "\nafter\n" << std::string(10, 'y');
  t.poll(collect, skip);
  EXPECT_EQ(got, (std::vector<std::string>{"short", "skipped 40", "after"}));
  EXPECT_EQ(t.skipped(), 1);
  std::ofstream(path, std::ios::app) << std::string(10, 'y');  // the unfinished line passes the bound
  t.poll(collect, skip);
  EXPECT_EQ(t.partial(), "");
  EXPECT_EQ(t.partial_long_bytes(), 20u);
  std::ofstream(path, std::ios::app) << "yyy\n" << std::string(16, 'z') << "\n";  // exactly the bound: a line
  t.poll(collect, skip);
  EXPECT_EQ(got, (std::vector<std::string>{"short", "skipped 40", "after", "skipped 23", std::string(16, 'z')}));
  EXPECT_EQ(t.skipped(), 2);
  fs::remove(path);
}

// Without the restart, a file cut short is not read again until it grows past the old offset, and then from the
// middle of its lines.
TEST(RecordTailer, ReadsATruncatedFileAgainFromItsStart) {
  const fs::path path = temp_path("trunc");
  fs::remove(path);
  RecordTailer t(path.string());
  std::vector<std::string> got;
  int restarts = 0;
  auto collect = [&](const std::string& l) { got.push_back(l); };
  std::ofstream(path) << "first record\nsecond record\nunfini";
  t.poll(collect);
  std::ofstream(path, std::ios::trunc) << "a\nb";
  t.poll(collect, {}, [&] { ++restarts; });
  EXPECT_EQ(got, (std::vector<std::string>{"first record", "second record", "a"}));
  EXPECT_EQ(t.partial(), "b");  // the old file's unfinished line is dropped
  EXPECT_EQ(t.restarts(), 1);
  EXPECT_EQ(restarts, 1);
  fs::remove(path);
}

// Without the restart, a file replaced at its path by one at least as long is read on from the old offset.
TEST(RecordTailer, ReadsARotatedFileAgainFromItsStart) {
  const fs::path path = temp_path("rot");
  fs::remove(path);
  RecordTailer t(path.string());
  std::vector<std::string> got;
  auto collect = [&](const std::string& l) { got.push_back(l); };
  std::ofstream(path) << "old 1\nold 2\n";
  t.poll(collect);
  const fs::path next = path.string() + ".next";
  std::ofstream(next) << "new 1\nnew 2\n";  // the same size
  fs::rename(next, path);
  t.poll(collect);
  EXPECT_EQ(got, (std::vector<std::string>{"old 1", "old 2", "new 1", "new 2"}));
  EXPECT_EQ(t.restarts(), 1);
  std::ofstream(path, std::ios::app) << "new 3\n";  // then tailed on as usual
  t.poll(collect);
  EXPECT_EQ(got.back(), "new 3");
  EXPECT_EQ(t.restarts(), 1);
  fs::remove(path);
}

TEST(RunSummaryRecord, RoundTripsTypedFieldsAndExtras) {
  RunSummary s;
  s.command = "run";
  s.final_val_loss = 2.5;
  s.loss_unit = "nats/byte";
  s.tokens = 123456;
  s.uptime = 0.9;
  s.goodput = std::nan("");  // written as null, read as unset
  s.extra = {{"learner_kills", 2}, {"rejects", {{"stale", 3}}}, {"tokens", "shadowed"}};
  const json j = s.to_json();
  EXPECT_EQ(j["tokens"], 123456);  // a typed field wins over an extra of the same name
  EXPECT_TRUE(j["goodput"].is_null());
  std::vector<std::string> wrong;
  const RunSummary r = RunSummary::from_json(j, &wrong);
  EXPECT_TRUE(wrong.empty());
  EXPECT_EQ(r.command, "run");
  EXPECT_EQ(r.final_val_loss, 2.5);
  EXPECT_EQ(r.loss_unit, "nats/byte");
  EXPECT_EQ(r.tokens, 123456);
  EXPECT_EQ(r.uptime, 0.9);
  EXPECT_FALSE(r.goodput);
  EXPECT_FALSE(r.outer_steps);
  EXPECT_EQ(r.extra, (json{{"learner_kills", 2}, {"rejects", {{"stale", 3}}}}));
}

TEST(RunSummaryRecord, AFieldOfTheWrongTypeIsUnsetAndNamed) {
  std::vector<std::string> wrong;
  const RunSummary r = RunSummary::from_json(
      json::parse(R"({"command":5,"final_val_loss":"<b>","tokens":1.5,"uptime":0.5,"steps":[1,2]})"), &wrong);
  EXPECT_EQ(r.command, "");
  EXPECT_FALSE(r.final_val_loss);
  EXPECT_FALSE(r.tokens);
  EXPECT_EQ(r.uptime, 0.5);
  EXPECT_EQ(r.extra, (json{{"steps", {1, 2}}}));
  EXPECT_EQ(wrong, (std::vector<std::string>{"command", "final_val_loss", "tokens"}));
  EXPECT_TRUE(RunSummary::from_json(json::parse("[1]")).extra.empty());
}

}  // namespace
}  // namespace deloco::rec
