// util/stop_signals.h — SIGINT and SIGTERM as a stop request for a process's main loop (`deloco train`,
// `deloco syncer`, `deloco learner`, `deloco run`).
//
// Contract
//  * install_stop_signals() resets the process-wide StopSignals, then installs handlers for SIGINT and SIGTERM
//    (sigaction, SA_RESTART) that set `requested` and record the first of them in `first`. It returns that state,
//    which lives as long as the process. Calling it again re-installs the handlers and resets the state.
//  * restore_stop_signals() puts back the handlers that were there before the first install_stop_signals() since
//    the last restore (a no-op when none is installed).
//  * The handler only stores to lock-free atomics (async-signal-safe); read the state from any thread.
//  * Call both from the main thread, not concurrently with each other.
#pragma once

#include <atomic>

namespace deloco {

struct StopSignals {
  std::atomic<bool> requested{false};  // a SIGINT or SIGTERM arrived
  std::atomic<int> first{0};           // the first one's number (0: none yet)
};

StopSignals& install_stop_signals();
void restore_stop_signals();

}  // namespace deloco
