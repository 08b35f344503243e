#include "deloco/fs.h"

#include <gtest/gtest.h>

#include "deloco/wire.h"

namespace deloco {
namespace {

TEST(Fs, FnvHexIsTheWireHashInHex) {
  EXPECT_EQ(fnv1a64_hex("", 0), "cbf29ce484222325");
  EXPECT_EQ(fnv1a64_hex("a", 1), "af63dc4c8601ec8c");
  EXPECT_EQ(fnv1a64_hex("foobar", 6), "85944171f73967e8");
  EXPECT_EQ(std::stoull(fnv1a64_hex("deloco", 6), nullptr, 16), fnv1a64("deloco", 6));
}

}  // namespace
}  // namespace deloco
