#include "util/stop_signals.h"

#include <signal.h>

#include <gtest/gtest.h>

namespace deloco {
namespace stop_signals_cases {

TEST(StopSignals, RecordsTheFirstSignalAndRestoresTheOldHandlers) {
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  StopSignals& s = install_stop_signals();
  EXPECT_FALSE(s.requested.load());
  EXPECT_EQ(s.first.load(), 0);
  ::raise(SIGTERM);
  ::raise(SIGINT);
  EXPECT_TRUE(s.requested.load());
  EXPECT_EQ(s.first.load(), SIGTERM);  // the first one wins
  EXPECT_EQ(&install_stop_signals(), &s);  // installing again resets the same state
  EXPECT_FALSE(s.requested.load());
  EXPECT_EQ(s.first.load(), 0);
  restore_stop_signals();
  struct sigaction after {};
  ::sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

}  // namespace
}  // namespace deloco
