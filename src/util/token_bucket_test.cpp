#include "util/token_bucket.h"

#include <gtest/gtest.h>

namespace deloco {
namespace token_bucket_cases {

TEST(TokenBucket, UnboundedAlwaysPasses) {
  TokenBucket b(0, 100);
  b.refill(0);
  EXPECT_TRUE(b.unbounded());
  EXPECT_TRUE(b.take(1e12));
}

TEST(TokenBucket, StartsEmptyAndFillsAtItsRate) {
  TokenBucket b(1000, 500);  // 1000 B/s, 500 B burst
  b.refill(10.0);
  EXPECT_FALSE(b.take(1));  // empty at the start
  b.refill(10.2);           // 200 B
  EXPECT_FALSE(b.take(300));
  EXPECT_TRUE(b.take(150));
  EXPECT_NEAR(b.tokens(), 50, 1e-9);
}

TEST(TokenBucket, NeverHoldsMoreThanItsBurst) {
  TokenBucket b(1000, 500);
  b.refill(0);
  b.refill(100);  // 100 s idle: still only the burst
  EXPECT_TRUE(b.take(500));
  EXPECT_FALSE(b.take(1));
}

TEST(TokenBucket, ATimeGoingBackAddsNothing) {
  TokenBucket b(1000, 500);
  b.refill(5);
  b.refill(4);  // earlier: no tokens, and the start stays at 5
  EXPECT_FALSE(b.take(1));
  b.refill(5.125);  // 125 B
  EXPECT_TRUE(b.take(125));
  EXPECT_FALSE(b.take(1));
}

TEST(TokenBucket, AUnitLargerThanTheBurstPassesWhenFullAndIsRepaid) {
  TokenBucket b(1024, 128);  // times below are binary fractions: exact arithmetic
  b.refill(0);
  b.refill(0.0625);            // 64 B: half full
  EXPECT_FALSE(b.take(512));
  b.refill(1.0);
  EXPECT_TRUE(b.take(512));    // full: passes, 384 in debt
  EXPECT_EQ(b.tokens(), -384);
  b.refill(1.375);             // debt repaid, empty again
  EXPECT_FALSE(b.take(1));
  b.refill(1.5);
  EXPECT_TRUE(b.take(512));
}

TEST(TokenBucket, SendsAtTheRateOverTime) {
  // Taking 100-byte units as fast as allowed for 10 s at 1000 B/s passes 10000 bytes, give or take one burst.
  TokenBucket b(1000, 200);
  double sent = 0;
  for (int i = 0; i <= 10000; ++i) {
    b.refill(i * 0.001);
    while (b.take(100)) sent += 100;
  }
  EXPECT_GE(sent, 9800);
  EXPECT_LE(sent, 10200);
  // Units five times the burst: the same average.
  TokenBucket big(1000, 100);
  sent = 0;
  for (int i = 0; i <= 10000; ++i) {
    big.refill(i * 0.001);
    while (big.take(500)) sent += 500;
  }
  EXPECT_GE(sent, 9500);
  EXPECT_LE(sent, 10600);
}

}  // namespace
}  // namespace deloco
