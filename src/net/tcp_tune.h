// TCP settings fitted to each connection's link, applied by the ZeroMQ transports (zmq_server.cpp, zmq_client.cpp)
// to the descriptors their received frames came on (ZMQ_SRCFD). Not a public header: the contract is
// TransportOptions::tcp_timeout and ::tcp_congestion in deloco/transport.h, and docs/transport.md.
//
// Why: `net.tcp_timeout` (TCP_USER_TIMEOUT through ZMQ_TCP_MAXRT) drops a connection whose data stays
// unacknowledged that long, so that after a cut heals the learner dials afresh instead of waiting out TCP's backoff.
// On a slow link with a deep queue (1 Mbit/s behind 256 KiB: 2 s of queueing) the base retransmission timeout is
// seconds, two retransmissions of one segment lost in a row already take longer than 10 s, and a healthy
// connection was dropped (the testbed's syncer host counted it in TcpExtTCPAbortOnTimeout; its learner had to join
// again and lost its pushes in flight: its base retransmission timeout there is 8–9 s, so the 10 s timeout dropped
// the connection at the second expiry, after one lost retransmission). The timeout of an established connection is
// therefore kRtoMultiple retransmission timeouts of that connection, never less than the configured floor, fitted
// again (at most once a second) whenever a frame arrives on it. The retransmission timeout is the larger of the base
// one (srtt + 4·rttvar, as TCP_INFO reports them) and the kernel's current one (tcpi_rto, doubled by each expiry of
// a retransmission chain). The expiries of a chain come at 1, 3, 7, 15 ... base timeouts: with 8 base timeouts a
// connection is dropped at the fourth expiry, once three retransmissions of a segment were lost in a row, and while
// frames keep arriving from the peer (it is alive: only our direction loses) the timeout grows with the backoff,
// staying above the time elapsed (under 2 timeouts of the current backoff), so such a connection is not dropped at
// all. A cut stops the frames: the timeout fitted before it holds (on a fast link the floor), as before.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace deloco::net {

class TcpTuner {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kRtoMultiple = 8;
  static constexpr int64_t kMaxTimeoutMs = 600'000;  // 10 min: beyond that the OS's own limits take over anyway
  static constexpr std::chrono::milliseconds kRefresh{1000};  // each connection re-fitted at most this often

  // floor: TransportOptions::tcp_timeout (0: leave the timeout to the OS, fit nothing). congestion: a TCP congestion
  // control this kernel offers (net.ipv4.tcp_available_congestion_control), or "" for the system's default.
  TcpTuner(std::chrono::milliseconds floor, std::string congestion);

  // A frame arrived on descriptor fd (ZMQ_SRCFD; negative: unknown). A connection is recognised by the socket's
  // inode, so a descriptor number reused by a later connection is tuned afresh. Never throws; a descriptor that is
  // not a TCP socket is left alone.
  void seen(int fd, Clock::time_point now = Clock::now());

  // The largest TCP_USER_TIMEOUT set on any connection so far (ms; 0: none set), and how many connections got the
  // congestion control asked for (those the kernel refused it are not counted).
  int64_t largest_timeout_ms() const { return largest_ms_; }
  uint64_t congestion_set() const { return congestion_set_; }

  // "" when this kernel offers the congestion control `name` (or name is ""), else why not, naming those it offers.
  static std::string unavailable(const std::string& name);

  // The user timeout for a connection whose TCP_INFO reads srtt, rttvar and rto (microseconds): the rule above.
  static int64_t timeout_for(int64_t floor_ms, uint32_t srtt_us, uint32_t rttvar_us, uint32_t rto_us);

 private:
  struct Conn {
    uint64_t dev = 0, ino = 0;
    bool tcp = false;        // a TCP socket (else left alone)
    Clock::time_point next;  // not re-fitted before this
    int64_t set_ms = 0;      // what it holds now (0: ZMQ_TCP_MAXRT's, the floor)
  };
  std::chrono::milliseconds floor_;
  std::string congestion_;
  std::unordered_map<int, Conn> conns_;
  int64_t largest_ms_ = 0;
  uint64_t congestion_set_ = 0;
};

}  // namespace deloco::net
