// libFuzzer target: the run-record reader of `deloco report` and the live dashboard (src/report/report.h), over real
// files, differentially: the incremental ReportRunReader against a whole read.
//
// Input: byte 0 picks the file the records go into (bit 0: learner-3.jsonl, else syncer.jsonl; bit 1: a second copy
// into shard-1/syncer.jsonl), byte 1 where the text is cut; the rest is the records' text. The first part is
// written and read by one ReportRunReader, then the rest is appended and it reads again.
// Properties: reading throws nothing but IoError (and that only for a folder without records, in both readers
// alike); at both moments the incremental read serves exactly the data of a whole read (report_data, compared as
// text); the data thinned to a few points and the page render without throwing.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "fuzz_util.h"
#include "report/report.h"
#include "util/fs.h"

namespace {
namespace fs = std::filesystem;

[[noreturn]] void fail(const char* what) { deloco::fuzz::property_violated("fuzz_report", what); }

fs::path folder() { return deloco::fuzz::scratch_folder("fuzz-report"); }

void append(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::app | std::ios::binary) << text;
}

// The data of a read as text, or nothing when the folder was refused (IoError).
std::optional<std::string> served(deloco::ReportRunReader& reader) {
  try {
    const deloco::ReportRun r = reader.load();
    const std::string all = deloco::report_data({r}).dump();
    (void)deloco::report_data({r}, 3).dump();
    (void)deloco::report_html({r}, "fuzz", "", "", false, 2);
    return all;
  } catch (const deloco::IoError&) {
    return std::nullopt;
  }
}

void same_as_whole_read(deloco::ReportRunReader& reader, const char* when) {
  const std::optional<std::string> incremental = served(reader);
  deloco::ReportRunReader fresh(folder().string());
  const std::optional<std::string> whole = served(fresh);
  if (incremental.has_value() != whole.has_value()) fail("one reader refused the folder and the other did not");
  if (incremental && *incremental != *whole) fail(when);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const fs::path dir = folder();
  fs::remove_all(dir);
  fs::create_directories(dir / "shard-1");
  const std::string text(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t cut = text.size() * data[1] / 255;
  const fs::path file = dir / ((data[0] & 1) ? "learner-3.jsonl" : "syncer.jsonl");
  const bool shard_copy = (data[0] & 2) != 0;
  deloco::ReportRunReader reader(dir.string());
  append(file, text.substr(0, cut));
  if (shard_copy) append(dir / "shard-1" / "syncer.jsonl", text.substr(0, cut));
  same_as_whole_read(reader, "the incremental read differs from a whole read (first part)");
  append(file, text.substr(cut));
  if (shard_copy) append(dir / "shard-1" / "syncer.jsonl", text.substr(cut));
  same_as_whole_read(reader, "the incremental read differs from a whole read (after the append)");
  return 0;
}
