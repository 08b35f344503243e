// report_reader: what one poll of the live dashboard costs on a long run, whole read against ReportRunReader.
//
// Usage: report_reader [learners=8] [records_per_learner=20000] [polls=21]
// Writes a run folder as `deloco run` leaves it after a long run (syncer.jsonl with status, merge and eval records,
// learner-<i>.jsonl with one record per learner report), then polls it `polls` times as the dashboard does every
// 2 s: before each poll every file gains a few records (a run that keeps going). Each poll is timed three ways,
// side by side on the same folder state:
//   whole   load_report_run(dir)          (what the dashboard did before ReportRunReader)
//   reader  ReportRunReader::load()       (reads only what the files gained)
//   json    report_data({run}).dump()     (every record of every series serialized, as the dashboard did)
//   thinned report_data({run}, kLiveReportPoints).dump()   (what the dashboard serves now)
// and the two reads are checked to give the same data. Prints medians in ms and the ratios.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "report/report.h"

namespace {
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Resident memory of this process in MB (Linux /proc/self/statm), 0 where unknown.
double resident_mb() {
  std::ifstream statm("/proc/self/statm");
  double pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1e6;
}

// Appends `n` records to every file of the run, continuing from record `from`.
void grow(const fs::path& dir, int learners, long from, long n) {
  for (int i = 0; i < learners; ++i) {
    std::ofstream f(dir / ("learner-" + std::to_string(i) + ".jsonl"), std::ios::app);
    for (long r = from; r < from + n; ++r) {
      const double t = 100.0 + static_cast<double>(r) + 0.01 * i;
      f << R"({"kind":"learner","t":)" << t << R"(,"step":)" << (r + 1) * 10 << R"(,"loss":)" << 8.0 / (1.0 + 1e-3 * r)
        << R"(,"tokens":)" << (r + 1) * 40960 << R"(,"state":"training"})" << '\n';
    }
  }
  std::ofstream s(dir / "syncer.jsonl", std::ios::app);
  for (long r = from; r < from + n; ++r) {
    const double t = 100.5 + static_cast<double>(r);
    s << R"({"kind":"status","t":)" << t << R"(,"connected":[0,1,2,3,4,5,6,7],"merges":)" << r / 4
      << R"(,"uptime":0.97})" << '\n';
    if (r % 4 == 3) {
      s << R"({"kind":"merge","t":)" << t + 0.1 << R"(,"learners":[0,1,2,3,4,5,6,7],"grace_wait":0.2})" << '\n';
    }
    if (r % 40 == 39) {
      s << R"({"kind":"eval","t":)" << t + 0.2 << R"(,"val_loss":)" << 6.0 / (1.0 + 1e-3 * r)
        << R"(,"val_bpb":1.5,"tokens":)" << (r + 1) * 40960 * learners << '}' << '\n';
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int learners = argc > 1 ? std::atoi(argv[1]) : 8;
  const long records = argc > 2 ? std::atol(argv[2]) : 20000;
  const int polls = argc > 3 ? std::atoi(argv[3]) : 21;
  if (learners < 1 || records < 1 || polls < 1) {
    std::fprintf(stderr, "usage: report_reader [learners>=1] [records_per_learner>=1] [polls>=1]\n");
    return 2;
  }
  const fs::path dir = fs::temp_directory_path() / ("deloco-report-bench-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  grow(dir, learners, 0, records);
  uintmax_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) bytes += fs::file_size(e.path());
  std::printf("run folder: %d learners x %ld records, %.1f MB; %d polls, each after 2 new records per file\n",
              learners, records, static_cast<double>(bytes) / 1e6, polls);

  const double rss_before = resident_mb();
  deloco::ReportRunReader reader(dir.string());
  reader.load();  // the dashboard's first poll reads everything once, as a whole read does
  std::printf("the reader's state after its first read: %.1f MB resident\n", resident_mb() - rss_before);
  std::vector<double> whole_ms, reader_ms, json_ms, thin_ms;
  size_t json_bytes = 0, thin_bytes = 0;
  long next = records;
  int mismatches = 0;
  for (int p = 0; p < polls; ++p) {
    grow(dir, learners, next, 2);
    next += 2;
    auto t0 = clock_type::now();
    const deloco::ReportRun whole = deloco::load_report_run(dir.string());
    whole_ms.push_back(ms_since(t0));
    t0 = clock_type::now();
    const deloco::ReportRun incremental = reader.load();
    reader_ms.push_back(ms_since(t0));
    t0 = clock_type::now();
    const std::string served = deloco::report_data({incremental}).dump();
    json_ms.push_back(ms_since(t0));
    json_bytes = served.size();
    t0 = clock_type::now();
    const std::string thin = deloco::report_data({incremental}, deloco::kLiveReportPoints).dump();
    thin_ms.push_back(ms_since(t0));
    thin_bytes = thin.size();
    if (deloco::report_data({whole}) != deloco::report_data({incremental})) ++mismatches;
  }
  fs::remove_all(dir);
  const double w = median(whole_ms), r = median(reader_ms), j = median(json_ms), th = median(thin_ms);
  std::printf("%-8s %12s\n", "read", "median_ms");
  std::printf("%-8s %12.3f\n", "whole", w);
  std::printf("%-8s %12.3f\n", "reader", r);
  std::printf("%-8s %12.3f  (%.1f MB served)\n", "json", j, static_cast<double>(json_bytes) / 1e6);
  std::printf("%-8s %12.3f  (%.2f MB served, %zu records per series at most)\n", "thinned", th,
              static_cast<double>(thin_bytes) / 1e6, deloco::kLiveReportPoints);
  std::printf("whole/reader %.1fx; a poll: %.2f ms whole read + json, %.2f ms reader + json, %.2f ms reader + "
              "thinned (%.1fx less)\n",
              w / r, w + j, r + j, r + th, (w + j) / (r + th));
  if (mismatches != 0) {
    std::fprintf(stderr, "error: the reader and a whole read differed in %d of %d polls\n", mismatches, polls);
    return 1;
  }
  return 0;
}
