// sync/codec_fit.h — net.encoding = auto and net.broadcast_encoding = auto: the codecs a learner's link uses,
// chosen from what was measured on that link (docs/runtime.md, "Codecs fitted to the link").
//
// The rule (fit_codecs), per learner m, over two ladders of codecs ordered finest first (push: fp32, bf16, int8,
// int4; broadcast: the same, each a delta against the version the learners hold). Nothing coarser than int4 by
// default: a longer sync period costs far less than int2 or top-k (measured with `deloco sim`, docs/runtime.md), so
// past int4 the period stretches instead (net.auto_coarsest = int2 or topk extends both ladders down to them):
//   T = H·ξ_m                          the learner's sync period in seconds (ξ_m: its seconds per inner step)
//   up(i)   = A_push(i) / r_up         the seconds to push every fragment once in push codec i
//   down(j) = b·A_bcast(j) / r_down    the seconds of the broadcasts over one period (b: merges of each fragment
//                                      per period of this learner, measured, at least 1)
//   sync(i, j) = l_up + O_push(i)/r_up + l_down + O_bcast(j)/r_down   one synchronisation of the largest fragment
// (r: a direction's rate, l: its latency, both measured: LinkEstimate).
// A pair (i, j) fits when up(i) ≤ u·T and down(j) ≤ u·T (u: the utilisation bound, 0.8; 0.5 where learners never wait): the link carries what
// the schedule sends. Where learners wait for their answers (sync.wait_for_answer), also sync(i, j) ≤ max(τ, 1)·ξ_m:
// the push and its answer travel while the learner trains τ steps on, else it stalls. A learner that never waits
// applies a late answer on arrival: lateness costs it staleness, not time, and a coarser codec to arrive within τ
// cost more (measured on the testbed: top-k pushes to meet τ = 5 steps of 30 ms at 10 Mbit/s, 2.53 nats at the end
// against 2.30 with int8 pushes a few steps late; docs/runtime.md). A pair finer than the current one in either
// direction must fit with the loads scaled by 1 + h (h: hysteresis, 0.25), so a choice does not flap on noise.
// Among the pairs that fit: the smallest max(i, j), then the smallest i + j, then the smallest j (the finest pair,
// coarsening the two directions evenly). When none fits: the coarsest pair, and the sync period stretched to
// H' = ⌈H·max(up, down)/(u·T)⌉ (at most max_stretch·H): the loads of the coarsest codecs at H' fit the link.
// A direction not measured yet counts as fast as the other; until either is measured the current choice stays.
// Before the first fit a link uses int4 both ways, the coarsest (kAutoStart; AlgorithmConfig::push_codec /
// answer_codec for auto): frames large enough to measure the link by (LinkEstimate::kMinRateBytes, at the demo's
// size), small enough not to flood a slow one for long. The first fit moves from there like any other (a finer
// pair needs the hysteresis' room), and the fitter moves at most one rung finer per fit in each direction
// (FitOptions::finer_rungs), coarser at once.
//
// CodecFitter keeps the measurements (moving averages of each link's transfer rates and of the merge interval) and
// each learner's choice. The syncer node and the simulator feed it the same events: a push's bytes and its time on
// the wire, a broadcast's bytes and its time, a merge; and ask it after each push. The broadcast codec is one per
// syncer (the delta broadcast keeps one version of Θ that every learner holds): the coarsest of the live learners'
// choices, so the slowest link decides it.
//
// Pure: no clocks and no I/O; times are passed in. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deloco/sync.h"
#include "deloco/wire.h"

namespace deloco {

struct AlgorithmConfig;

// The codec auto starts from, both ways, until a link is measured.
constexpr Encoding kAutoStart = Encoding::kInt4;

// Throws SyncError "<what> needs a float encoding, not <name>" for kRaw or an unknown encoding, and the top-k
// options' own error (validate_topk) for a sparse codec. What the learner (push codecs) and the syncer (delta
// codecs) check a codec with.
void check_float_codec(const Codec& codec, const std::string& what);

// The expected payload bytes of n elements in `codec`: exact for the dense encodings; for top-k, k = round(d·n)
// values in the block encoding, their block scales and one LEB128 index gap each of the size the mean gap 1/d takes.
double expected_encoded_bytes(const Codec& codec, uint64_t n);

struct CodecLadder {
  std::vector<Codec> codecs;  // finest first
  std::vector<double> one;    // per codec: frame bytes (header included) of the largest fragment
  std::vector<double> all;    // per codec: frame bytes of every fragment once
  size_t size() const { return codecs.size(); }
};
// The index of kAutoStart in a ladder (its last codec when absent: a fixed encoding).
int start_index(const CodecLadder& ladder);
// The ladder of `codecs` over fragments of these element counts. Throws SyncError when empty.
CodecLadder codec_ladder(const std::vector<Codec>& codecs, const std::vector<int64_t>& fragment_elements);
// What auto chooses from: fp32, bf16, int8, int4. A direction whose encoding is not auto has the one codec the
// config names.
std::vector<Codec> push_codecs(const AlgorithmConfig& cfg);
std::vector<Codec> broadcast_codecs(const AlgorithmConfig& cfg);

// One direction of a link: a transfer of x bytes takes l + x/r seconds. Fitted robustly to the last kWindow
// samples (x, seconds) — a sample can be far off (a syncer busy merging reads a heartbeat and the push behind it
// together, and the push seems instant): the Theil–Sen fit, the median of the slopes between samples whose sizes
// differ by over 5 %, and l the median of seconds − x·slope, when at least 3 such pairs exist and both come out
// positive; the latency so found is kept for the times the sizes do not vary. Then r = the median over the samples
// of x/(seconds − l), counting only samples whose transfer part is at least a quarter of their time (frames that
// are mostly latency say little of the rate), or all of them while there is no rate yet; no rate before
// kMinSamples samples.
// Frames under kMinRateBytes count only while the link has no larger one: a shaped link lets a burst through at
// line rate (tc tbf's bucket: 32 KiB on the testbed), so a small frame can look 100× faster than the link is.
struct LinkEstimate {
  static constexpr size_t kWindow = 16;
  static constexpr double kMinRateBytes = 64 * 1024;
  static constexpr size_t kMinSamples = 3;  // no rate from fewer (one far-off sample would be the estimate)
  static constexpr double kLatencySpread = 2;  // the latency is fitted only when the largest sample is ≥ 2× the smallest
  bool sized = false;  // a sample of at least kMinRateBytes was seen (smaller ones are then ignored)
  std::vector<std::pair<double, double>> samples;  // the last kWindow (bytes, seconds), oldest first
  double latency = 0;
  bool latency_known = false;
  double rate = 0;  // bytes/s (0: no sample)
  void add(double bytes, double seconds);
};

struct LinkLoad {
  double up_rate = 0;                 // bytes/s learner → syncer (0: not measured)
  double down_rate = 0;               // bytes/s syncer → learner (0: not measured)
  double up_latency = 0, down_latency = 0;  // seconds
  double step_seconds = 0;            // ξ_m (0: not known)
  double broadcasts_per_period = 1;   // b
};

// u for learners that never wait (make_codec_fitter): their answers come whenever the links deliver them, and a
// link loaded at 80 % queues them. Measured on the testbed at 10 Mbit/s (docs/wan-apply.md): at u = 0.8 the
// estimates, noisy around the link's rate, put one learner on bf16 pushes that filled its uplink; its answers came a
// median 56 steps after its pushes (H = 40), its pushes of a period no longer merged together, and the demo ended
// 0.1 nats worse than in the repeats on int8.
constexpr double kNoWaitUtilisation = 0.5;

struct FitOptions {
  int64_t sync_every = 1;   // H
  int64_t overlap = 0;      // τ
  double utilisation = 0.8; // u (kNoWaitUtilisation where learners never wait)
  double hysteresis = 0.25;
  bool overlap_binds = true;  // sync(i, j) ≤ max(τ, 1)·ξ is a condition (sync.wait_for_answer), else only reported
  int64_t max_stretch = 8;
  // At most this many rungs finer than the codecs in use per fit (0: any). A link's first measurements can be
  // off (a shaped link passes its first bytes at line rate): on the testbed at 10 Mbit/s the first fit jumped from
  // int4 to fp32 and its broadcasts queued for seconds. Coarser moves are never limited.
  int finer_rungs = 0;
};

struct CodecChoice {
  int push = 0, broadcast = 0;  // ladder indices
  int64_t period = 0;           // the sync period: H, or H' > H when no pair fits (0: not chosen yet)
  bool fits = false;            // the pair met all three conditions
  // The figures the choice was made from (seconds): up, down, sync of the chosen pair, and u·T, τ·ξ.
  double up = 0, down = 0, sync = 0, budget = 0, overlap_budget = 0;
};

// The rule above. Returns `current` unchanged when the link's rates or the step time are not known.
CodecChoice fit_codecs(const CodecLadder& push, const CodecLadder& broadcast, const LinkLoad& load,
                       const FitOptions& o, const CodecChoice& current);

class CodecFitter {
 public:
  // `learners` links; the ladders of push_codecs / broadcast_codecs over this syncer's fragments. `ema`: the decay of
  // the moving averages (sync.ema).
  CodecFitter(CodecLadder push, CodecLadder broadcast, FitOptions o, int64_t learners, double ema);

  // A push of `bytes` (frame) from learner m that took `seconds` on the wire; a broadcast to m of `bytes` that took
  // `seconds` from the link's being free to its arrival; a merge of fragment p at time t.
  void observe_upload(int64_t m, double bytes, double seconds);
  void observe_download(int64_t m, double bytes, double seconds);
  void observe_merge(int64_t fragment, double t);

  // Refits learner m, whose latest step time was `step_seconds` (the rule takes a moving average of them: one slow
  // stretch of steps does not move a codec). Returns the new choice when its push codec, broadcast codec or period
  // changed.
  std::optional<CodecChoice> refit(int64_t m, double step_seconds);
  const CodecChoice& choice(int64_t m) const { return choice_.at(static_cast<size_t>(m)); }
  // The broadcast ladder index for the next merge: the coarsest choice among the learners `live` marks (the ladder's
  // kAutoStart codec while none of them has been fitted).
  int broadcast(const std::vector<bool>& live) const;
  // The longest fitted sync period among the learners `live` marks (0 while none has been fitted): the span of the
  // grace window for rebasing learners (Syncer::set_link_period).
  int64_t longest_period(const std::vector<bool>& live) const;
  const CodecLadder& push_ladder() const { return push_; }
  const CodecLadder& broadcast_ladder() const { return bcast_; }
  const LinkEstimate& up(int64_t m) const { return up_.at(static_cast<size_t>(m)); }
  const LinkEstimate& down(int64_t m) const { return down_.at(static_cast<size_t>(m)); }
  double up_rate(int64_t m) const { return up(m).rate; }
  double down_rate(int64_t m) const { return down(m).rate; }
  double broadcasts_per_period(double step_seconds) const;

 private:
  CodecLadder push_, bcast_;
  FitOptions opts_;
  double ema_;
  std::vector<LinkEstimate> up_, down_;
  std::vector<Ema> step_;
  std::vector<CodecChoice> choice_;
  std::vector<double> last_merge_;
  Ema merge_interval_;
};

// The fitter a driver (the syncer node, the simulator) runs for `cfg` over fragments of these element counts (a
// shard's, in its order): null unless net.encoding or net.broadcast_encoding is auto. H, τ, whether the overlap
// binds (sync.wait_for_answer) and the moving averages' decay (sync.ema) come from cfg.sync.
std::unique_ptr<CodecFitter> make_codec_fitter(const AlgorithmConfig& cfg, const std::vector<int64_t>& fragment_elements,
                                               int64_t learners);

}  // namespace deloco
