// deloco/algorithm.h — the one algorithm configuration every driver shares: sync.* (deloco/sync.h), merge.*
// (deloco/merge.h) and outer.* (deloco/outer.h), with one bind, one validation and one table of presets.
//
// A preset names a merge plan and an outer optimizer with the rates its paper uses. The preset's outer kind, η and
// μ apply unless the config names them (outer.kind, outer.lr, outer.momentum); they are filled in by resolve(),
// which ConfigSchema::validate() runs through the outer.kind key, so the config a run records holds the values
// it used. The default preset is "diloco" (mean merge, Nesterov η 0.7, μ 0.9), matching the synchronous defaults
// of SyncOptions. The merge.* keys are MergeConfig's (deloco/merge.h), one binding shared with `deloco merge`;
// `deloco config presets` prints this table.
//
//   preset      merge plan                                   outer       η     μ    source
//   diloco      mean                                         nesterov    0.7   0.9  DiLoCo
//   decoupled   rda for matrices, mean for embeddings        nesterov    0.7   0.9  Decoupled DiLoCo
//   isoloco     iso_c for every 2-D tensor                   nesterov    1.8   0.8  IsoLoCo
//   iso_c_sgd   iso_c                                        sgd         2.1   0    IsoLoCo (Iso-C, plain SGD)
//   iso_cts     iso_cts                                      nesterov    3.1   0.8  IsoLoCo's rate for Iso-CTS
//   tsv         tsv                                          nesterov    0.6   0.8  IsoLoCo's rate for TSV
//   ties        ties                                         nesterov    0.7   0.8  IsoLoCo's rate for TIES
//   dare        dare                                         nesterov    1.5   0.8  IsoLoCo's rate for DARE
// (μ 0.8 for the last four is IsoLoCo's momentum; the paper's tables give their rates, not a separate μ.)
//
// Errors: validate() throws ConfigError naming the key. Not thread-safe.
#pragma once

#include <string>
#include <vector>

#include "deloco/merge.h"
#include "deloco/outer.h"
#include "deloco/sync.h"
#include "deloco/wire.h"
#include "deloco/workload.h"

namespace deloco {

class ConfigSchema;

struct AlgorithmPreset {
  std::string name;
  MergePlan plan;
  OuterOptions outer;
  std::string inner = "adamw";  // the learners' inner optimizer where train.optimizer = auto (muloco: muon)
};
// Throws ConfigError for an unknown name, listing the known ones.
const AlgorithmPreset& algorithm_preset(const std::string& name);
const std::vector<AlgorithmPreset>& algorithm_presets();
struct TrainConfig;
// train.optimizer = "auto" becomes the inner optimizer of merge.preset `preset` (muon for muloco, else adamw); an
// explicit adamw or muon stays. Every driver that builds learners from a run config and an algorithm config (the
// simulator, the learner node) calls it once. Throws ConfigError for an unknown preset.
void resolve_inner_optimizer(TrainConfig& train, const std::string& preset);

struct AlgorithmConfig {
  SyncOptions sync;
  MergeConfig merge;           // merge.*: merge.preset (also the outer optimizer's), merge.method, rules, options
  OuterOptions outer = unresolved_outer();  // kind "" and NaN rates until resolve()
  // The codecs are part of the algorithm (they change what is merged), so both drivers apply them.
  std::string encoding = "fp32";            // net.encoding: pushes (outer gradients): fp32 | bf16 | int8 | int4 | int2
                                            // | topk (top-k entries, src/wire/sparse.h) | auto (fitted to the link)
  std::string broadcast_encoding = "fp32";  // net.broadcast_encoding: merged fragments sent to learners (topk, auto:
                                            // as a delta against the version the learner holds)
  bool error_feedback = true;               // net.error_feedback: carry the push quantization residual
  double error_feedback_decay = 1.0;        // net.error_feedback_decay: β in (0, 1]; the residual is βe before it
                                            // joins the next push (e ← βe + Δ: SparseLoCo's accumulator; 1: classic)
  int64_t topk_bits = 2;                    // net.topk_bits: bits per kept value of a topk payload: 2 | 4 | 8
  std::string topk_values = "absmax";       // net.topk_values: the 2-bit values' code: absmax (kTopk2: −s, 0, +s per
                                            // 64) | bins (kTopk2b: SparseLoCo's four bins, each its values' mean)
  double topk_density = 0.03;               // net.topk_density: kept fraction of a topk push, in (0, 1]
  int64_t topk_chunk = 0;                   // net.topk_chunk: top-k per chunk of this many elements (0: per payload)
  double broadcast_topk_density = 0;        // net.broadcast_topk_density: of a topk broadcast (0: topk_density)
  int64_t broadcast_topk_bits = 0;          // net.broadcast_topk_bits: of a topk broadcast, 2 | 4 | 8 (0: topk_bits)
  bool broadcast_delta = false;             // net.broadcast_delta: broadcast a merge as the change against the
                                            // version the learner holds (Syncer::set_delta_broadcast); topk implies it
  std::string auto_coarsest = "int4";       // net.auto_coarsest: the coarsest codec auto may fit before the sync
                                            // period stretches: int4 | int2 | topk (sync/codec_fit.h)

  // Binds sync.*, merge.* (MergeConfig::Use::kTraining), outer.kind, outer.lr, outer.momentum, net.encoding,
  // net.broadcast_encoding, net.error_feedback, net.error_feedback_decay, net.topk_bits, net.topk_values, net.topk_density,
  // net.topk_chunk, net.broadcast_topk_density, net.broadcast_topk_bits, net.broadcast_delta, net.auto_coarsest.
  void bind(ConfigSchema& schema);
  // Fills the outer kind, η and μ the config did not name from the preset. Idempotent. Throws ConfigError for an
  // unknown preset.
  void resolve();
  // Throws ConfigError naming the first bad key (also an unresolved outer optimizer).
  void validate() const;
  MergePlan merge_plan() const { return merge.plan(); }
  Encoding push_encoding() const { return push_codec().encoding; }
  Encoding answer_encoding() const { return answer_codec().encoding; }
  // The codecs with their top-k options ("topk" resolves to kTopk2/4/8 by net.topk_bits, kTopk2b with
  // net.topk_values = bins). Throw ConfigError.
  Codec push_codec() const;
  Codec answer_codec() const;
  // The top-k codecs of pushes and broadcasts whatever net.encoding says (net.auto_coarsest = topk's last rungs).
  Codec push_topk_codec() const;
  Codec answer_topk_codec() const;
  // Whether merges go out as deltas (net.broadcast_delta, or net.broadcast_encoding = topk).
  bool delta_broadcast() const { return broadcast_delta || broadcast_encoding == "topk" || broadcast_encoding == "auto"; }
  // net.encoding = auto / net.broadcast_encoding = auto: the codecs fitted to each link (sync/codec_fit.h). Until
  // a link is measured its pushes and broadcasts use int4 (what push_codec and answer_codec give; sync/codec_fit.h).
  bool push_auto() const { return encoding == "auto"; }
  bool broadcast_auto() const { return broadcast_encoding == "auto"; }

  static OuterOptions unresolved_outer();
};

// What the syncer core checks learner m's counters against (Syncer::set_budget, deloco/sync.h): tokens per step =
// what the workload says one inner step of learner m of M consumes on one rank (Workload::step_tokens, 0: unknown,
// the check off) × `ranks` (learner.ranks: a group counts the tokens of all its ranks); total steps = the run's
// train.steps. The one source of these figures for the simulator and the syncer node alike.
LearnerBudget learner_budget(const Workload& workload, int64_t learner, int64_t learners, int64_t total_steps,
                             int64_t ranks = 1);

}  // namespace deloco
