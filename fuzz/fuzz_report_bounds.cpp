// libFuzzer target: the bounds of the run-record reader of `deloco report` and the live dashboard
// (src/report/report.h) over hostile records: absurd times, long lines, mistyped fields and summaries, markup.
//
// Input: byte 0 picks max_points (0, or 1..63), byte 1 the files (bit 0: learner-2.jsonl, else syncer.jsonl; bit 1:
// the rest also as summary.json); the rest is the records' text, where each byte 0x01 (at most 4 of them) stands for
// 300 KiB of 'x' so that lines over the 1 MiB bound (kMaxRecordLine) are within the fuzzer's reach.
// Properties: reading throws nothing but IoError; what report_data serves is bounded by max_points whatever the
// times or the lines held (every chart series, the event list and the merge-rate buckets at most max_points long,
// or with 0 the merge rate at most max(20, merges) buckets), every served time is finite and in [0, kMaxRecordTime],
// texts and notes are cut, and the whole data is at most a fixed size per served point; the page's data block holds
// no <, >, & or U+2028/9 and reads back as the same data. libFuzzer's -timeout and -rss_limit_mb bound the time and
// memory of one input (fuzz/CMakeLists.txt: 10 s, 2 GiB).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "report/report.h"
#include "util/fs.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void fail(const char* what, const std::string& detail = "") {
  deloco::fuzz::property_violated("fuzz_report_bounds", what, detail);
}

fs::path folder() { return deloco::fuzz::scratch_folder("fuzz-report-bounds"); }

void check_time(const json& t) {
  if (t.is_null()) return;  // a value that is not a number is served as null
  if (!t.is_number()) fail("a served time is not a number", t.dump());
  const double v = t.get<double>();
  if (!(v >= 0 && v <= deloco::kMaxRecordTime)) fail("a served time is out of range", t.dump());
}

void check_bounded(const json& d, const deloco::ReportRun& r, size_t max_points) {
  const size_t cap = max_points > 0 ? max_points : static_cast<size_t>(-1);
  const auto series = [&](const json& s, const char* what) {
    if (!s.is_array() || s.size() > cap) fail("a series is longer than max_points:", what);
    for (const auto& p : s) check_time(p[0]);
  };
  series(d["evals"], "evals");
  series(d["merges"], "merges");
  series(d["events"], "events");
  for (const auto& [id, pts] : d["learners"].items()) series(pts, "learner");
  const size_t rate_cap = max_points > 0 ? max_points : std::max<size_t>(20, r.merges.size());
  if (d["merge_rate"].size() > rate_cap) fail("more merge-rate buckets than the bound");
  for (const auto& e : d["events"])
    if (e[1].get_ref<const std::string&>().size() > deloco::kMaxRecordText) fail("an event text is not cut");
  if (d["notes"].size() > deloco::kMaxNotes) fail("more notes than kMaxNotes");
  if (d["rejects"].size() > deloco::kMaxRejectReasons + 1) fail("more reject reasons than kMaxRejectReasons");
  if (max_points > 0) {
    // Each served point is a few numbers; the rest (names, notes, reasons, the summary) is bounded by constants.
    const size_t points = max_points * (4 + d["learners"].size()) + d["learner_now"].size();
    const size_t size = d.dump().size();
    if (size > 256 * points + (2u << 20)) fail("the served data is larger than its bound", std::to_string(size));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t max_points = data[0] % 64;
  const fs::path dir = folder();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string text;
  int expansions = 0;
  for (size_t i = 2; i < size; ++i) {
    if (data[i] == 0x01 && expansions < 4) {
      text.append(300u << 10, 'x');
      ++expansions;
    } else {
      text.push_back(static_cast<char>(data[i]));
    }
  }
  std::ofstream(dir / ((data[1] & 1) ? "learner-2.jsonl" : "syncer.jsonl"), std::ios::binary) << text;
  if (data[1] & 2) std::ofstream(dir / "summary.json", std::ios::binary) << text;
  deloco::ReportRun r;
  try {
    r = deloco::load_report_run(dir.string());
  } catch (const deloco::IoError&) {
    return 0;
  }
  const json d = deloco::report_data({r}, max_points);
  check_bounded(d[0], r, max_points);
  const std::string html = deloco::report_html({r}, "fuzz", "", "", false, max_points);
  const std::string open = R"(<script id="deloco-data" type="application/json">)";
  const size_t a = html.find(open);
  const size_t b = html.find("</script>", a);
  if (a == std::string::npos || b == std::string::npos) fail("the page has no data block");
  const std::string block = html.substr(a + open.size(), b - a - open.size());
  for (const char* bad : {"<", ">", "&", "\xe2\x80\xa8", "\xe2\x80\xa9"})
    if (block.find(bad) != std::string::npos) fail("the data block holds a character that is not escaped:", bad);
  if (json::parse(block) != d) fail("the data block does not read back as the data");
  return 0;
}
