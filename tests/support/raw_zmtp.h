// tests/support/raw_zmtp.h — a peer without a key, written in raw bytes: what a stranger can send a ZeroMQ CURVE
// server before any authentication. Used by the transport tests (src/net) and the real-syncer tests (src/roles).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

namespace deloco::testing {

// A plain TCP connection to 127.0.0.1:port (-1 on failure).
inline int tcp_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A ZMTP 3.0 greeting asking for the CURVE mechanism (as a client), followed by the header of a long command
// frame declaring `declared` bytes.
inline std::string curve_greeting_and_frame_header(uint64_t declared) {
  std::string g(64, '\0');
  g[0] = static_cast<char>(0xff);  // signature: 0xff, 8 bytes of padding, 0x7f
  g[9] = 0x7f;
  g[10] = 3;  // version 3.0
  g[11] = 0;
  std::memcpy(&g[12], "CURVE", 5);  // mechanism, NUL-padded to 20 bytes; as-server = 0; filler
  g.push_back(0x06);                // flags: long frame, command
  for (int i = 7; i >= 0; --i) g.push_back(static_cast<char>((declared >> (8 * i)) & 0xff));  // size, big-endian
  return g;
}

// Writes up to `total` bytes of junk to `fd` until the peer closes or resets the connection; returns the bytes
// written then, or -1 when it was still open after `within`.
inline long long stream_until_closed(int fd, size_t total, std::chrono::milliseconds within) {
  using Clock = std::chrono::steady_clock;
  const std::string chunk(64 * 1024, 'j');
  size_t sent = 0;
  const auto end = Clock::now() + within;
  while (Clock::now() < end) {
    pollfd p{fd, static_cast<short>(POLLIN | (sent < total ? POLLOUT : 0)), 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[256];
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);  // the server's greeting, then EOF or reset
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return static_cast<long long>(sent);
    }
    if ((p.revents & POLLOUT) && sent < total) {
      const ssize_t n = ::send(fd, chunk.data(), std::min(chunk.size(), total - sent), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EINTR) return static_cast<long long>(sent);
      if (n > 0) sent += static_cast<size_t>(n);
    }
  }
  return -1;
}

// One keyless peer: connects, sends the greeting and a frame header declaring `declared` bytes, and streams the
// frame. Returns the bytes of the frame sent before the server closed the connection; -1 when it was still open
// after `within`, -2 when it could not connect or send the header.
inline long long oversized_handshake(int port, uint64_t declared, std::chrono::milliseconds within) {
  const int fd = tcp_connect(port);
  if (fd < 0) return -2;
  const std::string head = curve_greeting_and_frame_header(declared);
  if (::send(fd, head.data(), head.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(head.size())) {
    ::close(fd);
    return -2;
  }
  const long long sent = stream_until_closed(fd, declared, within);
  ::close(fd);
  return sent;
}

}  // namespace deloco::testing

namespace deloco::testing {

// A plaintext ZeroMQ DEALER written in raw bytes over a Unix socket (an ipc:// endpoint): the ZMTP 3.0 greeting
// with the NULL mechanism and a READY command, then two-frame messages, and it never reads what the server sends:
// what an attacker who stops reading looks like to the server. -1 when it cannot connect.
inline int unix_connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    ::close(fd);
    return -1;
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One ZMTP frame: flags (more, command) and the size in the short or the long form.
inline std::string zmtp_frame(const std::string& body, bool more, bool command = false) {
  std::string f;
  const bool lng = body.size() > 255;
  f.push_back(static_cast<char>((more ? 0x01 : 0) | (lng ? 0x02 : 0) | (command ? 0x04 : 0)));
  if (lng) {
    for (int i = 7; i >= 0; --i) f.push_back(static_cast<char>((static_cast<uint64_t>(body.size()) >> (8 * i)) & 0xff));
  } else {
    f.push_back(static_cast<char>(body.size()));
  }
  return f + body;
}

// The greeting (NULL mechanism, as a client) and READY (Socket-Type DEALER).
inline std::string zmtp_null_dealer_handshake() {
  std::string g(64, '\0');
  g[0] = static_cast<char>(0xff);
  g[9] = 0x7f;
  g[10] = 3;
  std::memcpy(&g[12], "NULL", 4);
  std::string ready = std::string("\x05READY", 6) + std::string("\x0bSocket-Type", 12) + std::string("\0\0\0\x06", 4) + "DEALER";
  return g + zmtp_frame(ready, false, true);
}

// Reads exactly n bytes within `within` (false on EOF, an error or the deadline).
inline bool read_exactly(int fd, char* out, size_t n, std::chrono::milliseconds within) {
  const auto end = std::chrono::steady_clock::now() + within;
  size_t got = 0;
  while (got < n && std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    const ssize_t r = ::recv(fd, out + got, n - got, 0);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) return false;
    if (r > 0) got += static_cast<size_t>(r);
  }
  return got == n;
}

// The server's side of the handshake: its greeting and its READY command. libzmq drops a connection whose first
// message arrives before its handshake (with a ZAP handler, the READY's check) is done, so a raw client sends
// messages only after this returns true.
inline bool zmtp_await_ready(int fd, std::chrono::milliseconds within = std::chrono::seconds(10)) {
  char greeting[64];
  if (!read_exactly(fd, greeting, sizeof greeting, within)) return false;
  unsigned char head[2];
  if (!read_exactly(fd, reinterpret_cast<char*>(head), 2, within) || !(head[0] & 0x04) || (head[0] & 0x02)) return false;
  std::string body(head[1], '\0');
  return read_exactly(fd, body.data(), body.size(), within) && body.compare(0, 6, "\x05READY") == 0;
}

// Writes all of `bytes` (blocking); false when the connection failed.
inline bool write_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace deloco::testing
