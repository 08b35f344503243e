// TcpTuner on real sockets: a loopback TCP connection made here, its options read back from the kernel.
#include "net/tcp_tune.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>

namespace deloco::net {
namespace {

using namespace std::chrono_literals;

// A connected pair of TCP sockets on 127.0.0.1 (client end, accepted end), closed at the end of the scope.
struct TcpPair {
  int client = -1, server = -1;
  TcpPair() {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      ADD_FAILURE() << "cannot listen on loopback: " << std::strerror(errno);
    client = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ADD_FAILURE() << std::strerror(errno);
    server = ::accept(listener, nullptr, nullptr);
    ::close(listener);
  }
  ~TcpPair() {
    if (client >= 0) ::close(client);
    if (server >= 0) ::close(server);
  }
};

unsigned int user_timeout_ms(int fd) {
  unsigned int v = 0;
  socklen_t len = sizeof v;
  EXPECT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, &len), 0);
  return v;
}

std::string congestion(int fd) {
  char name[32] = {};
  socklen_t len = sizeof name;
  EXPECT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
  return std::string(name, ::strnlen(name, sizeof name));
}

TEST(TcpTuner, TheTimeoutCoversEightRetransmissionTimeoutsAndNeverLessThanTheFloor) {
  // Written from RFC 6298 (RTO = SRTT + 4·RTTVAR) and Linux's 200 ms minimum, not from the implementation.
  EXPECT_EQ(TcpTuner::timeout_for(10'000, 100, 50, 201'000), 10'000);  // a LAN: 8 × 201 ms = 1.6 s < the floor
  EXPECT_EQ(TcpTuner::timeout_for(10'000, 1'500'000, 500'000, 3'500'000), 28'000);  // 1 Mbit/s, 2 s queue: 8 × 3.5 s
  EXPECT_EQ(TcpTuner::timeout_for(1'000, 0, 0, 0), 1'600);
  EXPECT_EQ(TcpTuner::timeout_for(10'000, 100'000'000, 0, 0), TcpTuner::kMaxTimeoutMs);  // capped at 10 min
  // A retransmission chain doubles the current timeout at each expiry: fitted again while the peer's frames
  // arrive, the user timeout stays 8 current timeouts, above the chain's elapsed time (under 2 of them), so a
  // connection whose peer is heard is not dropped. Third expiry of a chain from a 3.5 s base: 28 s current.
  EXPECT_EQ(TcpTuner::timeout_for(10'000, 1'500'000, 500'000, 28'000'000), 224'000);
  EXPECT_GT(TcpTuner::timeout_for(10'000, 1'500'000, 500'000, 28'000'000), 3'500 * (1 + 2 + 4 + 8));
}

TEST(TcpTuner, AConnectionGetsItsFittedTimeoutOnceAndAgainOnlyAfterTheRefreshInterval) {
  TcpPair p;
  // A floor below what the link needs (8 × the 200 ms minimum): the tuner raises it.
  TcpTuner t(100ms, "");
  const auto t0 = TcpTuner::Clock::now();
  t.seen(p.server, t0);
  EXPECT_GE(user_timeout_ms(p.server), 1'600u);
  EXPECT_EQ(static_cast<unsigned int>(t.largest_timeout_ms()), user_timeout_ms(p.server));
  EXPECT_EQ(user_timeout_ms(p.client), 0u) << "only the descriptor a frame came on is touched";
  // Within the refresh interval nothing is read or set again (here: an option changed behind its back stays).
  const unsigned int other = 77;
  ASSERT_EQ(::setsockopt(p.server, IPPROTO_TCP, TCP_USER_TIMEOUT, &other, sizeof other), 0);
  t.seen(p.server, t0 + 500ms);
  EXPECT_EQ(user_timeout_ms(p.server), other);
  // After it the connection is fitted again... and since what it holds is what the tuner set last time, the tuner
  // (which does not read the option back) leaves it: the refresh sets only a changed fit.
  t.seen(p.server, t0 + 1500ms);
  EXPECT_EQ(user_timeout_ms(p.server), other);
}

TEST(TcpTuner, ADescriptorNumberReusedByAnotherConnectionIsTunedAfresh) {
  TcpTuner t(100ms, "");
  constexpr int kFd = 200;  // both connections' accepted ends are placed on this number in turn
  const auto t0 = TcpTuner::Clock::now();
  {
    TcpPair p;
    ASSERT_EQ(::dup2(p.server, kFd), kFd);
    t.seen(kFd, t0);
    EXPECT_GE(user_timeout_ms(kFd), 1'600u);
    ::close(kFd);
  }
  TcpPair q;
  ASSERT_EQ(::dup2(q.server, kFd), kFd);
  EXPECT_EQ(user_timeout_ms(kFd), 0u);
  t.seen(kFd, t0 + 10ms);  // within the old connection's refresh interval, but another socket: tuned at once
  EXPECT_GE(user_timeout_ms(kFd), 1'600u);
  ::close(kFd);
}

TEST(TcpTuner, WhatIsNotATcpSocketIsLeftAloneAndAZeroFloorFitsNothing) {
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  TcpTuner t(100ms, "reno");
  t.seen(pipefd[0]);
  t.seen(-1);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  t.seen(pair[0]);
  EXPECT_EQ(t.largest_timeout_ms(), 0);
  EXPECT_EQ(t.congestion_set(), 0u);
  for (int fd : {pipefd[0], pipefd[1], pair[0], pair[1]}) ::close(fd);

  TcpPair p;
  TcpTuner off(0ms, "");
  off.seen(p.server);
  EXPECT_EQ(user_timeout_ms(p.server), 0u) << "tcp_timeout = 0 leaves the OS's limits";
}

TEST(TcpTuner, TheCongestionControlAskedForIsSetOnEachNewConnection) {
  TcpPair p;
  // reno is built into every Linux kernel; the system default here is something else or the same, either way the
  // option must read back as reno afterwards.
  TcpTuner t(0ms, "reno");
  t.seen(p.server);
  t.seen(p.client);
  EXPECT_EQ(congestion(p.server), "reno");
  EXPECT_EQ(congestion(p.client), "reno");
  EXPECT_EQ(t.congestion_set(), 2u);
  EXPECT_EQ(user_timeout_ms(p.server), 0u) << "no floor: the timeout is not touched";
}

TEST(TcpTuner, ACongestionControlTheKernelLacksIsNamedWithThoseItOffers) {
  EXPECT_EQ(TcpTuner::unavailable(""), "");
  EXPECT_EQ(TcpTuner::unavailable("reno"), "");
  const std::string why = TcpTuner::unavailable("no_such_cc");
  EXPECT_NE(why.find("net.tcp_congestion = 'no_such_cc'"), std::string::npos) << why;
  EXPECT_NE(why.find("reno"), std::string::npos) << "the list of those offered: " << why;
}

}  // namespace
}  // namespace deloco::net
