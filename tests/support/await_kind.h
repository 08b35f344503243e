// tests/support/await_kind.h — a hand-made learner's receive loop: wait for the next message of one kind from the
// syncer, counting every kind seen on the way. Shared by the roles tests that drive a syncer by hand.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "deloco/transport.h"
#include "deloco/wire.h"

namespace deloco::testing {

// The next message of `kind` on `tx` within `seconds`, as (header, payload); every message received (of any kind)
// is counted in `seen`. nullopt on timeout.
inline std::optional<std::pair<MessageHeader, std::string>> await_kind(ClientTransport& tx, MessageKind kind,
                                                                       double seconds,
                                                                       std::map<MessageKind, int>& seen) {
  using clk = std::chrono::steady_clock;
  const auto deadline = clk::now() + std::chrono::duration<double>(seconds);
  while (clk::now() < deadline) {
    Envelope env;
    if (!tx.receive(&env, std::chrono::milliseconds(20))) continue;
    const MessageHeader h = decode_header(env.header.data(), env.header.size());
    ++seen[h.kind];
    if (h.kind == kind) return std::make_pair(h, env.payload.str());
  }
  return std::nullopt;
}

}  // namespace deloco::testing
