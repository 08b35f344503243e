// deloco/merge_config.h — the [merge] section of a config, bound once for training (`deloco sim`, `run`, `syncer`,
// `learner`, through AlgorithmConfig) and for `deloco merge` alike: every key means the same under both.
//
//   merge.preset          the algorithm preset (deloco/algorithm.h) whose merge plan is used; training also takes
//                         its outer optimizer from it
//   merge.method          "" : the preset's plan; a merger name (merger_names()): that method for every tensor of
//                         rank ≥ 2; a plan name (diloco, decoupled, isoloco): that plan (MergePlan::preset)
//   merge.rules           "glob=method,..." tried before the plan's own rules (first match wins)
//   merge.vector_method   the method for tensors of rank < 2 that no rule names
//   merge.dtype           compute precision: fp32 | fp64
//   merge.seed            seed of random methods (dare)
//   merge.ties_keep, merge.dare_drop, merge.iso_cts_common, merge.iso_fast_polish   MergeOptions (deloco/merge.h)
//   merge.alpha, merge.threads   `deloco merge` only (the task vector's scale, the file merge's workers): bound
//                         for Use::kCheckpoints, so a training config that names them is refused as unknown keys
//
// The defaults give the plan training always used: the diloco preset's (the mean everywhere), fp32, seed 0, and
// MergeOptions' defaults. Errors: the keys' checks (run by ConfigSchema::validate()) name the key; plan() throws
// ConfigError or MergeError. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deloco/merge.h"

namespace deloco {

class ConfigSchema;

struct MergeConfig {
  std::string preset = "diloco";
  std::string method;
  std::string rules;
  std::string vector_method = "mean";
  std::string dtype = "fp32";
  int64_t seed = 0;
  double ties_keep = 0.9;
  double dare_drop = 0.1;
  double iso_cts_common = 0.8;
  int64_t iso_fast_polish = 1;
  // `deloco merge` only.
  double alpha = 1.0;
  int64_t threads = 0;

  enum class Use { kTraining, kCheckpoints };
  // Binds the keys above (alpha and threads only for kCheckpoints), each with its check. This object must outlive
  // `schema`.
  void bind(ConfigSchema& schema, Use use);
  // The merge plan these keys name (see the table above). Throws ConfigError for an unknown preset and MergeError
  // for a malformed rule; MergeSelector(plan()) checks the method names and option values.
  MergePlan plan() const;
  // What the plan is called in a manifest: merge.method when given, else the preset's one method when its plan has
  // no rules ("mean" for diloco), else the preset's name.
  std::string label() const;
  MergeOptions options() const;
};

// The names merge.method accepts besides the merger names: "diloco", "decoupled", "isoloco".
const std::vector<std::string>& merge_plan_names();

}  // namespace deloco
