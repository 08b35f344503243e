// `deloco report RUN_DIR... --out report.html [--png DIR]`: one self-contained HTML page from the records of run
// folders of `deloco run`, `deloco sim` or `deloco train`, several runs overlaid (src/report/report.h).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>

#include "commands.h"
#include "common.h"
#include "report/report.h"
#include "util/fs.h"
#include "web_assets.h"

namespace deloco::cli {
namespace {

struct ReportOptions {
  std::vector<std::string> dirs;
  std::string out = "report.html";
  std::string png_dir;
  std::string title;
  std::string summary_path;
  size_t max_points = 10000;
};

void run(const ReportOptions& o) {
  if (std::string(kUplotJs).empty())
    throw std::runtime_error(
        "this deloco was built without uPlot, the chart library its reports embed: run scripts/setup.sh (it fetches "
        "uPlot from the npm registry into third_party/uplot) and rebuild");
  std::vector<ReportRun> runs;
  std::set<std::string> names;
  for (const auto& d : o.dirs) {
    ReportRun r = load_report_run(d);
    std::string name = r.name;
    for (int k = 2; names.count(name); ++k) name = r.name + " (" + std::to_string(k) + ")";
    r.name = name;
    names.insert(name);
    if (r.bad_lines > 0 || r.long_lines > 0 || r.bad_times > 0) {
      std::cerr << "report: " << r.name << ": skipped " << r.bad_lines << " line(s) that were not JSON records, "
                << r.long_lines << " line(s) over " << (kMaxRecordLine >> 20) << " MiB and " << r.bad_times
                << " record(s) with an impossible time; the page lists the first ones\n";
    }
    for (const auto& n : r.notes) std::cerr << "report: " << r.name << ": " << n << "\n";
    runs.push_back(std::move(r));
  }
  std::string title = o.title;
  if (title.empty()) {
    title = "deloco report: ";
    for (size_t i = 0; i < runs.size(); ++i) title += (i ? ", " : "") + runs[i].name;
  }
  const std::filesystem::path parent = std::filesystem::path(o.out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomic(o.out, report_html(runs, title, kUplotJs, kUplotCss, /*live=*/false, o.max_points));
  std::cout << "report written to " << o.out << " (" << runs.size() << (runs.size() == 1 ? " run" : " runs")
            << "; open it in a browser, it loads nothing else)\n";
  for (const auto& r : runs)
    std::cout << "  " << r.name << " (" << r.kind << "): " << r.evals.size() << " evaluations, " << r.merges.size()
              << " merges, " << r.learners.size() << " learner(s), " << r.events.size() << " events\n";
  for (const auto& r : runs) {
    const size_t longest = longest_series(r);
    if (o.max_points > 0 && longest > o.max_points)
      std::cout << "  " << r.name << ": charts thinned to " << o.max_points << " of up to " << longest
                << " records per series (--max-points 0 keeps every record)\n";
  }
  std::vector<std::string> pngs;
  if (!o.png_dir.empty()) {
    pngs = write_report_pngs(runs, o.png_dir, o.max_points);
    for (const auto& p : pngs) std::cout << "  " << p << "\n";
  }
  if (!o.summary_path.empty()) {
    nlohmann::json s{{"command", "report"}, {"out", o.out}, {"runs", report_data(runs, o.max_points)}, {"pngs", pngs}};
    write_file_atomic(o.summary_path, s.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto opts = std::make_shared<ReportOptions>();
  CLI::App* sub = app.add_subcommand(
      "report",
      "one self-contained HTML page (charts, summary table, events) from run folders of deloco run, sim or train; "
      "several folders are overlaid for comparison");
  sub->add_option("runs", opts->dirs, "run folders (RUN of deloco run, the out folder of sim or train)")
      ->required()
      ->check(CLI::ExistingDirectory);
  sub->add_option("--out", opts->out, "the HTML file to write (default report.html)");
  sub->add_option("--png", opts->png_dir, "also write the main charts as PNG (with gnuplot) into DIR");
  sub->add_option("--title", opts->title, "the page title (default: the run names)");
  sub->add_option("--summary", opts->summary_path, "write the charts' data as JSON to FILE");
  sub->add_option("--max-points", opts->max_points,
                  "thin each chart series, the event list and the merge-rate buckets (and the --summary data) to at "
                  "most N evenly spaced records, the first and last kept (default 10000; 0 keeps every record)");
  sub->callback([opts]() { run(*opts); });
}

}  // namespace deloco::cli
