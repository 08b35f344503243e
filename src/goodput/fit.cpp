// Calibration of the goodput simulator against a table (see src/goodput/fit.h).
#include "goodput/fit.h"

#include <nlopt.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>

#include "deloco/config.h"
#include "deloco/error.h"
#include "util/config_toml.h"
#include "util/text.h"

namespace deloco {
namespace {

// The fields of a CSV line, each without blanks at its ends.
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == ',') {
      out.push_back(trim_space(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(trim_space(cur));
  return out;
}

// A whole decimal number (no sign, no exponent); false otherwise.
bool parse_count(const std::string& s, int64_t* v) {
  if (s.empty() || s.size() > 12) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *v = std::stoll(s);
  return true;
}

bool parse_number(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*v);
}

// A goodput.* number of `p` by its key name, read and written through bind_goodput_config, the one list of the
// keys (so a fit parameter needs no binding of its own).
double param_value(const GoodputParams& p, const std::string& name) {
  GoodputParams copy = p;
  ConfigSchema schema;
  bind_goodput_config(schema, copy);
  return schema.to_json().at("goodput").at(name).get<double>();
}

void set_param(GoodputParams& p, const std::string& name, double value) {
  ConfigSchema schema;
  bind_goodput_config(schema, p);
  schema.from_json({{"goodput", {{name, value}}}}, "goodput --fit");
}

// Eigenvalues (returned) and eigenvectors (columns of *v) of the symmetric matrix `a`, by cyclic Jacobi rotations:
// a handful of parameters, so accuracy over speed.
std::vector<double> symmetric_eigen(std::vector<std::vector<double>> a, std::vector<std::vector<double>>* v) {
  const size_t n = a.size();
  v->assign(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i) (*v)[i][i] = 1.0;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0, total = 0;
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j) {
        total += a[i][j] * a[i][j];
        if (i != j) off += a[i][j] * a[i][j];
      }
    if (off <= 1e-30 * total) break;
    for (size_t p = 0; p + 1 < n; ++p)
      for (size_t q = p + 1; q < n; ++q) {
        if (a[p][q] == 0) continue;
        const double theta = (a[q][q] - a[p][p]) / (2 * a[p][q]);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), sn = t * c;
        for (size_t k = 0; k < n; ++k) {  // A·R
          const double akp = a[k][p], akq = a[k][q];
          a[k][p] = c * akp - sn * akq;
          a[k][q] = sn * akp + c * akq;
        }
        for (size_t k = 0; k < n; ++k) {  // Rᵀ·A
          const double apk = a[p][k], aqk = a[q][k];
          a[p][k] = c * apk - sn * aqk;
          a[q][k] = sn * apk + c * aqk;
        }
        for (size_t k = 0; k < n; ++k) {
          const double vkp = (*v)[k][p], vkq = (*v)[k][q];
          (*v)[k][p] = c * vkp - sn * vkq;
          (*v)[k][q] = sn * vkp + c * vkq;
        }
      }
  }
  std::vector<double> lambda(n);
  for (size_t i = 0; i < n; ++i) lambda[i] = a[i][i];
  return lambda;
}

// `p` with the one row `t` as its whole grid, for validate_goodput.
GoodputParams with_row(const GoodputParams& p, const GoodputTarget& t) {
  return params_for_spec(p, RunSpec{t.scheme, t.chips, t.learners});
}

// Checks `p`'s keys with a one-slice DP row standing in for the grid: errors that are no row's doing.
void validate_model(const GoodputParams& p) {
  GoodputParams q = p;
  q.chips = {std::max<int64_t>(1, p.slice_chips)};
  q.learners = {1};
  q.dp = true;
  q.elastic_dp = q.diloco = false;
  validate_goodput(q);
}

// "TABLE:LINE" of a row for messages ("line N" without a table name, "row N" for a row from no file).
std::string row_name(const std::string& table, const GoodputTarget& t, size_t index) {
  if (t.line <= 0) return "row " + std::to_string(index + 1);
  return table.empty() ? "line " + std::to_string(t.line) : table + ":" + std::to_string(t.line);
}

struct Problem {
  GoodputParams base;
  std::vector<GoodputTarget> targets;
  std::vector<GoodputFitParameter> params;
  int64_t evaluations = 0;   // of the simulator, every one
  int64_t search_limit = 0;  // the start, the scan and the search stop at this many evaluations
  nlopt_opt opt = nullptr;   // while the search runs: stopped at search_limit
  // The best point evaluated (start, scan or search) and its residuals.
  std::vector<double> best_x, best_r;
  double best = std::numeric_limits<double>::infinity();

  GoodputParams at(const double* x) const {
    GoodputParams p = base;
    for (size_t i = 0; i < params.size(); ++i) {
      const double u = std::clamp(x[i], 0.0, 1.0);
      set_param(p, params[i].name, params[i].lower + u * (params[i].upper - params[i].lower));
    }
    return p;
  }
  std::vector<double> residuals(const double* x) {
    ++evaluations;
    const std::vector<double> sim = simulate_targets(at(x), targets);
    std::vector<double> r(sim.size());
    for (size_t i = 0; i < sim.size(); ++i) r[i] = sim[i] - targets[i].goodput;
    return r;
  }
  // The sum of squared residuals at x (one evaluation), remembering the best point. Precondition:
  // evaluations < search_limit.
  double objective(const double* x) {
    const std::vector<double> r = residuals(x);
    double s = 0;
    for (double v : r) s += v * v;
    if (s < best) {
      best = s;
      best_x.assign(x, x + params.size());
      best_r = r;
    }
    return s;
  }
};

double nlopt_objective(unsigned n, const double* x, double* grad, void* data) {
  (void)n;
  (void)grad;  // derivative-free
  Problem& pr = *static_cast<Problem*>(data);
  if (pr.evaluations >= pr.search_limit) {  // the cap is ours to keep, whatever NLopt counts
    nlopt_force_stop(pr.opt);
    return pr.best;
  }
  return pr.objective(x);
}

std::string nlopt_reason(nlopt_result r) {
  switch (r) {
    case NLOPT_SUCCESS: return "success";
    case NLOPT_STOPVAL_REACHED: return "objective reached its stop value";
    case NLOPT_FTOL_REACHED: return "objective tolerance reached";
    case NLOPT_XTOL_REACHED: return "parameter tolerance reached";
    case NLOPT_MAXEVAL_REACHED: return "evaluation limit reached";
    case NLOPT_MAXTIME_REACHED: return "time limit reached";
    case NLOPT_ROUNDOFF_LIMITED: return "round-off limited";
    default: return "failed (" + std::to_string(static_cast<int>(r)) + ")";
  }
}


}  // namespace

const std::vector<GoodputFitParameter>& goodput_fit_parameters() {
  static const std::vector<GoodputFitParameter> params = {
      {"restart_minutes", 0.0, 120.0},   {"downscale_seconds", 0.0, 1800.0}, {"upscale_seconds", 0.0, 1800.0},
      {"swap_minutes", 0.0, 120.0},      {"spare_fraction", 0.0, 0.25},      {"reset_fraction", 0.0, 1.0},
      {"reset_minutes", 0.0, 60.0},      {"step_time_cv", 0.0, 0.2},         {"repair_hours", 0.05, 24.0},
      {"catchup_minutes", 0.0, 60.0},    {"quorum", 0.01, 1.0},
  };
  return params;
}

std::vector<std::string> default_goodput_fit_names() {
  return {"restart_minutes", "downscale_seconds", "upscale_seconds", "swap_minutes",
          "spare_fraction",  "reset_fraction",    "step_time_cv"};
}

std::vector<GoodputTarget> parse_goodput_csv(const std::string& text, const std::string& name,
                                             const GoodputParams& base) {
  validate_model(base);  // before any row: slice_chips divides below
  std::vector<GoodputTarget> out;
  std::istringstream in(text);
  std::string line;
  int64_t n = 0;
  std::map<std::string, size_t> col;
  size_t columns = 0;
  std::vector<bool> percent_sign;
  bool plain_above_one = false;
  auto fail = [&](const std::string& why) { throw ConfigError(name + ":" + std::to_string(n) + ": " + why); };
  while (std::getline(in, line)) {
    ++n;
    const std::string t = trim_space(line);
    if (t.empty() || t[0] == '#') continue;
    const std::vector<std::string> f = csv_fields(t);
    if (col.empty()) {  // the header
      for (size_t i = 0; i < f.size(); ++i) {
        const std::string h = f[i];
        if (h == "scheme" || h == "learners" || h == "chips" || h == "goodput") {
          if (col.count(h)) fail("column '" + h + "' appears twice in the header");
          col[h] = i;
        }
      }
      columns = f.size();
      for (const char* need : {"scheme", "learners", "chips", "goodput"})
        if (!col.count(need)) fail(std::string("the header lacks the column '") + need + "' (scheme,learners,chips,goodput)");
      continue;
    }
    if (f.size() != columns)
      fail("expected " + std::to_string(columns) + " fields, like the header, got " + std::to_string(f.size()));
    GoodputTarget g;
    g.line = n;
    const std::string scheme = f[col["scheme"]];
    if (scheme == "dp") g.scheme = Scheme::kDataParallel;
    else if (scheme == "elastic_dp") g.scheme = Scheme::kElasticDP;
    else if (scheme == "diloco") g.scheme = Scheme::kDecoupledDiLoCo;
    else fail("scheme '" + scheme + "' is not dp, elastic_dp or diloco");
    const std::string learners = f[col["learners"]];
    if (g.scheme == Scheme::kDecoupledDiLoCo) {
      if (!parse_count(learners, &g.learners) || g.learners < 1 || g.learners > 1024)
        fail("a diloco row needs a learner count between 1 and 1024, got '" + learners + "'");
    } else if (!learners.empty() && learners != "1") {
      fail("a " + scheme + " row has one learner (leave learners empty or write 1), got '" + learners + "'");
    }
    const std::string chips = f[col["chips"]];
    if (!parse_count(chips, &g.chips) || g.chips < 1 || g.chips > 100000000)
      fail("chips must be a whole number between 1 and 1e8, got '" + chips + "'");
    if (g.chips % base.slice_chips != 0)
      fail(chips + " chips is not a whole number of " + std::to_string(base.slice_chips) +
           "-chip slices (goodput.slice_chips)");
    const int64_t slices = g.chips / base.slice_chips;
    if (slices % g.learners != 0)
      fail(std::to_string(g.learners) + " learners do not divide the " + std::to_string(slices) + " slices of " + chips +
           " chips");
    try {
      validate_goodput(with_row(base, g));  // this row against the simulator's limits (every row, not the first)
    } catch (const ConfigError& e) {
      fail(std::string("this row is beyond the simulator's limits: ") + e.what());
    }
    std::string gp = f[col["goodput"]];
    const bool pct = !gp.empty() && gp.back() == '%';
    if (pct) gp = trim_space(gp.substr(0, gp.size() - 1));
    if (!parse_number(gp, &g.goodput)) fail("goodput '" + f[col["goodput"]] + "' is not a number");
    if (pct) {
      if (g.goodput < 0 || g.goodput > 100) fail("goodput " + f[col["goodput"]] + " is not between 0% and 100%");
      g.goodput /= 100.0;
    } else {
      if (g.goodput < 0 || g.goodput > 100) fail("goodput " + gp + " is neither a fraction nor a percentage");
      if (g.goodput > 1) plain_above_one = true;
    }
    percent_sign.push_back(pct);
    out.push_back(g);
  }
  if (col.empty()) throw ConfigError(name + ": no header line (scheme,learners,chips,goodput)");
  if (out.empty()) throw ConfigError(name + ": the table has a header but no rows");
  if (plain_above_one) {  // a column of plain percentages: every plain number is one
    for (size_t i = 0; i < out.size(); ++i)
      if (!percent_sign[i]) out[i].goodput /= 100.0;
  }
  return out;
}

std::vector<double> simulate_targets(const GoodputParams& p, const std::vector<GoodputTarget>& targets) {
  std::vector<RunSpec> specs;
  for (const auto& t : targets)
    specs.push_back({t.scheme, t.chips, t.scheme == Scheme::kDecoupledDiLoCo ? t.learners : 1});
  const auto runs = simulate_specs(p, specs);
  std::vector<double> out;
  for (const auto& r : runs) {
    double s = 0;
    for (const auto& x : r) s += x.goodput;
    out.push_back(s / static_cast<double>(r.size()));
  }
  return out;
}

GoodputFitResult fit_goodput(const GoodputParams& base, const std::vector<GoodputTarget>& targets,
                             const GoodputFitOptions& opts) {
  if (targets.empty()) throw ConfigError("goodput --fit: the table has no rows");
  if (opts.names.empty()) throw ConfigError("goodput --fit: no parameters to fit");
  if (opts.max_evaluations < 1) throw ConfigError("goodput --fit: the evaluation limit must be positive");
  Problem pr;
  pr.base = base;
  pr.targets = targets;
  for (const auto& nm : opts.names) {
    auto it = std::find_if(goodput_fit_parameters().begin(), goodput_fit_parameters().end(),
                           [&](const GoodputFitParameter& q) { return q.name == nm; });
    if (it == goodput_fit_parameters().end()) {
      std::string known;
      for (const auto& q : goodput_fit_parameters()) known += (known.empty() ? "" : ", ") + q.name;
      throw ConfigError("goodput --fit: cannot fit '" + nm + "' (fittable: " + known + ")");
    }
    for (const auto& q : pr.params)
      if (q.name == nm) throw ConfigError("goodput --fit: '" + nm + "' is listed twice");
    pr.params.push_back(*it);
  }
  validate_model(base);  // the keys that are no row's doing, plainly
  const size_t np = pr.params.size();
  std::vector<double> x(np), lo(np, 0.0), hi(np, 1.0);
  for (size_t i = 0; i < np; ++i) {
    const auto& q = pr.params[i];
    x[i] = std::clamp((param_value(base, q.name) - q.lower) / (q.upper - q.lower), 0.0, 1.0);
  }
  // Every row against the simulator's limits, at the start and at either end of every fitted range.
  const std::pair<const char*, const double*> checks[] = {
      {"", x.data()},
      {" with the fitted parameters at their lower bounds", lo.data()},
      {" with the fitted parameters at their upper bounds", hi.data()}};
  for (const auto& [where, at] : checks) {
    const GoodputParams p = pr.at(at);
    for (size_t i = 0; i < targets.size(); ++i) {
      try {
        validate_goodput(with_row(p, targets[i]));
      } catch (const ConfigError& e) {
        throw ConfigError("goodput --fit: " + row_name(opts.table, targets[i], i) +
                          ": this row is beyond the simulator's limits" + where + ": " + e.what());
      }
    }
  }
  // The evaluation limit: the Jacobian's evaluations are set aside when the limit leaves the search at least one
  // besides the start; otherwise no standard errors.
  const int64_t jacobian = 2 * static_cast<int64_t>(np);
  const bool with_errors = opts.max_evaluations >= 1 + 1 + jacobian;
  pr.search_limit = opts.max_evaluations - (with_errors ? jacobian : 0);

  GoodputFitResult res;
  res.start_rms = std::sqrt(pr.objective(x.data()) / static_cast<double>(targets.size()));
  // A coarse scan first, one parameter at a time over 9 points of its range: table rows that sit at 0 (DP at
  // scale) make wide flat regions in which a local search started far away cannot find its way. Each parameter
  // moves from the best point so far.
  bool cut = false;
  for (size_t j = 0; j < np && !cut; ++j) {
    for (int k = 0; k <= 8; ++k) {
      if (pr.evaluations >= pr.search_limit) {
        cut = true;
        break;
      }
      std::vector<double> y = pr.best_x;
      y[j] = k / 8.0;
      pr.objective(y.data());
    }
  }
  x = pr.best_x;

  if (pr.evaluations >= pr.search_limit) {
    res.stop_reason = cut ? "evaluation limit reached during the scan (no search)" : "evaluation limit reached (no search)";
  } else {
    nlopt_opt opt = nlopt_create(NLOPT_LN_SBPLX, static_cast<unsigned>(np));
    if (!opt) throw GoodputError("goodput --fit: NLopt could not create its optimizer");
    pr.opt = opt;
    nlopt_set_lower_bounds(opt, lo.data());
    nlopt_set_upper_bounds(opt, hi.data());
    nlopt_set_min_objective(opt, nlopt_objective, &pr);
    nlopt_set_xtol_rel(opt, opts.xtol);
    nlopt_set_ftol_abs(opt, 1e-10);
    nlopt_set_maxeval(opt, static_cast<int>(pr.search_limit - pr.evaluations));
    std::vector<double> step(np, 0.05);
    nlopt_set_initial_step(opt, step.data());
    double minf = 0;
    const nlopt_result rc = nlopt_optimize(opt, x.data(), &minf);
    nlopt_destroy(opt);
    pr.opt = nullptr;
    if (rc == NLOPT_FORCED_STOP || rc == NLOPT_MAXEVAL_REACHED)
      res.stop_reason = nlopt_reason(NLOPT_MAXEVAL_REACHED);
    else if (rc < 0 && rc != NLOPT_ROUNDOFF_LIMITED)
      throw GoodputError("goodput --fit: the optimizer " + nlopt_reason(rc));
    else
      res.stop_reason = nlopt_reason(rc);
    x = pr.best_x;  // the best point evaluated (NLopt's x, or better)
  }

  // Residuals (the best point's, already evaluated) and the Jacobian (central differences in the scaled space,
  // one-sided at a bound), when the limit left room for it.
  const std::vector<double> r0 = pr.best_r;
  const size_t n = r0.size();
  std::vector<std::vector<double>> J(n, std::vector<double>(np, 0.0));
  const double h = 0.02;
  res.stderrs_estimated = with_errors;
  for (size_t j = 0; j < np && with_errors; ++j) {
    std::vector<double> xp = x, xm = x;
    xp[j] = std::min(1.0, x[j] + h);
    xm[j] = std::max(0.0, x[j] - h);
    const std::vector<double> rp = pr.residuals(xp.data()), rm = pr.residuals(xm.data());
    for (size_t i = 0; i < n; ++i) J[i][j] = (rp[i] - rm[i]) / (xp[j] - xm[j]);
  }
  double rss = 0;
  for (double r : r0) rss += r * r;
  const LinearisedErrors errs = linearised_errors(J, rss);

  res.params = pr.at(x.data());
  res.names = opts.names;
  for (size_t j = 0; j < np; ++j) {
    const auto& q = pr.params[j];
    res.values.push_back(param_value(res.params, q.name));
    res.at_bound.push_back(x[j] <= 1e-9 || x[j] >= 1 - 1e-9);
    // In the parameter's own unit: the search ran over [0, 1].
    res.stderrs.push_back(!with_errors ? std::numeric_limits<double>::quiet_NaN() : errs.se[j] * (q.upper - q.lower));
    res.inseparable.push_back(with_errors && errs.inseparable[j]);
  }
  res.fitted.resize(n);
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    res.fitted[i] = r0[i] + targets[i].goodput;
    worst = std::max(worst, std::fabs(r0[i]));
  }
  res.rms = std::sqrt(rss / static_cast<double>(n));
  res.worst = worst;
  res.evaluations = pr.evaluations;
  return res;
}

LinearisedErrors linearised_errors(const std::vector<std::vector<double>>& J, double rss) {
  const size_t n = J.size(), np = n > 0 ? J[0].size() : 0;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  LinearisedErrors out;
  out.se.assign(np, nan);
  out.inseparable.assign(np, false);
  std::vector<size_t> keep;  // columns some row depends on; the others are unidentified
  for (size_t a = 0; a < np; ++a) {
    bool zero = true;
    for (size_t i = 0; i < n; ++i) zero = zero && J[i][a] == 0;
    if (zero) out.se[a] = inf;
    else keep.push_back(a);
  }
  if (n <= np || keep.empty()) return out;  // no degrees of freedom left for s²: not estimable (NaN)
  const double s2 = rss / static_cast<double>(n - np);
  std::vector<std::vector<double>> JtJ(keep.size(), std::vector<double>(keep.size(), 0.0)), v;
  for (size_t a = 0; a < keep.size(); ++a)
    for (size_t b = 0; b < keep.size(); ++b)
      for (size_t i = 0; i < n; ++i) JtJ[a][b] += J[i][keep[a]] * J[i][keep[b]];
  const std::vector<double> lambda = symmetric_eigen(JtJ, &v);
  double top = 0;
  for (double l : lambda) top = std::max(top, l);
  // Directions of (numerically) zero curvature: the rows constrain only combinations of the parameters along them.
  const double floor = 1e-12 * top;
  for (size_t a = 0; a < keep.size(); ++a) {
    double var = 0, in_null = 0;
    for (size_t k = 0; k < keep.size(); ++k) {
      if (lambda[k] > floor) var += v[a][k] * v[a][k] / lambda[k];  // the pseudo-inverse's diagonal
      else in_null += v[a][k] * v[a][k];
    }
    if (in_null > 1e-8) out.inseparable[keep[a]] = true;  // stays NaN
    else out.se[keep[a]] = std::sqrt(std::max(0.0, s2 * var));
  }
  return out;
}

std::string goodput_toml(const GoodputParams& p, const std::string& comment) {
  std::ostringstream o;
  std::istringstream c(comment);
  for (std::string line; std::getline(c, line);) o << "# " << line << "\n";
  GoodputParams copy = p;
  ConfigSchema schema;
  bind_goodput_config(schema, copy);
  return o.str() + toml_of(schema.to_json());
}

}  // namespace deloco
