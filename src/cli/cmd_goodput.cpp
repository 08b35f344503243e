// `deloco goodput`: the chip-scale chaos simulator. Parses flags and config, runs deloco::run_goodput and writes
// the terminal table, the --summary JSON, an optional CSV and an optional PNG plot (through gnuplot).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "goodput/fit.h"
#include "goodput/goodput.h"
#include "util/fs.h"
#include "util/shell.h"

namespace deloco::cli {
namespace {

struct GoodputOptions {
  CommonOptions common;
  std::vector<std::string> flag_values;  // one per goodput_key_docs() entry; empty = not given
  std::string csv_path;
  std::string plot_path;
  std::string fit_path;      // --fit FILE.csv
  std::string fit_params;    // --fit-params a,b,c
  std::string fit_out;       // --fit-out FILE.toml
  int64_t fit_evals = 400;   // --fit-evals N
};

std::string chips_label(int64_t c) {
  std::ostringstream o;
  if (c >= 1000000 && c % 100000 == 0) o << c / 1000000.0 << "M";
  else if (c >= 1000 && c % 1000 == 0) o << c / 1000 << "k";
  else o << c;
  return o.str();
}

std::string series_label(const GoodputRow& r) {
  if (r.scheme == "dp") return "DP";
  if (r.scheme == "elastic_dp") return "elastic DP";
  return "DiLoCo M=" + std::to_string(r.learners);
}

std::string cell(double mean, double ci) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(3) << mean << "±" << std::setprecision(3) << ci;
  return o.str();
}

// One table: rows = chip counts, columns = scheme series.
void print_pivot(std::ostream& out, const std::vector<GoodputRow>& rows, bool goodput) {
  std::vector<std::string> series;
  std::vector<int64_t> chips;
  for (const auto& r : rows) {
    const std::string s = series_label(r);
    if (std::find(series.begin(), series.end(), s) == series.end()) series.push_back(s);
    if (std::find(chips.begin(), chips.end(), r.chips) == chips.end()) chips.push_back(r.chips);
  }
  const int w = 14;
  out << (goodput ? "goodput" : "uptime ") << " (mean±95% CI over seeds)\n";
  out << std::left << std::setw(8) << "chips" << std::setw(8) << "slices";
  for (const auto& s : series) out << std::setw(w) << s;
  out << "\n";
  for (int64_t c : chips) {
    int64_t slices = 0;
    for (const auto& r : rows)
      if (r.chips == c) slices = r.slices;
    out << std::setw(8) << chips_label(c) << std::setw(8) << slices;
    for (const auto& s : series) {
      std::string text = "-";
      for (const auto& r : rows)
        if (r.chips == c && series_label(r) == s)
          text = goodput ? cell(r.goodput, r.goodput_ci95) : cell(r.uptime, r.uptime_ci95);
      // "±" is two bytes in UTF-8 but one column on screen.
      out << text << std::string(static_cast<size_t>(std::max<int>(1, w - static_cast<int>(text.size()) + 1)), ' ');
    }
    out << "\n";
  }
}

nlohmann::json row_json(const GoodputRow& r) {
  return {{"scheme", r.scheme},           {"chips", r.chips},
          {"slices", r.slices},           {"spare_slices", r.spare_slices},
          {"learners", r.learners},       {"quorum", r.quorum},
          {"goodput", r.goodput},         {"goodput_ci95", r.goodput_ci95},
          {"uptime", r.uptime},           {"uptime_ci95", r.uptime_ci95},
          {"failures_per_run", r.failures}, {"seeds", r.seeds}};
}

std::string csv_text(const std::vector<GoodputRow>& rows) {
  std::ostringstream o;
  o << "scheme,chips,slices,spare_slices,learners,quorum,goodput,goodput_ci95,uptime,uptime_ci95,failures_per_run,seeds\n";
  o << std::setprecision(6);
  for (const auto& r : rows)
    o << r.scheme << "," << r.chips << "," << r.slices << "," << r.spare_slices << "," << r.learners << ","
      << r.quorum << "," << r.goodput << "," << r.goodput_ci95 << "," << r.uptime << "," << r.uptime_ci95 << ","
      << r.failures << "," << r.seeds << "\n";
  return o.str();
}

// Creates the folder that will hold `path`, so --csv out/x.csv works in a fresh tree.
void make_parent(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw std::runtime_error("cannot create the folder '" + parent.string() + "': " + ec.message());
}

// Writes STEM.dat and STEM.gp beside the PNG and runs gnuplot when it is installed.
void write_plot(const std::string& png, const std::vector<GoodputRow>& rows, const GoodputParams& p) {
  std::string stem = png;
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".png") == 0) stem.resize(stem.size() - 4);
  const std::string dat = stem + ".dat", gp = stem + ".gp";
  std::vector<std::string> series;
  for (const auto& r : rows)
    if (std::find(series.begin(), series.end(), series_label(r)) == series.end()) series.push_back(series_label(r));
  std::ostringstream d;
  d << std::setprecision(6);
  for (size_t i = 0; i < series.size(); ++i) {
    d << "# " << series[i] << "\n# chips goodput goodput_ci95 uptime uptime_ci95\n";
    for (const auto& r : rows)
      if (series_label(r) == series[i])
        d << r.chips << " " << r.goodput << " " << r.goodput_ci95 << " " << r.uptime << " " << r.uptime_ci95 << "\n";
    d << "\n\n";
  }
  make_parent(dat);
  write_file_atomic(dat, d.str());
  auto base = [](const std::string& path) {
    const auto slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
  };
  std::ostringstream g;
  g << "# gnuplot script written by `deloco goodput`; run `gnuplot " << base(gp) << "` in this folder.\n"
    << "set terminal pngcairo size 900,560 enhanced font 'Sans,11'\n"
    << "set output '" << base(png) << "'\n"
    << "set title 'Goodput under chip failures (chip MTBI " << p.mtbi_chip_years << " y, " << p.slice_chips
    << "-chip slices, " << p.days << " days, " << p.seeds << " seeds)'\n"
    << "set xlabel 'chips'\nset ylabel 'goodput (useful / allocated chip-time)'\n"
    << "set logscale x 2\nset yrange [0:1.02]\nset grid\nset key outside right\n";
  int64_t cmin = p.chips.front(), cmax = p.chips.front();
  g << "set xtics (";
  for (size_t i = 0; i < p.chips.size(); ++i) {
    g << (i ? ", " : "") << "'" << chips_label(p.chips[i]) << "' " << p.chips[i];
    cmin = std::min(cmin, p.chips[i]);
    cmax = std::max(cmax, p.chips[i]);
  }
  g << ")\nset xrange [" << cmin / 1.25 << ":" << cmax * 1.25 << "]\nplot \\\n";
  for (size_t i = 0; i < series.size(); ++i)
    g << "  '" << base(dat) << "' index " << i << " using 1:2:3 with yerrorlines lw 2" << (series[i] == "elastic DP" ? " dt 2" : "") << " title '"
      << series[i] << "'"
      << (i + 1 < series.size() ? ", \\\n" : "\n");
  write_file_atomic(gp, g.str());
  if (!have_program("gnuplot")) {
    std::cerr << "goodput: gnuplot is not installed, so no PNG was drawn; wrote " << dat << " and " << gp
              << " (install it with `apt-get install gnuplot-nox`, then run `gnuplot " << base(gp) << "` in that folder)\n";
    return;
  }
  std::string dir = ".";
  const auto slash = gp.find_last_of('/');
  if (slash != std::string::npos) dir = gp.substr(0, slash);
  if (!run_gnuplot(dir, base(gp), /*quiet=*/false)) throw std::runtime_error("gnuplot failed to draw " + png + " from " + gp);
  std::cerr << "plot written to " << png << " (data " << dat << ", script " << gp << ")\n";
}

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

// `deloco goodput --fit FILE.csv`: calibrate, print the parameters and the rows, write the fitted TOML.
void run_fit(GoodputOptions& o, const GoodputParams& base, const ConfigSchema& schema) {
  const std::string text = read_file(o.fit_path);
  const std::vector<GoodputTarget> targets = parse_goodput_csv(text, o.fit_path, base);
  GoodputFitOptions fo;
  if (!o.fit_params.empty()) {
    fo.names.clear();
    std::string cur;
    std::istringstream in(o.fit_params);
    while (std::getline(in, cur, ','))
      if (!cur.empty()) fo.names.push_back(cur);
  }
  fo.max_evaluations = o.fit_evals;
  fo.table = o.fit_path;
  std::string names;
  for (const auto& n : fo.names) names += (names.empty() ? "" : ", ") + n;
  std::cout << "deloco goodput --fit " << o.fit_path << ": " << targets.size() << " rows, fitting " << fo.names.size()
            << " parameters (" << names << ") by bounded least squares (NLopt Subplex); each evaluation simulates every row for "
            << base.days << " days x " << base.seeds << " seeds (the same seeds every time)\n\n";
  const auto start = std::chrono::steady_clock::now();
  const GoodputFitResult r = fit_goodput(base, targets, fo);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // At the fitted values: a fit that moved repair_hours up may have measured before the repairs' steady state.
  if (const std::string w = goodput_warnings(r.params); !w.empty())
    std::cerr << "deloco goodput --fit: warning at the fitted values: " << w << "\n";

  std::cout << "fitted parameters (± linearised standard error)\n";
  for (size_t i = 0; i < r.names.size(); ++i) {
    std::ostringstream line;
    line << "  " << std::left << std::setw(20) << r.names[i] << std::right << std::setw(12) << fixed(r.values[i], 4);
    if (std::isinf(r.stderrs[i])) line << "   unidentified: no row depends on it";
    else if (r.inseparable[i]) line << "   ± n/a: inseparable (the rows constrain it only together with another)";
    else if (!r.stderrs_estimated) line << "   ± n/a (--fit-evals left no evaluations for the standard errors)";
    else if (std::isnan(r.stderrs[i])) line << "   ± n/a (no more rows than parameters)";
    else line << " ± " << fixed(r.stderrs[i], 4);
    if (r.at_bound[i]) line << "   (at a bound)";
    std::cout << line.str() << "\n";
  }
  std::cout << "\n  line  scheme       M   chips      target   fitted   residual\n";
  size_t worst = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto& t = targets[i];
    if (std::fabs(r.fitted[i] - t.goodput) > std::fabs(r.fitted[worst] - targets[worst].goodput)) worst = i;
    std::cout << "  " << std::left << std::setw(6) << t.line << std::setw(12) << scheme_name(t.scheme) << std::right
              << std::setw(2) << t.learners << std::setw(9) << chips_label(t.chips) << std::setw(11)
              << fixed(t.goodput, 4) << std::setw(9) << fixed(r.fitted[i], 4) << std::setw(11)
              << fixed(r.fitted[i] - t.goodput, 4) << "\n";
  }
  std::cout << "\nRMS residual " << fixed(r.rms, 4) << " (at the start " << fixed(r.start_rms, 4) << "), worst "
            << fixed(r.worst, 4) << " (line " << targets[worst].line << "); " << r.evaluations << " evaluations in "
            << fixed(wall, 1) << " s (" << r.stop_reason << ")\n";

  // The fitted config: the table's chip and learner counts and schemes, so `--config` reruns these rows.
  GoodputParams out = r.params;
  out.chips.clear();
  out.learners.clear();
  out.dp = out.elastic_dp = out.diloco = false;
  for (const auto& t : targets) {
    if (std::find(out.chips.begin(), out.chips.end(), t.chips) == out.chips.end()) out.chips.push_back(t.chips);
    if (t.scheme == Scheme::kDataParallel) out.dp = true;
    if (t.scheme == Scheme::kElasticDP) out.elastic_dp = true;
    if (t.scheme == Scheme::kDecoupledDiLoCo) {
      out.diloco = true;
      if (std::find(out.learners.begin(), out.learners.end(), t.learners) == out.learners.end())
        out.learners.push_back(t.learners);
    }
  }
  std::sort(out.chips.begin(), out.chips.end());
  std::sort(out.learners.begin(), out.learners.end());
  if (out.learners.empty()) out.learners = {1};
  std::string path = o.fit_out;
  if (path.empty()) {
    path = o.fit_path;
    if (path.size() > 4 && path.compare(path.size() - 4, 4, ".csv") == 0) path.resize(path.size() - 4);
    path += ".fit.toml";
  }
  std::string note;
  try {
    validate_goodput(out);
  } catch (const ConfigError& e) {
    note = std::string("note: the table's chip and learner counts do not form a grid deloco goodput can run (") +
           e.what() + "); edit goodput.chips / goodput.learners before using it";
  }
  make_parent(path);
  write_file_atomic(path, goodput_toml(out, "written by `deloco goodput --fit " + o.fit_path + "` (RMS residual " +
                                                fixed(r.rms, 4) + ", worst " + fixed(r.worst, 4) +
                                                ")\nfitted: " + names + "\n`deloco goodput --config` on this "
                                                "file reproduces the fitted goodput of every row of the table"));
  std::cout << "fitted config written to " << path << " (deloco goodput --config " << path
            << " reproduces the fitted column)\n";
  if (!note.empty()) std::cout << note << "\n";

  nlohmann::json summary;
  summary["command"] = "goodput --fit";
  summary["config"] = schema.to_json();
  summary["table"] = o.fit_path;
  summary["fitted_config"] = path;
  summary["parameters"] = nlohmann::json::array();
  for (size_t i = 0; i < r.names.size(); ++i) {
    nlohmann::json q{{"name", r.names[i]}, {"value", r.values[i]}, {"at_bound", static_cast<bool>(r.at_bound[i])}};
    q["stderr"] = std::isfinite(r.stderrs[i]) ? nlohmann::json(r.stderrs[i]) : nlohmann::json(nullptr);
    q["identified"] = !std::isinf(r.stderrs[i]);
    q["separable"] = !r.inseparable[i];
    q["stderr_estimated"] = r.stderrs_estimated;
    summary["parameters"].push_back(q);
  }
  summary["rows"] = nlohmann::json::array();
  for (size_t i = 0; i < targets.size(); ++i)
    summary["rows"].push_back({{"line", targets[i].line}, {"scheme", scheme_name(targets[i].scheme)},
                               {"learners", targets[i].learners}, {"chips", targets[i].chips},
                               {"target", targets[i].goodput}, {"fitted", r.fitted[i]},
                               {"residual", r.fitted[i] - targets[i].goodput}});
  summary["rms"] = r.rms;
  summary["worst"] = r.worst;
  summary["start_rms"] = r.start_rms;
  summary["evaluations"] = r.evaluations;
  summary["stop_reason"] = r.stop_reason;
  summary["wall_seconds"] = wall;
  write_summary(o.common, summary);
}

void run(GoodputOptions& o) {
  GoodputParams p;
  ConfigSchema schema;
  bind_goodput_config(schema, p);
  // The one load order (deloco/config.h): the config file, DELOCO_SET, the per-key flags (another spelling of
  // --set), --set.
  ConfigSources src;
  src.base = [&] {
    if (!o.common.config_path.empty()) schema.load_file(o.common.config_path);
  };
  const auto& docs = goodput_key_docs();
  for (size_t i = 0; i < docs.size(); ++i) {
    if (o.flag_values[i].empty()) continue;
    std::string flag = docs[i].key.substr(8);
    for (auto& c : flag) if (c == '_') c = '-';
    src.key_flags.emplace_back("--" + flag + " '" + o.flag_values[i] + "'", docs[i].key + "=" + o.flag_values[i]);
  }
  src.sets = o.common.sets;
  load_config(schema, src);
  if (!o.fit_path.empty()) return run_fit(o, p, schema);
  validate_goodput(p);
  if (const std::string w = goodput_warnings(p); !w.empty()) std::cerr << "deloco goodput: warning: " << w << "\n";

  const auto start = std::chrono::steady_clock::now();
  const std::vector<GoodputRow> rows = run_goodput(p);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::cout << "deloco goodput: chip MTBI " << p.mtbi_chip_years << " y, " << p.slice_chips << "-chip slices, repair "
            << p.repair_hours << " h (" << p.repair_dist << "), restart " << p.restart_minutes << " min, reconfig "
            << p.downscale_seconds << "/" << p.upscale_seconds << " s, quorum "
            << (p.quorum_learners > 0 ? "K=" + std::to_string(p.quorum_learners) : fixed(p.quorum, 2)) << ", spares "
            << p.spare_fraction;
  if (p.spare_fraction > 0) std::cout << " (swap " << p.swap_minutes << " min)";
  if (p.reset_fraction > 0) std::cout << ", resets " << p.reset_fraction * 100 << "% x " << p.reset_minutes << " min";
  if (p.domain_slices > 0)
    std::cout << ", domains of " << p.domain_slices << " slices every " << p.domain_mtbf_days << " d";
  if (p.syncer_mtbf_hours > 0)
    std::cout << ", syncer MTBF " << p.syncer_mtbf_hours << " h (restart " << p.syncer_restart_minutes << " min)";
  if (p.catchup_minutes > 0) std::cout << ", catch-up " << p.catchup_minutes << " min";
  std::cout << ", " << p.days << " days x " << p.seeds << " seeds\n\n";
  print_pivot(std::cout, rows, true);
  std::cout << "\n";
  print_pivot(std::cout, rows, false);
  std::cout << "\n" << rows.size() * static_cast<size_t>(p.seeds) << " runs in " << std::fixed << std::setprecision(2)
            << wall << " s\n";

  if (!o.csv_path.empty()) {
    make_parent(o.csv_path);
    write_file_atomic(o.csv_path, csv_text(rows));
    std::cerr << "csv written to " << o.csv_path << "\n";
  }
  if (!o.plot_path.empty()) write_plot(o.plot_path, rows, p);

  nlohmann::json summary;
  summary["command"] = "goodput";
  summary["config"] = schema.to_json();
  summary["rows"] = nlohmann::json::array();
  for (const auto& r : rows) summary["rows"].push_back(row_json(r));
  summary["wall_seconds"] = wall;
  write_summary(o.common, summary);
}

}  // namespace

void add_goodput_command(CLI::App& app) {
  auto opts = std::make_shared<GoodputOptions>();
  CLI::App* sub = app.add_subcommand(
      "goodput",
      "chip-scale chaos simulator: goodput and uptime of DP, elastic DP and Decoupled DiLoCo under chip failures "
      "(every goodput.* config key is also a flag; see docs/goodput.md)");
  add_common_options(sub, &opts->common);
  sub->add_option("--csv", opts->csv_path, "write the result rows as CSV to FILE");
  sub->add_option("--plot", opts->plot_path,
                  "draw goodput against chip count to FILE.png with gnuplot (FILE.dat and FILE.gp are kept beside it)");
  sub->add_option("--fit", opts->fit_path,
                  "calibrate: fit the unpublished parameters to a CSV of scheme,learners,chips,goodput rows and write "
                  "the fitted config (see docs/goodput.md)");
  sub->add_option("--fit-params", opts->fit_params,
                  "with --fit: the goodput.* keys to fit, comma-separated (default restart_minutes,downscale_seconds,"
                  "upscale_seconds,swap_minutes,spare_fraction,reset_fraction,step_time_cv)");
  sub->add_option("--fit-out", opts->fit_out, "with --fit: where to write the fitted TOML (default: FILE.fit.toml)");
  sub->add_option("--fit-evals", opts->fit_evals,
                  "with --fit: at most this many evaluations of the simulator in all (each simulates every row; the "
                  "start, the scan, the search and the standard errors' 2 per parameter; default 400)")
      ->check(CLI::Range(1, 100000));
  const auto& docs = goodput_key_docs();
  opts->flag_values.resize(docs.size());
  for (size_t i = 0; i < docs.size(); ++i) {
    std::string flag = docs[i].key.substr(8);  // drop "goodput."
    for (auto& c : flag) if (c == '_') c = '-';
    sub->add_option("--" + flag, opts->flag_values[i], docs[i].help + " [" + docs[i].key + "]");
  }
  sub->callback([opts]() { run(*opts); });
}

}  // namespace deloco::cli
