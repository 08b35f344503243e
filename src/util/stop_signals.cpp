// SIGINT/SIGTERM as a stop request (contract in src/util/stop_signals.h).
#include "util/stop_signals.h"

#include <signal.h>

namespace deloco {
namespace {

StopSignals g_state;
struct sigaction g_old_int {}, g_old_term {};
bool g_installed = false;  // g_old_* hold the handlers to restore

static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "the signal handler may only touch lock-free atomics");

void on_stop_signal(int sig) {
  int none = 0;
  g_state.first.compare_exchange_strong(none, sig);
  g_state.requested.store(true);
}

}  // namespace

StopSignals& install_stop_signals() {
  g_state.requested.store(false);
  g_state.first.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, g_installed ? nullptr : &g_old_int);
  ::sigaction(SIGTERM, &sa, g_installed ? nullptr : &g_old_term);
  g_installed = true;
  return g_state;
}

void restore_stop_signals() {
  if (!g_installed) return;
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  g_installed = false;
}

}  // namespace deloco
