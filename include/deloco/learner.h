// deloco/learner.h — the learner half of the algorithm core (README: Algorithm options), written once and driven by the
// simulator (virtual clock) and by the learner process (wall clock). deloco/sync.h is the syncer half.
//
// What a learner does between inner steps, and nothing else:
//  * counters c_steps[p], c_tokens[p] per fragment p, bumped after every inner step, reset when an answer for p is
//    applied (or a global state installed);
//  * which fragments are due after step t (t mod H == offset_p), and the push for each: the outer gradient
//    Δ_p = Θ_p^v − θ_p against the version v of Θ_p this learner holds (the last one it applied or downloaded),
//    quantized in the wire encoding with error feedback (the residual of one push is added to the next);
//  * the answer rule: an answer (merged Θ_p, version v) is applied at the first step boundary at or after
//    max(arrival, send + τ): θ_p ← (1 − α)·Θ_p + α·θ_p. Applying it clears the outstanding send of p;
//  * the wait rule: with wait_for_answer, the learner may not start its next step while a fragment it sent has no
//    answer and send + τ (or the end of training) is reached. The answer to a push is a version that includes it:
//    a syncer that marks its broadcasts (receive(): `covers`) says so, and a newer Θ_p that does not include the
//    push (another learner's merge that overtook it) is held back until one that does arrives, so the next push is
//    not based on a version its own merge already replaced (with delta_anchor = global that staleness feeds the
//    last outer update back into the next; with Nesterov momentum a learner stuck one version behind diverges,
//    docs/sim.md: Stability of the global anchor). The syncer node and the simulator set the marks alike
//    (src/sync/answer_marks.h). Unmarked answers (covers = −1: an older syncer, a caller that does not mark) answer
//    any push; without wait_for_answer every answer is applied when due, as before;
//  * the step-time estimate: the mean duration of the inner steps since the previous push (carried by the push).
//
// Contract
//  * No I/O, no clock, no threads: durations come in as arguments. The same calls in the same order give
//    bit-identical parameters and pushes, whichever driver makes them.
//  * The core binds the model's parameter tensors (handles sharing storage with the model, any device, float32)
//    and updates them in place when it applies or installs; the caller must not reorder or reallocate them.
//  * Answers and installed states are flat fp32 CPU tensors in the fragment's FlatLayout. Versions only go up: an
//    answer older than (or equal to) what the learner holds is ignored.
//  * Errors: a wrong-sized answer or state throws SyncError; nothing is changed then. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deloco/sync.h"
#include "deloco/wire.h"

namespace deloco {

// FlatLayout, flatten_into, unflatten and the model plan (ModelPlan, plan_model): deloco/sync.h.

// One fragment push, ready for the wire (the simulator decodes it exactly as the syncer node does).
struct Push {
  int64_t fragment = 0;
  int64_t base_version = 0;   // version of Θ_p the outer gradient is taken against (wire header `round`)
  int64_t c_steps = 0, c_tokens = 0;
  int64_t step = 0;           // the inner step after which it was sent
  double step_time = 0;       // mean seconds per inner step since the previous push
  Encoding encoding = Encoding::kFp32;
  int64_t elements = 0;
  std::string payload;        // Δ_p encoded in `encoding` (wire.h payload layout)
  bool final = false;         // a final state (final_pushes(): the wire's final_state, Syncer::receive_final)
};

// What the syncer makes of a fragment push: the payload (`bytes` bytes in `encoding`, the fragment's layout)
// validated and held in its wire encoding (Contribution::encoded: the syncer merges straight from it), plus the
// header's fields. The one reader of pushes, used by the syncer node and the simulator alike. Throws WireError for a
// payload that does not match the layout (NonFiniteError, a WireError, when it holds a non-finite value or block
// scale; the message names which). This form copies the payload; with `owner` (which keeps `payload` alive and
// unchanged) it holds the caller's bytes without a copy.
Contribution decode_push(int64_t learner, int64_t fragment, const FlatLayout& layout, Encoding encoding,
                         const void* payload, size_t bytes, int64_t base_version, int64_t c_steps, int64_t c_tokens,
                         double step_time, std::shared_ptr<const void> owner = nullptr);
// The same for a Push the caller holds (the simulator, embedding programs).
Contribution decode_push(int64_t learner, const Push& push, const FlatLayout& layout);

struct Applied {
  int64_t fragment = 0;
  int64_t version = 0;
};

// base + delta (flat fp32 CPU, equal sizes) as a new tensor, element by element in fp32: exactly what
// Syncer::set_delta_broadcast installs as the new version (deloco/sync.h). The one place a learner applies a delta.
at::Tensor add_delta(const at::Tensor& base, const at::Tensor& delta);

class LearnerCore {
 public:
  // params: the model's named parameters (bound, see above). plan: plan_model() over them (deloco/sync.h): the
  // core takes its fragments and layouts from it and throws SyncError when the parameters' names or shapes are not
  // the plan's. The learner starts holding version 0 of every fragment = the current parameters (every node
  // initialises identically). error_feedback: carry each push's compression residual e into the next (a lossy
  // push_codec only); error_feedback_decay β ∈ (0, 1] scales e first (e ← βe + Δ, SparseLoCo), else SyncError.
  LearnerCore(const SyncOptions& opts, const ModelPlan& plan, std::vector<std::pair<std::string, at::Tensor>> params,
              int64_t total_steps, Codec push_codec = Codec(), bool error_feedback = true,
              double error_feedback_decay = 1.0);

  const std::vector<Fragment>& fragments() const { return fragments_; }
  const FlatLayout& layout(int64_t fragment) const { return layouts_.at(static_cast<size_t>(fragment)); }
  const FlatLayout& model_layout() const { return model_layout_; }

  // After inner step `step` (the new step count) trained `tokens` tokens in `seconds`: bumps the counters and
  // returns the pushes due now (their fragments become outstanding).
  std::vector<Push> after_step(int64_t step, int64_t tokens, double seconds);
  // After the last step (total_steps; sync.apply = rebase): the fragments whose final push fell due while an earlier
  // push of theirs was unanswered, so it was not made; the steps since that push stay out of the final model. Empty
  // before the last step. (Pushing them once answered was tried: on the testbed's larger model at 1 Mbit/s each
  // such rest merged alone, at one learner's full weight, and the final loss was no better: docs/wan-long.md.)
  // (With sync.final_round: empty; the final round sends what the answers leave, in_flight() says what they did not.)
  std::vector<int64_t> held_back_at_end(int64_t step) const;
  // sync.final_round (deloco/sync.h), after the last step (total_steps; empty before it or when off): this learner's
  // final state of every fragment with no push in flight, one Push each in the fragment's push codec with its error
  // feedback (Δ_p = Θ_p^v − θ_p, the counters since its last push): Syncer::receive_final merges them. The drivers
  // wait for the answers in flight first (apply_due), so that each state holds what those pushes did. The last step
  // itself pushes nothing under this option. Nothing becomes outstanding.
  std::vector<Push> final_pushes(int64_t step);
  // The fragments whose push is unanswered (outstanding), ascending.
  std::vector<int64_t> in_flight() const;
  // The merged Θ_p of version `version` arrived (flat fp32 CPU, the fragment's layout). Kept until it is due;
  // a newer answer replaces an older one not yet applied. covers: −1 = unmarked (answers any outstanding push);
  // ≥ 0 = it includes this learner's pushes of the fragment based on versions below `covers` (the syncer's mark:
  // 1 + the base version of the latest of its pushes merged into it, 0 = none).
  void receive(int64_t fragment, int64_t version, at::Tensor flat, int64_t covers = -1);
  // A delta broadcast (Syncer::set_delta_broadcast): `delta` (flat fp32 CPU, the fragment's layout) is version
  // `version` of Θ_p minus version `version` − 1. When the newest version of the fragment this learner holds or has
  // pending is `version` − 1, receives (receive()) that version + delta, computed in fp32 exactly as the syncer
  // computed it; returns true. True, doing nothing, when it has `version` or newer already. False, changing nothing,
  // when it holds an older version (a delta was lost or superseded): it needs the whole fragment.
  bool receive_delta(int64_t fragment, int64_t version, const at::Tensor& delta, int64_t covers = -1);
  // The newest version of fragment p this learner holds or has pending.
  int64_t newest_version(int64_t fragment) const;
  // At the boundary before inner step `step` + 1: applies every received answer whose time has come.
  std::vector<Applied> apply_due(int64_t step);
  // With wait_for_answer: the fragments whose answer the learner must have before it trains on (empty: go on).
  std::vector<int64_t> waiting_for(int64_t step) const;
  bool must_wait(int64_t step) const { return !waiting_for(step).empty(); }
  // A whole global state (join or rejoin): flat fp32 CPU over model_layout() and the per-fragment versions.
  // Overwrites every parameter, holds these versions, resets counters, outstanding sends, answers not yet applied,
  // the error-feedback residuals and the step-time estimate.
  void install(const at::Tensor& flat_model, const std::vector<int64_t>& versions);
  // Part of a global state (one shard of a sharded syncer, deloco/runtime.h): flat fp32 CPU holding the listed
  // fragments' layouts one after another, in the list's order, and their versions. Those fragments as install()
  // does them (parameters, versions, counters, outstanding sends, unapplied answers, residuals); the others and
  // the step-time estimate are untouched. Throws SyncError (unknown fragment, sizes) and then changes nothing.
  void install_fragments(const std::vector<int64_t>& fragments, const at::Tensor& flat,
                         const std::vector<int64_t>& versions);
  // Forgets outstanding sends and answers not yet applied (the link to the syncer was lost; they will not come).
  void forget_in_flight();
  // The same for the listed fragments only (the link to one shard was lost).
  void forget_in_flight(const std::vector<int64_t>& fragments);
  // The syncer refused the outstanding push of `fragment` (a reject naming it): no answer will come for that push,
  // so the wait rule no longer waits for it. An answer already received is kept. Its counters were reset when it
  // was sent: the refused steps still live in θ, and the next push (Θ^v − θ) carries them. Under wait_for_answer
  // the error-feedback residual goes back to what it was before the refused push (which delivered nothing), so the
  // next push does not send what the codec left out of it a second time.
  void refused(int64_t fragment);
  // A refusal that would repeat (refusal_drops_drift, deloco/sync.h): besides refused(), drops the learner's local
  // drift of `fragment`: θ_p ← Θ_p^v (the version it holds), its counters and error-feedback residual reset. An
  // answer already received stays pending; the inner optimizer's state is the caller's and is kept. Throws
  // SyncError for an unknown fragment (nothing changed).
  void drop_drift(int64_t fragment);

  // Dynamic local updates (SyncOptions::dynamic_local_updates; the period the syncer computed, Syncer::
  // local_updates): from now on a fragment is due `h` steps after its previous push. Until a fragment's first push
  // (at the start and after install()) the usual schedule holds (t mod H == offset_p), so learners start aligned.
  // Throws SyncError unless τ < h ≤ H; without dynamic_local_updates it changes nothing.
  void set_sync_every(int64_t h);
  // net.encoding = auto (sync/codec_fit.h): fragment p's pushes from now on in `codec`. The error-feedback residual
  // carries across a change. Throws SyncError for an unknown fragment or a codec that is not a float encoding.
  void set_push_codec(int64_t fragment, const Codec& codec);
  const Codec& push_codec(int64_t fragment) const { return codecs_.at(static_cast<size_t>(fragment)); }
  // The sync period stretched for a link too slow for every codec (sync/codec_fit.h): a fragment is due h steps
  // after its previous push (until its first push the usual schedule holds). 0 or H: not stretched. Throws
  // SyncError unless h is 0 or in [H, kMaxLinkStretch·H]. While stretched, the last step (total_steps) pushes every
  // fragment with progress (a stretched period could leave up to 8H steps of it out of the final model).
  static constexpr int64_t kMaxLinkStretch = 8;
  void set_link_period(int64_t h);
  int64_t link_period() const { return link_period_; }
  int64_t sync_every() const { return sync_every_; }
  int64_t version(int64_t fragment) const { return held_version_.at(static_cast<size_t>(fragment)); }
  const std::vector<int64_t>& versions() const { return held_version_; }
  int64_t c_steps(int64_t fragment) const { return c_steps_.at(static_cast<size_t>(fragment)); }
  int64_t c_tokens(int64_t fragment) const { return c_tokens_.at(static_cast<size_t>(fragment)); }
  int64_t outstanding(int64_t fragment) const { return sent_at_.at(static_cast<size_t>(fragment)); }
  // The step-time estimate of the latest push (before the first push: the running mean so far).
  double step_time() const;

 private:
  bool answer_due(size_t p, int64_t step) const;
  bool answers_push(size_t p) const;
  // The push of fragment p after `step` (Θ_p^v − θ_p with error feedback); unless `final`, it becomes outstanding
  // (and, rebasing, θ as pushed is kept).
  Push make_push(size_t p, int64_t step, bool final);  // a pending answer that answers the outstanding push (or there is none)
  // `covers_push`: the version holds this learner's outstanding push (answers_push), for sync.apply = rebase.
  void apply(size_t p, int64_t version, const at::Tensor& flat, bool covers_push);

  SyncOptions opts_;
  std::vector<Fragment> fragments_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<std::vector<size_t>> index_;  // per fragment: parameter indices in layout order
  std::vector<FlatLayout> layouts_;
  FlatLayout model_layout_;
  int64_t total_steps_ = 0;
  Codec codec_;
  std::vector<Codec> codecs_;       // per fragment: its push codec (codec_ until set_push_codec)
  // sync.apply = rebase: per fragment, θ as it was pushed (flat fp32; undefined when nothing is outstanding) and the
  // counters then (the progress after the push is what the next push carries once an answer covers this one).
  std::vector<at::Tensor> theta_push_;
  std::vector<int64_t> c_steps_push_, c_tokens_push_;
  std::vector<bool> overdue_;       // rebase: a push fell due while the previous one was unanswered
  int64_t link_period_ = 0;         // set_link_period (0: not stretched)
  bool error_feedback_ = true;
  float error_feedback_decay_ = 1.0f;  // β of net.error_feedback_decay: the residual is βe before it joins a push

  std::vector<int64_t> c_steps_, c_tokens_, sent_at_, sent_base_, held_version_;
  int64_t sync_every_ = 0;          // H, or the learner's own period under dynamic local updates
  std::vector<int64_t> last_push_;  // per fragment: the step of its latest push since the start or install (−1: none)
  std::vector<at::Tensor> held_;                 // per fragment: flat Θ_p^v as applied/installed
  std::vector<std::vector<float>> residual_;     // error feedback per fragment
  std::vector<std::vector<float>> residual_before_;  // per fragment: the residual before its latest push (refused())
  struct Answer {
    int64_t version = 0;
    at::Tensor flat;
    int64_t covers = -1;
  };
  std::vector<std::optional<Answer>> pending_;
  double acc_time_ = 0;
  int64_t acc_steps_ = 0;
  double last_step_time_ = -1;
};

}  // namespace deloco
