#include "run/summary.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "run/supervisor.h"

namespace deloco::run {
namespace {

TEST(RunSummary, MedianMaxAndRejoinsOnlyAfterTheKill) {
  EXPECT_TRUE(median_max({}).is_null());
  EXPECT_EQ(median_max({3, 1, 2}), (nlohmann::json{{"median", 2.0}, {"max", 3.0}, {"count", 3}}));
  EXPECT_DOUBLE_EQ(median_max({4, 1}).at("median").get<double>(), 2.5);
  RejoinLog log(2);
  EXPECT_EQ(log.joined(0, 10), -1);  // no kill open
  log.killed(0, 100);
  EXPECT_EQ(log.joined(0, 99), -1);  // a record from before the kill
  EXPECT_DOUBLE_EQ(log.joined(0, 102), 2);
  EXPECT_EQ(log.joined(0, 103), -1);  // closed
  log.pushed(0, 104);
  EXPECT_EQ(log.rejoin_seconds()["count"].get<int64_t>(), 1);
  EXPECT_DOUBLE_EQ(log.recontribute_seconds()["median"].get<double>(), 4);
  EXPECT_TRUE(RejoinLog(1).rejoin_seconds().is_null());
}

TEST(RunSummary, FinalReport) {
  const nlohmann::json s = {{"wall_seconds", 118.4}, {"learners", 2}, {"final_val_loss", 1.47701}, {"val_bpb", 2.1309},
                            {"outer_steps", 251}, {"contributions_merged", 283}, {"contributions_rejected", 0},
                            {"uptime", 0.948}, {"goodput", 0.91}, {"learner_kills", 3}, {"learner_stops", 0},
                            {"syncer_kills", 1}, {"rejoin_seconds", {{"median", 3.08}, {"max", 3.6}}},
                            {"recontribute_seconds", nullptr}};
  EXPECT_EQ(final_report(s, "runs/x/summary.json"),
            "deloco run: 1m58s, 2 learners: final val loss 1.4770 nats/byte, 2.131 bits/byte; 251 fragment merges, "
            "283 contributions merged, 0 rejected; uptime 0.948, goodput 0.910\n"
            "chaos: 3 learner kills (rejoin median 3.1 s, max 3.6 s; contributing again n/a), 0 stops, 1 syncer kills\n"
            "summary: runs/x/summary.json\n");
  nlohmann::json tokens = s;  // token files: the loss is per token, and the summary says so
  tokens["loss_unit"] = "nats/token";
  EXPECT_NE(final_report(tokens, "s.json").find("final val loss 1.4770 nats/token, 2.131 bits/byte"), std::string::npos)
      << final_report(tokens, "s.json");
}

TEST(Supervisor, CrashLoopPolicy) {
  Child c;
  EXPECT_EQ(record_failure(c, 0), "");
  EXPECT_EQ(record_failure(c, 5), "");
  EXPECT_EQ(record_failure(c, 9), "3 times within 10 s");
  Child slow;
  for (double t : {0.0, 20.0, 40.0, 60.0}) EXPECT_EQ(record_failure(slow, t), "") << t;
  EXPECT_EQ(record_failure(slow, 80), "5 times within 120 s");
  Child spread;
  for (double t : {0.0, 30.0, 60.0, 90.0, 121.0}) EXPECT_EQ(record_failure(spread, t), "") << t;  // 0 s drops out
  EXPECT_EQ(spread.failures.size(), 4u);
}

TEST(Supervisor, ChildEnvironmentDropsAddressFallbacksAndAddsExtras) {
  const char* omp_before = std::getenv("OMP_NUM_THREADS");
  const std::string saved = omp_before ? omp_before : "";
  ::setenv("DELOCO_SYNCER", "tcp://elsewhere:1", 1);
  ::setenv("OMP_NUM_THREADS", "8", 1);
  const auto env = child_environment({"OMP_NUM_THREADS=1"});
  ::unsetenv("DELOCO_SYNCER");
  if (omp_before) ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else ::unsetenv("OMP_NUM_THREADS");
  int omp = 0;
  for (const auto& kv : env) {
    EXPECT_NE(kv.rfind("DELOCO_SYNCER=", 0), 0u) << kv;
    if (kv.rfind("OMP_NUM_THREADS=", 0) == 0) {
      ++omp;
      EXPECT_EQ(kv, "OMP_NUM_THREADS=1");
    }
  }
  EXPECT_EQ(omp, 1);
}

}  // namespace
}  // namespace deloco::run
