// The syncer's fused merge (src/sync/fused_merge.h, Syncer::merge) against the general per-tensor path on the same
// inputs: every wire encoding, both anchors, token weights capped by sync.max_share, the mean (diloco) and rda +
// mean (decoupled) plans, nesterov, plain sgd and heavy-ball sgd; the transaction (a non-finite result rolls back
// bitwise), thread-count independence, the shared broadcast buffer, and receive()'s checks on encoded pushes.
//
// Tolerance. The reference is the general path: the merge methods on decoded fp32 tensors (src/merge) and
// OuterOptimizer::step (torch ops). The fused pass evaluates the same sums of at most M + 4 products per element in
// another order (block scale folded into the weight, the anchor correction per version, the outer rule written out),
// so each element differs by a few fp32 roundings of the largest term: ≲ (M + 6) · 2^-24 · Σ|terms| ≈ 6e-7 of
// max |Θ| here (M = 4), growing by at most 1 + η(1 + μ) ≈ 2.3 per outer step through Θ and the momentum; rda's
// norms differ by ~1e-7 relative (double sums of q²·scale² vs fp32 norms). Over three rounds that is < 1e-5 of
// max(1, max |Θ|), the bound used. A real mistake moves Θ by ~η · |Δ| ≈ 1e-3 (deltas are ~1e-2), 100× the bound:
// TheComparisonCanFail shows a 1 % change in the outer learning rate is caught.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "deloco/learner.h"
#include "deloco/sync.h"
#include "sync/fused_merge.h"
#include "wire/quantize.h"

namespace deloco {
namespace fused_merge_cases {

// Odd sizes so tensor boundaries fall inside quantization blocks and merge chunks; ~46K elements over 11+ chunks.
std::vector<std::pair<std::string, at::Tensor>> model(uint64_t seed) {
  torch::manual_seed(seed);
  return {{"tok_embed.weight", torch::randn({37, 129}) * 0.1},
          {"h.0.w", torch::randn({300, 70}) * 0.1},
          {"h.0.b", torch::randn({70}) * 0.1},
          {"h.1.w", torch::randn({128, 65}) * 0.1},
          {"h.1.norm", torch::randn({65}) * 0.1 + 1},
          {"h.2.w", torch::randn({97, 31}) * 0.1}};
}

std::vector<Fragment> one_fragment(const std::vector<std::pair<std::string, at::Tensor>>& g) {
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const auto& [n, t] : g) sizes.emplace_back(n, t.numel() * 4);
  return plan_fragments(sizes, 1, 10);
}

FlatLayout layout_of(const Syncer& s) {
  std::vector<at::Tensor> ts = s.fragment_tensors(0);
  return make_flat_layout(s.fragments()[0].names, ts);
}

// Learner m's push against version `base`: Δ̂ = 0.01 · (random), encoded in `enc`, as the node receives it.
Contribution push(const FlatLayout& L, int64_t m, int64_t round, int64_t base, Encoding enc, int64_t tokens) {
  torch::manual_seed(1000 + 17 * m + round);
  at::Tensor d = torch::randn({L.elements}) * 0.01;
  if (m == 2) d.mul_(3);  // one learner drifts further: rda's radius and direction differ from the mean
  const std::string payload = encode_floats(d.data_ptr<float>(), static_cast<size_t>(L.elements), enc);
  return decode_push(m, 0, L, enc, payload.data(), payload.size(), base, 10, tokens, 1.0);
}

struct Case {
  std::string plan = "diloco";
  std::string anchor = "global";
  OuterOptions outer{"nesterov", 0.7, 0.9};
  Encoding enc = Encoding::kInt8;
  int64_t threads = 0;
};

SyncOptions options(const Case& s, bool fused) {
  SyncOptions o;
  o.learners = 4;
  o.quorum = 1;
  o.delta_anchor = s.anchor;
  o.max_share = 0.4;
  o.fused_merge = fused;
  o.merge_threads = s.threads;
  return o;
}

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

// Max |a − b| over Θ and the momentum, relative to max(1, max |Θ_b|).
double difference(const Syncer& a, const Syncer& b) {
  double diff = 0, scale = 1;
  for (size_t i = 0; i < a.global().size(); ++i) {
    diff = std::max(diff, max_abs(a.global()[i].second - b.global()[i].second));
    scale = std::max(scale, max_abs(b.global()[i].second));
  }
  const auto sa = a.outer_state(), sb = b.outer_state();
  EXPECT_EQ(sa.size(), sb.size());
  for (const auto& [k, t] : sb) diff = std::max(diff, max_abs(sa.at(k) - t));
  return diff / scale;
}

using Rounds = std::vector<std::vector<std::pair<int64_t, int64_t>>>;  // per round: (learner, base version)

// The same pushes into a (fused) and b (general), each round merged with merge(); token weights 1 : 4 : 9 : 16, capped
// at 0.4. Checks that the outcomes agree (‖Δ‖ too when `same_norm`) and that only a took the fused path.
void merge_both(Syncer& a, Syncer& b, const FlatLayout& L, Encoding enc, const Rounds& rounds, bool same_norm) {
  const int64_t fused_a = a.fused_merges(), fused_b = b.fused_merges();
  for (size_t r = 0; r < rounds.size(); ++r) {
    for (const auto& [m, base] : rounds[r]) {
      const int64_t tokens = 100 * (m + 1) * (m + 1);
      EXPECT_EQ(a.receive(0, push(L, m, static_cast<int64_t>(r), base, enc, tokens)), SyncReject::kNone);
      EXPECT_EQ(b.receive(0, push(L, m, static_cast<int64_t>(r), base, enc, tokens)), SyncReject::kNone);
    }
    const MergeOutcome oa = a.merge(0), ob = b.merge(0);
    EXPECT_TRUE(oa.ok() && ob.ok()) << oa.detail << ob.detail;
    EXPECT_EQ(oa.learners, ob.learners);
    EXPECT_EQ(oa.weights, ob.weights);
    EXPECT_EQ(oa.version, ob.version);
    if (same_norm) {
      EXPECT_NEAR(oa.delta_norm, ob.delta_norm, 1e-5 * ob.delta_norm);
    }
  }
  EXPECT_EQ(a.fused_merges() - fused_a, static_cast<int64_t>(rounds.size()));  // the path under test was taken
  EXPECT_EQ(b.fused_merges() - fused_b, 0);
  EXPECT_EQ(a.stale_bases(), b.stale_bases());
  EXPECT_EQ(a.versions(), b.versions());
}

// Three rounds into a fused and a general syncer; the second round mixes bases (a learner still on version 0),
// so anchor global uses the history. Returns the relative difference after the last round.
double run_pair(const Case& s, double lr_scale = 1.0) {
  const auto g = model(7);
  OuterOptions other = s.outer;
  other.lr *= lr_scale;
  Syncer a(options(s, true), one_fragment(g), g, MergePlan::preset(s.plan), other);
  Syncer b(options(s, false), one_fragment(g), g, MergePlan::preset(s.plan), s.outer);
  for (Syncer* x : {&a, &b})
    for (int64_t m = 0; m < 4; ++m) x->note_joined(m);
  merge_both(a, b, layout_of(a), s.enc,
             {{{0, 0}, {1, 0}, {2, 0}, {3, 0}},   // (learner, base)
              {{0, 1}, {1, 0}, {2, 1}},           // learner 1 still holds version 0
              {{0, 2}, {1, 2}, {2, 2}, {3, 0}}},  // learner 3 too (two older bases are not both kept here: 0 is)
             /*same_norm=*/lr_scale == 1.0);
  return difference(a, b);
}

constexpr double kTolerance = 1e-5;

TEST(SyncFusedMerge, MatchesTheGeneralPathForEveryEncodingAnchorPlanAndRule) {
  const std::vector<OuterOptions> rules = {{"nesterov", 0.7, 0.9}, {"sgd", 1.0, 0.0}, {"sgd", 0.5, 0.8}};
  for (Encoding enc : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4, Encoding::kInt2})
    for (const std::string anchor : {"global", "base"})
      for (const std::string plan : {"diloco", "decoupled"})
        for (const OuterOptions& rule : rules) {
          Case s;
          s.enc = enc;
          s.anchor = anchor;
          s.plan = plan;
          s.outer = rule;
          const double d = run_pair(s);
          EXPECT_LT(d, kTolerance) << encoding_name(enc) << " " << anchor << " " << plan << " " << rule.kind << " "
                                   << rule.momentum;
        }
}

// The delta broadcast (anchor global): every Δ_m anchored at Θ_p + e_p. A general syncer merges two rounds under
// top-k broadcasts (so e_p is the large unsent part of those merges); a fused and a general syncer resync from its
// image (the same Θ, momentum, versions and e_p) and merge three more rounds of the same pushes with merge(), which
// leaves e_p as it is (the top-k re-encoding of on_round would turn fp32 rounding into different kept entries).
// Returns the relative difference, and the max |e_p| they merged with in *residual.
double run_delta_pair(const Case& s, double* residual, bool drop_residual = false) {
  const auto g = model(11);
  TopkOptions topk;
  topk.density = 0.05;
  const Codec codec(Encoding::kTopk8, topk);
  Syncer seed(options(s, false), one_fragment(g), g, MergePlan::preset(s.plan), s.outer);
  seed.set_delta_broadcast(codec);
  const FlatLayout L = layout_of(seed);
  for (int64_t m = 0; m < 4; ++m) seed.note_joined(m);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t m = 0; m < 4; ++m)
      EXPECT_EQ(seed.receive(0, push(L, m, 10 + r, r, s.enc, 100 * (m + 1))), SyncReject::kNone);
    EXPECT_TRUE(seed.on_round(0.0, 0).merged());
  }
  Syncer::Image im = seed.image();
  EXPECT_EQ(im.broadcast_residual.size(), 1u);
  *residual = max_abs(im.broadcast_residual.at(0));
  Syncer a(options(s, true), one_fragment(g), g, MergePlan::preset(s.plan), s.outer);
  Syncer b(options(s, false), one_fragment(g), g, MergePlan::preset(s.plan), s.outer);
  a.set_delta_broadcast(codec);
  b.set_delta_broadcast(codec);
  a.resync(im);
  if (drop_residual) im.broadcast_residual[0].zero_();
  b.resync(im);
  const int64_t v = im.versions.at(0);  // 2
  merge_both(a, b, L, s.enc,
             {{{0, v}, {1, v}, {2, v}, {3, v}}, {{0, v + 1}, {1, v}, {2, v + 1}}, {{0, v + 2}, {1, v + 2}, {2, v + 2}, {3, v}}},
             /*same_norm=*/!drop_residual);
  return difference(a, b);
}

TEST(SyncFusedMerge, MatchesTheGeneralPathUnderTheDeltaBroadcast) {
  const std::vector<OuterOptions> rules = {{"nesterov", 0.7, 0.9}, {"sgd", 1.0, 0.0}};
  for (Encoding enc : {Encoding::kFp32, Encoding::kInt4, Encoding::kTopk2})
    for (const std::string plan : {"diloco", "decoupled"})
      for (const OuterOptions& rule : rules) {
        Case s;
        s.enc = enc;
        s.plan = plan;
        s.outer = rule;
        double residual = 0;
        const double d = run_delta_pair(s, &residual);
        EXPECT_GT(residual, 1e-3) << "e_p should hold most of two merges' steps";  // so the comparison means something
        EXPECT_LT(d, kTolerance) << encoding_name(enc) << " " << plan << " " << rule.kind;
      }
}

TEST(SyncFusedMerge, UnderTheDeltaBroadcastTheResidualCounts) {
  Case s;
  double residual = 0;
  EXPECT_GT(run_delta_pair(s, &residual, /*drop_residual=*/true), 10 * kTolerance);  // general without e_p
}

TEST(SyncFusedMerge, TheComparisonCanFail) {
  Case s;
  EXPECT_GT(run_pair(s, 1.01), 10 * kTolerance);  // η 1 % off
}

TEST(SyncFusedMerge, ContributionsHeldAsTensorsTakeItToo) {
  const auto g = model(3);
  Case st;
  Syncer a(options(st, true), one_fragment(g), g, MergePlan::preset("decoupled"), st.outer);
  Syncer b(options(st, false), one_fragment(g), g, MergePlan::preset("decoupled"), st.outer);
  for (Syncer* x : {&a, &b})
    for (int64_t m = 0; m < 2; ++m) {
      Contribution c;
      c.learner = m;
      c.c_steps = 10;
      c.c_tokens = 100 * (m + 1);
      torch::manual_seed(50 + m);
      for (const auto& [n, t] : g) c.deltas.push_back(torch::randn(t.sizes()) * 0.01);
      ASSERT_EQ(x->receive(0, std::move(c)), SyncReject::kNone);
    }
  ASSERT_TRUE(a.merge(0).ok());
  ASSERT_TRUE(b.merge(0).ok());
  EXPECT_EQ(a.fused_merges(), 1);
  EXPECT_LT(difference(a, b), kTolerance);
}

TEST(SyncFusedMerge, ResultDoesNotDependOnTheThreadCount) {
  // 600K elements: two threads really split it (fragments under 256K elements per thread use one).
  std::vector<std::pair<std::string, at::Tensor>> g = {{"w", torch::randn({600, 1000}) * 0.1},
                                                       {"b", torch::randn({1000}) * 0.1}};
  std::vector<std::unique_ptr<Syncer>> s;
  for (int64_t threads : {1, 2, 3}) {
    Case st;
    st.threads = threads;
    s.push_back(std::make_unique<Syncer>(options(st, true), one_fragment(g), g, MergePlan::preset("decoupled"),
                                         st.outer));
  }
  const FlatLayout L = layout_of(*s[0]);
  for (int r = 0; r < 2; ++r)
    for (auto& x : s) {
      for (int64_t m = 0; m < 3; ++m)
        ASSERT_EQ(x->receive(0, push(L, m, r, r, Encoding::kInt8, 100 * (m + 1))), SyncReject::kNone);
      ASSERT_TRUE(x->merge(0).ok());
    }
  for (size_t k = 1; k < s.size(); ++k) {
    EXPECT_EQ(s[k]->fused_merges(), 2);
    for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(torch::equal(s[0]->global()[i].second, s[k]->global()[i].second));
    for (const auto& [n, t] : s[0]->outer_state()) EXPECT_TRUE(torch::equal(s[k]->outer_state().at(n), t));
  }
}

// A round whose outer step would overflow cannot be proven safe, so the fused path leaves it to the general path,
// which rolls it back: Θ, the momentum, the version and the history (a learner on version 0 is anchored exactly as
// by a syncer that never saw the poison) bitwise as before.
TEST(SyncFusedMerge, ANonFiniteResultIsRolledBackBitwise) {
  const auto g = model(11);
  for (const std::string anchor : {"global", "base"}) {
    Case st;
    st.anchor = anchor;
    SyncOptions o = options(st, true);
    o.max_delta_ratio = 0;  // let the poison reach the merge
    o.max_delta_outlier = 0;
    Syncer a(o, one_fragment(g), g, MergePlan::preset("diloco"), st.outer);
    Syncer b(o, one_fragment(g), g, MergePlan::preset("diloco"), st.outer);
    const FlatLayout L = layout_of(a);
    for (Syncer* x : {&a, &b}) {
      for (int64_t m = 0; m < 4; ++m) x->note_joined(m);
      ASSERT_EQ(x->receive(0, push(L, 0, 0, 0, Encoding::kInt8, 100)), SyncReject::kNone);
      ASSERT_TRUE(x->merge(0).ok());  // version 1 (fused), momentum set; version 0 kept (learner 1 holds it)
    }
    ASSERT_EQ(a.fused_merges(), 1);
    std::vector<at::Tensor> theta;
    for (const auto& [n, t] : a.global()) theta.push_back(t.clone());
    const auto outer = a.outer_state();
    // 3.3e38 in every element of two pushes: the merged gradient is finite, the outer step overflows.
    std::vector<float> huge(static_cast<size_t>(L.elements), 3.3e38f);
    const std::string payload = encode_floats(huge.data(), huge.size(), Encoding::kFp32);
    for (int64_t m : {2, 3})
      ASSERT_EQ(a.receive(0, decode_push(m, 0, L, Encoding::kFp32, payload.data(), payload.size(), 1, 10, 100, 1.0)),
                SyncReject::kNone);
    const MergeOutcome bad = a.merge(0);
    EXPECT_EQ(bad.rejected, SyncReject::kMergeNonFinite) << bad.detail;
    EXPECT_EQ(a.version(0), 1);
    EXPECT_EQ(a.fused_merges(), 1);  // refused by the bound, left to the general path
    for (size_t i = 0; i < theta.size(); ++i) EXPECT_TRUE(torch::equal(a.global()[i].second, theta[i]));
    ASSERT_EQ(a.outer_state().size(), outer.size());
    for (const auto& [k, t] : outer) EXPECT_TRUE(torch::equal(a.outer_state().at(k), t)) << k;
    for (Syncer* x : {&a, &b}) {
      ASSERT_EQ(x->receive(0, push(L, 1, 2, 0, Encoding::kInt8, 100)), SyncReject::kNone);
      ASSERT_TRUE(x->merge(0).ok());
    }
    EXPECT_EQ(a.fused_merges(), 2);
    for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(torch::equal(a.global()[i].second, b.global()[i].second));
    for (const auto& [k, t] : b.outer_state()) EXPECT_TRUE(torch::equal(a.outer_state().at(k), t)) << k;
    EXPECT_EQ(a.stale_bases(), b.stale_bases());
  }
}

// With share_flat, RoundResult::flat is the syncer's Θ_p; neither a later fused nor a general merge writes it.
TEST(SyncFusedMerge, ASharedBroadcastIsNeverWrittenAgain) {
  const auto g = model(5);
  for (bool fused : {true, false}) {
    Case st;
    Syncer s(options(st, fused), one_fragment(g), g, MergePlan::preset("diloco"), st.outer);
    s.share_flat(true);
    const FlatLayout L = layout_of(s);
    ASSERT_EQ(s.receive(0, push(L, 0, 0, 0, Encoding::kInt8, 100)), SyncReject::kNone);
    const RoundResult r = s.on_round(0, 0);
    ASSERT_TRUE(r.merged());
    const at::Tensor copy = r.flat.clone();
    EXPECT_TRUE(torch::equal(r.flat, torch::cat({s.global()[0].second.flatten(), s.global()[1].second.flatten(),
                                                 s.global()[2].second.flatten(), s.global()[3].second.flatten(),
                                                 s.global()[4].second.flatten(), s.global()[5].second.flatten()})));
    ASSERT_EQ(s.receive(0, push(L, 1, 1, 1, Encoding::kInt8, 100)), SyncReject::kNone);
    ASSERT_TRUE(s.on_round(0, 0).merged());
    EXPECT_TRUE(torch::equal(r.flat, copy));
    EXPECT_FALSE(torch::equal(s.global()[0].second.flatten(), copy.narrow(0, 0, s.global()[0].second.numel())));
  }
}

// receive() checks a push it holds in its wire encoding: the element count, non-finite blocks, the norm (from the
// encoded blocks: the same as the decoded values' within rounding).
TEST(SyncFusedMerge, ReceiveChecksEncodedPushes) {
  const auto g = model(9);
  Case st;
  SyncOptions o = options(st, true);
  Syncer s(o, one_fragment(g), g, MergePlan::preset("diloco"), st.outer);
  const FlatLayout L = layout_of(s);
  Contribution c = push(L, 0, 0, 0, Encoding::kInt8, 100);
  Contribution wrong = c;
  wrong.encoded.elements -= 1;
  EXPECT_EQ(s.receive(0, wrong), SyncReject::kWrongShape);
  std::string nan_scale(c.encoded.data, c.encoded.bytes);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_scale.data() + 8, &nan, 4);  // block 2's scale
  Contribution poisoned = c;
  poisoned.encoded.data = nan_scale.data();
  EXPECT_EQ(s.receive(0, poisoned), SyncReject::kNonFinite);
  // The norm bound sees the decoded norm.
  const std::vector<float> x = decode_floats(c.encoded.data, c.encoded.bytes, Encoding::kInt8, L.elements);
  double sq = 0;
  for (float v : x) sq += static_cast<double>(v) * v;
  const FloatScan scan = scan_floats(c.encoded.data, c.encoded.bytes, Encoding::kInt8, L.elements,
                                     {static_cast<size_t>(L.elements)});
  EXPECT_NEAR(std::sqrt(scan.sumsq[0]), std::sqrt(sq), 1e-6 * std::sqrt(sq));
  o.max_delta_norm = std::sqrt(sq) * 0.999;
  Syncer tight(o, one_fragment(g), g, MergePlan::preset("diloco"), st.outer);
  EXPECT_EQ(tight.receive(0, c), SyncReject::kNormBound);
  o.max_delta_norm = std::sqrt(sq) * 1.001;
  Syncer loose(o, one_fragment(g), g, MergePlan::preset("diloco"), st.outer);
  EXPECT_EQ(loose.receive(0, c), SyncReject::kNone);
  EXPECT_EQ(s.receive(0, c), SyncReject::kNone);
}

// A block with a huge scale over zeros only measures as nothing, so the merge's overflow bound did not see it, while
// the fused pass folds the rda coefficient (weight / ‖Δ‖, large for a push this small) into the scale first:
// c · FLT_MAX = inf, and inf · 0 put NaN into Θ and the momentum (found by review). No encoder writes such a block:
// receive() refuses it as malformed, and the honest push it was made from merges finite.
TEST(SyncFusedMerge, AScaleOverZerosIsRefusedNotMergedIntoNaN) {
  const auto g = model(13);
  Case st;
  st.plan = "decoupled";
  SyncOptions o = options(st, true);
  o.max_delta_ratio = 0;  // no bound stands in a tiny push's way
  o.max_delta_outlier = 0;
  Syncer s(o, one_fragment(g), g, MergePlan::preset("decoupled"), st.outer);
  for (int64_t m = 0; m < 4; ++m) s.note_joined(m);
  const FlatLayout L = layout_of(s);
  // The first block wholly inside h.0.w, a matrix (rda under the decoupled plan), after tok_embed's 37 × 129.
  const size_t block = static_cast<size_t>(g[0].second.numel()) / 64 + 1;
  ASSERT_EQ(std::string(MergeSelector(MergePlan::preset("decoupled")).select("h.0.w", 2).name()), "rda");
  std::vector<float> d(static_cast<size_t>(L.elements), 0.f);
  for (size_t i = 0; i < d.size(); i += 64)
    if (i / 64 != block) d[i] = 1e-3f;  // one small value in every block but that one
  const std::string honest = encode_floats(d.data(), d.size(), Encoding::kInt8);
  std::string crafted = honest;
  const float big = std::numeric_limits<float>::max();
  std::memcpy(crafted.data() + 4 * block, &big, 4);  // its scale FLT_MAX over 64 zero codes
  EXPECT_THROW(decode_push(0, 0, L, Encoding::kInt8, crafted.data(), crafted.size(), 0, 10, 100, 1.0), WireError);
  Contribution c = decode_push(0, 0, L, Encoding::kInt8, honest.data(), honest.size(), 0, 10, 100, 1.0);
  c.encoded.data = crafted.data();  // held as received, past decode_push: receive() checks it again
  EXPECT_EQ(s.receive(0, c), SyncReject::kWrongShape);
  ASSERT_EQ(s.receive(0, decode_push(1, 0, L, Encoding::kInt8, honest.data(), honest.size(), 0, 10, 100, 1.0)),
            SyncReject::kNone);
  const MergeOutcome out = s.merge(0);
  ASSERT_TRUE(out.ok()) << out.detail;
  EXPECT_EQ(s.fused_merges(), 1);
  EXPECT_EQ(out.learners, std::vector<int64_t>{1});
  for (const auto& [n, t] : s.global()) EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << n;
  for (const auto& [k, t] : s.outer_state()) EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << k;
}

// decode_push validates what it holds with decoding's errors: a node tells malformed from non-finite pushes apart.
TEST(SyncFusedMerge, DecodePushRefusesWhatDecodingRefuses) {
  const auto g = model(9);
  Case st;
  Syncer s(options(st, true), one_fragment(g), g, MergePlan::preset("diloco"), st.outer);
  const FlatLayout L = layout_of(s);
  std::vector<float> x(static_cast<size_t>(L.elements), 0.5f);
  x[x.size() / 2] = std::nanf("");
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16}) {
    std::string payload(encoded_bytes(e, x.size()), '\0');
    if (e == Encoding::kFp32) {
      std::memcpy(payload.data(), x.data(), payload.size());
    } else {
      const std::string ok = encode_floats(std::vector<float>(x.size(), 0.5f).data(), x.size(), e);
      payload = ok;
      payload[2 * (x.size() / 2) + 1] = static_cast<char>(0x7f);  // exponent all ones: NaN/Inf
      payload[2 * (x.size() / 2)] = static_cast<char>(0xc0);
    }
    EXPECT_THROW(decode_push(0, 0, L, e, payload.data(), payload.size(), 0, 1, 1, 1.0), NonFiniteError)
        << encoding_name(e);
    EXPECT_THROW(decode_push(0, 0, L, e, payload.data(), payload.size() - 2, 0, 1, 1, 1.0), WireError);
  }
  std::string q = encode_floats(std::vector<float>(x.size(), 0.5f).data(), x.size(), Encoding::kInt8);
  const float neg = -1.f;
  std::memcpy(q.data() + 4, &neg, 4);
  try {
    decode_push(0, 0, L, Encoding::kInt8, q.data(), q.size(), 0, 1, 1, 1.0);
    ADD_FAILURE() << "a negative block scale was accepted";
  } catch (const NonFiniteError&) {
    ADD_FAILURE() << "a negative scale is malformed, not non-finite";
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find("negative scale"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deloco
