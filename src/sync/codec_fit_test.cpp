// Tests of net.encoding / net.broadcast_encoding = auto (sync/codec_fit.h), written from the rule as docs/runtime.md
// states it ("Codecs fitted to the link"), with the expected choices worked out by hand from the figures in each
// case; the learner's side (per-fragment push codecs, a stretched period) and the core's switch of the delta codec.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <random>

#include "deloco/algorithm.h"
#include "deloco/config.h"
#include "deloco/learner.h"
#include "deloco/merge.h"
#include "deloco/sync.h"
#include "sync/codec_fit.h"
#include "wire/quantize.h"
#include "wire/sparse.h"

namespace deloco {
namespace codec_fit_cases {

// Three codecs, one fragment; frame bytes 1000, 500 and 130.
CodecLadder ladder3() {
  CodecLadder l;
  l.codecs = {Codec(Encoding::kFp32), Codec(Encoding::kBf16), Codec(Encoding::kInt4)};
  l.one = l.all = {1000, 500, 130};
  return l;
}

FitOptions opts(int64_t H, int64_t tau) {
  FitOptions o;
  o.sync_every = H;
  o.overlap = tau;
  return o;
}

LinkLoad link(double rate, double step, double b = 1) {
  LinkLoad l;
  l.up_rate = l.down_rate = rate;
  l.step_seconds = step;
  l.broadcasts_per_period = b;
  return l;
}

TEST(ExpectedBytes, DenseCodecsAreExactAndTopkIsNearARealPayload) {
  EXPECT_EQ(expected_encoded_bytes(Codec(Encoding::kFp32), 1000), 4000);
  EXPECT_EQ(expected_encoded_bytes(Codec(Encoding::kBf16), 1000), 2000);
  EXPECT_EQ(expected_encoded_bytes(Codec(Encoding::kInt4), 1000), 16 * 4 + 500);  // 16 block scales, 500 bytes
  TopkOptions t;
  t.density = 0.03;
  const Codec topk(Encoding::kTopk2, t);
  // k = 300: 4 (count) + 5 block scales × 4 + 75 bytes of 2-bit codes + 300 one-byte gaps (mean gap 33).
  EXPECT_EQ(expected_encoded_bytes(topk, 10000), 4 + 20 + 75 + 300);
  std::mt19937 rng(7);
  std::normal_distribution<float> n01;
  std::vector<float> x(100000);
  for (float& v : x) v = n01(rng);
  const double real = static_cast<double>(encode_topk(x.data(), x.size(), Encoding::kTopk2, t).size());
  const double expected = expected_encoded_bytes(topk, x.size());
  EXPECT_NEAR(real / expected, 1.0, 0.1) << real << " " << expected;
}

TEST(FitCodecs, TakesTheFinestPairWhoseLoadsAndSynchronisationFit) {
  // T = H·ξ = 10 × 0.1 = 1 s, u·T = 0.8 s; τ = 5: one synchronisation within 0.5 s; 1000 B/s both ways.
  // (0, *): up 1.0 s > 0.8. (1, 1): sync 0.5 + 0.5 = 1.0 > 0.5. (1, 2), (2, 1): sync 0.63 > 0.5. (2, 2): 0.26.
  CodecChoice c = fit_codecs(ladder3(), ladder3(), link(1000, 0.1), opts(10, 5), CodecChoice());
  EXPECT_EQ(c.push, 2);
  EXPECT_EQ(c.broadcast, 2);
  EXPECT_TRUE(c.fits);
  EXPECT_EQ(c.period, 10);
  EXPECT_NEAR(c.up, 0.13, 1e-12);
  EXPECT_NEAR(c.sync, 0.26, 1e-12);
  EXPECT_NEAR(c.budget, 0.8, 1e-12);
  EXPECT_NEAR(c.overlap_budget, 0.5, 1e-12);
  // τ = 10 (1 s for a synchronisation): (1, 1) fits (0.5, 0.5, 1.0); it beats (1, 2) and (2, 1) (max index 2).
  c = fit_codecs(ladder3(), ladder3(), link(1000, 0.1), opts(10, 10), CodecChoice());
  EXPECT_EQ(c.push, 1);
  EXPECT_EQ(c.broadcast, 1);
  // Three merges per period: down(1) = 3 × 0.5 = 1.5 s > 0.8, down(2) = 0.39: the broadcast coarsens, the push not.
  c = fit_codecs(ladder3(), ladder3(), link(1000, 0.1, 3), opts(10, 10), CodecChoice());
  EXPECT_EQ(c.push, 1);
  EXPECT_EQ(c.broadcast, 2);
}

TEST(FitCodecs, WithoutWaitingOnlyTheLoadsBind) {
  // As the first case (τ = 5: only (2, 2) arrives within 0.5 s), but learners that never wait: (1, 1) loads 0.5 s
  // each way ≤ 0.8 and wins; its synchronisation (1.0 s) is reported, not a condition.
  FitOptions o = opts(10, 5);
  o.overlap_binds = false;
  const CodecChoice c = fit_codecs(ladder3(), ladder3(), link(1000, 0.1), o, CodecChoice());
  EXPECT_EQ(c.push, 1);
  EXPECT_EQ(c.broadcast, 1);
  EXPECT_TRUE(c.fits);
  EXPECT_NEAR(c.sync, 1.0, 1e-12);
}

TEST(FitCodecs, AFinerCodecNeedsRoomToSpare) {
  // From (2, 2) at τ = 10 the finer pairs must fit with their figures × 1.25: (1, 1): sync 1.25 > 1.0, out;
  // (1, 2): up 0.625, sync 0.7875, in; (2, 1): the same, in, and it comes first (the smaller broadcast index last).
  CodecChoice cur;
  cur.push = cur.broadcast = 2;
  cur.period = 10;
  CodecChoice c = fit_codecs(ladder3(), ladder3(), link(1000, 0.1), opts(10, 10), cur);
  EXPECT_EQ(c.push, 2);
  EXPECT_EQ(c.broadcast, 1);
  // The current pair itself needs no margin: at exactly its bounds it stays.
  cur.push = cur.broadcast = 1;
  c = fit_codecs(ladder3(), ladder3(), link(1000, 0.1), opts(10, 10), cur);
  EXPECT_EQ(c.push, 1);
  EXPECT_EQ(c.broadcast, 1);
}

TEST(FitCodecs, MovesFinerOneRungAtATimeAndCoarserAtOnce) {
  FitOptions o = opts(10, 10);
  o.finer_rungs = 1;
  CodecChoice cur;  // int4 both ways, as a link starts
  cur.push = cur.broadcast = 2;
  CodecChoice c = fit_codecs(ladder3(), ladder3(), link(1e6, 0.1), o, cur);  // everything fits
  EXPECT_EQ(c.push, 1);
  EXPECT_EQ(c.broadcast, 1);
  c = fit_codecs(ladder3(), ladder3(), link(1e6, 0.1), o, c);
  EXPECT_EQ(c.push, 0);
  EXPECT_EQ(c.broadcast, 0);
  o.finer_rungs = 0;  // unlimited: straight to fp32
  c = fit_codecs(ladder3(), ladder3(), link(1e6, 0.1), o, cur);
  EXPECT_EQ(c.push, 0);
  // From fp32 a link of 100 B/s goes straight to the coarsest (stretched).
  o.finer_rungs = 1;
  CodecChoice fine;
  fine.period = 10;
  c = fit_codecs(ladder3(), ladder3(), link(100, 0.1), o, fine);
  EXPECT_EQ(c.push, 2);
  EXPECT_EQ(c.broadcast, 2);
}

TEST(FitCodecs, WhenNothingFitsThePeriodStretchesWithTheCoarsestCodecs) {
  // 100 B/s: the coarsest pair pushes 130 B in 1.3 s > 0.8 s: H' = ⌈10 × 1.3 / 0.8⌉ = ⌈16.25⌉ = 17.
  CodecChoice c = fit_codecs(ladder3(), ladder3(), link(100, 0.1), opts(10, 10), CodecChoice());
  EXPECT_FALSE(c.fits);
  EXPECT_EQ(c.push, 2);
  EXPECT_EQ(c.broadcast, 2);
  EXPECT_EQ(c.period, 17);
  // 10 B/s would need 163: capped at 8 H.
  c = fit_codecs(ladder3(), ladder3(), link(10, 0.1), opts(10, 10), CodecChoice());
  EXPECT_EQ(c.period, 80);
  // Only the synchronisation misses (τ = 1 step: 0.1 s < 0.26 s): the coarsest pair, the period unchanged.
  c = fit_codecs(ladder3(), ladder3(), link(1000, 0.1), opts(10, 1), CodecChoice());
  EXPECT_FALSE(c.fits);
  EXPECT_EQ(c.period, 10);
}

TEST(FitCodecs, LatencyCountsForTheSynchronisationNotTheLoad) {
  // 10 kB/s, 0.2 s latency each way, τ = 5 × 0.1 = 0.5 s: (0, 0) loads 0.1 s each, sync 0.4 + 0.2 = 0.6 > 0.5;
  // (0, 1) and (1, 0): 0.55 > 0.5; (1, 1): 0.5 fits.
  LinkLoad l = link(10000, 0.1);
  l.up_latency = l.down_latency = 0.2;
  const CodecChoice c = fit_codecs(ladder3(), ladder3(), l, opts(10, 5), CodecChoice());
  EXPECT_EQ(c.push, 1);
  EXPECT_EQ(c.broadcast, 1);
  EXPECT_TRUE(c.fits);
}

TEST(FitCodecs, UnknownRatesKeepTheCurrentChoice) {
  CodecChoice cur;
  cur.push = 1;
  cur.period = 10;
  LinkLoad l = link(1000, 0.1);
  l.down_rate = 0;
  const CodecChoice c = fit_codecs(ladder3(), ladder3(), l, opts(10, 10), cur);
  EXPECT_EQ(c.push, 1);
  EXPECT_EQ(c.broadcast, 0);
  EXPECT_EQ(c.period, 10);
}

TEST(LinkEstimate, SeparatesLatencyFromRateWhenSizesVary) {
  // Transfers take 0.05 s + bytes / 2e6.
  LinkEstimate e;
  for (int i = 0; i < 40; ++i) {
    const double bytes = i % 2 ? 1e5 : 4e5;
    e.add(bytes, 0.05 + bytes / 2e6);
  }
  EXPECT_NEAR(e.latency, 0.05, 1e-9);
  EXPECT_NEAR(e.rate, 2e6, 1e-3);
  // Then only small frames: the latency is kept, so the rate is not mistaken for bytes/(latency + bytes/r).
  for (int i = 0; i < 60; ++i) e.add(1000, 0.05 + 1000 / 2e6);
  EXPECT_NEAR(e.rate, 2e6, 1e-3);
  // Never a negative or infinite rate from nonsense.
  LinkEstimate f;
  f.add(1000, 0.01);
  f.add(1000, 0.01);
  EXPECT_EQ(f.rate, 0);  // no rate from fewer than 3 samples
  f.add(1000, 0.01);
  EXPECT_NEAR(f.rate, 1e5, 1e-6);
  f.add(0, 1);
  f.add(1000, -1);
  f.add(1000, std::numeric_limits<double>::infinity());
  EXPECT_NEAR(f.rate, 1e5, 1e-6);
}

TEST(LinkEstimate, QueueingBehindAnotherPushIsNotLatency) {
  // The testbed at 1 Mbit/s (125 kB/s): two learners' int4 pushes of near-equal fragments (80 to 95 kB) share the
  // syncer's downlink, and each push waits about half a second behind the other learner's, whatever its own size:
  // 0.5 s + x / 400 kB/s, ± 30 ms. Over so narrow a range of sizes that is no latency to subtract (it was: 0.5 s of
  // "latency" and a link of 400 kB/s, three times its rate): the rate is about the bytes over the time they took.
  LinkEstimate e;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> size(8e4, 9.5e4), noise(-0.03, 0.03);
  double sum_x = 0, sum_y = 0;
  for (int i = 0; i < 16; ++i) {
    const double x = size(rng), y = 0.5 + x / 4e5 + noise(rng);
    sum_x += x;
    sum_y += y;
    e.add(x, y);
  }
  EXPECT_EQ(e.latency, 0);
  EXPECT_LE(e.rate, 1.3e5);
  EXPECT_NEAR(e.rate, sum_x / sum_y, 0.1 * sum_x / sum_y);
}

TEST(LinkEstimate, OneSampleFarOffDoesNotMoveTheFit) {
  // 1.25 MB/s, 20 ms latency, pushes of 40 to 400 kB; one push read together with its heartbeat (0.1 ms) and one
  // held up behind a merge (3 s).
  LinkEstimate e;
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> size(4e4, 4e5);
  for (int i = 0; i < 16; ++i) {
    const double x = size(rng);
    double y = 0.02 + x / 1.25e6;
    if (i == 7) y = 1e-4;
    if (i == 11) y = 3.0;
    e.add(x, y);
  }
  EXPECT_NEAR(e.rate / 1.25e6, 1.0, 0.01);
  EXPECT_NEAR(e.latency, 0.02, 1e-3);
}

TEST(CodecFitter, RefitsFromMeasurementsAndTheSlowestLiveLinkSetsTheBroadcast) {
  CodecFitter f(ladder3(), ladder3(), opts(10, 10), 2, 0.9);
  EXPECT_FALSE(f.refit(0, 0.1));  // nothing measured
  // A link starts at the coarsest codecs (int4, here the ladder's last): the first fit moves finer only with the
  // hysteresis' room. At 1500 B/s (1, 1) has it (sync 0.67 s · 1.25 ≤ 1 s); (1, 0) and (0, 1) do not (1 s · 1.25).
  {  // one direction measured: the other counts as fast as it
    CodecFitter g(ladder3(), ladder3(), opts(10, 10), 1, 0.9);
    for (int i = 0; i < 3; ++i) g.observe_upload(0, 1000, 1000.0 / 1500.0);
    auto c = g.refit(0, 0.1);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->push, 1);
    EXPECT_EQ(c->broadcast, 1);
  }
  // Learner 0 at 1500 B/s: (1, 1) as above; learner 1 at 100 B/s: nothing fits, (2, 2) stretched.
  for (int i = 0; i < 3; ++i) {  // no rate from fewer than 3 samples
    f.observe_upload(0, 1000, 1000.0 / 1500.0);
    f.observe_download(0, 1000, 1000.0 / 1500.0);
    f.observe_upload(1, 1000, 10.0);
    f.observe_download(1, 1000, 10.0);
  }
  auto c0 = f.refit(0, 0.1);
  ASSERT_TRUE(c0);
  EXPECT_EQ(c0->push, 1);
  EXPECT_EQ(c0->broadcast, 1);
  EXPECT_FALSE(f.refit(0, 0.1));  // the same: no change to report
  auto c1 = f.refit(1, 0.1);
  ASSERT_TRUE(c1);
  EXPECT_EQ(c1->period, 17);
  EXPECT_EQ(f.broadcast({true, true}), 2);
  EXPECT_EQ(f.broadcast({true, false}), 1);
  EXPECT_EQ(f.broadcast({false, false}), 2);  // nobody fitted: int4 (kAutoStart)
  // Merges every 0.25 s of a fragment and a period of 1 s: four broadcasts per period (at most one per learner: 2).
  for (int i = 0; i < 20; ++i) f.observe_merge(0, 0.25 * i);
  EXPECT_NEAR(f.broadcasts_per_period(0.1), 2.0, 1e-9);
  for (int i = 0; i < 40; ++i) f.observe_merge(1, 1.0 * i);  // now both fragments merge each second: 1 per period
  EXPECT_LT(f.broadcasts_per_period(0.1), 2.0);
}

TEST(CodecLadders, AutoListsFp32ToInt4AndAFixedEncodingItself) {
  AlgorithmConfig cfg;
  cfg.encoding = "auto";
  cfg.broadcast_encoding = "int8";
  cfg.topk_bits = 4;
  cfg.topk_density = 0.05;
  const auto push = push_codecs(cfg);
  ASSERT_EQ(push.size(), 4u);  // nothing coarser than int4: the period stretches instead
  EXPECT_EQ(push[0].encoding, Encoding::kFp32);
  EXPECT_EQ(push[1].encoding, Encoding::kBf16);
  EXPECT_EQ(push[2].encoding, Encoding::kInt8);
  EXPECT_EQ(push[3].encoding, Encoding::kInt4);
  const auto bc = broadcast_codecs(cfg);
  ASSERT_EQ(bc.size(), 1u);
  EXPECT_EQ(bc[0].encoding, Encoding::kInt8);
  EXPECT_FALSE(cfg.delta_broadcast());
  cfg.broadcast_encoding = "auto";
  EXPECT_TRUE(cfg.delta_broadcast());
  EXPECT_EQ(cfg.push_codec().encoding, Encoding::kInt4);  // until a link is measured: kAutoStart
  // The ladder's bytes: 3 fragments of 100, 300 and 200 elements in fp32.
  const CodecLadder l = codec_ladder({Codec(Encoding::kFp32)}, {100, 300, 200});
  EXPECT_EQ(l.one[0], 1200 + kWireHeaderBytes);
  EXPECT_EQ(l.all[0], 2400 + 3 * kWireHeaderBytes);
}

TEST(CodecLadders, AutoCoarsestAddsInt2AndTheTopkCodecBelowInt4) {
  AlgorithmConfig cfg;
  cfg.encoding = "auto";
  cfg.broadcast_encoding = "auto";
  cfg.topk_bits = 4;
  cfg.topk_density = 0.05;
  cfg.broadcast_topk_bits = 8;
  cfg.auto_coarsest = "int2";
  ASSERT_EQ(push_codecs(cfg).size(), 5u);
  EXPECT_EQ(push_codecs(cfg).back().encoding, Encoding::kInt2);
  cfg.auto_coarsest = "topk";
  const auto push = push_codecs(cfg), bc = broadcast_codecs(cfg);
  ASSERT_EQ(push.size(), 6u);
  EXPECT_EQ(push[4].encoding, Encoding::kInt2);
  EXPECT_EQ(push[5].encoding, Encoding::kTopk4);  // net.topk_bits, whatever net.encoding says
  EXPECT_DOUBLE_EQ(push[5].topk.density, 0.05);
  ASSERT_EQ(bc.size(), 6u);
  EXPECT_EQ(bc[5].encoding, Encoding::kTopk8);    // net.broadcast_topk_bits
  EXPECT_EQ(start_index(codec_ladder(push, {1000})), 3);  // auto still starts at int4
  EXPECT_EQ(cfg.push_codec().encoding, Encoding::kInt4);
  // A top-k rung is the ladder's cheapest.
  const CodecLadder l = codec_ladder(push, {100000});
  EXPECT_LT(l.all[5], l.all[4]);
  EXPECT_LT(l.all[4], l.all[3]);
  ConfigSchema schema;
  cfg.bind(schema);
  schema.apply_override("net.auto_coarsest=int1");
  try {
    schema.validate();
    FAIL() << "accepted net.auto_coarsest=int1";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("net.auto_coarsest"), std::string::npos) << e.what();
  }
}

TEST(CodecFitter, TheLongestLivePeriodSpansTheGraceWindow) {
  CodecFitter f(ladder3(), ladder3(), opts(10, 10), 2, 0.9);
  EXPECT_EQ(f.longest_period({true, true}), 0);  // nobody fitted
  for (int i = 0; i < 3; ++i) {
    f.observe_upload(0, 1000, 1000.0 / 1500.0);
    f.observe_download(0, 1000, 1000.0 / 1500.0);
    f.observe_upload(1, 1000, 10.0);
    f.observe_download(1, 1000, 10.0);
  }
  ASSERT_TRUE(f.refit(0, 0.1));
  ASSERT_TRUE(f.refit(1, 0.1));
  EXPECT_EQ(f.longest_period({true, true}), 17);   // learner 1's stretched period
  EXPECT_EQ(f.longest_period({true, false}), 10);  // learner 0's: H
  EXPECT_EQ(f.longest_period({false, false}), 0);
}

TEST(CodecLadders, TheConfigAcceptsAutoAndNamesTheKeyOtherwise) {
  AlgorithmConfig cfg;
  ConfigSchema s;
  cfg.bind(s);
  s.apply_override("net.encoding=auto");
  s.apply_override("net.broadcast_encoding=auto");
  EXPECT_NO_THROW(s.validate());
  s.apply_override("net.encoding=automatic");
  try {
    s.validate();
    FAIL() << "accepted net.encoding=automatic";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("net.encoding"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto"), std::string::npos) << e.what();
  }
}

// The wire's names of the sparse codes are not settings: net.encoding = topk8 would skip net.topk_density (pushes at
// the default 3 %), and net.broadcast_encoding = topk8 would send whole fragments top-k encoded, which learners decode
// with ~97 % of Θ_p zero (found by review). Each key names topk and its options instead; raw is no float encoding.
TEST(CodecLadders, TheConfigRefusesTheWireNamesOfSparseCodes) {
  for (const std::string key : {"net.encoding", "net.broadcast_encoding"}) {
    for (const std::string bad : {"topk8", "topk4", "topk2", "topk2b", "raw"}) {
      AlgorithmConfig cfg;
      ConfigSchema s;
      cfg.bind(s);
      s.apply_override(key + "=" + bad);
      try {
        s.validate();
        ADD_FAILURE() << "accepted " << key << "=" << bad;
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
        if (bad != "raw") EXPECT_NE(std::string(e.what()).find("\"topk\""), std::string::npos) << e.what();
      }
    }
    for (const std::string good : {"fp32", "bf16", "int8", "int4", "int2", "topk", "auto"}) {
      AlgorithmConfig cfg;
      ConfigSchema s;
      cfg.bind(s);
      s.apply_override(key + "=" + good);
      EXPECT_NO_THROW(s.validate()) << key << "=" << good;
    }
  }
}

// ---- the learner's side ----------------------------------------------------------------------------------------

struct Toy {
  std::vector<std::pair<std::string, at::Tensor>> params{{"w", torch::zeros({8, 8})}, {"b", torch::zeros({8})}};
  ModelPlan plan;
  explicit Toy(int64_t P, int64_t H) : plan(plan_model(params, P, H)) {}
  void train(float by) {
    torch::NoGradGuard ng;
    for (auto& [n, t] : params) t.add_(by);
  }
};

SyncOptions learner_opts(int64_t H) {
  SyncOptions o;
  o.learners = 1;
  o.quorum = 1;
  o.sync_every = H;
  o.overlap = 0;
  return o;
}

TEST(LearnerCodecs, APushCodecChangeKeepsTheResidualAndFp32FlushesIt) {
  // Every push is against version 0 (Θ = 0, nothing answered): Δ_k = −θ_k. Error feedback sends Q(Δ_k + e) and
  // carries e ← Δ_k + e − Q(·); fp32 is exact, so the first fp32 push sends what int4 left out: from then on the
  // decoded pushes add up to the true Δs.
  Toy toy(1, 1);
  LearnerCore core(learner_opts(1), toy.plan, toy.params, 100, Codec(Encoding::kInt4));
  torch::manual_seed(3);
  const int64_t n = core.layout(0).elements;
  std::vector<double> sent(static_cast<size_t>(n), 0), truth(static_cast<size_t>(n), 0);
  auto gap = [&] {
    double g = 0;
    for (int64_t i = 0; i < n; ++i) g = std::max(g, std::abs(sent[i] - truth[i]));
    return g;
  };
  for (int64_t step = 1; step <= 6; ++step) {
    if (step == 4) core.set_push_codec(0, Codec(Encoding::kFp32));
    {
      torch::NoGradGuard ng;
      for (auto& [name, t] : toy.params) t.add_(torch::rand_like(t) * 2 - 1);
    }
    auto pushes = core.after_step(step, 1, 0.1);
    ASSERT_EQ(pushes.size(), 1u);
    EXPECT_EQ(pushes[0].encoding, step < 4 ? Encoding::kInt4 : Encoding::kFp32) << step;
    const auto d = decode_floats(pushes[0].payload.data(), pushes[0].payload.size(), pushes[0].encoding, n);
    std::vector<at::Tensor> ts;
    for (auto& [name, t] : toy.params) ts.push_back(t.flatten());
    const at::Tensor theta = torch::cat(ts);
    const float* th = theta.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      sent[i] += d[i];
      truth[i] -= th[i];
    }
    if (step == 3) EXPECT_GT(gap(), 1e-3) << "int4 left nothing out";
    if (step >= 4) EXPECT_LT(gap(), 1e-4) << step;
  }
  EXPECT_EQ(core.push_codec(0).encoding, Encoding::kFp32);
  EXPECT_THROW(core.set_push_codec(1, Codec(Encoding::kFp32)), SyncError);
  EXPECT_THROW(core.set_push_codec(0, Codec(Encoding::kRaw)), SyncError);
}

TEST(LearnerCodecs, AStretchedPeriodSpacesPushesFromTheFirstOn) {
  Toy toy(1, 10);
  LearnerCore core(learner_opts(10), toy.plan, toy.params, 1000);
  core.set_link_period(25);
  std::vector<int64_t> at;
  for (int64_t step = 1; step <= 80; ++step) {
    toy.train(0.01f);
    for (const Push& p : core.after_step(step, 1, 0.1)) {
      at.push_back(step);
      core.receive(p.fragment, core.version(p.fragment) + 1, torch::zeros({core.layout(0).elements}));
      core.apply_due(step);
    }
  }
  // The usual schedule for the first push (step 10), then every 25 steps.
  EXPECT_EQ(at, (std::vector<int64_t>{10, 35, 60}));
  core.set_link_period(0);  // back to H
  EXPECT_THROW(core.set_link_period(5), SyncError);
  EXPECT_THROW(core.set_link_period(81), SyncError);
}

// ---- the core's delta codec --------------------------------------------------------------------------------------

TEST(DeltaCodecs, TheNextMergesDeltaUsesTheSelectedEncoding) {
  torch::manual_seed(5);
  std::vector<std::pair<std::string, at::Tensor>> g{{"w", torch::randn({32, 16})}};
  std::vector<std::pair<std::string, int64_t>> sizes{{"w", 32 * 16 * 4}};
  SyncOptions o;
  o.learners = 1;
  o.quorum = 1;
  o.max_delta_outlier = 0;
  Syncer s(o, plan_fragments(sizes, 1, 10), g, MergePlan::preset("diloco"), OuterOptions{"nesterov", 0.7, 0.9});
  EXPECT_THROW(s.set_delta_codecs({Codec(Encoding::kFp32)}), SyncError);  // the delta broadcast is off
  s.set_delta_broadcast(Codec(Encoding::kFp32));
  s.set_delta_codecs({Codec(Encoding::kFp32), Codec(Encoding::kBf16), Codec(Encoding::kInt4)});
  auto round = [&](int64_t v) {
    Contribution c;
    c.learner = 0;
    c.fragment = 0;
    c.deltas = {0.01f * torch::randn({32, 16})};
    c.base_version = v;
    c.c_steps = 10;
    c.c_tokens = 100;
    c.step_time = 1;
    EXPECT_EQ(s.receive(0.0, std::move(c)), SyncReject::kNone);
    return s.on_round(0.0, 0);
  };
  RoundResult r = round(0);
  ASSERT_TRUE(r.delta);
  EXPECT_EQ(r.delta->size(), 32u * 16 * 4);
  s.use_delta_encoding(Encoding::kInt4);
  EXPECT_EQ(s.delta_encoding(), Encoding::kInt4);
  r = round(1);
  ASSERT_TRUE(r.delta);
  EXPECT_EQ(r.delta->size(), max_encoded_bytes(Encoding::kInt4, 32 * 16));
  EXPECT_THROW(s.use_delta_encoding(Encoding::kInt8), SyncError);  // not listed
  EXPECT_EQ(s.delta_encoding(), Encoding::kInt4);
}

// net.topk_values = bins picks SparseLoCo's 2-bit value code (wire/sparse.h); it is a 2-bit code only.
TEST(TopkBins, IsChosenByNetTopkValues) {
  AlgorithmConfig c;
  c.encoding = "topk";
  EXPECT_EQ(c.push_codec().encoding, Encoding::kTopk2);
  c.topk_values = "bins";
  EXPECT_EQ(c.push_codec().encoding, Encoding::kTopk2b);
  c.broadcast_encoding = "topk";
  c.broadcast_topk_bits = 8;
  EXPECT_EQ(c.answer_codec().encoding, Encoding::kTopk8);  // bins is a 2-bit code: an 8-bit broadcast keeps absmax
  ConfigSchema s;
  AlgorithmConfig b;
  b.bind(s);
  s.apply_override("net.topk_values=bins");
  s.apply_override("net.topk_bits=4");
  try {
    s.validate();
    b.validate();
    ADD_FAILURE() << "bins at 4 bits was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("net.topk_values = bins is SparseLoCo's 2-bit code"), std::string::npos)
        << e.what();
  }
  ConfigSchema s2;
  AlgorithmConfig b2;
  b2.bind(s2);
  s2.apply_override("net.topk_values=median");
  EXPECT_THROW(s2.validate(), ConfigError);
}

}  // namespace codec_fit_cases
}  // namespace deloco
