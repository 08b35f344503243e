// util/token_bucket.h — a byte-rate bound without a clock of its own: the one token bucket behind net.serve_rate (the
// syncer's share of fetched downloads, a donor learner's serving).
//
// Contract
//  * TokenBucket(bytes_per_second, burst_bytes): bytes_per_second <= 0 means unbounded (take() always succeeds and
//    nothing is counted). Otherwise the bucket holds at most burst_bytes and starts empty at the first refill.
//  * refill(t) adds (t - last t) * rate, capped at the burst; t is seconds on any monotonic clock the caller keeps
//    (the first call only sets the start). A t earlier than the last is treated as no time passed.
//  * take(n) spends n bytes when the bucket holds at least min(n, burst) and says whether it did. A unit larger than
//    the burst passes once the bucket is full and leaves it in debt (negative), repaid at the rate before the next
//    passes: the average rate holds for any unit size, and no unit waits forever.
//  * Pure arithmetic on doubles; not thread-safe (one owner).
#pragma once

#include <algorithm>

namespace deloco {

class TokenBucket {
 public:
  TokenBucket() : TokenBucket(0, 0) {}  // unbounded
  TokenBucket(double bytes_per_second, double burst_bytes) : rate_(bytes_per_second), burst_(burst_bytes) {}
  // A rate in Mbit/s (a config's unit; <= 0: unbounded) with a tenth of a second of burst.
  static TokenBucket mbit(double mbit_per_second) {
    const double r = mbit_per_second * 1e6 / 8;
    return TokenBucket(r, r / 10);
  }

  bool unbounded() const { return rate_ <= 0; }
  double tokens() const { return tokens_; }

  void refill(double t) {
    if (unbounded()) return;
    if (at_ >= 0 && t > at_) tokens_ = std::min(tokens_ + (t - at_) * rate_, burst_);
    if (at_ < 0 || t > at_) at_ = t;
  }

  bool take(double bytes) {
    if (unbounded()) return true;
    if (tokens_ < std::min(bytes, burst_)) return false;
    tokens_ -= bytes;
    return true;
  }

 private:
  double rate_, burst_;
  double tokens_ = 0, at_ = -1;
};

}  // namespace deloco
