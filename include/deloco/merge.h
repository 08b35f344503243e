// deloco/merge.h — merging contributions Δ_1..Δ_T of one tensor into one (docs/merge.md), merging a whole model
// tensor by tensor, the [merge] config section (MergeConfig) and merging whole checkpoints (merge_checkpoints).
//
// Contract
//  * A Merger is a small immutable object with one verb, merge(). Make one by name with make_merger(); the
//    names are merger_names(): mean, rda, iso_c, iso_c_fast, iso_c_ns, iso_cts, tsv, ties, dare.
//  * merge() takes T ≥ 1 tensors of identical shape, dtype class (floating point) and device, and T weights
//    (empty = uniform). Weights must be finite and ≥ 0 with a positive sum; they are normalised to sum 1, so
//    every method returns a result on the scale of the weighted mean (merging T copies of Δ gives Δ for mean,
//    rda, iso_c on an isotropic Δ, ties with ties_keep = 1 — the default 0.9 trims the smallest 10 % of its
//    entries — and, in expectation, dare).
//  * The arithmetic runs in MergeOptions::compute_dtype (fp32 by default, fp64 on request; fp64 inputs always
//    in fp64) on the device of the inputs; the result has the dtype and device of deltas[0]. Inputs are never modified or retained.
//  * Matrix methods (iso_c, iso_c_fast, iso_c_ns, iso_cts, tsv) view a tensor of rank ≥ 2 as the matrix
//    shape[0] × (product of the other dims); a tensor of rank < 2 falls back to the weighted mean.
//  * Iso methods follow the papers (Marczak et al. 2025; IsoLoCo): iso_c gives every one of the r = min(m,n)
//    thin singular directions of M the mean σ̄ = (1/r)·Σ_{i≤r} σ_i, zeros included. Rank-deficient inputs: the
//    null directions of M then also get σ̄, along the orthonormal completion the SVD routine returns (not
//    unique; deterministic for one build). iso_c_fast cannot reproduce that completion: it returns σ̄·U_k V_kᵀ
//    on the k directions it resolves (σ_i > max(m,n)·eps·σ_max) and leaves M's null space null, so on a
//    rank-deficient M it differs from iso_c by exactly that completion (relative error √((r − k)/r); a full-rank
//    M's directions below that limit are lost the same way). MergeOptions::iso_rank_threshold > 0 switches both
//    to the thresholded variant (drop σ_i ≤ threshold·σ_max, mean over the kept ones, null space stays null),
//    where they agree. iso_c_ns reaches the same target by Newton–Schulz-type quintic iterations (matrix
//    products only; MergeOptions::iso_ns_steps, iso_ns_dtype): null directions stay null as with iso_c_fast,
//    singular values far below the top one are only partly lifted to σ̄ (its error against iso_c,
//    docs/merge.md), and it ignores iso_rank_threshold. iso_cts follows Iso-CTS: every direction gets the mean
//    of the concatenated common and task-specific singular values, the common rank k makes (r − k) divisible
//    by T (src/merge/iso_cts.cpp).
//    An all-zero matrix merges to zeros. No method returns NaN or Inf for finite inputs.
//  * Determinism: for a given seed, tensor name, round and inputs the result is bit-identical run to run and
//    independent of the number of worker threads (random methods seed one CPU generator per tensor from
//    (seed, name, round), so every outer step draws fresh masks).
//  * Errors throw MergeError naming the tensor and the problem: T = 0, shape/dtype/device mismatch, a
//    non-finite value (naming the contribution), weights that do not match T or are negative/all zero, an
//    unknown method name (listing the known ones), a bad option value.
//  * Thread safety: a Merger's merge() may be called from many threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "deloco/error.h"

namespace deloco {

class ConfigSchema;

struct MergeOptions {
  at::ScalarType compute_dtype = at::kFloat;  // kFloat or kDouble
  uint64_t seed = 0;                          // for dare (and any other random method)
  double ties_keep = 0.9;                     // ties: fraction of entries kept per contribution (top |x|)
  double dare_drop = 0.1;                     // dare: drop probability p; kept entries are scaled 1/(1−p)
  double iso_cts_common = 0.8;                // iso_cts: fraction of the rank given to the common subspace
  int iso_fast_polish = 1;                    // iso_c_fast: Newton–Schulz clean-up steps after the Gram solve
  // iso_c_ns: quintic Newton–Schulz steps, 1..30 (3 matrix products each); 0 = by precision: 10 for fp32/fp64
  // iterations, 8 for bf16 (where more steps add error; docs/merge.md).
  int iso_ns_steps = 0;
  at::ScalarType iso_ns_dtype = at::kFloat;   // iso_c_ns: iteration precision, kFloat or kBFloat16 (scaling fp32)
  // iso_c, iso_c_fast: 0 = off, the papers' definition (mean over all r = min(m,n) singular values, every
  // direction kept). In (0, 1): singular values ≤ iso_rank_threshold·σ_max are dropped with their directions
  // and the mean is taken over the rest (nuclear norm preserved, null space stays null). iso_cts ignores it.
  double iso_rank_threshold = 0.0;
  // Throws MergeError when a value is out of range.
  void validate() const;
};

// The contributions for one tensor.
struct MergeInput {
  std::string name;                // used in error messages and to derive the per-tensor random stream
  std::vector<at::Tensor> deltas;  // Δ_1..Δ_T, same shape
  std::vector<double> weights;     // w_1..w_T, or empty for uniform
  // The outer step / fragment version this merge belongs to; random methods (dare) mix it into their stream so
  // every outer step draws fresh masks. Deterministic given (seed, name, round). Deterministic methods ignore it.
  uint64_t round = 0;
};

class Merger {
 public:
  virtual ~Merger() = default;
  virtual const char* name() const = 0;
  // True when the method needs a matrix (and falls back to the weighted mean for rank < 2 tensors).
  virtual bool needs_matrix() const { return false; }
  // Validates the input, converts to the compute dtype, merges, converts back.
  at::Tensor merge(const MergeInput& in) const;

 protected:
  // deltas: T tensors in the compute dtype (validated; rank ≥ 2 matrix methods receive 2-D views);
  // w: normalised weights (sum 1). Returns a tensor of the deltas' shape in the compute dtype.
  virtual at::Tensor compute(const std::vector<at::Tensor>& deltas, const std::vector<double>& w,
                             uint64_t seed) const = 0;

 private:
  friend std::unique_ptr<Merger> make_merger(const std::string& name, const MergeOptions& opts);
  at::ScalarType compute_dtype_ = at::kFloat;
  uint64_t seed_ = 0;
};

// Throws MergeError for an unknown name (listing the known ones) or invalid options.
std::unique_ptr<Merger> make_merger(const std::string& name, const MergeOptions& opts = MergeOptions());

const std::vector<std::string>& merger_names();

// ---- Per-parameter-group selection -------------------------------------------------------------------------
// A rule "pattern=method" applies `method` to every tensor whose full name matches the glob `pattern`
// ('*' any run of characters, '?' one character); the first matching rule wins. A tensor no rule matches uses
// `method` when it has rank ≥ 2 and `vector_method` (default: the weighted mean) when it is a vector or scalar
// (norm gains, biases). A matrix method chosen by a rule for a vector falls back to the weighted mean.
struct MergeRule {
  std::string pattern;
  std::string method;
};

struct MergePlan {
  std::string method = "mean";
  std::vector<MergeRule> rules;
  std::string vector_method = "mean";
  MergeOptions options;

  // Parses "pat=method,pat=method" (empty string = no rules). Throws MergeError on a malformed entry.
  static std::vector<MergeRule> parse_rules(const std::string& text);
  // Named plans: "diloco" (mean everywhere), "decoupled" (rda for matrices, mean for embeddings),
  // "isoloco" (iso_c for every 2-D tensor including embeddings). Throws MergeError for other names.
  static MergePlan preset(const std::string& name);
};

bool glob_match(const std::string& pattern, const std::string& text);

// A resolved plan: one Merger per method name in use. Immutable; safe to share across threads.
class MergeSelector {
 public:
  explicit MergeSelector(const MergePlan& plan);  // throws MergeError for an unknown method name
  // The merger for a tensor called `name` of rank `dim`.
  const Merger& select(const std::string& name, int64_t dim) const;

 private:
  MergePlan plan_;
  std::map<std::string, std::unique_ptr<Merger>> mergers_;
};

// ---- Whole models ----------------------------------------------------------------------------------------
// Merges every name in `names` with `threads` workers (≤ 0: hardware concurrency). `load(name)` returns the
// contributions of one tensor (called from worker threads; must be thread-safe); `store(name, merged)`
// receives each result (also from worker threads). At most `threads` tensors' contributions are alive at once,
// so memory stays bounded by the caller's load(). The first exception from any worker stops the run and is
// rethrown on the calling thread. Returns name → method used.
std::map<std::string, std::string> merge_tensors(
    const MergeSelector& selector, const std::vector<std::string>& names,
    const std::function<MergeInput(const std::string&)>& load,
    const std::function<void(const std::string&, const at::Tensor&)>& store, int threads);

// ---- The [merge] config section ---------------------------------------------------------------------------
// The [merge] section of a config, bound once for training (`deloco sim`, `run`, `syncer`,
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
//   merge.ties_keep, merge.dare_drop, merge.iso_cts_common, merge.iso_fast_polish, merge.iso_ns_steps
//                         MergeOptions (above)
//   merge.iso_ns_precision  iso_c_ns's iteration precision: fp32 | bf16 (MergeOptions::iso_ns_dtype)
//   merge.alpha, merge.threads   `deloco merge` only (the task vector's scale, the file merge's workers): bound
//                         for Use::kCheckpoints, so a training config that names them is refused as unknown keys
//
// The defaults give the plan training always used: the diloco preset's (the mean everywhere), fp32, seed 0, and
// MergeOptions' defaults. Errors: the keys' checks (run by ConfigSchema::validate()) name the key; plan() throws
// ConfigError or MergeError. Not thread-safe.

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
  int64_t iso_ns_steps = 0;
  std::string iso_ns_precision = "fp32";
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

// ---- Whole checkpoints (`deloco merge`) ------------------------------------------------------------------
// Merging whole checkpoints as task vectors against a base (`deloco merge`):
//   τ_i = θ_i − θ_base,   θ = θ_base + α·Merge(τ_1..τ_T)   with the per-tensor methods above.
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

struct CheckpointMergeOptions {
  std::string base;                  // base checkpoint
  std::vector<std::string> inputs;   // fine-tuned checkpoints (T ≥ 1)
  std::string out;                   // output .safetensors path
  std::vector<double> weights;       // one non-negative weight per input (empty: uniform)
  // The plan and its options (merge.preset / merge.method, rules, vector method, dtype, seed, the methods'
  // options), α (merge.alpha) and the workers (merge.threads, ≤ 0: one per core): the [merge] keys of
  // MergeConfig above, the same as a training run's. The default is the diloco preset's plan: the mean.
  MergeConfig merge;
};

nlohmann::json merge_checkpoints(const CheckpointMergeOptions& opts);

}  // namespace deloco
