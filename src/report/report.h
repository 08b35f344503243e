// src/report/report.h — `deloco report RUN_DIR... --out report.html [--png DIR]`: one self-contained HTML page (and,
// optionally, PNG charts through gnuplot) from the JSON-lines records of finished or running runs of `deloco run`,
// `deloco sim` or `deloco train`, several runs overlaid for comparison.
//
// Contract
//  * load_report_run(dir) reads what the folder holds: summary.json (optional while a run is still going) and the
//    records of metrics.jsonl (sim, train), syncer.jsonl or shard-*/syncer.jsonl, learner-*.jsonl and events.jsonl
//    (`deloco run`). Records are untrusted text, read line by line through the record schema (records/kinds.h):
//      - a line longer than kMaxRecordLine bytes is never held in memory: it is skipped and counted in
//        `long_lines` (its bytes are read past, not kept);
//      - a line that is not a JSON object with a string "kind" is counted in `bad_lines` and skipped;
//      - a record whose time ("t", else "elapsed_s") is a number but not a finite time in [0, kMaxRecordTime] s is
//        skipped and counted in `bad_times`;
//      - a field of an unexpected type is read as missing; texts (event lines, reject reasons) are cut to
//        kMaxRecordText bytes of valid UTF-8; more than kMaxRejectReasons distinct reject reasons are counted
//        together under "(other reasons)"; the records of learners beyond the first kMaxLearnerSeries ids seen are
//        not charted (a note says how many), so no record sizes the page by the number of series it opens.
//    Each skip of the first kMaxNotes adds a line to `notes` naming the file (relative to the run folder), the line
//    number and the problem, e.g. "syncer.jsonl line 12: time 1e+300 is not a finite time in [0, 1e+10] s; record
//    skipped". summary.json is read whole: one over kMaxSummaryBytes, or not a JSON object, throws IoError naming
//    it; a shown summary field of the wrong type (a string where a number is expected) is dropped with a note.
//    A folder with neither a summary nor any record throws IoError naming it. The run's name is its folder's name
//    as valid UTF-8 with control characters written as '?'.
//  * Memory: a load holds one line of at most kMaxRecordLine bytes at a time, and about 100-400 bytes per charted
//    record (never a record's whole JSON, never anything sized by a record's time or a line's length); a syncer's
//    status records are reduced to the latest per shard and file as they are read.
//  * The series use seconds since the run's first record (the "t" field: wall clock for `deloco run`, virtual time
//    for `deloco sim`; `elapsed_s` for `deloco train`).
//  * report_html() fills the page's template (src/report/web/report.html, with its report.js and report.css, compiled
//    in) with the chart library (uPlot, passed in) and the data: the page loads nothing at run time.
//    The data is JSON inside a <script type="application/json"> block with every <, >, & and U+2028/U+2029
//    written as \uXXXX, so no text of a record can end the block or start markup; the page's script puts every
//    value it shows into the DOM escaped (or as textContent), whatever its JSON type.
//  * write_report_pngs() writes DIR/<chart>.dat, .gp and, when gnuplot is installed, .png; returns the PNG paths
//    (empty when gnuplot is missing, after saying so on stderr). Run names reach the .gp script only as
//    single-quoted gnuplot strings (where gnuplot substitutes nothing) with every ' doubled and every control
//    character written as '?', so a name cannot end its line or its string: no name runs a command.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "records/record.h"

namespace deloco {

struct ReportRun {
  std::string name;            // the folder's name (made unique by the caller)
  std::string dir;
  std::string kind;            // "run", "sim" or "train"
  nlohmann::json summary;      // summary.json, or null
  // Series (time in seconds since the run's first record).
  std::vector<std::array<double, 4>> evals;   // t, tokens, val_loss, val_bpb
  std::vector<std::array<double, 3>> merges;  // t, quorum (contributions merged), grace wait (s)
  std::map<int64_t, std::vector<std::array<double, 4>>> learners;  // id -> t, step, loss, tokens
  std::map<std::string, int64_t> rejects;     // reason -> contributions refused
  std::vector<std::pair<double, std::string>> events;  // t, what (chaos, failures, restarts)
  // The latest of each learner: its state ("training", "down", "rejoining", "done"; "" when unknown), step,
  // training loss, throughput (tokens/s over its last two records) and when it last wrote.
  struct LearnerNow {
    std::string state;
    double t = 0, step = 0, loss = std::numeric_limits<double>::quiet_NaN(), tokens_per_s = 0;
  };
  std::map<int64_t, LearnerNow> learner_now;
  int64_t bad_lines = 0;   // lines that were not a JSON object with a string "kind"
  int64_t long_lines = 0;  // lines over kMaxRecordLine bytes, skipped unread
  int64_t bad_times = 0;   // records with a time that is not a finite time in [0, kMaxRecordTime]
  std::vector<std::string> notes;  // the first kMaxNotes skips, each naming its file, line and problem
};

// The bounds of the reader (see the contract above).
inline constexpr size_t kMaxRecordLine = rec::kMaxRecordLine;  // 1 MiB: a record line (real ones are < 1 KiB)
inline constexpr double kMaxRecordTime = 1e10;                  // s: a unix time (year 2286) or a run's seconds
inline constexpr size_t kMaxRecordText = rec::kMaxRecordText;  // 256 bytes of an event line or reject reason
inline constexpr size_t kMaxRejectReasons = 64;                 // distinct reject reasons kept by name
inline constexpr size_t kMaxSummaryBytes = size_t{16} << 20;    // 16 MiB: summary.json (real ones are < 10 KiB)
inline constexpr size_t kMaxNotes = 20;                         // skip notes kept per run
inline constexpr size_t kMaxLearnerSeries = 512;                // learners charted per run (ids in order of appearance)
inline constexpr size_t kLearnerPointBudget = 65536;            // thinned learner points per run, over all learners

ReportRun load_report_run(const std::string& dir);

// The same folder read again and again, as a live dashboard asks every 2 s: each load() returns what
// load_report_run(dir) would return at that moment, but reads only the bytes the record files gained since the
// previous load() (a file that shrank, or was replaced by another at its path, is read again from its start:
// records/record.h, RecordTailer), so a poll costs the new records, not the run's whole history. summary.json is read whole each time. Not thread-safe: one caller at a time.
class ReportRunReader {
 public:
  explicit ReportRunReader(std::string dir);
  ~ReportRunReader();
  ReportRunReader(ReportRunReader&&) noexcept;
  ReportRunReader& operator=(ReportRunReader&&) noexcept;
  ReportRun load();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The data block of the page (also what a live dashboard serves): one object per run.
// max_points > 0 thins each chart series longer than that (the evaluations, the merges, each learner's records, the
// event list) to max_points records evenly spaced in their order, the first and the last always kept, and marks
// the run with "thinned_to": max_points; 0 keeps every record. The learners' series share kLearnerPointBudget
// points besides (each keeps at most max(2, budget / learners)), so a run of many learners stays a bounded answer. The merge rate has at most max_points buckets
// (0: at most max(20, merges) buckets), whatever the span of the run's times. learner_now and the summary are
// never thinned; the summary keeps only its shown fields, and only those of the expected JSON type (numbers; a
// string for "command" and "loss_unit", cut to kMaxRecordText bytes). "dir" is the folder as given to the
// reader (the live dashboard serves "." instead: it shows no absolute path).
nlohmann::json report_data(const std::vector<ReportRun>& runs, size_t max_points = 0);

// The number of records of the run's longest chart series (evaluations, merges, any learner's): report_data thins
// the run when this exceeds a nonzero max_points.
size_t longest_series(const ReportRun& run);

// What the live dashboard serves per series (a chart of about 1,100 pixels shows no more).
inline constexpr size_t kLiveReportPoints = 2000;

// live = true: the page of a running syncer's dashboard. It starts empty and fetches `api/data` (report_data() of
// the run folder) every 2 s, updating the charts in place (a chart the user zoomed into keeps its zoom); the runs
// given are then ignored. max_points: as report_data's.
std::string report_html(const std::vector<ReportRun>& runs, const std::string& title, const std::string& uplot_js,
                        const std::string& uplot_css, bool live = false, size_t max_points = 0);

// max_points: the merge-rate chart's bucket bound, as report_data's.
std::vector<std::string> write_report_pngs(const std::vector<ReportRun>& runs, const std::string& dir,
                                           size_t max_points = 10000);

}  // namespace deloco
