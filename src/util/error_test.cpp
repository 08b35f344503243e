// Every error class of the torch-free modules derives from deloco::Error (the torch-side ones are checked in
// src/merge/checkpoint_merge_test.cpp).
#include "deloco/error.h"

#include <type_traits>

#include <gtest/gtest.h>

#include "deloco/config.h"
#include "deloco/fs.h"
#include "deloco/transport.h"
#include "deloco/wire.h"

namespace deloco {
namespace {

static_assert(std::is_base_of_v<std::runtime_error, Error>);
static_assert(std::is_base_of_v<Error, ConfigError>);
static_assert(std::is_base_of_v<Error, IoError>);
static_assert(std::is_base_of_v<Error, TransportError>);
static_assert(std::is_base_of_v<Error, WireError>);

TEST(Error, ModuleErrorsAreCaughtAsDelocoErrorWithTheirMessage) {
  auto message_of = [](auto thrower) -> std::string {
    try {
      thrower();
    } catch (const Error& e) {
      return e.what();
    } catch (...) {
      return "not a deloco::Error";
    }
    return "nothing thrown";
  };
  EXPECT_EQ(message_of([] { throw ConfigError("bad key"); }), "bad key");
  EXPECT_EQ(message_of([] { throw IoError("no file"); }), "no file");
  EXPECT_EQ(message_of([] { throw WireError("bad magic"); }), "bad magic");
  EXPECT_EQ(message_of([] { read_file("/nonexistent/deloco/file"); }).rfind("cannot open", 0), 0u);
  EXPECT_EQ(message_of([] { throw std::runtime_error("other"); }), "not a deloco::Error");
}

}  // namespace
}  // namespace deloco
