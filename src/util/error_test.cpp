// Every deloco error class (all declared in deloco/error.h) derives from deloco::Error, and so from
// std::runtime_error, and carries its message; the module headers still name the same types.
#include "deloco/error.h"

#include <string>
#include <type_traits>

#include <gtest/gtest.h>

#include "deloco/config.h"
#include "deloco/transport.h"
#include "deloco/wire.h"
#include "util/fs.h"

namespace deloco {
namespace error_cases {

static_assert(std::is_base_of_v<std::runtime_error, Error>);
static_assert(std::is_base_of_v<Error, ConfigError>);
static_assert(std::is_base_of_v<Error, IoError>);
static_assert(std::is_base_of_v<Error, DataError>);
static_assert(std::is_base_of_v<Error, TokenizerError>);
static_assert(std::is_base_of_v<Error, SafetensorsError>);
static_assert(std::is_base_of_v<Error, CheckpointError>);
static_assert(std::is_base_of_v<Error, ModelError>);  // constructed in the torch tests (its constructors need libtorch)
static_assert(std::is_base_of_v<Error, MergeError>);
static_assert(std::is_base_of_v<Error, OuterError>);
static_assert(std::is_base_of_v<Error, SyncError>);
static_assert(std::is_base_of_v<Error, WireError>);
static_assert(std::is_base_of_v<WireError, NonFiniteError>);
static_assert(std::is_base_of_v<Error, TransportError>);
static_assert(std::is_base_of_v<Error, RefusedError>);
static_assert(std::is_base_of_v<Error, GroupError>);
static_assert(std::is_base_of_v<Error, GoodputError>);
static_assert(std::is_base_of_v<Error, RunError>);

template <class Thrower>
std::string message_of(Thrower thrower) {
  try {
    thrower();
  } catch (const Error& e) {
    return e.what();
  } catch (...) {
    return "not a deloco::Error";
  }
  return "nothing thrown";
}

// Thrown as E, caught as deloco::Error, as std::runtime_error and as E itself, with the message intact.
template <class E>
void expect_caught_with_message(const std::string& message) {
  SCOPED_TRACE(message);
  EXPECT_EQ(message_of([&] { throw E(message); }), message);
  try {
    throw E(message);
  } catch (const E& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
  try {
    throw E(message);
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(Error, EveryErrorClassIsADelocoErrorCarryingItsMessage) {
  expect_caught_with_message<Error>("base");
  expect_caught_with_message<ConfigError>("bad key");
  expect_caught_with_message<IoError>("no file");
  expect_caught_with_message<DataError>("bad shard");
  expect_caught_with_message<TokenizerError>("bad vocab");
  expect_caught_with_message<SafetensorsError>("bad header");
  expect_caught_with_message<CheckpointError>("optimizer state lacks 'step'");
  expect_caught_with_message<MergeError>("bad merge");
  expect_caught_with_message<OuterError>("bad outer");
  expect_caught_with_message<SyncError>("bad sync");
  expect_caught_with_message<WireError>("bad magic");
  expect_caught_with_message<NonFiniteError>("NaN");
  expect_caught_with_message<TransportError>("cannot connect");
  expect_caught_with_message<RefusedError>("the syncer refused learner 3: fingerprint_mismatch");
  expect_caught_with_message<GroupError>("learner group: rank 0 sent a malformed control message");
  expect_caught_with_message<GoodputError>("goodput --fit: NLopt could not create its optimizer");
  expect_caught_with_message<RunError>("fork failed: out of memory");
  // NonFiniteError is also a WireError (the syncer counts both apart, but a WireError handler sees it).
  EXPECT_EQ(message_of([] {
              try {
                throw NonFiniteError("inf scale");
              } catch (const WireError& e) {
                throw Error(std::string("wire: ") + e.what());
              }
            }),
            "wire: inf scale");
}

TEST(Error, ModuleErrorsAreCaughtAsDelocoErrorWithTheirMessage) {
  EXPECT_EQ(message_of([] { read_file("/nonexistent/deloco/file"); }).rfind("cannot open", 0), 0u);
  EXPECT_EQ(message_of([] { throw std::runtime_error("other"); }), "not a deloco::Error");
}

}  // namespace
}  // namespace deloco
