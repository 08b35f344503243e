// `deloco merge`: merge fine-tuned checkpoints (or any safetensors files with matching names and shapes) as
// task vectors against a base:  τ_i = θ_i − θ_base,  θ = θ_base + α·Merge(τ_1..τ_T). This file only maps flags
// and config keys ([merge], bound by MergeConfig as for training) onto merge_checkpoints()
// (deloco/merge.h), which does the work and writes the output and its manifest.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "deloco/config.h"
#include "deloco/merge.h"

namespace deloco::cli {

void add_merge_command(CLI::App& app) {
  auto args = std::make_shared<CheckpointMergeOptions>();
  auto common = std::make_shared<CommonOptions>();
  auto schema = std::make_shared<ConfigSchema>();
  MergeConfig& m = args->merge;
  CLI::App* sub = app.add_subcommand(
      "merge", "merge checkpoints as task vectors against a base: theta = base + alpha*Merge(theta_i - base)");
  add_common_options(sub, common.get());
  // The flags are the [merge] keys a training run has too (deloco/merge.h), plus alpha and threads.
  sub->add_option("--method", m.method,
                  "merge method (mean, rda, iso_c, iso_c_fast, iso_c_ns, iso_cts, tsv, ties, dare) or plan "
                  "(diloco, decoupled, isoloco) [merge.method; default: merge.preset's plan, the mean]");
  sub->add_option("--base", args->base, "base checkpoint (.safetensors file or checkpoint folder)")->required();
  sub->add_option("--inputs", args->inputs, "fine-tuned checkpoints to merge")->required();
  sub->add_option("--out", args->out, "output .safetensors file (manifest written to OUT.manifest.json)")
      ->required();
  sub->add_option("--alpha", m.alpha, "scale of the merged task vector (default 1) [merge.alpha]");
  sub->add_option("--weights", args->weights, "one non-negative weight per input (default uniform)");
  sub->add_option("--rules", m.rules, "per-tensor methods: 'glob=method,glob=method' (first match wins) [merge.rules]");
  sub->add_option("--vector-method", m.vector_method, "method for 1-D tensors under matrix methods [merge.vector_method]");
  sub->add_option("--dtype", m.dtype, "compute precision: fp32 (default) or fp64 [merge.dtype]");
  sub->add_option("--seed", m.seed, "seed for random methods (dare) [merge.seed]");
  sub->add_option("--threads", m.threads, "worker threads (default: all cores) [merge.threads]");
  m.bind(*schema, MergeConfig::Use::kCheckpoints);

  sub->callback([args, common, schema, sub] {
    // The flags were parsed into the same fields; the one load order (file, environment, --set) runs over them and
    // then gives the explicit flags back, so that they win.
    const MergeConfig flags = args->merge;
    MergeConfig& m = args->merge;
    apply_config(*schema, *common, NoConfig::kBoundDefaults, nullptr, [&] {
      auto keep = [&](const char* opt, auto& field, const auto& value) {
        if (sub->get_option(opt)->count() > 0) field = value;
      };
      keep("--method", m.method, flags.method);
      keep("--alpha", m.alpha, flags.alpha);
      keep("--rules", m.rules, flags.rules);
      keep("--vector-method", m.vector_method, flags.vector_method);
      keep("--dtype", m.dtype, flags.dtype);
      keep("--seed", m.seed, flags.seed);
      keep("--threads", m.threads, flags.threads);
    });
    nlohmann::json result = merge_checkpoints(*args);
    std::cerr << "merged " << result["tensors_merged"] << " tensors (" << result["methods_used"].dump() << ") in "
              << result["wall_seconds"].get<double>() << " s -> " << args->out << "\n";
    nlohmann::json summary = result;
    summary.erase("per_tensor");
    write_summary(*common, summary);
  });
}

}  // namespace deloco::cli
