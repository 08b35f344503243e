#include "util/clock.h"

#include <chrono>
#include <cmath>

#include <gtest/gtest.h>

namespace deloco {
namespace clock_cases {

TEST(Clock, FormatDurationPadsAndTruncates) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(45.9), "45s");
  EXPECT_EQ(format_duration(60), "1m00s");
  EXPECT_EQ(format_duration(118.2), "1m58s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3600 + 5 * 60 + 59), "1h05m");
  EXPECT_EQ(format_duration(-3), "0s");
  EXPECT_EQ(format_duration(NAN), "0s");
}

TEST(Clock, UnixNowIsTheSystemClock) {
  const double sys = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(unix_now(), sys, 1.0);
  EXPECT_GT(unix_now(), 1.6e9);  // after 2020
}

}  // namespace
}  // namespace deloco
