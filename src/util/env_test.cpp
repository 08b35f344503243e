#include "util/env.h"

#include <cstdlib>
#include <limits>

#include <gtest/gtest.h>

#include "deloco/config.h"

namespace deloco {
namespace env_cases {

// Sets a variable for one test and restores the unset state after it.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { ::setenv(n, value, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
};

std::string error_of(const char* name, int64_t lo, int64_t hi) {
  try {
    environment_integer_in(name, 0, lo, hi);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Environment, StringIsTheValueAndEmptyCountsAsUnset) {
  ::unsetenv("DELOCO_TEST_ENV");
  EXPECT_EQ(environment_string("DELOCO_TEST_ENV", "dflt"), "dflt");
  EXPECT_EQ(environment_string("DELOCO_TEST_ENV"), "");
  {
    ScopedEnv e("DELOCO_TEST_ENV", "");
    EXPECT_EQ(environment_string("DELOCO_TEST_ENV", "dflt"), "dflt");
  }
  ScopedEnv e("DELOCO_TEST_ENV", "tcp://h:1");
  EXPECT_EQ(environment_string("DELOCO_TEST_ENV", "dflt"), "tcp://h:1");
}

TEST(Environment, IntegerParsesWholeNumbersInRange) {
  ::unsetenv("DELOCO_TEST_INT");
  EXPECT_EQ(environment_integer_in("DELOCO_TEST_INT", -7, 0, 10), -7);
  ScopedEnv e("DELOCO_TEST_INT", "10");
  EXPECT_EQ(environment_integer_in("DELOCO_TEST_INT", -7, 0, 10), 10);
  ::setenv("DELOCO_TEST_INT", "-3", 1);
  EXPECT_EQ(environment_integer_in("DELOCO_TEST_INT", 0, -5, 5), -3);
}

TEST(Environment, IntegerRefusesTextTrailingCharactersAndOutOfRangeByName) {
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  ScopedEnv e("DELOCO_TEST_INT", "3x");
  EXPECT_EQ(error_of("DELOCO_TEST_INT", lo, hi), "DELOCO_TEST_INT='3x' is not an integer");
  ::setenv("DELOCO_TEST_INT", "one", 1);
  EXPECT_EQ(error_of("DELOCO_TEST_INT", lo, hi), "DELOCO_TEST_INT='one' is not an integer");
  ::setenv("DELOCO_TEST_INT", "99999999999999999999", 1);
  EXPECT_EQ(error_of("DELOCO_TEST_INT", lo, hi), "DELOCO_TEST_INT='99999999999999999999' is not an integer");
  ::setenv("DELOCO_TEST_INT", "11", 1);
  EXPECT_EQ(error_of("DELOCO_TEST_INT", 1, 10), "DELOCO_TEST_INT='11' is not an integer in [1, 10]");
  ::setenv("DELOCO_TEST_INT", "0", 1);
  EXPECT_EQ(error_of("DELOCO_TEST_INT", 1, 10), "DELOCO_TEST_INT='0' is not an integer in [1, 10]");
}

}  // namespace
}  // namespace deloco
