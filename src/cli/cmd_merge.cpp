// `deloco merge`: merge fine-tuned checkpoints (or any safetensors files with matching names and shapes) as
// task vectors against a base:  τ_i = θ_i − θ_base,  θ = θ_base + α·Merge(τ_1..τ_T). This file only maps flags
// and config keys ([merge]) onto merge_checkpoints() (deloco/checkpoint_merge.h), which does the work and writes
// the output and its manifest.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "deloco/checkpoint_merge.h"
#include "deloco/config.h"

namespace deloco::cli {

void add_merge_command(CLI::App& app) {
  auto args = std::make_shared<CheckpointMergeOptions>();
  auto common = std::make_shared<CommonOptions>();
  auto schema = std::make_shared<ConfigSchema>();
  CLI::App* sub = app.add_subcommand(
      "merge", "merge checkpoints as task vectors against a base: theta = base + alpha*Merge(theta_i - base)");
  add_common_options(sub, common.get());
  sub->add_option("--method", args->method,
                  "merge method (mean, rda, iso_c, iso_c_fast, iso_cts, tsv, ties, dare) or plan "
                  "(diloco, decoupled, isoloco)");
  sub->add_option("--base", args->base, "base checkpoint (.safetensors file or checkpoint folder)")->required();
  sub->add_option("--inputs", args->inputs, "fine-tuned checkpoints to merge")->required();
  sub->add_option("--out", args->out, "output .safetensors file (manifest written to OUT.manifest.json)")
      ->required();
  sub->add_option("--alpha", args->alpha, "scale of the merged task vector (default 1)");
  sub->add_option("--weights", args->weights, "one non-negative weight per input (default uniform)");
  sub->add_option("--rules", args->rules, "per-tensor methods: 'glob=method,glob=method' (first match wins)");
  sub->add_option("--vector-method", args->vector_method, "method for 1-D tensors under matrix methods");
  sub->add_option("--dtype", args->dtype, "compute precision: fp32 (default) or fp64");
  sub->add_option("--seed", args->seed, "seed for random methods (dare)");
  sub->add_option("--threads", args->threads, "worker threads (default: all cores)");

  // The same settings as config keys (section [merge]); explicit flags win over the config.
  schema->bind("merge.method", &args->method, "merge method or plan");
  schema->bind("merge.rules", &args->rules, "per-tensor rules 'glob=method,...'");
  schema->bind("merge.vector_method", &args->vector_method, "method for 1-D tensors under matrix methods");
  schema->bind("merge.dtype", &args->dtype, "compute precision fp32|fp64");
  schema->bind("merge.alpha", &args->alpha, "scale of the merged task vector");
  schema->bind("merge.seed", &args->seed, "seed for random methods");
  schema->bind("merge.threads", &args->threads, "worker threads (0 = all cores)");
  schema->bind("merge.ties_keep", &args->ties_keep, "ties: fraction of entries kept");
  schema->bind("merge.dare_drop", &args->dare_drop, "dare: drop probability");
  schema->bind("merge.iso_cts_common", &args->iso_cts_common, "iso_cts: common-subspace fraction");
  schema->bind("merge.iso_fast_polish", &args->iso_fast_polish, "iso_c_fast: Newton-Schulz polish steps");

  sub->callback([args, common, schema, sub] {
    // Re-apply explicit flags after the config so that they take precedence.
    CheckpointMergeOptions flags = *args;
    apply_config(*schema, *common);
    auto keep = [&](const char* opt, auto& field, const auto& value) {
      if (sub->get_option(opt)->count() > 0) field = value;
    };
    keep("--method", args->method, flags.method);
    keep("--alpha", args->alpha, flags.alpha);
    keep("--rules", args->rules, flags.rules);
    keep("--vector-method", args->vector_method, flags.vector_method);
    keep("--dtype", args->dtype, flags.dtype);
    keep("--seed", args->seed, flags.seed);
    keep("--threads", args->threads, flags.threads);
    nlohmann::json m = merge_checkpoints(*args);
    std::cerr << "merged " << m["tensors_merged"] << " tensors (" << m["methods_used"].dump() << ") in "
              << m["wall_seconds"].get<double>() << " s -> " << args->out << "\n";
    nlohmann::json summary = m;
    summary.erase("per_tensor");
    write_summary(*common, summary);
  });
}

}  // namespace deloco::cli
