// goodput/fit.h — calibrating the chip-scale goodput simulator (goodput/goodput.h) against a table of
// published or observed goodput figures: `deloco goodput --fit FILE.csv` (docs/goodput.md, "Calibration").
//
// The parameters behind published goodput tables (restart, reconfiguration and swap times, the spare pool, what
// one interrupt takes out, straggler spread) are rarely published. fit_goodput() finds the values of a chosen set
// of them that make the simulator reproduce the table best: bounded least squares on the goodput residuals,
// minimised with NLopt's derivative-free Subplex (LN_SBPLX) over the parameters scaled to [0, 1] by their bounds,
// after a coarse scan of each parameter in turn over 9 points of its range (rows at 0, like DP at scale, make
// flat regions a local search cannot leave).
// Every evaluation simulates every row with the same seeds (goodput.seed, goodput.seeds: common random numbers),
// so the objective is a deterministic, piecewise-smooth function of the parameters.
//
// Uncertainty: the Gauss–Newton covariance s²·(JᵀJ)⁻¹ at the optimum, with J the central-difference Jacobian of
// the residuals and s² = RSS / (rows − parameters). It is a local, linearised standard error; a parameter the
// table does not constrain (a zero column of J, e.g. restart_minutes without DP rows) is reported as unidentified
// (stderr = +inf), and with no more rows than parameters no error is given (NaN). When JᵀJ is singular (two
// parameters the rows constrain only in combination, e.g. columns that are multiples of each other), the
// parameters in its null space are reported inseparable (NaN) and every other one keeps its error, from the
// pseudo-inverse (linearised_errors).
//
// Contract
//  * parse_goodput_csv: columns scheme,learners,chips,goodput (a header line naming them, in any order; other
//    columns are ignored, so the --csv output of `deloco goodput` is a valid table). scheme ∈ {dp, elastic_dp, diloco}; learners empty or 1 for DP rows, a positive integer
//    for diloco; chips a positive whole number of goodput.slice_chips slices that the learners divide; goodput a
//    fraction in [0, 1] or a percentage ("87.5%"; a column whose plain numbers exceed 1 is read as percentages).
//    Blank lines and lines starting with '#' are skipped. Every row is checked against the simulator's limits
//    at `base` (validate_goodput with that row alone: slices and spares, expected failures per run), not only
//    the first. Anything else throws ConfigError "FILE:LINE: <problem>"; an invalid `base` (a key, not a row)
//    throws its plain validate_goodput error.
//  * fit_goodput: `base` supplies every parameter not fitted (validated first); `names` are keys of
//    goodput_fit_parameters() (ConfigError otherwise). The starting point is base's values clamped into the
//    bounds. Every row is checked against the simulator's limits at the start and with every fitted parameter at
//    its lower and at its upper bound (the limits are monotone in each, e.g. spares grow with spare_fraction),
//    so no evaluation can meet a row beyond them; a row that fails throws ConfigError "goodput --fit:
//    TABLE:LINE: ..." (opts.table; "line N" without it). Deterministic for given inputs and independent of
//    `threads`. No I/O, no clock.
//  * Evaluation limit: opts.max_evaluations (≥ 1) caps every evaluation of the simulator (one evaluation
//    simulates every row over base.seeds seeds): the start, the scan, the search and the Jacobian of the
//    standard errors. The start comes first; the Jacobian's 2·parameters evaluations are set aside first when
//    the limit leaves at least one evaluation besides them and the start; otherwise no errors are estimated
//    (stderrs_estimated false, every stderr NaN); the scan is cut short and the search skipped when the rest
//    runs out. The result is the best point evaluated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "goodput/goodput.h"

namespace deloco {

struct GoodputTarget {
  Scheme scheme = Scheme::kDataParallel;
  int64_t learners = 1;
  int64_t chips = 0;
  double goodput = 0;  // fraction
  int64_t line = 0;    // 1-based line of the CSV it came from
};

// Parses a calibration table (see the contract). `name` is used in error messages (a file name).
std::vector<GoodputTarget> parse_goodput_csv(const std::string& text, const std::string& name,
                                             const GoodputParams& base);

// A parameter the fit can move, with its bounds (in the key's own unit).
struct GoodputFitParameter {
  std::string name;  // goodput.* key without the prefix, e.g. "restart_minutes"
  double lower = 0, upper = 0;
};
const std::vector<GoodputFitParameter>& goodput_fit_parameters();
// The default set: restart, down-scale, up-scale, swap time, spare pool size, interrupt granularity, straggler cv.
std::vector<std::string> default_goodput_fit_names();

struct GoodputFitOptions {
  std::vector<std::string> names = default_goodput_fit_names();
  int64_t max_evaluations = 400;  // simulator evaluations in all, the Jacobian's included (see the contract)
  double xtol = 1e-3;             // relative tolerance on the scaled parameters
  std::string table;              // the table's name (a file) for error messages; "" = "line N"
};

struct GoodputFitResult {
  GoodputParams params;                // base with the fitted values in place (reproduces `fitted`)
  std::vector<std::string> names;      // fitted keys
  std::vector<double> values, stderrs; // per name; stderr +inf = unidentified, NaN = not estimable or not estimated
                                       // or inseparable
  std::vector<bool> inseparable;       // the rows constrain it only together with other fitted parameters
  bool stderrs_estimated = true;       // false: the evaluation limit left no room for the Jacobian
  std::vector<bool> at_bound;          // the value sits on a bound
  std::vector<double> fitted;          // per target: the simulator's mean goodput at the fitted values
  double rms = 0, worst = 0;           // of the residuals fitted − target
  double start_rms = 0;                // at the starting point
  int64_t evaluations = 0;             // simulator evaluations, including the Jacobian's (≤ max_evaluations)
  std::string stop_reason;             // NLopt's
};

GoodputFitResult fit_goodput(const GoodputParams& base, const std::vector<GoodputTarget>& targets,
                             const GoodputFitOptions& opts = {});

// The linearised standard errors of least squares with Jacobian J (rows × parameters, each parameter's own scale)
// and residual sum of squares rss: s²·diag((JᵀJ)⁺), s² = rss / (rows − parameters). Per parameter: +inf for a zero
// column (unidentified), NaN with inseparable set for one in the null space of JᵀJ, NaN for all with no more rows
// than parameters. No I/O.
struct LinearisedErrors {
  std::vector<double> se;
  std::vector<bool> inseparable;
};
LinearisedErrors linearised_errors(const std::vector<std::vector<double>>& J, double rss);

// The simulator's mean goodput over base.seeds seeds for each target, exactly as run_goodput() computes the row.
std::vector<double> simulate_targets(const GoodputParams& p, const std::vector<GoodputTarget>& targets);

// The [goodput] TOML of `p` (every key), for `deloco goodput --config`. `comment` lines are prefixed with '#'.
std::string goodput_toml(const GoodputParams& p, const std::string& comment);

}  // namespace deloco
