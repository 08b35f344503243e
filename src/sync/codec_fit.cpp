// sync/codec_fit.cpp — the codec fitting rule and its measurements (sync/codec_fit.h).
#include "sync/codec_fit.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "deloco/algorithm.h"
#include "wire/sparse.h"

namespace deloco {

namespace {

// Bytes of one unsigned LEB128 varint holding v.
double leb128_bytes(double v) {
  double bytes = 1;
  for (double cap = 128; v >= cap && bytes < 5; cap *= 128) ++bytes;
  return bytes;
}

// fp32, bf16, int8, int4, then down to net.auto_coarsest: int2, and the top-k codec `topk`.
std::vector<Codec> auto_ladder(const std::string& coarsest, const Codec& topk) {
  std::vector<Codec> l = {Codec(Encoding::kFp32), Codec(Encoding::kBf16), Codec(Encoding::kInt8), Codec(Encoding::kInt4)};
  if (coarsest == "int2" || coarsest == "topk") l.emplace_back(Encoding::kInt2);
  if (coarsest == "topk") l.push_back(topk);
  return l;
}

}  // namespace

void check_float_codec(const Codec& codec, const std::string& what) {
  if (codec.encoding == Encoding::kRaw || static_cast<uint8_t>(codec.encoding) > kMaxEncoding)
    throw SyncError(what + " needs a float encoding, not " + encoding_name(codec.encoding));
  if (!is_sparse(codec.encoding)) return;
  try {
    validate_topk(codec.topk);
  } catch (const WireError& e) {
    throw SyncError(e.what());
  }
}

double expected_encoded_bytes(const Codec& codec, uint64_t n) {
  if (!is_sparse(codec.encoding)) return static_cast<double>(max_encoded_bytes(codec.encoding, n));
  const double d = codec.topk.density;
  const double k = std::max(1.0, std::round(d * static_cast<double>(n)));
  return 4 + static_cast<double>(topk_values_bytes(codec.encoding, static_cast<uint64_t>(k))) +
         k * leb128_bytes(1.0 / d);
}

int start_index(const CodecLadder& ladder) {
  for (size_t i = 0; i < ladder.codecs.size(); ++i)
    if (ladder.codecs[i].encoding == kAutoStart) return static_cast<int>(i);
  return static_cast<int>(ladder.codecs.size()) - 1;
}

CodecLadder codec_ladder(const std::vector<Codec>& codecs, const std::vector<int64_t>& fragment_elements) {
  if (codecs.empty()) throw SyncError("codec_ladder: no codecs");
  CodecLadder l;
  l.codecs = codecs;
  for (const Codec& c : codecs) {
    double one = 0, all = 0;
    for (int64_t n : fragment_elements) {
      const double b = expected_encoded_bytes(c, static_cast<uint64_t>(n)) + static_cast<double>(kWireHeaderBytes);
      one = std::max(one, b);
      all += b;
    }
    l.one.push_back(one);
    l.all.push_back(all);
  }
  return l;
}

std::vector<Codec> push_codecs(const AlgorithmConfig& cfg) {
  if (cfg.encoding != "auto") return {cfg.push_codec()};
  return auto_ladder(cfg.auto_coarsest, cfg.push_topk_codec());
}

std::vector<Codec> broadcast_codecs(const AlgorithmConfig& cfg) {
  if (cfg.broadcast_encoding != "auto") return {cfg.answer_codec()};
  return auto_ladder(cfg.auto_coarsest, cfg.answer_topk_codec());
}

namespace {
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
  const double hi = v[h];
  if (v.size() % 2) return hi;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h)) + hi) / 2;
}
}  // namespace

void LinkEstimate::add(double bytes, double seconds) {
  if (!(bytes > 0) || !(seconds > 0) || !std::isfinite(bytes) || !std::isfinite(seconds)) return;
  if (bytes < kMinRateBytes && sized) return;
  if (bytes >= kMinRateBytes && !sized) {
    sized = true;
    samples.clear();  // the small frames before it may have gone through at line rate
  }
  samples.emplace_back(bytes, seconds);
  if (samples.size() > kWindow) samples.erase(samples.begin());
  // The intercept is a latency only where the sizes span a range: frames of about one size (one codec over
  // near-equal fragments) give slopes of noise, and the intercept then took up queueing delays, which do not grow
  // with the bytes: on the testbed at 1 Mbit/s it made 0.6 s of a 1 s push "latency" and the link 1.8× faster than
  // its rate, the period shrank, broadcasts queued for 9 s. Without such a range the previous latency stays (0 at
  // first: the rate is then bytes over the whole time, queueing included).
  double lo = samples.front().first, hi = lo;
  for (const auto& [x, y] : samples) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  std::vector<double> slopes;
  if (hi >= kLatencySpread * lo)
    for (size_t a = 0; a < samples.size(); ++a)
    for (size_t b = a + 1; b < samples.size(); ++b) {
      const auto [xa, ya] = samples[a];
      const auto [xb, yb] = samples[b];
      if (std::abs(xb - xa) > 0.05 * std::max(xa, xb)) slopes.push_back((yb - ya) / (xb - xa));
    }
  if (slopes.size() >= 3) {
    const double slope = median(slopes);
    std::vector<double> ls;
    for (const auto& [x, y] : samples) ls.push_back(y - slope * x);
    const double l = median(ls);
    if (slope > 0 && l >= 0) {
      latency = l;
      latency_known = true;
    }
  }
  if (samples.size() < kMinSamples) return;
  std::vector<double> rates, all;
  for (const auto& [x, y] : samples) {
    const double t = y - std::min(latency, 0.9 * y);
    all.push_back(x / t);
    if (y - latency >= 0.25 * y) rates.push_back(x / t);
  }
  if (!rates.empty()) rate = median(rates);
  else if (rate == 0) rate = median(all);
}

CodecChoice fit_codecs(const CodecLadder& push, const CodecLadder& broadcast, const LinkLoad& load,
                       const FitOptions& o, const CodecChoice& current) {
  if (!(load.up_rate > 0) || !(load.down_rate > 0) || !(load.step_seconds > 0)) return current;
  const double T = static_cast<double>(o.sync_every) * load.step_seconds;
  const double budget = o.utilisation * T;
  const double overlap_budget = static_cast<double>(std::max<int64_t>(o.overlap, 1)) * load.step_seconds;
  const double b = std::max(1.0, load.broadcasts_per_period);
  // The codecs in use (before the first fit: the ones the link started with, kAutoStart from CodecFitter).
  const int cur_i = current.push;
  const int cur_j = current.broadcast;
  auto figures = [&](int i, int j, CodecChoice* c) {
    c->push = i;
    c->broadcast = j;
    c->up = push.all[i] / load.up_rate;
    c->down = b * broadcast.all[j] / load.down_rate;
    c->sync = load.up_latency + push.one[i] / load.up_rate + load.down_latency + broadcast.one[j] / load.down_rate;
    c->budget = budget;
    c->overlap_budget = overlap_budget;
  };
  std::optional<CodecChoice> best;
  auto key = [](const CodecChoice& c) { return std::make_tuple(std::max(c.push, c.broadcast), c.push + c.broadcast, c.broadcast); };
  for (int i = 0; i < static_cast<int>(push.size()); ++i)
    for (int j = 0; j < static_cast<int>(broadcast.size()); ++j) {
      CodecChoice c;
      figures(i, j, &c);
      // Moving to a finer codec in either direction needs room to spare.
      const double scale = (i < cur_i || j < cur_j) ? 1 + o.hysteresis : 1.0;
      if (o.finer_rungs > 0 && (i < cur_i - o.finer_rungs || j < cur_j - o.finer_rungs)) continue;
      if (c.up * scale > budget || c.down * scale > budget) continue;
      if (o.overlap_binds && c.sync * scale > overlap_budget) continue;
      c.fits = true;
      c.period = o.sync_every;
      if (!best || key(c) < key(*best)) best = c;
    }
  if (best) return *best;
  CodecChoice c;
  figures(static_cast<int>(push.size()) - 1, static_cast<int>(broadcast.size()) - 1, &c);
  const double need = std::max(c.up, c.down) / budget;  // > 1 unless only the overlap failed
  int64_t period = o.sync_every;
  if (need > 1) period = static_cast<int64_t>(std::ceil(static_cast<double>(o.sync_every) * need - 1e-9));
  c.period = std::min(period, std::max<int64_t>(1, o.max_stretch) * o.sync_every);
  c.fits = false;
  return c;
}

CodecFitter::CodecFitter(CodecLadder push, CodecLadder broadcast, FitOptions o, int64_t learners, double ema)
    : push_(std::move(push)), bcast_(std::move(broadcast)), opts_(o), ema_(ema) {
  up_.resize(static_cast<size_t>(learners));
  down_.resize(static_cast<size_t>(learners));
  choice_.resize(static_cast<size_t>(learners));
  for (CodecChoice& c : choice_) {  // not chosen yet (period 0): the codecs every link starts with
    c.push = start_index(push_);
    c.broadcast = start_index(bcast_);
  }
  step_.resize(static_cast<size_t>(learners));
}

void CodecFitter::observe_upload(int64_t m, double bytes, double seconds) {
  if (m < 0 || m >= static_cast<int64_t>(up_.size())) return;
  up_[static_cast<size_t>(m)].add(bytes, seconds);
}

void CodecFitter::observe_download(int64_t m, double bytes, double seconds) {
  if (m < 0 || m >= static_cast<int64_t>(down_.size())) return;
  down_[static_cast<size_t>(m)].add(bytes, seconds);
}

void CodecFitter::observe_merge(int64_t fragment, double t) {
  if (fragment < 0) return;
  if (static_cast<size_t>(fragment) >= last_merge_.size()) last_merge_.resize(static_cast<size_t>(fragment) + 1, -1);
  double& last = last_merge_[static_cast<size_t>(fragment)];
  if (last >= 0 && t > last) merge_interval_.add(t - last, ema_);
  last = t;
}

double CodecFitter::broadcasts_per_period(double step_seconds) const {
  if (!merge_interval_.seeded || !(merge_interval_.value > 0) || !(step_seconds > 0)) return 1;
  const double b = static_cast<double>(opts_.sync_every) * step_seconds / merge_interval_.value;
  return std::clamp(b, 1.0, std::max<double>(1, static_cast<double>(up_.size())));
}

std::optional<CodecChoice> CodecFitter::refit(int64_t m, double step_seconds) {
  if (m < 0 || m >= static_cast<int64_t>(choice_.size())) return std::nullopt;
  Ema& xi = step_[static_cast<size_t>(m)];
  if (step_seconds > 0 && std::isfinite(step_seconds)) xi.add(step_seconds, ema_);
  step_seconds = xi.seeded ? xi.value : 0;
  LinkLoad load;
  // A direction not measured yet is taken to be as fast as the other (most links are symmetric; a downlink seen only
  // through acknowledgements that queued behind pushes may have no clean sample for a while).
  load.up_rate = up_rate(m) > 0 ? up_rate(m) : down_rate(m);
  load.down_rate = down_rate(m) > 0 ? down_rate(m) : up_rate(m);
  load.up_latency = up(m).latency;
  load.down_latency = down(m).latency;
  load.step_seconds = step_seconds;
  load.broadcasts_per_period = broadcasts_per_period(step_seconds);
  CodecChoice& cur = choice_[static_cast<size_t>(m)];
  const CodecChoice next = fit_codecs(push_, bcast_, load, opts_, cur);
  const bool changed = next.period != cur.period || next.push != cur.push || next.broadcast != cur.broadcast;
  const bool first = cur.period == 0 && next.period > 0;
  cur = next;
  if (changed || first) return next;
  return std::nullopt;
}

int CodecFitter::broadcast(const std::vector<bool>& live) const {
  int j = -1;
  for (size_t m = 0; m < choice_.size() && m < live.size(); ++m)
    if (live[m] && choice_[m].period > 0) j = std::max(j, choice_[m].broadcast);
  return j >= 0 ? j : start_index(bcast_);
}

int64_t CodecFitter::longest_period(const std::vector<bool>& live) const {
  int64_t h = 0;
  for (size_t m = 0; m < choice_.size() && m < live.size(); ++m)
    if (live[m]) h = std::max(h, choice_[m].period);
  return h;
}

std::unique_ptr<CodecFitter> make_codec_fitter(const AlgorithmConfig& cfg, const std::vector<int64_t>& fragment_elements,
                                               int64_t learners) {
  if (!cfg.push_auto() && !cfg.broadcast_auto()) return nullptr;
  FitOptions o;
  o.sync_every = cfg.sync.sync_every;
  o.overlap = cfg.sync.overlap;
  o.overlap_binds = cfg.sync.wait_for_answer;
  // Learners that never wait: nothing bounds the time to their answers but the links' queues, so their loads stay
  // at half of each direction (FitOptions::utilisation).
  if (!cfg.sync.wait_for_answer) o.utilisation = kNoWaitUtilisation;
  o.finer_rungs = 1;
  return std::make_unique<CodecFitter>(codec_ladder(push_codecs(cfg), fragment_elements),
                                       codec_ladder(broadcast_codecs(cfg), fragment_elements), o, learners,
                                       cfg.sync.ema);
}

}  // namespace deloco
