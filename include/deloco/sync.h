// deloco/sync.h — the algorithm core of DiLoCo / Streaming DiLoCo / Decoupled DiLoCo (README: Algorithm options), written
// once and driven by the simulator (virtual clock) and by the runtime's syncer node (wall clock).
//
// Contract
//  * No I/O and no clock: every method that depends on time takes `now` (seconds, any monotone origin) as an
//    argument. Given the same calls in the same order, results are bit-identical.
//  * The model plan: plan_fragments() packs tensors into P fragments of near-equal bytes (largest tensor first into
//    the lightest fragment); fragment p is due on a learner after local step t when t mod H == offset_p.
//    plan_model() is the one plan of a model every part uses: the fragments, each fragment's flat layout and the
//    whole model's (the syncer, the learner core, the simulator and the nodes); plan_shard() cuts it per syncer shard.
//  * Quorum and grace: decide_round() is a pure function of (now, round state, options, grace window). A round
//    merges once it holds K contributions and either every connected learner has contributed, the grace window
//    (adaptive, §2.4) has passed since the quorum, or grace is off.
//  * Syncer: holds the global parameters Θ (its own copies), one round per fragment, the outer optimizer and the
//    merge selector. Contributions are checked on arrival (receive(): shape, finite, the counters, the norm bounds)
//    and rejected with a counted reason; accepted ones wait in their fragment's round (a newer one from the same
//    learner replaces an older).
//    Learners send outer gradients Δ̂ = Θ_p^v − θ_m against the version v they hold; the syncer keeps the earlier
//    versions still held by someone. merge() computes Δ_m = anchor − θ_m with θ_m = Θ_p^v − Δ̂ and the anchor the
//    current Θ_p (delta_anchor = global: Δ_m = Δ̂ + Θ_p − Θ_p^v) or the held Θ_p^v (base: Δ_m = Δ̂), token or
//    uniform weights (capped by sync.max_share), merges (random methods draw per outer step), applies the outer
//    step and returns the new Θ_p.
//  * The round: on_round() is the whole merge round of one fragment as every driver runs it — decide, merge (or
//    roll back), flatten the new Θ_p — and drain() the same for every fragment still holding contributions at the
//    end of a run. A driver keeps events, time, bytes, encoding and sending: it arms a timer for kWaitUntil,
//    encodes and sends the flat fragment, tells the refused contributors, reports the transfer times
//    (observe_sync) and writes its records.
//  * Rejections are a SyncReject code from receive() to the records (sync_reject_name: the text records show).
//  * Trust: a learner is authenticated but not trusted. What it sends can be refused but can neither crash the
//    syncer nor make Θ non-finite: (1) ‖Δ̂‖ is computed in double (no overflow for any float input) and bounded
//    relative to the fragment (sync.max_delta_ratio) and to the median of the fragment's recent accepted norms
//    (sync.max_delta_outlier), both on by default with margins honest runs never reach; (2) c_steps and c_tokens
//    are checked against what the syncer can verify (receive()); (3) sync.max_share optionally caps one
//    learner's share of a merge; (4) merge() is a transaction: a merge that fails or yields a non-finite Θ_p or
//    outer state is rolled back exactly and its contributions rejected; (5) restore() refuses non-finite state.
//  * Memory and the fused merge: Θ_p of an fp32 CPU fragment is one flat buffer its tensors view, never written once
//    it holds a version (copy on write: every merge and restore writes a new buffer; the old one becomes the kept
//    Θ_p^v, is reused as the next merge's buffer, or is freed), so a version kept for anchoring and the broadcast
//    (share_flat) cost no copy. Pushes may be held in their wire encoding (Contribution::encoded; receive() checks
//    them from the encoded blocks). A fragment whose tensors all merge by mean or rda (the diloco and decoupled
//    plans) in fp32 is merged in one cache-blocked, multi-threaded pass from the wire bytes to the new Θ_p
//    (src/sync/fused_merge.h; sync.fused_merge, sync.merge_threads) that writes the momentum in place: it runs only
//    when bounds from max |Θ_p|, max |b_p|, max |Θ_p^v| and each push's max |Δ̂| prove no value can overflow, so it
//    cannot fail once it writes; otherwise the general per-tensor path runs, with its check and exact rollback. Both
//    compute the same merge (to fp32 rounding: src/sync/fused_merge_test.cpp).
//  * Run accounting: run_uptime() and run_goodput() are the one definition of the uptime and goodput every driver
//    reports.
//  * Errors: bad options throw SyncError with a sentence naming the key. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deloco/error.h"
#include "deloco/merge.h"
#include "deloco/outer.h"
#include "deloco/wire.h"

namespace deloco {

class ConfigSchema;

struct SyncOptions {
  int64_t learners = 4;             // M
  int64_t quorum = 4;               // K: minimum contributions per merge (1 ≤ K ≤ M)
  int64_t fragments = 1;            // P
  int64_t sync_every = 50;          // H: inner steps between two sends of one fragment
  int64_t overlap = 0;              // τ: inner steps between sending a fragment and applying the answer (< H)
  bool wait_for_answer = true;      // a learner blocks at send+τ until the answer came (sync/streaming); false:
                                    // never waits, applies answers whenever they arrive (Decoupled DiLoCo)
  bool grace = false;               // adaptive grace window after the quorum
  double grace_gamma = 0.8;         // γ
  double grace_cap = 60.0;          // hard cap on the grace window (seconds; × the stretch of a rebasing
                                    // learner's period, grace_window())
  double ema = 0.9;                 // decay of the moving averages ξ_step, ξ_quorum, ξ_sync
  std::string weighting = "token";  // token | uniform
  std::string delta_anchor = "global";  // global (Θ_p now) | base (Θ_p the learner last received)
  double alpha = 0.0;               // learner apply: θ ← (1−α)·Θ + α·θ (0 = overwrite)
  // How a learner applies a new version Θ' of a fragment: overwrite (the papers': θ ← Θ', with α above; the steps
  // it trained since its push are lost) | rebase (θ ← Θ' + (θ − R): it keeps what Θ' does not hold. R is θ as it
  // pushed when Θ' answers that push, else the version it held; deloco/learner.h). With answers that arrive many steps
  // after the push (slow links, quorum 1: each learner's merge reaches the other late) overwrite discards most of a
  // learner's work; rebase keeps it for its next push. A fragment whose push is unanswered is not pushed again
  // until the answer came (its progress waits for the next due step); the last step (train.steps) pushes every
  // fragment with progress and none outstanding, so the final model holds it. Needs α = 0. Rebasing, an answer is
  // late only after H steps, and the grace window uses H for τ (grace_window()): the learners' pushes of a period
  // merge together on a slow link too. Measured (docs/apply-rule.md, docs/wan-apply.md): with the outer momentum
  // lowered to 0.6, rebase ends the demo better with answers ~27 steps late than overwrite does with answers on
  // time; at μ = 0.9 it ends ~0.1 nats worse than at 0.6. configs/demo.toml uses it.
  std::string apply = "overwrite";
  // The final round (deloco/learner.h: final_pushes; Syncer::receive_final, final_round): after its last step a
  // learner waits for the answers to its pushes in flight and then sends its final state of every fragment (a
  // push's form, Θ_p^v − θ_p); once every learner is done the syncer's final model is the weighted mean (weights as
  // sync.weighting) of those states, anchored as pushes are (sync.delta_anchor), in place of a last merge of
  // whatever the schedule sent. Off: the papers' rule (the final model is the last merge). On a slow link the
  // global model lags its learners (docs/wan-long.md): measured there and in the simulator.
  bool final_round = false;
  double max_delta_norm = 0.0;      // reject a contribution whose ‖Δ‖ over the fragment exceeds this (0 = off)
  // Contribution bounds that are on by default (0 = off), see receive(). The defaults sit far above anything an
  // honest learner sends (docs/runtime.md gives the measured figures).
  double max_delta_ratio = 10.0;    // reject ‖Δ‖ > ratio · max(‖Θ_p‖, √n_p · kDeltaRmsFloor)  (reason norm_ratio)
  double max_delta_outlier = 100.0; // reject ‖Δ‖/c_steps > outlier · median of the fragment's last delta_window
                                    // accepted norms per step, once it has delta_warmup of them (reason norm_outlier)
  int64_t delta_window = 64;        // accepted norms per fragment the median is taken over
  int64_t delta_warmup = 8;         // accepted norms needed before the outlier bound applies
  // Staleness-aware weights (asynchronous Local-SGD; FedAsync's staleness functions, Xie et al. 2019): a
  // contribution based on version v of a fragment now at version V is k = V − v merges stale and its weight is
  // multiplied by s(k) after normalisation, so the merged outer gradient is Σ_m w_m·s(k_m)·Δ_m (one stale
  // contribution alone moves Θ by s(k)·Δ, not Δ). none: s = 1; poly: s(k) = (1 + k)^−a; exp: s(k) = e^(−a·k).
  std::string staleness = "none";
  double staleness_exponent = 0.5;  // a (> 0)
  // Dynamic local updates (Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling"): learner m's
  // sync period becomes H_m = max(1, round(H · ξ_fastest / ξ_m)) from the step times the syncer measured
  // (Syncer::local_updates), so slower learners push after fewer steps and contributions arrive together.
  bool dynamic_local_updates = false;
  double max_share = 1.0;           // cap on one contribution's normalised weight in a merge, in (0, 1] (1 = off);
                                    // a merge of n contributions caps at max(max_share, 1/n), the excess goes
                                    // to the others in proportion to their weights
  bool learners_auto_ok = false;    // not a key: drivers that resolve learners = 0 ("one per core") set it
  // The fused merge (Syncer::merge): fragments whose tensors all merge by mean or rda in fp32 run in one
  // cache-blocked pass from the pushes' wire payloads to the new Θ_p; false: every fragment takes the general path.
  bool fused_merge = true;
  // Threads of the fused merge; 0 = the process's compute threads (at::get_num_threads(): `--threads`, or one per
  // core). Fragments under 256K elements per thread use fewer. The result does not depend on it.
  int64_t merge_threads = 0;

  // Throws SyncError naming the first inconsistent key.
  void validate() const;
  // Binds every key under "sync." (check lambdas run at ConfigSchema::validate()).
  void bind(ConfigSchema& schema);
};

// ---- Fragments ------------------------------------------------------------------------------------------
struct Fragment {
  int64_t id = 0;
  std::vector<std::string> names;  // in model order
  int64_t bytes = 0;
  int64_t offset = 0;              // due after local step t when t mod H == offset
};

// tensors: (name, bytes) in model order. Throws SyncError when P < 1, P > tensors or H < 1.
std::vector<Fragment> plan_fragments(const std::vector<std::pair<std::string, int64_t>>& tensors, int64_t P,
                                     int64_t H);
inline bool fragment_due(const Fragment& f, int64_t step, int64_t H) { return step > 0 && step % H == f.offset; }

// A sharded syncer (syncer.shards = S): which shard serves each fragment, balanced by bytes the way fragments are
// balanced over tensors — the largest fragment first to the lightest shard (ties: the lower fragment id, the lower
// shard). Result[p] is the shard of fragment p; every shard gets at least one fragment. Deterministic: every node
// computes the same assignment from the same plan. Throws SyncError when S < 1 or S > P.
std::vector<int64_t> assign_shards(const std::vector<Fragment>& fragments, int64_t S);
// The fragments shard s serves, in increasing id order (its local order: local index k ↔ global id result[k]).
std::vector<int64_t> shard_fragments(const std::vector<int64_t>& assignment, int64_t s);

// How a list of tensors maps onto one flat fp32 vector (in the list's order): the payload of pushes, answers and
// state downloads.
struct FlatLayout {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets;  // element offset of each tensor
  int64_t elements = 0;
};
FlatLayout make_flat_layout(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors);
// Copies tensors (any device, float32) into out[0..elements).
void flatten_into(const std::vector<at::Tensor>& tensors, float* out);
// Views of a flat CPU float tensor of `layout.elements` elements, shaped like the layout.
std::vector<at::Tensor> unflatten(const at::Tensor& flat, const FlatLayout& layout);

// The model plan: how every part cuts the model, identically given the same parameters and (P, H).
struct ModelPlan {
  std::vector<Fragment> fragments;          // plan_fragments over the tensors' byte sizes
  std::vector<FlatLayout> fragment_layouts; // per fragment, its tensors in the fragment's name order
  FlatLayout model;                         // the whole model in parameter order
};
// params: the model's named tensors in model order. Throws SyncError as plan_fragments does.
ModelPlan plan_model(const std::vector<std::pair<std::string, at::Tensor>>& params, int64_t P, int64_t H);

// What one shard of a sharded syncer (syncer.shards = S) serves, identically on the shard and on every learner:
// its fragments (assign_shards) in local order, and the layout of its part of the model — the fragments' layouts
// concatenated in local order — over which its welcome, state download and checkpoints run. Fragment ids on the wire
// are global (the model's); `local` maps them to the shard's order (−1: another shard's).
struct ShardPlan {
  int64_t shard = 0, shards = 1;
  std::vector<int64_t> owner;                  // per global fragment: the shard that serves it
  std::vector<int64_t> fragments;              // global ids, local order
  std::vector<int64_t> local;                  // per global fragment: local index, or −1
  std::vector<Fragment> local_fragments;       // the fragments with id = local index (what the shard's core holds)
  std::vector<FlatLayout> fragment_layouts;    // local order
  FlatLayout model;                            // the shard's part of the model: names of its fragments in order
                                               // (S = 1: plan.model, the whole model in model order)
};
// Throws SyncError (S > P, S < 1) or ConfigError (s outside [0, S)).
ShardPlan plan_shard(const ModelPlan& plan, int64_t S, int64_t s);

// ---- Weights, moving averages, grace window, quorum -------------------------------------------------------
// token: c_tokens · (c_tokens / c_steps) (0 when c_steps == 0); uniform: 1. Throws SyncError for other modes.
double contribution_weight(const std::string& mode, int64_t c_tokens, int64_t c_steps);
// s(k) of SyncOptions::staleness for a contribution k ≥ 0 merges stale (k < 0 counts as 0). Throws SyncError for an
// unknown mode.
double staleness_scale(const std::string& mode, double exponent, int64_t k);
// Dynamic local updates: max(1, round(H · fastest / step_time)); H when either time is not positive or finite.
int64_t dynamic_sync_every(int64_t H, double fastest, double step_time);
struct Ema {
  double value = 0;
  bool seeded = false;
  void add(double x, double decay) {
    value = seeded ? decay * value + (1 - decay) * x : x;
    seeded = true;
  }
};

struct GraceStats {
  Ema step, quorum, sync;  // ξ_step, ξ_quorum, ξ_sync
  // The longest sync period of a live learner in steps when a fitted codec stretched it past H (net.encoding = auto:
  // CodecFitter::longest_period; Syncer::set_link_period); 0: H.
  int64_t period = 0;
};

// ξ_grace = min(cap, max(0, γ · (W·ξ_step − (ξ_quorum + ξ_sync)))); 0 when grace is off. W = τ (sync.apply =
// overwrite: the answer must come within the overlap) or H (rebase: a learner keeps its work whenever the answer
// comes, and needs it before its next push of the fragment; so on a slow link the window stays open and the
// learners' pushes of one period merge together instead of one merge each), or the stretched period s.period when
// a link's codecs stretched it past H, and then the cap grows with it (cap · s.period / H).
double grace_window(const GraceStats& s, const SyncOptions& o);

// A round's decision (Syncer::on_round, RoundResult::decision); the rule that makes it is the core's own (src/sync/policy.h).
struct RoundDecision {
  enum Kind { kWait, kWaitUntil, kMerge } kind = kWait;
  double until = 0;  // for kWaitUntil: call again at this time
};

// ---- Learner side (the rest is deloco/learner.h) ---------------------------------------------------------
// θ ← (1−α)·Θ + α·θ in place (α = 0: copy).
void apply_global(at::Tensor& local, const at::Tensor& global, double alpha);

// ---- The syncer -----------------------------------------------------------------------------------------
// The RMS a fragment's scale is never taken below by the sync.max_delta_ratio bound (a fragment of zero-initialised
// biases, or an all-zero toy model, has ‖Θ_p‖ = 0).
constexpr double kDeltaRmsFloor = 1.0;

// Why the syncer core refused a contribution (Syncer::receive, in the order it checks) or dropped a round's
// contributions (Syncer::merge rolled it back). Drivers act on the code; sync_reject_name() is the text the records,
// Syncer::rejected() and the summaries' rejected_by_reason show.
enum class SyncReject : uint8_t {
  kNone = 0,           // accepted / merged
  kUnknownFragment,    // unknown_fragment
  kUnknownLearner,     // unknown_learner
  kWrongTensorCount,   // wrong_tensor_count
  kFutureBase,         // future_base
  kCounterOutOfRange,  // counter_out_of_range
  kWrongShape,         // wrong_shape
  kNonFinite,          // non_finite
  kNormBound,          // norm_bound
  kNormRatio,          // norm_ratio
  kNormOutlier,        // norm_outlier
  kMergeNonFinite,     // merge_non_finite (a rolled-back round)
  kMergeFailed,        // merge_failed (a rolled-back round)
};
constexpr SyncReject kLastSyncReject = SyncReject::kMergeFailed;
// "unknown_fragment", ... as listed above; "" for kNone.
const char* sync_reject_name(SyncReject r);

// Whether a rejection of Syncer::receive would repeat for the learner's next push of the fragment, so that the
// learner must drop its local drift of it (LearnerCore::drop_drift): the norm bounds (norm_bound, norm_ratio,
// norm_outlier). A refused push's progress stays in θ, so the next Δ = Θ^v − θ carries it again, larger: without the
// drop, that fragment would never merge again for that learner.
bool refusal_drops_drift(SyncReject reason);

// The slack of the step check, in units of sync_every (see Syncer::receive).
constexpr int64_t kStepSlackPeriods = 1;

// A push's payload held as it came off the wire (a float encoding of the fragment's flat layout, wire/quantize.h):
// the syncer merges straight from it, without decoding it into fp32 tensors first.
struct EncodedDelta {
  Encoding encoding = Encoding::kFp32;
  std::shared_ptr<const void> owner;  // keeps `data` alive (shared, never written)
  const char* data = nullptr;
  size_t bytes = 0;
  int64_t elements = 0;
  bool defined() const { return data != nullptr; }
};

struct Contribution {
  int64_t learner = 0;
  int64_t fragment = 0;
  std::vector<at::Tensor> deltas;   // Δ̂_{m,p} = Θ_p^v − θ_{m,p} as decoded from the wire, in the fragment's name order
  EncodedDelta encoded;             // or (deltas empty) Δ̂_{m,p} still in its wire encoding, the fragment's flat layout
  int64_t base_version = 0;         // v: the version of Θ_p the learner held when it computed Δ̂
  int64_t c_steps = 0, c_tokens = 0;
  double step_time = 0;             // the learner's step-time estimate (deloco/learner.h), feeds ξ_step
  int64_t step = -1;                // the learner's inner step as the driver last heard it when this arrived (the
                                    // node: the highest step of its heartbeats and hello; the simulator: the step
                                    // the push was made at); −1: unknown. Feeds the step check (receive()).
};

// What the syncer may check one learner's counters against, from the run's configuration (drivers: one
// learner_budget() in deloco/algorithm.h). 0 leaves that check off (embedding programs that set nothing).
struct LearnerBudget {
  int64_t tokens_per_step = 0;  // tokens one inner step of this learner consumes (its batch × context length)
  int64_t total_steps = 0;      // inner steps of the whole run: no learner ever reports a later step
};

struct MergeOutcome {
  int64_t fragment = 0;
  int64_t version = 0;                   // fragment version after this merge (1, 2, ...); unchanged when rolled back
  std::vector<int64_t> learners;         // whose contributions were merged (or dropped, when rolled back)
  std::vector<double> weights;           // normalised weights used, times each one's staleness scale (so their sum
                                         // is below 1 when sync.staleness discounted a stale contribution)
  std::vector<int64_t> staleness;        // per contribution: merges since its base version (V − v)
  double delta_norm = 0;                 // ‖merged Δ‖ over the fragment
  // kNone: merged. Else the round was rolled back — Θ, the outer state, the version and the kept history are
  // exactly as before the call — and its contributions dropped and counted under this reason: kMergeNonFinite (the
  // new Θ_p or outer state, or a merged outer gradient, held NaN/Inf) or kMergeFailed (the merge method threw;
  // `detail`).
  SyncReject rejected = SyncReject::kNone;
  std::string detail;
  bool ok() const { return rejected == SyncReject::kNone; }
};

// One merge round of a fragment (Syncer::on_round, Syncer::drain).
struct RoundResult {
  RoundDecision decision;  // kWait: nothing to do; kWaitUntil: call on_round again at decision.until; kMerge: merged,
                           // or rolled back (outcome.ok() says which)
  MergeOutcome outcome;    // kMerge only
  double grace = 0;        // the grace window when the round merged (ξ_grace, seconds)
  double grace_wait = 0;   // now − the time the round reached its quorum (0: it never marked one)
  at::Tensor flat;         // merged: the new Θ_p, flat fp32 CPU in the fragment's layout (what the learners receive);
                           // the caller's own copy, or with Syncer::share_flat(true) the syncer's Θ_p itself (never
                           // written again by the syncer; the caller must not write it either)
  // Merged with a delta broadcast on (Syncer::set_delta_broadcast): Θ_p^version − Θ_p^(version−1) in the broadcast
  // codec, what a learner holding version − 1 adds to it to hold `flat` exactly (null: no delta this round, send
  // `flat`). Shared, never written.
  std::shared_ptr<const std::string> delta;
  bool merged() const { return decision.kind == RoundDecision::kMerge && outcome.ok(); }
  bool rolled_back() const { return decision.kind == RoundDecision::kMerge && !outcome.ok(); }
};

// ---- Run accounting: the one definition every driver reports ----------------------------------------------------
// Uptime: the fraction of `elapsed` seconds in which global training advanced, 1 − stalled / elapsed (1 while no time
// has elapsed).
inline double run_uptime(double stalled, double elapsed) { return elapsed > 0 ? 1.0 - stalled / elapsed : 1.0; }
// Goodput: the learners' seconds in completed inner steps over M × elapsed (0 while no time has elapsed).
inline double run_goodput(double busy, int64_t learners, double elapsed) {
  return elapsed > 0 ? busy / (static_cast<double>(learners) * elapsed) : 0.0;
}

struct RoundState;  // src/sync/policy.h

class Syncer {
 public:
  // `global` is copied (cloned). Throws SyncError/MergeError/OuterError for bad options.
  Syncer(const SyncOptions& opts, std::vector<Fragment> fragments,
         const std::vector<std::pair<std::string, at::Tensor>>& global, const MergePlan& plan,
         const OuterOptions& outer);

  const std::vector<Fragment>& fragments() const { return fragments_; }
  const SyncOptions& options() const { return opts_; }

  // Connection state of a learner (affects "every connected learner has contributed").
  void set_connected(int64_t learner, bool connected);
  // `learner` finished its training and will not contribute again. A round that now holds the lowered quorum
  // starts its grace window at `now`.
  void retire(double now, int64_t learner);
  // sync.final_round: `learner` took its last inner step (finished = true), which pushes nothing, so it will send no
  // push again, only its final states, then its goodbye (retire()). Until then the rounds treat it as retired (no
  // round waits for its push, and the quorum is lowered; a round that now holds it starts its grace window at
  // `now`), but the versions it holds stay kept: its final states are rebuilt from them. finished = false undoes it
  // (a learner that resumed from an earlier step). Throws SyncError without sync.final_round (a last step pushes then).
  void set_finished(double now, int64_t learner, bool finished);
  bool finished(int64_t learner) const { return finished_.at(static_cast<size_t>(learner)); }
  // True while some fragment holds contributions but fewer than the effective quorum (global training stalls).
  bool stalled() const;
  double quorum_time(int64_t fragment) const { return rounds_.at(fragment).quorum_time; }
  // `learner` downloaded the current global state (it holds every fragment's current version).
  void note_joined(int64_t learner);

  // What learner m's counters are checked against (see receive()); before this call only their signs are.
  void set_budget(int64_t learner, const LearnerBudget& budget);

  // A contribution arrives. Returns kNone when accepted, else the rejection reason (also counted under its name),
  // checked in order:
  //  * unknown_fragment, unknown_learner, wrong_tensor_count, future_base (a base version this syncer never
  //    produced);
  //  * counter_out_of_range — the counters claim more than the syncer can verify (rejected, never clamped):
  //    c_steps < 0 or c_tokens < 0 (an unsigned wire value above 2^63); with a budget's tokens_per_step T > 0,
  //    c_tokens > c_steps · T; with a budget's total_steps > 0, c_steps > total_steps or
  //        c_steps > (s − s_since) + kStepSlackPeriods · H,   s = min(total_steps, max(highest step heard, c.step))
  //    c_steps counts the learner's steps since it last applied (or installed) a version of the fragment, and a
  //    learner applies a newer version only after its previous push. So s_since is s at m's previous accepted
  //    contribution to this fragment if that one had another base version; else (same base: its counter ran on)
  //    s at the accepted contribution before the first one with this base; 0 when none since the start or a
  //    restore(). Under sync.apply = rebase a learner's counter is cut only by the answer to its own push, so
  //    s_since is s at m's last contribution to this fragment that a merge took (an accepted push that was then
  //    dropped or rolled back cuts nothing). The slack covers a step heard a little after its push (less than H
  //    steps in both drivers).
  //    A liar gains at most the slack per run of pushes on one base; its reported steps cannot pass total_steps;
  //  * wrong_shape; non_finite (‖Δ̂‖, accumulated in double, is NaN or Inf);
  //  * norm_bound: ‖Δ̂‖ > max_delta_norm (when > 0);
  //  * norm_ratio: ‖Δ̂‖ > max_delta_ratio · max(‖Θ_p‖, √n_p · kDeltaRmsFloor) (when > 0; n_p elements);
  //  * norm_outlier: ‖Δ̂‖ / max(1, c_steps) > max_delta_outlier · the median of the last delta_window accepted
  //    ‖Δ̂‖ / max(1, c_steps) of this fragment, once delta_warmup of them were seen and that median is > 0 (when > 0).
  //    Per step, so a push after a long partition (every step since the learner's last accepted push) is judged
  //    by its rate of drift, not by how long the learner was cut off.
  SyncReject receive(double now, Contribution c);
  // The decision for fragment p at time `now`.
  RoundDecision decide(double now, int64_t fragment) const;
  // Merges whatever fragment p holds (≥ 1 contribution), applies the outer step and checks that the new Θ_p and
  // outer state are finite; on failure rolls everything back (MergeOutcome::rejected). Never throws for what the
  // contributions hold; throws SyncError when the round is empty. Under the delta broadcast (set_delta_broadcast)
  // a merge must go through on_round() or drain(), which also compress the new version (Θ_p kept equal to what the
  // learners hold, e_p updated); merge() alone leaves both as they are (a tool for tests, not for a driver).
  MergeOutcome merge(int64_t fragment);
  // The merge round of fragment p at time `now`: decide(); on kMerge, merge() and, when it merged, the new Θ_p
  // flattened (RoundResult::flat). Call it after every arrival for p, at a kWaitUntil's time, and when the learners'
  // connections change.
  RoundResult on_round(double now, int64_t fragment);
  // The end of a run (nobody will send again): merges every fragment still holding contributions, whatever the
  // quorum, in fragment order; one result (decision kMerge) per fragment merged or rolled back.
  std::vector<RoundResult> drain(double now);
  // Feeds ξ_sync: the time one synchronisation of a fragment costs besides the quorum wait — the upload of a
  // contribution, the merge and the broadcast — as measured or modelled by the driver.
  void observe_sync(double upload_seconds, double merge_seconds, double broadcast_seconds) {
    stats_.sync.add(upload_seconds + merge_seconds + broadcast_seconds, opts_.ema);
  }

  // The final round (SyncOptions::final_round). receive_final(): learner m's final state of fragment p after its last
  // step, Δ_m = Θ_p^v − θ_m in a push's form, checked as receive() checks a push (the same reasons, counted under
  // their names) and held until final_round(); a later one from the same learner replaces it. It is not merged by
  // on_round() or drain(). final_round(), once nobody will send again: for each fragment holding final states, in
  // fragment order, Θ_p ← Σ_m ŵ_m θ_m, the learners' final states' weighted mean (ŵ_m = w_m / Σ w; sync.weighting
  // token: w_m = the tokens one step of m trains, from its budget, 1 without one; uniform: 1), each state θ_m =
  // A_m − Δ_m from the anchor a push of m has (delta_anchor global: Θ_p^{v_m} as kept, exactly the learner's state;
  // a version no longer kept, or delta_anchor base: Θ_p + e_p, rebased onto the current model, counted in
  // stale_bases()). The delta broadcast's residual e_p is then zero (nothing is broadcast after it). One result per
  // fragment with final states (decision kMerge, the version + 1, the learners and ŵ, the flat new Θ_p); a mean
  // that is not finite changes nothing and comes back rolled back (merge_non_finite, its learners named). The
  // outer optimizer's state is untouched: this is the model the run ends with, not an outer step.
  SyncReject receive_final(Contribution c);
  std::vector<RoundResult> final_round();
  // Final states held (every fragment), the learners whose final state of fragment p is held (ascending), and
  // final states merged so far.
  int64_t finals_held() const;
  std::vector<int64_t> final_learners(int64_t fragment) const {
    std::vector<int64_t> out;
    for (const auto& kv : rounds_.at(static_cast<size_t>(fragment)).finals) out.push_back(kv.first);
    return out;
  }
  int64_t finals_merged() const { return finals_merged_; }

  // The compressed broadcast (net.broadcast_encoding = topk, or net.broadcast_delta): after every merge the new
  // Θ_p' is not kept as merged. With Θ_p the version the learners hold and e_p the fragment's broadcast residual
  // (zero at the start), the syncer encodes D = Θ_p' + e_p − Θ_p in `codec`, installs Θ_p + decode(D) as the new
  // version (fp32, exactly what a learner computes from the delta) and keeps e_p ← Θ_p' + e_p − that. So Θ is always
  // what the learners hold (state downloads, donors and anchors stay exact), and what compression left out is sent
  // later (error feedback on the broadcast): the sum of the versions' changes plus e_p is the sum of the merged outer
  // steps. With delta_anchor = global every contribution is anchored at Θ_p + e_p (Δ_m = Θ_p + e_p − θ_m, the
  // fused pass adds (Σ c_i)·e_p, the general path adds e_p to each Δ̂): the learners train from the lagging Θ_p, and
  // anchored there their progress would propose what e_p holds a second time (measured: Nesterov diverged at 3%
  // top-k). So under outer SGD at η the next T is Θ_p − η·mean(Δ̂) + (1 − η)·e_p: at η = 1 the merged model is the
  // learners' mean and e_p is not sent later but dropped (docs/wire.md). RoundResult::delta carries the encoded D. An encoding failure (Θ_p' + e_p − Θ_p overflowing) installs
  // Θ_p' + e_p as merged and sends no delta (e_p ← 0). Needs every fragment held flat in fp32 on the CPU; throws
  // SyncError otherwise or for a codec that is not a float encoding. restore() and resync() set e_p to zero, or to
  // the image's. Call before the first merge.
  void set_delta_broadcast(const Codec& codec);
  bool delta_broadcast() const { return delta_on_; }
  // net.broadcast_encoding = auto (sync/codec_fit.h): the codecs the delta broadcast may switch between (each checked
  // as set_delta_broadcast checks its codec; the codec in use stays when listed, else the first is used).
  // use_delta_encoding(e): the
  // next merges' deltas are encoded in the listed codec of encoding e (a merge's delta is self-describing, so the
  // learners and the versions do not change). Both throw SyncError (the delta broadcast off, an encoding not listed).
  void set_delta_codecs(const std::vector<Codec>& codecs);
  void use_delta_encoding(Encoding e);
  Encoding delta_encoding() const { return delta_codec_.encoding; }
  // e_p of each fragment (flat fp32; empty tensors when off).
  const std::vector<at::Tensor>& broadcast_residual() const { return residual_; }

  // RoundResult::flat shares the syncer's new Θ_p instead of copying it (the syncer never writes a Θ_p buffer it
  // has handed out: every merge and restore writes a new one). For drivers that only read it (the syncer node).
  void share_flat(bool share) { share_flat_ = share; }
  // Merges of fragments that took the fused path (deloco/sync.h: SyncOptions::fused_merge) and the general one.
  int64_t fused_merges() const { return fused_merges_; }
  int64_t general_merges() const { return general_merges_; }

  // Dynamic local updates (SyncOptions::dynamic_local_updates): learner m's sync period H_m =
  // max(τ + 1, dynamic_sync_every(H, fastest, ξ_m)) from the moving averages of the step times its accepted pushes
  // carried (ξ_m) and the fastest such average of a learner not retired; H while m has pushed nothing, or when off.
  // Drivers hand it to learner m (LearnerCore::set_sync_every) after every merge.
  int64_t local_updates(int64_t learner) const;
  int64_t pending(int64_t fragment) const { return static_cast<int64_t>(rounds_.at(fragment).waiting.size()); }
  // The learners whose accepted contributions wait in fragment p's round, ascending (a newer push of one of them
  // replaces its waiting one: receive()).
  std::vector<int64_t> waiting_learners(int64_t fragment) const {
    std::vector<int64_t> out;
    for (const auto& kv : rounds_.at(fragment).waiting) out.push_back(kv.first);
    return out;
  }
  // Whether learner m's accepted contribution waits in fragment p's round.
  bool holds(int64_t fragment, int64_t learner) const { return rounds_.at(fragment).waiting.count(learner) > 0; }
  double grace() const { return grace_window(stats_, opts_); }
  // The longest live learner's sync period in steps when a fitted codec stretched it past H (0 or ≤ H: H): the span of
  // a rebasing learner's grace window (grace_window). Drivers with net.encoding = auto set it after each fit.
  void set_link_period(int64_t steps) { stats_.period = steps; }
  const GraceStats& stats() const { return stats_; }
  int64_t version(int64_t fragment) const { return rounds_.at(fragment).version; }
  // Current global tensors of a fragment (views into the syncer's state; clone before mutating).
  std::vector<at::Tensor> fragment_tensors(int64_t fragment) const;
  const std::vector<std::pair<std::string, at::Tensor>>& global() const { return global_; }
  const std::map<std::string, int64_t>& rejected() const { return rejected_; }
  int64_t merged_contributions() const { return merged_; }
  // Contributions whose base version was no longer kept (e.g. after a restore): anchored at the current Θ_p.
  int64_t stale_bases() const { return stale_bases_; }
  int64_t rejected_contributions() const;

  // Checkpoints. outer_state() is the outer optimizer's state (deloco/outer.h names); versions() the per-fragment
  // versions. restore() replaces Θ (every name, same shapes), the outer state, the versions and the merged counter
  // and drops waiting contributions and the counter and norm statistics; it throws SyncError naming the first
  // mismatch or the first tensor holding NaN/Inf (a poisoned state is never resumed) and then changes nothing.
  std::map<std::string, at::Tensor> outer_state() const { return outer_->state(); }
  std::vector<int64_t> versions() const;
  void restore(const std::map<std::string, at::Tensor>& global, const std::map<std::string, at::Tensor>& outer_state,
               const std::vector<int64_t>& versions, int64_t merged);

  // Replication (a standby syncer, src/roles/replication.h): image() is everything a second Syncer built with the same
  // options, fragments and initial tensors needs to continue bit-identically — restore()'s state (Θ, the outer state,
  // versions, merged) plus what restore() keeps (connections, retirements, the step-time and grace moving averages,
  // the path counters). resync(image) is restore() and then those; it drops waiting contributions, the kept history
  // and the counter and norm statistics, exactly as restore() does. Two syncers that resync from one image and then
  // see the same calls in the same order give bit-identical results; the leader resyncs itself with the image it
  // sends, so leader and standby both start from that point. Throws as restore() does, changing nothing.
  struct Image {
    std::map<std::string, at::Tensor> global, outer;
    std::vector<int64_t> versions;
    int64_t merged = 0;
    std::vector<bool> connected, retired;
    std::vector<bool> finished;     // per learner (set_finished); empty: none
    std::vector<Ema> learner_step;  // per learner
    GraceStats stats;
    int64_t fused_merges = 0, general_merges = 0, stale_bases = 0;
    std::map<std::string, int64_t> rejected;
    std::vector<at::Tensor> broadcast_residual;  // per fragment e_p (empty: zero, or the delta broadcast is off)
  };
  Image image() const;
  void resync(const Image& image);
  // The learners whose contributions wait in fragment p's round (ascending): what a resync drops.
  std::vector<int64_t> waiting(int64_t fragment) const;
  // Drops every waiting contribution (each round starts afresh at its version); nothing else changes. A driver
  // whose learners will count those pushes as refused (a standby syncer taking over: they join it afresh and fold
  // the progress into their next push) calls it, so no progress is merged twice. Final states (receive_final) stay
  // held: each is its learner's whole state, not progress pushed again, and a learner past its last step has none
  // to fold into a later push, so dropping them would lose its last steps from the final round.
  void drop_waiting();

 private:
  // A waiting contribution with what receive() measured of it: per tensor ‖Δ̂‖² and max |Δ̂|.
  struct Held {
    Contribution c;
    std::vector<double> sumsq;
    double amax = 0;
    int64_t credited = 0;  // s, the step credited to its learner when it was accepted
  };
  struct Round {
    std::map<int64_t, Held> waiting;  // by learner
    std::map<int64_t, Held> finals;   // final states (receive_final), by learner
    double first_arrival = 0;
    double quorum_time = -1;
    int64_t version = 0;
  };
  RoundState round_state(int64_t fragment) const;
  // Records the time fragment p's round first holds the effective quorum (it opens the grace window, feeds ξ_quorum).
  void mark_quorum(double now, int64_t fragment);
  SyncReject check(const Contribution& c, double* norm, Held* measured) const;
  // The fused merge of fragment p when it applies (returns false, having changed nothing, when it does not).
  bool merge_fused(int64_t fragment, const std::vector<double>& w, MergeOutcome* out, int64_t* stale);
  // The general per-tensor path (every merge method); a transaction as merge() describes.
  void merge_general(int64_t fragment, const std::vector<double>& w, MergeOutcome* out, int64_t* stale);
  // Points fragment p's tensors at a new flat buffer (its Θ_p).
  void install(int64_t fragment, const at::Tensor& flat);
  SyncReject check_counters(const Contribution& c) const;
  // on_round's kMerge: merge() plus the result's grace figures and flat fragment.
  void merge_round(double now, int64_t fragment, RoundResult* result);
  at::Tensor& global_tensor(const std::string& name);
  // ‖Θ_p‖ (double), kept in theta_norm_ and refreshed whenever Θ_p changes.
  double fragment_norm(int64_t fragment) const;

  SyncOptions opts_;
  std::vector<Fragment> fragments_;
  std::vector<std::pair<std::string, at::Tensor>> global_;
  std::map<std::string, size_t> index_;
  std::vector<Round> rounds_;
  std::vector<bool> connected_;
  std::vector<bool> retired_;
  std::vector<bool> finished_;  // set_finished: past the last step, not yet retired
  std::vector<Ema> learner_step_;  // per learner: moving average of the step times its accepted pushes carried
  // Earlier versions of each fragment that a learner may still hold: version → Θ_p^v. A version is dropped once no
  // learner that may still contribute can hold it (floor_: the lowest version each learner may reference).
  struct Version {
    std::vector<at::Tensor> tensors;
    double amax = -1;  // max |Θ_p^v| (< 0: not known)
    at::Tensor flat;   // the flat buffer the tensors view (undefined: a fragment held per tensor)
  };
  // A version no longer kept: its flat buffer becomes the fragment's spare if nobody else holds it.
  void recycle(int64_t fragment, Version v);
  // A buffer for a new Θ_p: the spare, or a fresh one.
  at::Tensor new_flat(int64_t fragment);
  std::vector<at::Tensor> spare_;  // per fragment (undefined: none)
  std::vector<std::map<int64_t, Version>> history_;
  // Per fragment: Θ_p as one flat fp32 CPU buffer that its tensors view (undefined: a fragment with another dtype or
  // device, held per tensor), whether its merge methods allow the fused path, and max |Θ_p|, max |b_p| (< 0: unknown).
  std::vector<at::Tensor> flat_;
  std::vector<bool> in_flat_;  // per global_ entry: a view of its fragment's flat buffer
  std::vector<bool> fusable_;
  std::vector<double> theta_amax_, buf_amax_;
  bool share_flat_ = false;
  int64_t fused_merges_ = 0, general_merges_ = 0;
  std::vector<std::vector<int64_t>> floor_;  // [learner][fragment]
  // Drops the versions no learner, waiting push or held final state can be anchored at; past 2M + 8 kept versions
  // (learners that went silent pin theirs), the oldest go too, but never one a waiting push or held final state is
  // anchored at (at most 2M more).
  void prune_history(int64_t fragment);
  int64_t stale_bases_ = 0;
  MergeSelector selector_;
  std::unique_ptr<OuterOptimizer> outer_;
  GraceStats stats_;
  std::map<std::string, int64_t> rejected_;
  int64_t merged_ = 0;
  int64_t finals_merged_ = 0;
  // The delta broadcast (set_delta_broadcast): its codec and each fragment's residual e_p.
  bool delta_on_ = false;
  Codec delta_codec_;
  std::vector<Codec> delta_codecs_;  // set_delta_codecs (empty: delta_codec_ only)
  std::vector<at::Tensor> residual_;
  std::vector<double> residual_amax_;  // per fragment: max |e_p| (< 0: unknown), kept by compress_version
  std::vector<std::vector<float>> delta_scratch_;  // per fragment: D, then its decoding (kept: no page faults)
  // Replaces the new Θ_p (flat_[p], just merged) by prev + decode(encode(Θ_p' + e_p − prev)); returns the payload.
  std::shared_ptr<const std::string> compress_version(int64_t fragment, const at::Tensor& prev);
  // Contribution bounds: per fragment ‖Θ_p‖, its element count and the last delta_window accepted ‖Δ̂‖ (a ring).
  std::vector<double> theta_norm_;
  std::vector<int64_t> elements_;
  std::vector<std::vector<double>> recent_norms_;
  std::vector<size_t> recent_next_;
  // Counter checks: per learner its budget and highest step heard; per [learner][fragment] its last accepted
  // contribution: s then, its base version (−1: none) and s at the accepted contribution before its run of
  // contributions with this base (the anchor of a counter that ran on).
  struct LastAccepted {
    int64_t step = 0, base = -1, anchor = 0;
    int64_t merged = 0;  // s at m's last contribution to this fragment that a merge took (sync.apply = rebase)
  };
  std::vector<LearnerBudget> budgets_;
  std::vector<int64_t> seen_step_;
  std::vector<std::vector<LastAccepted>> last_;
};

}  // namespace deloco
