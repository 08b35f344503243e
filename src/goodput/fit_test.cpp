// Tests of the goodput simulator's further failure modes (hot spares with a swap time, host resets, correlated
// domains, syncer failures, catch-up, a fixed quorum) against closed forms, and of the calibration
// (goodput/fit.h): recovering known parameters from a table the simulator made, CSV errors, the TOML.
#include "goodput/fit.h"

#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deloco/config.h"
#include "goodput/test_util.h"

namespace deloco {
namespace fit_cases {

using goodput_test::set_slice_mtbf;

GoodputParams base_params() {
  GoodputParams p = goodput_test::small_params();
  p.repair_dist = "fixed";
  return p;
}

RunResult mean_run(const GoodputParams& p, Scheme s, int64_t chips, int64_t learners = 1) {
  const auto runs = simulate_specs(p, {{s, chips, learners}})[0];
  RunResult m;
  for (const auto& r : runs) {
    m.goodput += r.goodput / static_cast<double>(runs.size());
    m.uptime += r.uptime / static_cast<double>(runs.size());
  }
  return m;
}

// Syncer failures alone: up for an exponential MTBF, down for the restart, so uptime = MTBF / (MTBF + restart).
// Only Decoupled DiLoCo has a syncer.
TEST(GoodputModes, SyncerFailuresCostTheirRenewalShare) {
  GoodputParams p = base_params();
  p.mtbi_chip_years = 1e9;  // no chip failures
  p.syncer_mtbf_hours = 10;
  p.syncer_restart_minutes = 60;
  const RunResult d = mean_run(p, Scheme::kDecoupledDiLoCo, 800, 4);
  EXPECT_NEAR(d.uptime, 10.0 / 11.0, 0.01);
  EXPECT_NEAR(d.goodput, 10.0 / 11.0, 0.01);
  EXPECT_DOUBLE_EQ(mean_run(p, Scheme::kElasticDP, 800).uptime, 1.0);
}

// DP with a deep hot-spare pool: every failure of one of its 8 slices stalls the job for the swap time, and
// failures during a stall extend it: the job runs while no swap is pending, P = exp(−Λ·w) (M/D/∞ with arrivals Λ).
TEST(GoodputModes, SwapTimeStallsDataParallelAsAnMDInfinityQueue) {
  GoodputParams p = base_params();
  set_slice_mtbf(&p, 100.0);
  p.repair_hours = 1;
  p.spare_fraction = 0.5;  // 4 spares for 8 slices: the pool is practically never empty
  p.swap_minutes = 30;
  const double lambda = 8.0 / 100.0, w = 0.5;
  EXPECT_NEAR(mean_run(p, Scheme::kDataParallel, 800).uptime, std::exp(-lambda * w), 0.006);
  p.swap_minutes = 0;  // the first model: swapped at once
  EXPECT_NEAR(mean_run(p, Scheme::kDataParallel, 800).uptime, 1.0, 1e-12);
}

// One slice: up an exponential MTBF, then out for a reset (fraction f) or a repair: availability
// MTBF / (MTBF + f·reset + (1−f)·repair).
TEST(GoodputModes, HostResetsShortenTheOutage) {
  GoodputParams p = base_params();
  set_slice_mtbf(&p, 100.0);
  p.repair_hours = 4;
  p.reset_fraction = 0.5;
  p.reset_minutes = 30;
  p.days = 2000;
  const double expected = 100.0 / (100.0 + 0.5 * 0.5 + 0.5 * 4.0);
  EXPECT_NEAR(mean_run(p, Scheme::kElasticDP, 100).uptime, expected, 0.005);
  p.reset_fraction = 0;
  EXPECT_NEAR(mean_run(p, Scheme::kElasticDP, 100).uptime, 100.0 / 104.0, 0.005);
}

// Correlated failures alone: two domains of 4 slices, each failing every 100 h for a 4 h repair. Elastic DP loses
// a domain's half of its chips for q = 4/104 of the time and stops only when both are down (q²).
TEST(GoodputModes, DomainFailuresTakeTheirSlicesTogether) {
  GoodputParams p = base_params();
  p.mtbi_chip_years = 1e9;
  p.repair_hours = 4;
  p.domain_slices = 4;
  p.domain_mtbf_days = 100.0 / 24.0;
  p.days = 2000;
  const double q = 4.0 / 104.0;
  const RunResult r = mean_run(p, Scheme::kElasticDP, 800);
  EXPECT_NEAR(r.goodput, 1.0 - q, 0.006);
  EXPECT_NEAR(r.uptime, 1.0 - q * q, 0.002);
  p.domain_slices = 8;  // one domain: the whole job
  EXPECT_NEAR(mean_run(p, Scheme::kElasticDP, 800).uptime, 1.0 - q, 0.006);
}

// Eight learners of one slice each, quorum 1: a learner alternates up (MTBF) and out (repair + catch-up), so the
// goodput is MTBF / (MTBF + repair + catch-up) and the catch-up costs exactly its share.
TEST(GoodputModes, CatchUpCostsARejoiningLearner) {
  GoodputParams p = base_params();
  set_slice_mtbf(&p, 100.0);
  p.repair_hours = 4;
  p.quorum_learners = 1;
  p.catchup_minutes = 60;
  p.days = 2000;
  const RunResult r = mean_run(p, Scheme::kDecoupledDiLoCo, 800, 8);
  EXPECT_NEAR(r.goodput, 100.0 / 105.0, 0.006);
  EXPECT_NEAR(r.uptime, 1.0, 1e-3);
  EXPECT_NEAR(mean_run(p, Scheme::kElasticDP, 800).goodput,  // no syncer to catch up with: unaffected
              mean_run([&] { GoodputParams q = p; q.catchup_minutes = 0; return q; }(), Scheme::kElasticDP, 800).goodput,
              1e-12);
}

TEST(GoodputModes, FixedQuorumIsMinOfKAndM) {
  GoodputParams p = base_params();
  p.learners = {1, 2, 8};
  p.chips = {800};
  p.dp = p.elastic_dp = false;
  p.quorum_learners = 2;
  const auto rows = run_goodput(p);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].quorum, 1);
  EXPECT_EQ(rows[1].quorum, 2);
  EXPECT_EQ(rows[2].quorum, 2);
}

TEST(GoodputModes, NewKeysAreCheckedNamingTheKey) {
  auto expect_error = [](GoodputParams p, const std::string& fragment) {
    try {
      validate_goodput(p);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  GoodputParams p = base_params();
  p.reset_fraction = 1.5;
  expect_error(p, "goodput.reset_fraction");
  p = base_params();
  p.domain_slices = 4;  // without its MTBF
  expect_error(p, "goodput.domain_slices");
  p = base_params();
  p.swap_minutes = -1;
  expect_error(p, "goodput.swap_minutes");
  p = base_params();
  p.quorum_learners = -2;
  expect_error(p, "goodput.quorum_learners");
  p = base_params();
  p.syncer_mtbf_hours = std::nan("");
  expect_error(p, "goodput.syncer_mtbf_hours");
}

// ---- calibration -------------------------------------------------------------------------------------------
// A table made by the simulator itself with known parameters; the fit, started elsewhere, finds them again.
TEST(GoodputFit, RecoversTheParametersOfATableTheSimulatorMade) {
  GoodputParams truth = base_params();
  set_slice_mtbf(&truth, 50.0);
  truth.repair_hours = 2;
  truth.spare_fraction = 0.1;
  truth.restart_minutes = 20;
  truth.downscale_seconds = 90;
  truth.step_time_cv = 0.03;
  truth.days = 20;
  truth.warmup_hours = 12;
  truth.seeds = 2;
  truth.threads = 2;
  std::vector<GoodputTarget> targets;
  for (int64_t chips : {2000, 4000, 8000, 16000}) {
    targets.push_back({Scheme::kDataParallel, 1, chips, 0, 0});
    targets.push_back({Scheme::kElasticDP, 1, chips, 0, 0});
    targets.push_back({Scheme::kDecoupledDiLoCo, 4, chips, 0, 0});
  }
  const std::vector<double> made = simulate_targets(truth, targets);
  for (size_t i = 0; i < targets.size(); ++i) targets[i].goodput = made[i];

  GoodputParams start = truth;
  start.restart_minutes = 5;
  start.downscale_seconds = 400;
  start.step_time_cv = 0.08;
  GoodputFitOptions o;
  o.names = {"restart_minutes", "downscale_seconds", "step_time_cv"};
  const GoodputFitResult r = fit_goodput(start, targets, o);
  ASSERT_EQ(r.values.size(), 3u);
  EXPECT_NEAR(r.values[0], 20.0, 2.0) << r.stop_reason;
  EXPECT_NEAR(r.values[1], 90.0, 9.0) << r.stop_reason;
  EXPECT_NEAR(r.values[2], 0.03, 0.003) << r.stop_reason;
  EXPECT_LT(r.rms, 0.005);
  EXPECT_GT(r.start_rms, 10 * r.rms);
  for (double se : r.stderrs) EXPECT_TRUE(std::isfinite(se));
  // The fitted parameters reproduce the fitted column exactly (the TOML written from them does too).
  EXPECT_EQ(simulate_targets(r.params, targets), r.fitted);
}

TEST(GoodputFit, AParameterNoRowDependsOnIsUnidentified) {
  GoodputParams p = base_params();
  set_slice_mtbf(&p, 50.0);
  p.days = 10;
  p.seeds = 2;
  std::vector<GoodputTarget> targets{{Scheme::kElasticDP, 1, 800, 0.9, 2}, {Scheme::kElasticDP, 1, 1600, 0.85, 3},
                                     {Scheme::kElasticDP, 1, 3200, 0.8, 4}};
  GoodputFitOptions o;
  o.names = {"restart_minutes", "downscale_seconds"};  // restart only matters to DP rows
  o.max_evaluations = 60;
  const GoodputFitResult r = fit_goodput(p, targets, o);
  EXPECT_TRUE(std::isinf(r.stderrs[0]));
  EXPECT_TRUE(std::isfinite(r.stderrs[1]));
  o.names = {"not_a_key"};
  EXPECT_THROW(fit_goodput(p, targets, o), ConfigError);
}

// Defect: one collinear pair made JᵀJ singular and every parameter was reported "unidentified: no row depends
// on it". Reference values by hand: with columns a = (1, 0, 0, 0), b = 2a, c = (0, 1, 1, 0), JᵀJ's null space is
// (2, −1, 0)/√5, so a and b are inseparable; c is orthogonal to it, var(c) = s² / (cᵀc) = (rss / (4 − 3)) / 2.
TEST(GoodputFit, CollinearParametersAreInseparableAndTheOthersKeepTheirErrors) {
  const std::vector<std::vector<double>> J{{1, 2, 0}, {0, 0, 1}, {0, 0, 1}, {0, 0, 0}};
  const LinearisedErrors e = linearised_errors(J, /*rss=*/0.5);
  EXPECT_TRUE(e.inseparable[0]);
  EXPECT_TRUE(e.inseparable[1]);
  EXPECT_TRUE(std::isnan(e.se[0]) && std::isnan(e.se[1]));
  EXPECT_FALSE(e.inseparable[2]);
  EXPECT_NEAR(e.se[2], std::sqrt(0.5 / 2.0), 1e-12);
  // A full-rank case against the textbook formula: J = [[1, 0], [1, 1], [0, 2]], (JᵀJ)⁻¹ = [[5, −1], [−1, 2]] / 9.
  const LinearisedErrors f = linearised_errors({{1, 0}, {1, 1}, {0, 2}}, /*rss=*/0.3);
  EXPECT_NEAR(f.se[0], std::sqrt(0.3 * 5.0 / 9.0), 1e-12);
  EXPECT_NEAR(f.se[1], std::sqrt(0.3 * 2.0 / 9.0), 1e-12);
  // A zero column is unidentified (+inf); no more rows than parameters: NaN for all.
  EXPECT_TRUE(std::isinf(linearised_errors({{0, 1}, {0, 2}, {0, 1}}, 1.0).se[0]));
  EXPECT_TRUE(std::isnan(linearised_errors({{1, 0}, {0, 1}}, 1.0).se[0]));
}

void expect_csv_error(const std::string& text, const std::string& fragment) {
  try {
    parse_goodput_csv(text, "t.csv", base_params());
    ADD_FAILURE() << "no error for " << fragment;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(GoodputFit, TableParsingAndItsErrorsNameTheLine) {
  const auto rows = parse_goodput_csv(
      "# a comment\nchips,scheme,goodput,learners,source\n800,dp,0.5,,paper\n\n800,elastic_dp,75%,1,x\n1600,diloco,0.9,4,y\n",
      "t.csv", base_params());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].scheme, Scheme::kDataParallel);
  EXPECT_EQ(rows[0].line, 3);
  EXPECT_DOUBLE_EQ(rows[1].goodput, 0.75);
  EXPECT_EQ(rows[2].learners, 4);
  EXPECT_EQ(rows[2].line, 6);
  // Plain numbers above 1: the column is in percent.
  EXPECT_DOUBLE_EQ(parse_goodput_csv("scheme,learners,chips,goodput\ndp,,800,50\ndp,,800,0.5\n", "t.csv",
                                     base_params())[1].goodput, 0.005);
  expect_csv_error("scheme,learners,chips\ndp,,800\n", "t.csv:1: the header lacks the column 'goodput'");
  expect_csv_error("scheme,learners,chips,goodput\ndp,,800,0.5\nsync,,800,0.5\n", "t.csv:3: scheme 'sync'");
  expect_csv_error("scheme,learners,chips,goodput\ndp,2,800,0.5\n", "t.csv:2: a dp row has one learner");
  expect_csv_error("scheme,learners,chips,goodput\ndiloco,,800,0.5\n", "t.csv:2: a diloco row needs a learner count");
  expect_csv_error("scheme,learners,chips,goodput\ndp,,850,0.5\n", "t.csv:2: 850 chips is not a whole number");
  expect_csv_error("scheme,learners,chips,goodput\ndiloco,3,800,0.5\n", "t.csv:2: 3 learners do not divide the 8 slices");
  expect_csv_error("scheme,learners,chips,goodput\ndp,,800,high\n", "t.csv:2: goodput 'high' is not a number");
  expect_csv_error("scheme,learners,chips,goodput\ndp,,800,120%\n", "t.csv:2: goodput 120% is not between");
  expect_csv_error("scheme,learners,chips,goodput\ndp,,800\n", "t.csv:2: expected 4 fields");
  expect_csv_error("scheme,learners,chips,goodput\n", "no rows");
  expect_csv_error("", "no header");
}

// Every row is checked against the simulator's limits (slices with spares, expected failures), not only the
// first: a later row beyond them used to run for minutes. The error names the row's line.
TEST(GoodputFit, EveryRowIsCheckedAgainstTheSimulatorsLimits) {
  GoodputParams p = base_params();
  p.mtbi_chip_years = 0.01;  // 800 chips: ~8e4 failures a run; 4e6 chips: ~4e8, over the limit of 2e8
  try {
    parse_goodput_csv("scheme,learners,chips,goodput\ndp,,800,0.5\nelastic_dp,,800,0.5\ndp,,4000000,0.5\n", "t.csv", p);
    ADD_FAILURE() << "a row of 4e8 expected failures was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("t.csv:4: this row is beyond the simulator's limits"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("failures per run"), std::string::npos) << e.what();
  }
  p = base_params();
  p.slice_chips = 50;
  p.mtbi_chip_years = 1e6;
  try {
    parse_goodput_csv("scheme,learners,chips,goodput\ndp,,800,0.5\n\ndp,,60000000,0.5\n", "t.csv", p);
    ADD_FAILURE() << "a row of 1.2e6 slices was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("t.csv:4: this row is beyond"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1200000 slices"), std::string::npos) << e.what();
  }
}

// A row within the limits at the start can leave them where the fit may go: 9e5 slices are fine without spares,
// but spare_fraction's upper bound (0.25) makes 1.125e6. fit_goodput refuses it before any evaluation.
TEST(GoodputFit, EveryRowIsCheckedOverTheFittedRange) {
  GoodputParams p = base_params();
  p.mtbi_chip_years = 1e6;  // hardly a failure: a run is cheap whatever its size
  p.days = 1;
  p.seeds = 1;
  const std::vector<GoodputTarget> targets{{Scheme::kElasticDP, 1, 800, 0.9, 2},
                                           {Scheme::kElasticDP, 1, 90000000, 0.9, 7}};
  GoodputFitOptions o;
  o.names = {"spare_fraction"};
  o.max_evaluations = 4;
  const int64_t before = goodput_runs_simulated();
  try {
    fit_goodput(p, targets, o);
    ADD_FAILURE() << "a row of 1.125e6 slices at spare_fraction = 0.25 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("goodput --fit: line 7: this row is beyond the simulator's limits"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("upper bounds"), std::string::npos) << e.what();
  }
  EXPECT_EQ(goodput_runs_simulated(), before);  // refused before simulating anything
}

// --fit-evals N: at most N evaluations of the simulator, counted by the simulator itself (one evaluation is
// rows × seeds runs). N = 2 used to run 80 (the scan and the Jacobian came on top).
TEST(GoodputFit, TheEvaluationLimitIsACap) {
  GoodputParams p = base_params();
  set_slice_mtbf(&p, 50.0);
  p.days = 10;
  p.seeds = 2;
  const std::vector<GoodputTarget> targets{{Scheme::kDataParallel, 1, 800, 0.9, 2},
                                           {Scheme::kElasticDP, 1, 1600, 0.85, 3},
                                           {Scheme::kDecoupledDiLoCo, 2, 3200, 0.8, 4}};
  const int64_t per_evaluation = static_cast<int64_t>(targets.size()) * p.seeds;
  GoodputFitOptions o;  // the default 7 parameters: the scan alone is 63 evaluations, the Jacobian 14
  for (int64_t n : {1, 2, 5, 16, 40, 120}) {
    o.max_evaluations = n;
    const int64_t before = goodput_runs_simulated();
    const GoodputFitResult r = fit_goodput(p, targets, o);
    const int64_t runs = goodput_runs_simulated() - before;
    EXPECT_LE(runs, n * per_evaluation) << "--fit-evals " << n;
    EXPECT_EQ(runs, r.evaluations * per_evaluation) << "--fit-evals " << n;
    if (n <= 40) EXPECT_EQ(r.evaluations, n) << "the scan alone needs more";
    // The result is the best point evaluated, and reproduces its fitted column.
    EXPECT_LE(r.rms, r.start_rms);
    EXPECT_EQ(simulate_targets(r.params, targets), r.fitted) << "--fit-evals " << n;
  }
}

// Below 2 + 2·parameters evaluations there is no room for the Jacobian: no standard errors, said so.
TEST(GoodputFit, StandardErrorsNeedTheirShareOfTheLimit) {
  GoodputParams p = base_params();
  set_slice_mtbf(&p, 50.0);
  p.days = 10;
  p.seeds = 2;
  const std::vector<GoodputTarget> targets{{Scheme::kDataParallel, 1, 800, 0.9, 2},
                                           {Scheme::kElasticDP, 1, 1600, 0.85, 3},
                                           {Scheme::kElasticDP, 1, 3200, 0.8, 4}};
  GoodputFitOptions o;
  o.names = {"restart_minutes", "downscale_seconds"};
  o.max_evaluations = 5;  // < 2 + 4
  GoodputFitResult r = fit_goodput(p, targets, o);
  EXPECT_FALSE(r.stderrs_estimated);
  for (double se : r.stderrs) EXPECT_TRUE(std::isnan(se));
  EXPECT_EQ(r.evaluations, 5);
  o.max_evaluations = 6;
  r = fit_goodput(p, targets, o);
  EXPECT_TRUE(r.stderrs_estimated);
  EXPECT_EQ(r.evaluations, 6);
  for (double se : r.stderrs) EXPECT_FALSE(std::isnan(se));
}

TEST(GoodputFit, EveryFitParameterIsABoundNumberKeyWithinItsRange) {
  GoodputParams p;
  ConfigSchema schema;
  bind_goodput_config(schema, p);
  const nlohmann::json values = schema.to_json().at("goodput");
  for (const auto& q : goodput_fit_parameters()) {
    ASSERT_TRUE(values.contains(q.name)) << q.name << " is no goodput.* key";
    EXPECT_TRUE(values.at(q.name).is_number_float()) << q.name;
    EXPECT_LT(q.lower, q.upper) << q.name;
  }
}

TEST(GoodputFit, TomlHoldsEveryKeyAndReadsBackToTheSameParameters) {
  GoodputParams p = base_params();
  p.chips = {800, 1600};
  p.learners = {2, 4};
  p.restart_minutes = 12.345678901234567;
  p.swap_minutes = 3.25;
  p.quorum_learners = 1;
  p.dp = false;
  const std::string toml = goodput_toml(p, "a comment\nover two lines");
  for (const auto& d : goodput_key_docs())
    EXPECT_NE(toml.find("\n" + d.key.substr(8) + " = "), std::string::npos) << d.key << " missing:\n" << toml;
  GoodputParams q;
  ConfigSchema schema;
  bind_goodput_config(schema, q);
  schema.load_string(toml, "fit.toml");
  schema.validate();
  EXPECT_EQ(q.chips, p.chips);
  EXPECT_EQ(q.learners, p.learners);
  EXPECT_EQ(q.restart_minutes, p.restart_minutes);  // bit-exact: the fitted values reproduce the fit
  EXPECT_EQ(q.swap_minutes, p.swap_minutes);
  EXPECT_EQ(q.quorum_learners, 1);
  EXPECT_FALSE(q.dp);
}

}  // namespace
}  // namespace deloco
