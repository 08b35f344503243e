// The [merge] keys (deloco/merge.h): one binding, the same plan for a training run's syncer and for
// `deloco merge`, the defaults that training always had, and refused values named by key.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/algorithm.h"
#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "deloco/merge.h"
#include "deloco/sim.h"

namespace deloco {
namespace merge_config_cases {

// A training config (what `deloco sim` binds) after the given overrides, validated.
SimConfig sim_config(const std::vector<std::string>& sets) {
  RunConfig run;
  SimConfig cfg;
  ConfigSchema schema;
  run.bind(schema);
  cfg.bind(schema);
  ConfigSources src;
  src.sets = sets;
  load_config(schema, src);
  return cfg;
}

std::string config_error(const std::vector<std::string>& sets) {
  try {
    sim_config(sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(MergeConfig, TrainingDefaultsAreThePresetsPlans) {
  for (const auto& preset : algorithm_presets()) {
    const MergePlan p = sim_config({"merge.preset=" + preset.name}).merge_plan();
    EXPECT_EQ(p.method, preset.plan.method) << preset.name;
    ASSERT_EQ(p.rules.size(), preset.plan.rules.size()) << preset.name;
    for (size_t i = 0; i < p.rules.size(); ++i) {
      EXPECT_EQ(p.rules[i].pattern, preset.plan.rules[i].pattern);
      EXPECT_EQ(p.rules[i].method, preset.plan.rules[i].method);
    }
    EXPECT_EQ(p.vector_method, "mean");
    const MergeOptions d;
    EXPECT_EQ(p.options.compute_dtype, d.compute_dtype);
    EXPECT_EQ(p.options.seed, d.seed);
    EXPECT_EQ(p.options.ties_keep, d.ties_keep);
    EXPECT_EQ(p.options.dare_drop, d.dare_drop);
    EXPECT_EQ(p.options.iso_cts_common, d.iso_cts_common);
    EXPECT_EQ(p.options.iso_fast_polish, d.iso_fast_polish);
  }
  // merge.method: one method for every matrix, the preset's rules dropped (as before the keys were shared).
  const MergePlan ties = sim_config({"merge.preset=decoupled", "merge.method=ties"}).merge_plan();
  EXPECT_EQ(ties.method, "ties");
  EXPECT_TRUE(ties.rules.empty());
}

TEST(MergeConfig, ATrainingRunsMethodOptionsReachTheSyncersMerge) {
  const SimConfig cfg = sim_config({"merge.method=ties", "merge.ties_keep=0.3", "merge.dare_drop=0.4",
                                    "merge.iso_cts_common=0.5", "merge.iso_fast_polish=3", "merge.seed=7",
                                    "merge.dtype=fp64"});
  const MergePlan plan = cfg.merge_plan();  // what the syncer core is built with (sim.cpp, syncer_node.cpp)
  EXPECT_EQ(plan.method, "ties");
  EXPECT_EQ(plan.options.ties_keep, 0.3);
  EXPECT_EQ(plan.options.dare_drop, 0.4);
  EXPECT_EQ(plan.options.iso_cts_common, 0.5);
  EXPECT_EQ(plan.options.iso_fast_polish, 3);
  EXPECT_EQ(plan.options.seed, 7u);
  EXPECT_EQ(plan.options.compute_dtype, at::kDouble);

  // The syncer core merges with that plan: the same result as ties keeping 30 %, not the default 90 %.
  at::manual_seed(3);
  MergeInput in{"h.0.w", {at::randn({8, 8}), at::randn({8, 8}), at::randn({8, 8})}, {}};
  MergeOptions keep30;
  keep30.ties_keep = 0.3;
  keep30.compute_dtype = at::kDouble;
  const at::Tensor got = MergeSelector(plan).select("h.0.w", 2).merge(in);
  EXPECT_TRUE(got.equal(make_merger("ties", keep30)->merge(in)));
  EXPECT_FALSE(got.equal(make_merger("ties")->merge(in)));
}

TEST(MergeConfig, DelocoMergeAndTrainingReadTheKeysAlike) {
  const std::vector<std::string> sets = {"merge.method=decoupled", "merge.rules=*ln*=mean,*attn*=rda",
                                         "merge.vector_method=rda", "merge.ties_keep=0.5"};
  MergeConfig ck;
  ConfigSchema schema;
  ck.bind(schema, MergeConfig::Use::kCheckpoints);
  ConfigSources src;
  src.sets = sets;
  load_config(schema, src);
  const MergePlan a = ck.plan(), b = sim_config(sets).merge_plan();
  EXPECT_EQ(a.method, "rda");
  EXPECT_EQ(a.method, b.method);
  ASSERT_EQ(a.rules.size(), b.rules.size());
  ASSERT_EQ(a.rules.size(), 2 + MergePlan::preset("decoupled").rules.size());
  EXPECT_EQ(a.rules[0].pattern, "*ln*");  // the config's rules before the plan's
  EXPECT_EQ(a.rules[1].method, "rda");
  for (size_t i = 0; i < a.rules.size(); ++i) EXPECT_EQ(a.rules[i].pattern, b.rules[i].pattern);
  EXPECT_EQ(a.vector_method, "rda");
  EXPECT_EQ(b.vector_method, "rda");
  EXPECT_EQ(a.options.ties_keep, b.options.ties_keep);
  // `deloco merge` without a method: the diloco preset's plan, recorded as "mean" as before.
  MergeConfig d;
  EXPECT_EQ(d.plan().method, "mean");
  EXPECT_EQ(d.label(), "mean");
  d.preset = "decoupled";
  EXPECT_EQ(d.label(), "decoupled");
  d.method = "tsv";
  EXPECT_EQ(d.label(), "tsv");
}

TEST(MergeConfig, BadValuesAndCheckpointOnlyKeysAreRefusedNamingTheKey) {
  EXPECT_NE(config_error({"merge.ties_keep=1.5"}).find("'merge.ties_keep': ties_keep must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(config_error({"merge.dare_drop=1"}).find("'merge.dare_drop'"), std::string::npos);
  EXPECT_NE(config_error({"merge.iso_fast_polish=99"}).find("'merge.iso_fast_polish'"), std::string::npos);
  EXPECT_NE(config_error({"merge.method=median"}).find("unknown merge method 'median'"), std::string::npos);
  EXPECT_NE(config_error({"merge.rules=*w*=median"}).find("'merge.rules'"), std::string::npos);
  EXPECT_NE(config_error({"merge.rules=nonsense"}).find("'merge.rules'"), std::string::npos);
  EXPECT_NE(config_error({"merge.vector_method=median"}).find("'merge.vector_method'"), std::string::npos);
  EXPECT_NE(config_error({"merge.dtype=fp16"}).find("'merge.dtype': must be fp32 or fp64"), std::string::npos);
  EXPECT_NE(config_error({"merge.preset=nope"}).find("'merge.preset'"), std::string::npos);
  // α and the file merge's workers mean nothing to a training run: unknown keys there.
  EXPECT_NE(config_error({"merge.alpha=0.5"}).find("unknown key 'merge.alpha'"), std::string::npos);
  EXPECT_NE(config_error({"merge.threads=2"}).find("unknown key 'merge.threads'"), std::string::npos);
  EXPECT_NE(config_error({"merge.nope=1"}).find("unknown key 'merge.nope'"), std::string::npos);
  EXPECT_EQ(config_error({"merge.ties_keep=1", "merge.dare_drop=0", "merge.iso_fast_polish=0"}), "");
  EXPECT_NE(config_error({"merge.iso_ns_steps=-1"}).find("'merge.iso_ns_steps'"), std::string::npos);
  EXPECT_NE(config_error({"merge.iso_ns_precision=fp16"}).find("'merge.iso_ns_precision': iso_ns_precision must be"),
            std::string::npos);
}

TEST(MergeConfig, IsoCNsIsSelectableWithItsOptions) {
  // The syncer's selector (through the isoloco preset's outer optimizer) and `deloco merge` alike.
  const MergePlan plan = sim_config({"merge.preset=isoloco", "merge.method=iso_c_ns", "merge.iso_ns_steps=11",
                                     "merge.iso_ns_precision=bf16"})
                             .merge_plan();
  EXPECT_EQ(plan.method, "iso_c_ns");
  EXPECT_EQ(plan.options.iso_ns_steps, 11);
  EXPECT_EQ(plan.options.iso_ns_dtype, at::kBFloat16);
  const MergeSelector sel(plan);
  EXPECT_STREQ(sel.select("h.0.attn.w", 2).name(), "iso_c_ns");
  EXPECT_STREQ(sel.select("h.0.ln.w", 1).name(), "mean");
  const MergeOptions d;
  EXPECT_EQ(d.iso_ns_steps, 0);  // 10 in fp32, 8 in bf16
  EXPECT_EQ(d.iso_ns_dtype, at::kFloat);
}

}  // namespace
}  // namespace deloco
