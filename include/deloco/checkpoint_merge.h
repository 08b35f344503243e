// deloco/checkpoint_merge.h — merging whole checkpoints as task vectors against a base (`deloco merge`):
//   τ_i = θ_i − θ_base,   θ = θ_base + α·Merge(τ_1..τ_T)   with the per-tensor methods of deloco/merge.h.
//
// Contract
//  * Inputs: `base` and every entry of `inputs` name a .safetensors file or a checkpoint folder (which stands for
//    its model.safetensors). Each input must hold exactly the base's tensor names, with the same shapes; floating
//    point tensors may differ in float dtype and are merged, other tensors must have the base's dtype and are
//    copied from the base unchanged.
//  * Files are memory-mapped; tensors are merged on `threads` workers (≤ 0: one per core) and written as they
//    finish, so memory holds only the tensors in flight. Arithmetic runs in `dtype` (fp32 | fp64); each output
//    tensor has the base tensor's dtype. Results do not depend on the number of threads (see merge_tensors()).
//  * Output: `out` (safetensors, metadata {"format": "deloco-merge", "method": method}) is written to a temporary
//    file and renamed into place only when complete; the manifest is then written atomically to
//    "<out>.manifest.json". The manifest is also returned: format, version, formula, method (MergeConfig::label()),
//    plan, alpha, weights, compute_dtype, seed, options, base, inputs, output, tensors_merged, tensors_copied,
//    methods_used, per_tensor (name → method) and wall_seconds.
//  * Errors: MergeError for bad settings (checked before any file is opened: no inputs, weights not one per input,
//    non-finite alpha, an unknown preset, dtype, method, rule or option value), missing/extra tensors, shape or dtype
//    mismatches and NaN/Inf values (naming the tensor and file); SafetensorsError for unreadable or malformed
//    files; IoError when the output cannot be written. An error before the output is complete leaves no output file.
//  * Not thread-safe with respect to `out`: one merge per output path at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deloco/merge_config.h"

namespace deloco {

struct CheckpointMergeOptions {
  std::string base;                  // base checkpoint
  std::vector<std::string> inputs;   // fine-tuned checkpoints (T ≥ 1)
  std::string out;                   // output .safetensors path
  std::vector<double> weights;       // one non-negative weight per input (empty: uniform)
  // The plan and its options (merge.preset / merge.method, rules, vector method, dtype, seed, the methods'
  // options), α (merge.alpha) and the workers (merge.threads, ≤ 0: one per core): the [merge] keys of
  // deloco/merge_config.h, the same as a training run's. The default is the diloco preset's plan: the mean.
  MergeConfig merge;
};

nlohmann::json merge_checkpoints(const CheckpointMergeOptions& opts);

}  // namespace deloco
