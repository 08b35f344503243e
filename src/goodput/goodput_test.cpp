// Tests of the chip-scale goodput simulator: closed-form cases, monotonicity, determinism, bad input.
#include "goodput/goodput.h"

#include <cmath>

#include <gtest/gtest.h>

#include "deloco/config.h"
#include "goodput/test_util.h"

namespace deloco {
namespace goodput_cases {

using goodput_test::set_slice_mtbf;

GoodputParams small_params() {
  GoodputParams p = goodput_test::small_params();
  p.learners = {1, 2, 4};
  p.repair_dist = "exponential";
  return p;
}

const GoodputRow& find_row(const std::vector<GoodputRow>& rows, const std::string& scheme, int64_t chips,
                           int64_t learners = 1) {
  for (const auto& r : rows)
    if (r.scheme == scheme && r.chips == chips && r.learners == learners) return r;
  throw std::runtime_error("row not found: " + scheme);
}

TEST(Goodput, ExpectedMaxOfNormalsMatchesKnownValues) {
  EXPECT_EQ(expected_max_normal(1), 0.0);
  EXPECT_NEAR(expected_max_normal(2), 1.0 / std::sqrt(M_PI), 1e-6);
  EXPECT_NEAR(expected_max_normal(10), 1.538753, 1e-5);
  EXPECT_NEAR(expected_max_normal(100), 2.507594, 1e-5);
  EXPECT_DOUBLE_EQ(straggler_efficiency(100, 0.0), 1.0);
  EXPECT_NEAR(straggler_efficiency(100, 0.02), 1.0 / (1.0 + 0.02 * 2.507594), 1e-6);
  EXPECT_GT(straggler_efficiency(10, 0.05), straggler_efficiency(1000, 0.05));
}

TEST(Goodput, NoFailuresMeansGoodputOne) {
  GoodputParams p = small_params();
  p.mtbi_chip_years = 1e12;
  p.restart_minutes = 10;
  p.downscale_seconds = 30;
  p.upscale_seconds = 30;
  const auto rows = run_goodput(p);
  ASSERT_EQ(rows.size(), 5u);
  for (const auto& r : rows) {
    EXPECT_DOUBLE_EQ(r.goodput, 1.0) << r.scheme << " M=" << r.learners;
    EXPECT_DOUBLE_EQ(r.uptime, 1.0) << r.scheme << " M=" << r.learners;
    EXPECT_EQ(r.failures, 0.0);
  }
}

TEST(Goodput, StragglersAloneCostTheSynchronousStep) {
  GoodputParams p = small_params();
  p.mtbi_chip_years = 1e12;
  p.step_time_cv = 0.05;
  p.learners = {4};
  const auto rows = run_goodput(p);
  EXPECT_NEAR(find_row(rows, "dp", 800).goodput, straggler_efficiency(8, 0.05), 1e-12);
  EXPECT_NEAR(find_row(rows, "diloco", 800, 4).goodput, straggler_efficiency(2, 0.05), 1e-12);
}

// A single slice with failure rate 1/MTBF and mean repair MTTR is up MTBF / (MTBF + MTTR) of the time, for any
// repair-time distribution (an alternating renewal process).
TEST(Goodput, SingleSliceAvailabilityMatchesClosedForm) {
  for (const std::string dist : {"exponential", "lognormal", "fixed"}) {
    GoodputParams p = small_params();
    p.chips = {100};
    p.learners = {1};
    p.repair_dist = dist;
    p.repair_hours = 2.0;
    set_slice_mtbf(&p, 10.0);
    p.days = 3650;
    p.seeds = 3;
    const double expected = 10.0 / 12.0;
    const auto rows = run_goodput(p);
    for (const auto& r : rows) {
      // About 7,300 up/down cycles per run: the standard error of the availability is about 0.003.
      EXPECT_NEAR(r.uptime, expected, 0.012) << dist << " " << r.scheme;
      EXPECT_NEAR(r.goodput, expected, 0.012) << dist << " " << r.scheme;
    }
  }
}

// With a restart r after each repair, a single-slice DP job runs only for the part of each healthy period X
// ~ Exp(MTBF) beyond r: uptime = MTBF·exp(-r/MTBF) / (MTBF + MTTR).
TEST(Goodput, SingleSliceRestartMatchesClosedForm) {
  GoodputParams p = small_params();
  p.chips = {100};
  p.learners = {1};
  p.elastic_dp = p.diloco = false;
  p.repair_hours = 2.0;
  set_slice_mtbf(&p, 10.0);
  p.restart_minutes = 60;
  p.days = 3650;
  p.seeds = 3;
  EXPECT_NEAR(run_goodput(p)[0].uptime, 10.0 * std::exp(-0.1) / 12.0, 0.012);  // 0.754
}

// P independent slices, each available A of the time: non-elastic DP runs only when all are up (A^P); elastic
// DP with free reconfiguration runs while any is up (1 - (1-A)^P) and its goodput is the mean fraction up (A).
TEST(Goodput, ManySlicesMatchClosedForm) {
  GoodputParams p = small_params();
  p.chips = {800};
  p.learners = {1};
  p.repair_hours = 1.0;
  set_slice_mtbf(&p, 9.0);  // A = 0.9
  p.days = 2000;
  const double a = 0.9;
  const auto rows = run_goodput(p);
  const auto& dp = find_row(rows, "dp", 800);
  EXPECT_NEAR(dp.uptime, std::pow(a, 8), 0.015);
  EXPECT_NEAR(dp.goodput, std::pow(a, 8), 0.015);
  const auto& el = find_row(rows, "elastic_dp", 800);
  EXPECT_NEAR(el.uptime, 1.0 - std::pow(1.0 - a, 8), 1e-4);
  EXPECT_NEAR(el.goodput, a, 0.01);
}

// DiLoCo with one slice per learner and free reconfiguration: learner i is up with probability A independently,
// so global training advances with the binomial probability P(up ≥ K), and useful work is E[up · 1{up ≥ K}].
TEST(Goodput, DiLoCoQuorumMatchesBinomial) {
  GoodputParams p = small_params();
  p.chips = {400};
  p.learners = {4};
  p.dp = p.elastic_dp = false;
  p.repair_hours = 1.0;
  set_slice_mtbf(&p, 4.0);  // A = 0.8
  p.days = 2000;
  p.quorum = 0.75;          // K = 3
  auto r = run_goodput(p)[0];
  EXPECT_EQ(r.quorum, 3);
  EXPECT_NEAR(r.uptime, 4 * 0.512 * 0.2 + 0.4096, 0.015);          // 0.8192
  EXPECT_NEAR(r.goodput, (3 * 0.4096 + 4 * 0.4096) / 4.0, 0.015);  // 0.7168
  p.quorum = 0.25;          // K = 1
  r = run_goodput(p)[0];
  EXPECT_EQ(r.quorum, 1);
  EXPECT_NEAR(r.uptime, 1.0 - std::pow(0.2, 4), 0.002);
  EXPECT_NEAR(r.goodput, 0.8, 0.015);
}

// Elastic DP with reconfiguration cost d and no repairs to speak of: it is idle for d after every failure and
// every return, i.e. up a fraction exp(-r d) where r is the rate of those events (2 × failure rate).
TEST(Goodput, ElasticReconfigurationMatchesPoissonGap) {
  GoodputParams p = small_params();
  p.chips = {800};
  p.learners = {1};
  p.repair_hours = 0.01;  // slices come back almost at once, so 8 stay healthy nearly all the time
  set_slice_mtbf(&p, 8.0);  // job failure rate 1 per hour
  p.downscale_seconds = 360;  // 0.1 h
  p.upscale_seconds = 0;
  p.days = 1000;
  const auto rows = run_goodput(p);
  EXPECT_NEAR(find_row(rows, "elastic_dp", 800).uptime, std::exp(-0.1), 0.01);
}

TEST(Goodput, DataParallelGoodputNeverRisesWithMoreChipsOrShorterMtbi) {
  GoodputParams p = small_params();
  p.chips = {200, 400, 800, 1600};
  p.learners = {1};
  p.restart_minutes = 6;
  p.repair_hours = 1.0;
  set_slice_mtbf(&p, 40.0);
  p.elastic_dp = p.diloco = false;
  double previous = 2.0;
  for (const auto& r : run_goodput(p)) {
    EXPECT_LT(r.goodput, previous) << r.chips;
    previous = r.goodput;
  }
  previous = 2.0;
  for (double mtbf : {80.0, 40.0, 20.0, 10.0}) {
    set_slice_mtbf(&p, mtbf);
    p.chips = {800};
    const double g = run_goodput(p)[0].goodput;
    EXPECT_LT(g, previous) << mtbf;
    previous = g;
  }
}

TEST(Goodput, DeterministicPerSeedAndIndependentOfThreads) {
  GoodputParams p = small_params();
  p.repair_dist = "lognormal";
  p.step_time_cv = 0.02;
  p.restart_minutes = 5;
  p.downscale_seconds = 30;
  p.upscale_seconds = 30;
  set_slice_mtbf(&p, 20.0);
  p.days = 30;
  const auto a = run_goodput(p);
  p.threads = 2;
  const auto b = run_goodput(p);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].goodput, b[i].goodput);
    EXPECT_EQ(a[i].uptime, b[i].uptime);
  }
  const RunSpec spec{Scheme::kDecoupledDiLoCo, 800, 2};
  const RunResult r1 = simulate_once(p, spec, 7), r2 = simulate_once(p, spec, 7), r3 = simulate_once(p, spec, 8);
  EXPECT_EQ(r1.goodput, r2.goodput);
  EXPECT_EQ(r1.failures, r2.failures);
  EXPECT_NE(r1.goodput, r3.goodput);
  p.seed = 2;
  EXPECT_NE(run_goodput(p)[0].goodput, a[0].goodput);
}

TEST(Goodput, OneLearnerDiLoCoIsElasticDP) {
  GoodputParams p = small_params();
  p.downscale_seconds = 60;
  p.upscale_seconds = 60;
  p.step_time_cv = 0.02;
  set_slice_mtbf(&p, 20.0);
  p.days = 60;
  const auto rows = run_goodput(p);
  EXPECT_EQ(find_row(rows, "diloco", 800, 1).goodput, find_row(rows, "elastic_dp", 800).goodput);
  EXPECT_EQ(find_row(rows, "diloco", 800, 1).uptime, find_row(rows, "elastic_dp", 800).uptime);
}

// At a scale where reconfigurations dominate, more learners keep global training going.
TEST(Goodput, MoreLearnersHelpWhenReconfigurationsDominate) {
  GoodputParams p = small_params();
  p.slice_chips = 100;
  p.chips = {6400};
  p.learners = {1, 16};
  p.mtbi_chip_years = 1.0 / 8766.0 * 100.0;  // each slice fails once per hour: 64 failures per hour
  p.downscale_seconds = 30;
  p.upscale_seconds = 30;
  p.repair_hours = 0.5;
  p.days = 5;
  p.dp = false;
  const auto rows = run_goodput(p);
  EXPECT_GT(find_row(rows, "diloco", 6400, 16).goodput, find_row(rows, "diloco", 6400, 1).goodput + 0.2);
}

// goodput.repair_home: each learner keeps its own slices, so learners pause independently. 4 learners of 16 slices,
// each slice failing once an hour and out 0.5 h (exponential), 120 s per reconfiguration, K = 2: a learner runs
// while no failure or return of its own came in the last 120 s, q = e^(−2·n_h·λ·d) with n_h = 16/1.5 healthy
// slices, and the quorum holds with the binomial P(≥ 2 of 4). Pooled repairs (the default) fill the emptiest learner,
// bunching each learner's pauses, and beat that.
TEST(Goodput, RepairsHomeMakeLearnersIndependent) {
  GoodputParams p = small_params();
  p.chips = {6400};
  p.learners = {4};
  p.quorum_learners = 2;
  set_slice_mtbf(&p, 1.0);
  p.repair_hours = 0.5;
  p.downscale_seconds = p.upscale_seconds = 120;
  p.days = 200;
  p.dp = p.elastic_dp = false;
  const double q = std::exp(-2.0 * 16 / 1.5 * 120 / 3600);
  const double binomial = 1 - std::pow(1 - q, 4) - 4 * q * std::pow(1 - q, 3);
  p.repair_home = true;
  const double home = find_row(run_goodput(p), "diloco", 6400, 4).uptime;
  EXPECT_NEAR(home, binomial, 0.01);
  p.repair_home = false;
  EXPECT_GT(find_row(run_goodput(p), "diloco", 6400, 4).uptime, home + 0.03);
}

TEST(Goodput, SparesShortenDataParallelStalls) {
  GoodputParams p = small_params();
  p.learners = {1};
  p.elastic_dp = p.diloco = false;
  p.restart_minutes = 2;
  p.repair_hours = 4;
  set_slice_mtbf(&p, 100.0);
  p.days = 100;
  const double without = run_goodput(p)[0].goodput;
  p.spare_fraction = 0.25;  // 2 spares for 8 slices
  const auto with = run_goodput(p)[0];
  EXPECT_EQ(with.spare_slices, 2);
  EXPECT_GT(with.uptime, without + 0.1);
  EXPECT_LT(with.goodput, with.uptime);  // the spares' chips are allocated but not useful
}

void expect_config_error(const GoodputParams& p, const std::string& fragment) {
  try {
    validate_goodput(p);
    ADD_FAILURE() << "no error for " << fragment;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Goodput, BadInputIsAClearError) {
  GoodputParams p;
  EXPECT_NO_THROW(validate_goodput(p));
  auto with = [&](auto f) { GoodputParams q; f(q); return q; };
  expect_config_error(with([](GoodputParams& q) { q.chips = {0}; }), "goodput.chips");
  expect_config_error(with([](GoodputParams& q) { q.chips = {-625}; }), "positive");
  expect_config_error(with([](GoodputParams& q) { q.chips = {1000}; }), "whole number");
  expect_config_error(with([](GoodputParams& q) { q.chips = {2000000000}; }), "absurd");
  expect_config_error(with([](GoodputParams& q) { q.learners = {7}; }), "do not divide");
  expect_config_error(with([](GoodputParams& q) { q.learners = {0}; }), "goodput.learners");
  expect_config_error(with([](GoodputParams& q) { q.slice_chips = 0; }), "goodput.slice_chips");
  expect_config_error(with([](GoodputParams& q) { q.mtbi_chip_years = -1; }), "goodput.mtbi_chip_years");
  expect_config_error(with([](GoodputParams& q) { q.repair_hours = 0; }), "goodput.repair_hours");
  expect_config_error(with([](GoodputParams& q) { q.repair_dist = "weibull"; }), "weibull");
  expect_config_error(with([](GoodputParams& q) { q.days = 0; }), "goodput.days");
  expect_config_error(with([](GoodputParams& q) { q.downscale_seconds = -1; }), "goodput.downscale_seconds");
  expect_config_error(with([](GoodputParams& q) { q.quorum = 0; }), "goodput.quorum");
  expect_config_error(with([](GoodputParams& q) { q.seeds = 0; }), "goodput.seeds");
  expect_config_error(with([](GoodputParams& q) { q.dp = q.elastic_dp = q.diloco = false; }), "nothing to simulate");
  expect_config_error(with([](GoodputParams& q) { q.slice_chips = 1; q.chips = {10000000}; }), "1e6");
  expect_config_error(with([](GoodputParams& q) { q.mtbi_chip_years = 0.001; q.days = 3650; }), "failures per run");
  // The learner check applies only when DiLoCo is simulated.
  EXPECT_NO_THROW(validate_goodput(with([](GoodputParams& q) { q.learners = {7}; q.diloco = false; })));
  EXPECT_THROW(simulate_once(p, RunSpec{Scheme::kDecoupledDiLoCo, 150000, 7}, 1), ConfigError);
  // Defect: the run was checked against `p`'s own grid. A DiLoCo run whose learners do not divide its slices
  // passed when p.diloco was false (and the simulator read past its groups); a DP run failed on p's learner list.
  GoodputParams no_diloco = p;
  no_diloco.diloco = false;
  EXPECT_THROW(simulate_once(no_diloco, RunSpec{Scheme::kDecoupledDiLoCo, 150000, 7}, 1), ConfigError);
  EXPECT_THROW(simulate_specs(no_diloco, {RunSpec{Scheme::kDecoupledDiLoCo, 150000, 7}}), ConfigError);
  GoodputParams grid = p;  // learners {1, 2, 4, 8, 16}: 2 does not divide 3 slices, which a DP run does not care about
  grid.days = 1;
  EXPECT_NO_THROW(simulate_once(grid, RunSpec{Scheme::kDataParallel, 3 * grid.slice_chips, 1}, 1));
}

// Defect: a domain failure counted domain_slices failures before taking them; with a spare swapped in at once the
// pool ran dry first and fewer went to repair. With no repair ending inside the run, no slice can be counted twice:
// at most slices + spares failures.
TEST(Goodput, ADomainFailureCountsOnlyTheSlicesItSendsToRepair) {
  GoodputParams p;
  p.slice_chips = 625;
  p.spare_fraction = 0.5;  // 2 slices, 1 spare, swapped in at once
  p.swap_minutes = 0;
  p.mtbi_chip_years = 1e6;  // no independent failures to speak of
  p.domain_slices = 3;
  p.domain_mtbf_days = 0.05;
  p.repair_dist = "fixed";
  p.repair_hours = 1000;  // none back within the run
  p.days = 1;
  p.warmup_hours = 0;
  int64_t most = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const RunResult r = simulate_once(p, RunSpec{Scheme::kDataParallel, 1250, 1}, seed);
    EXPECT_LE(r.failures, 3) << "seed " << seed;
    most = std::max(most, r.failures);
  }
  EXPECT_GE(most, 2);  // domains did fail: the bound was tested
}

TEST(Goodput, AWarmUpShorterThanThreeRepairTimesIsWarnedAbout) {
  GoodputParams p;  // the defaults: 12 h warm-up, 1 h repairs
  EXPECT_EQ(goodput_warnings(p), "");
  p.repair_hours = 24;  // the fit's upper bound
  const std::string w = goodput_warnings(p);
  EXPECT_NE(w.find("goodput.warmup_hours"), std::string::npos) << w;
  EXPECT_NE(w.find("at least 72"), std::string::npos) << w;
}

TEST(Goodput, ConfigKeysBindAndCheck) {
  GoodputParams p;
  ConfigSchema schema;
  bind_goodput_config(schema, p);
  schema.load_string("[goodput]\nchips = [1250, 2500]\nmtbi_chip_years = 2\nrepair_dist = \"fixed\"\n", "test.toml");
  schema.apply_override("goodput.learners=1,2");
  schema.apply_override("goodput.days=3.5");
  EXPECT_EQ(p.chips, (std::vector<int64_t>{1250, 2500}));
  EXPECT_EQ(p.learners, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(p.mtbi_chip_years, 2.0);
  EXPECT_EQ(p.days, 3.5);
  EXPECT_EQ(p.repair_dist, "fixed");
  EXPECT_NO_THROW(schema.validate());
  EXPECT_THROW(schema.apply_override("goodput.nope=1"), ConfigError);
  schema.apply_override("goodput.seeds=-3");
  EXPECT_THROW(schema.validate(), ConfigError);
  // Every documented key is bound, and every bound key documented.
  for (const auto& d : goodput_key_docs()) {
    EXPECT_TRUE(schema.has(d.key)) << d.key;
    EXPECT_FALSE(d.reason.empty()) << d.key;
  }
}

}  // namespace
}  // namespace deloco
