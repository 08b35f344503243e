#include "net/tcp_tune.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

namespace deloco::net {

TcpTuner::TcpTuner(std::chrono::milliseconds floor, std::string congestion)
    : floor_(floor), congestion_(std::move(congestion)) {}

std::string TcpTuner::unavailable(const std::string& name) {
  if (name.empty()) return "";
  const char* kAvailable = "/proc/sys/net/ipv4/tcp_available_congestion_control";
  std::ifstream f(kAvailable);
  std::string line;
  if (!f || !std::getline(f, line))
    return "net.tcp_congestion = '" + name + "' needs Linux (" + kAvailable + " cannot be read here)";
  std::istringstream words(line);
  for (std::string w; words >> w;)
    if (w == name) return "";
  return "net.tcp_congestion = '" + name + "' is not a TCP congestion control this kernel offers (" + kAvailable +
         ": " + line + "; a module such as tcp_bbr may need loading)";
}

int64_t TcpTuner::timeout_for(int64_t floor_ms, uint32_t srtt_us, uint32_t rttvar_us, uint32_t rto_us) {
  // The base retransmission timeout as TCP computes it (RFC 6298), at least Linux's 200 ms minimum, or the current
  // one where a retransmission chain has doubled it.
  const int64_t base_us = static_cast<int64_t>(srtt_us) + 4 * static_cast<int64_t>(rttvar_us);
  const int64_t rto_ms = std::max<int64_t>(200, (std::max<int64_t>(base_us, rto_us) + 999) / 1000);
  return std::min(kMaxTimeoutMs, std::max(floor_ms, kRtoMultiple * rto_ms));
}

void TcpTuner::seen(int fd, Clock::time_point now) {
  if (fd < 0 || (floor_.count() <= 0 && congestion_.empty())) return;
  struct stat st;  // one fstat per frame: a descriptor number taken over by a new connection is tuned at once
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return;
  auto it = conns_.find(fd);
  const bool fresh = it == conns_.end() || it->second.dev != static_cast<uint64_t>(st.st_dev) ||
                     it->second.ino != static_cast<uint64_t>(st.st_ino);
  if (!fresh && (!it->second.tcp || now < it->second.next)) return;
  if (fresh) {
    Conn c;
    c.dev = static_cast<uint64_t>(st.st_dev);
    c.ino = static_cast<uint64_t>(st.st_ino);
    int type = 0, proto = 0;
    socklen_t len = sizeof type, plen = sizeof proto;
    c.tcp = ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM &&
            ::getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &plen) == 0 && proto == IPPROTO_TCP;
    it = conns_.insert_or_assign(fd, c).first;  // not TCP (ipc): remembered, so its frames cost one fstat each
    if (!c.tcp) return;
    if (!congestion_.empty() &&
        ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, congestion_.data(), static_cast<socklen_t>(congestion_.size())) == 0)
      ++congestion_set_;
  }
  Conn& c = it->second;
  c.next = now + kRefresh;
  if (floor_.count() <= 0) return;
  struct tcp_info info {};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return;
  const int64_t want = timeout_for(floor_.count(), info.tcpi_rtt, info.tcpi_rttvar, info.tcpi_rto);
  // The floor is what ZMQ_TCP_MAXRT set when the connection opened: nothing to do until the link asks for more.
  if (want == (c.set_ms > 0 ? c.set_ms : floor_.count())) return;
  const unsigned int ms = static_cast<unsigned int>(want);
  if (::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms) != 0) return;
  c.set_ms = want;
  largest_ms_ = std::max(largest_ms_, want);
}

}  // namespace deloco::net
