#include "run/summary.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "run/supervisor.h"

namespace deloco::run {
namespace summary_cases {

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

TEST(RunSummary, ShardSummariesCombined) {
  using nlohmann::json;
  const json a = {{"command", "syncer"}, {"shard", 0}, {"shards", 2}, {"fragments", {0, 2}}, {"outer_steps", 10},
                  {"contributions_merged", 20}, {"bytes_sent", 1000}, {"bytes_received", 300}, {"grace_waits", 4},
                  {"broadcasts_sent", 20}, {"broadcasts_superseded", 3}, {"broadcasts_acked", 17},
                  {"uploads_measured", 9}, {"broadcasts_measured", 8}, {"state_requests_dropped", 0},
                  {"states_held", 1}, {"blocked_spells", 1}, {"uptime", 0.9}, {"goodput", 0.8}, {"tokens", 5000},
                  {"upload_seconds", 0.2}, {"broadcast_seconds", 1.0}, {"joins", {1, 2}},
                  {"rejects", {{"stale", 1}}}, {"resumed", false}, {"learners", 2}, {"send_window_bytes", 4096},
                  {"final_val_loss", 1.5}, {"val_bpb", 2.1}, {"checkpoint", "a"}, {"peak_rss_bytes", 7},
                  {"parameters", 100}};
  const json b = {{"shard", 1}, {"shards", 2}, {"fragments", {1, 3}}, {"outer_steps", 11},
                  {"contributions_merged", 21}, {"bytes_sent", 2000}, {"bytes_received", 400}, {"grace_waits", 5},
                  {"broadcasts_sent", 22}, {"broadcasts_superseded", 4}, {"broadcasts_acked", 18},
                  {"uploads_measured", 10}, {"broadcasts_measured", 7}, {"state_requests_dropped", 2},
                  {"states_held", 0}, {"blocked_spells", 0}, {"uptime", 0.7}, {"goodput", 0.6}, {"tokens", 5200},
                  {"upload_seconds", 0.4}, {"broadcast_seconds", nullptr}, {"joins", {3, 1, 1}},
                  {"rejects", {{"stale", 2}, {"fingerprint", 1}}}, {"resumed", true}, {"learners", 2},
                  {"send_window_bytes", 4096}, {"checkpoint", "b"}, {"peak_rss_bytes", 9}, {"parameters", 120}};
  const json s = combine_shard_summaries({a, b});
  for (const char* f : {"outer_steps", "contributions_merged", "bytes_sent", "bytes_received", "grace_waits",
                        "broadcasts_sent", "broadcasts_superseded", "broadcasts_acked", "uploads_measured",
                        "broadcasts_measured", "state_requests_dropped", "states_held", "blocked_spells"})
    EXPECT_EQ(s.at(f).get<int64_t>(), a[f].get<int64_t>() + b[f].get<int64_t>()) << f;
  EXPECT_DOUBLE_EQ(s.at("uptime").get<double>(), 0.7);              // the lowest
  EXPECT_DOUBLE_EQ(s.at("goodput").get<double>(), 0.8);             // shard 0's
  EXPECT_EQ(s.at("tokens").get<int64_t>(), 5200);                   // the highest
  EXPECT_DOUBLE_EQ(s.at("upload_seconds").get<double>(), 0.3);      // the mean
  EXPECT_DOUBLE_EQ(s.at("broadcast_seconds").get<double>(), 1.0);   // the mean of the shards that measured one
  EXPECT_EQ(s.at("joins"), (json{3, 2, 1}));                        // per learner, the most any shard saw
  EXPECT_EQ(s.at("rejects"), (json{{"stale", 3}, {"fingerprint", 1}}));
  EXPECT_TRUE(s.at("resumed").get<bool>());
  EXPECT_EQ(s.at("learners").get<int64_t>(), 2);
  EXPECT_EQ(s.at("send_window_bytes").get<int64_t>(), 4096);
  for (const char* f :
       {"shard", "fragments", "checkpoint", "final_val_loss", "val_bpb", "peak_rss_bytes", "parameters"})
    EXPECT_FALSE(s.contains(f)) << f;
  ASSERT_EQ(s.at("shards").size(), 2u);
  EXPECT_EQ(s["shards"][1].at("shard").get<int64_t>(), 1);
  EXPECT_DOUBLE_EQ(s["shards"][1].at("upload_seconds").get<double>(), 0.4);
  EXPECT_TRUE(s["shards"][1].at("broadcast_seconds").is_null());
  EXPECT_FALSE(s.contains("syncer_summary_missing"));

  // A shard without a summary: flagged; an older shard without the newer counters: what the others counted.
  const json c = combine_shard_summaries({a, json{{"syncer_summary_missing", true}}});
  EXPECT_TRUE(c.at("syncer_summary_missing").get<bool>());
  EXPECT_EQ(c.at("broadcasts_superseded").get<int64_t>(), 3);
  EXPECT_DOUBLE_EQ(c.at("broadcast_seconds").get<double>(), 1.0);
  const json none = combine_shard_summaries({json{{"upload_seconds", nullptr}}, json{{"upload_seconds", nullptr}}});
  EXPECT_TRUE(none.at("upload_seconds").is_null());
  EXPECT_FALSE(none.contains("broadcasts_superseded"));
}

// Issue 56: the fate of every push, from the learners' tallies and the (two shards') syncer summaries.
TEST(RunSummary, PushAccountingAddsUpAcrossShards) {
  using nlohmann::json;
  const json a = {{"contributions_merged", 20}, {"contributions_replaced", 3}, {"contributions_pending_at_end", 1},
                  {"push_rejects", {{"norm_ratio", 1}}}};
  const json b = {{"contributions_merged", 15}, {"contributions_replaced", 2}, {"contributions_pending_at_end", 0},
                  {"push_rejects", {{"norm_ratio", 2}, {"future_base", 1}}}};
  const json s = combine_shard_summaries({a, b});
  EXPECT_EQ(s.at("contributions_replaced").get<int64_t>(), 5);
  EXPECT_EQ(s.at("contributions_pending_at_end").get<int64_t>(), 1);
  EXPECT_EQ(s.at("push_rejects"), (json{{"norm_ratio", 3}, {"future_base", 1}}));
  const json joins = combine_shard_summaries({{{"joins_refused", 2}, {"joins_refused_by", {{"fingerprint", 2}}}},
                                              {{"joins_refused", 1}, {"joins_refused_by", {{"fingerprint", 1}}}}});
  EXPECT_EQ(joins.at("joins_refused").get<int64_t>(), 3);  // every shard's, not the first one's
  EXPECT_EQ(joins.at("joins_refused_by"), (json{{"fingerprint", 3}}));
  // Learner 0: 30 due, 25 sent, 4 superseded, 1 left at the end; learner 1 (two processes): 24 due, 22 sent, 2 dropped.
  PushTally l0{30, 25, 4, 0, 1, 1}, l1{24, 22, 0, 2, 0, 2};
  const json acc = push_accounting({l0, l1}, s);
  EXPECT_EQ(acc.at("due").get<int64_t>(), 54);
  EXPECT_EQ(acc.at("sent").get<int64_t>(), 47);
  EXPECT_EQ(acc.at("unsent"), (json{{"superseded", 4}, {"dropped", 2}, {"at_end", 1}}));
  EXPECT_EQ(acc.at("merged").get<int64_t>(), 35);
  EXPECT_EQ(acc.at("unmerged"), (json{{"refused", 4}, {"replaced", 5}, {"pending_at_end", 1}}));
  EXPECT_EQ(acc.at("refused_by_reason"), (json{{"norm_ratio", 3}, {"future_base", 1}}));
  EXPECT_EQ(acc.at("unaccounted").get<int64_t>(), 47 - 35 - 4 - 5 - 1);
  EXPECT_EQ(acc.at("learners")[1].at("processes").get<int64_t>(), 2);
  // The final report names what did not go and what did not merge.
  json run = {{"push_accounting", acc}};
  const std::string report = final_report(run, "s.json");
  EXPECT_NE(report.find("pushes: 54 due, 47 sent (4 superseded while the link was busy, 2 dropped while not joined, 1 "
                        "unsent at the end), 35 merged (4 refused, 5 replaced by a newer push, 1 waiting at the end, 2 "
                        "not counted by the final syncer)"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("counted from push records"), std::string::npos);
  EXPECT_EQ(report.find("more merged"), std::string::npos);
  // A learner with a killed process (counted from its push records): the line says so.
  PushTally killed{12, 9, 0, 3, 0, 2, 1};
  run["push_accounting"] = push_accounting({killed}, json{{"contributions_merged", 8}});
  EXPECT_EQ(run["push_accounting"].at("processes_from_records").get<int64_t>(), 1);
  EXPECT_NE(final_report(run, "s.json").find("pushes: 12 due, 9 sent (3 dropped while not joined), 8 merged (1 not "
                                             "counted by the final syncer); 1 killed learner process counted from "
                                             "push records"),
            std::string::npos)
      << final_report(run, "s.json");
  // More merged than sent: records cut short; the line says so.
  PushTally survivor{5, 5, 0, 0, 0, 1};
  run["push_accounting"] = push_accounting({survivor}, json{{"contributions_merged", 12}});
  EXPECT_NE(final_report(run, "s.json").find("pushes: 5 due, 5 sent, 12 merged; more merged than the learners' "
                                             "records say were sent"),
            std::string::npos)
      << final_report(run, "s.json");
  // Nothing lost: no line.
  PushTally all{10, 10, 0, 0, 0, 1};
  run["push_accounting"] = push_accounting({all}, json{{"contributions_merged", 10}});
  EXPECT_EQ(final_report(run, "s.json").find("pushes:"), std::string::npos);
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
