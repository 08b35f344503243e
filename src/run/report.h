// src/run/report.h — `deloco report RUN_DIR... --out report.html [--png DIR]`: one self-contained HTML page (and,
// optionally, PNG charts through gnuplot) from the JSON-lines records of finished or running runs of `deloco run`,
// `deloco sim` or `deloco train`, several runs overlaid for comparison.
//
// Contract
//  * load_report_run(dir) reads what the folder holds: summary.json (optional while a run is still going) and the
//    records of metrics.jsonl (sim, train), syncer.jsonl or shard-*/syncer.jsonl, learner-*.jsonl and events.jsonl
//    (`deloco run`). Records are untrusted text: a line that is not a JSON object with a string "kind" is counted
//    in `bad_lines` and skipped; a field of an unexpected type skips that record. A folder with neither a summary
//    nor any record throws IoError naming it.
//  * The series use seconds since the run's first record (the "t" field: wall clock for `deloco run`, virtual time
//    for `deloco sim`; `elapsed_s` for `deloco train`).
//  * report_html() embeds the chart library (uPlot, passed in) and the data: the page loads nothing at run time.
//    Text from the records is JSON-escaped into a <script> block with "</" written as "<\/".
//  * write_report_pngs() writes DIR/<chart>.dat, .gp and, when gnuplot is installed, .png; returns the PNG paths
//    (empty when gnuplot is missing, after saying so on stderr).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  int64_t bad_lines = 0;
};

ReportRun load_report_run(const std::string& dir);

// The same folder read again and again, as a live dashboard asks every 2 s: each load() returns what
// load_report_run(dir) would return at that moment, but reads only the bytes the record files gained since the
// previous load() (a file that shrank is read again from its start), so a poll costs the new records, not the
// run's whole history. summary.json is read whole each time. Not thread-safe: one caller at a time.
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
// max_points > 0 thins each chart series longer than that (the evaluations, the merges, each learner's records) to
// max_points records evenly spaced in their order, the first and the last always kept, and marks the run with
// "thinned_to": max_points; 0 keeps every record. learner_now, the summary and the event list are never thinned.
nlohmann::json report_data(const std::vector<ReportRun>& runs, size_t max_points = 0);

// The number of records of the run's longest chart series (evaluations, merges, any learner's): report_data thins
// the run when this exceeds a nonzero max_points.
size_t longest_series(const ReportRun& run);

// What the live dashboard serves per series (a chart of about 1,100 pixels shows no more).
inline constexpr size_t kLiveReportPoints = 2000;

// live = true: the page of a running syncer's dashboard. It starts empty and fetches `api/data` (report_data() of
// the run folder) every 2 s, redrawing; the runs given are then ignored. max_points: as report_data's.
std::string report_html(const std::vector<ReportRun>& runs, const std::string& title, const std::string& uplot_js,
                        const std::string& uplot_css, bool live = false, size_t max_points = 0);

std::vector<std::string> write_report_pngs(const std::vector<ReportRun>& runs, const std::string& dir);

}  // namespace deloco
