// flood_attack: the attacker side of bench/flood.sh. Each subcommand floods a running `deloco syncer` one way,
// prints what happened (one line of key=value pairs), and exits. Memory is measured by the script, not here.
//
//   flood_attack handshake ENDPOINT CONNECTIONS DECLARED_BYTES SEND_BYTES HOLD_S
//       CONNECTIONS raw TCP peers without a key, each sending a ZMTP 3.0 greeting for CURVE and then a handshake
//       frame declaring DECLARED_BYTES, and streaming SEND_BYTES of it (then stalling) until the server closes the
//       connection; peers still open are held until HOLD_S seconds have passed. (issue 11, item 1)
//   flood_attack multiframe ENDPOINT KEY SERVER_PUB FRAMES FRAME_BYTES MESSAGES HOLD_S [unfinished]
//       an authenticated DEALER (KEY: a learner's .key, SERVER_PUB: the syncer's .pub) sending MESSAGES messages of
//       FRAMES frames of FRAME_BYTES each, then holding the connection until HOLD_S. With "unfinished" the last
//       message's final frame is never sent; note that libzmq itself then never sends that message's frames (it
//       flushes a message on its last frame), so this measures nothing unless the attacker speaks ZMTP by hand.
//       (item 5)
//   flood_attack hello ENDPOINT KEY SERVER_PUB FINGERPRINT LEARNER COUNT HOLD_S
//       an authenticated DEALER sending COUNT hellos for LEARNER that ask for the state, reading nothing, then
//       holding the connection HOLD_S seconds. (item 4)
//   flood_attack slowloris HOST:PORT CONNECTIONS SECONDS SCRAPES
//       CONNECTIONS clients each starting a request and sending one more byte every 1.5 s for SECONDS, while
//       SCRAPES plain GET /metrics run spread over those SECONDS: how many succeeded, their latencies, and when
//       the slow clients were cut.
//       (item 10)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "deloco/transport.h"
#include "deloco/wire.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int tcp_connect(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) throw std::runtime_error("bad IPv4 address " + host);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot connect to " + host + ":" + std::to_string(port));
  }
  return fd;
}

// "tcp://host:port" → (host, port)
std::pair<std::string, int> host_port(const std::string& endpoint) {
  std::string s = endpoint.rfind("tcp://", 0) == 0 ? endpoint.substr(6) : endpoint;
  const size_t c = s.rfind(':');
  if (c == std::string::npos) throw std::runtime_error("endpoint " + endpoint + " has no port");
  return {s.substr(0, c), std::stoi(s.substr(c + 1))};
}

// ---------------------------------------------------------------------------------------------------------------
int handshake(const std::string& endpoint, int connections, uint64_t declared, uint64_t send_bytes, double hold_s) {
  const uint64_t body = std::min(declared, send_bytes);
  const auto [host, port] = host_port(endpoint);
  std::string head(64, '\0');
  head[0] = static_cast<char>(0xff);
  head[9] = 0x7f;
  head[10] = 3;
  std::memcpy(&head[12], "CURVE", 5);
  head.push_back(0x06);  // long command frame
  for (int i = 7; i >= 0; --i) head.push_back(static_cast<char>((declared >> (8 * i)) & 0xff));
  struct Peer {
    int fd;
    uint64_t sent = 0;
    bool open = true;
    double closed_at = -1;
  };
  std::vector<Peer> peers;
  const auto t0 = Clock::now();
  for (int i = 0; i < connections; ++i) {
    Peer p{tcp_connect(host, port)};
    ::send(p.fd, head.data(), head.size(), MSG_NOSIGNAL);
    peers.push_back(p);
  }
  const std::string chunk(256 * 1024, 'j');
  while (since(t0) < hold_s) {
    std::vector<pollfd> fds;
    for (auto& p : peers)
      if (p.open) fds.push_back({p.fd, static_cast<short>(POLLIN | (p.sent < body ? POLLOUT : 0)), 0});
    if (fds.empty()) break;
    if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
    size_t k = 0;
    for (auto& p : peers) {
      if (!p.open) continue;
      const pollfd& f = fds[k++];
      bool closed = false;
      if (f.revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[512];
        const ssize_t n = ::recv(p.fd, buf, sizeof buf, MSG_DONTWAIT);
        closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
      }
      if (!closed && (f.revents & POLLOUT) && p.sent < body) {
        const ssize_t n = ::send(p.fd, chunk.data(), std::min<uint64_t>(chunk.size(), body - p.sent),
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) p.sent += static_cast<uint64_t>(n);
        closed = n < 0 && errno != EAGAIN && errno != EINTR;
      }
      if (closed) {
        p.open = false;
        p.closed_at = since(t0);
        ::close(p.fd);
      }
    }
  }
  int dropped = 0;
  uint64_t most = 0;
  double last_close = 0;
  for (auto& p : peers) {
    dropped += !p.open;
    most = std::max(most, p.sent);
    last_close = std::max(last_close, p.closed_at);
    if (p.open) ::close(p.fd);
  }
  std::printf("connections=%d dropped_by_server=%d max_bytes_sent_per_connection=%llu last_drop_s=%.2f\n",
              connections, dropped, static_cast<unsigned long long>(most), last_close);
  return 0;
}

// ---------------------------------------------------------------------------------------------------------------
struct Dealer {
  void* ctx = zmq_ctx_new();
  void* s = nullptr;
  Dealer(const std::string& endpoint, const std::string& key, const std::string& server_pub) {
    s = zmq_socket(ctx, ZMQ_DEALER);
    const deloco::KeyPair own = deloco::read_secret_key_file(key);
    const std::string server = deloco::read_public_key_file(server_pub);
    const int zero = 0, timeout = 2000, hwm = 100000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server.c_str(), 41);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, own.public_key.c_str(), 41);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, own.secret_key.c_str(), 41);
    if (zmq_connect(s, endpoint.c_str()) != 0) throw std::runtime_error("cannot connect to " + endpoint);
  }
  ~Dealer() {
    zmq_close(s);
    zmq_ctx_term(ctx);
  }
  // Zero copy: `frame` must outlive the socket (big frames are sent many times from one buffer).
  bool send(const std::string& frame, bool more) {
    zmq_msg_t m;
    zmq_msg_init_data(&m, const_cast<char*>(frame.data()), frame.size(), [](void*, void*) {}, nullptr);
    if (zmq_msg_send(&m, s, more ? ZMQ_SNDMORE : 0) >= 0) return true;
    zmq_msg_close(&m);
    return false;
  }
};

int multiframe(const std::string& endpoint, const std::string& key, const std::string& pub, int frames,
               size_t frame_bytes, int messages, double hold_s, bool unfinished) {
  const std::string frame(frame_bytes, 'f');  // before the socket: it must outlive it (zero copy)
  Dealer d(endpoint, key, pub);
  const auto t0 = Clock::now();
  long long sent_frames = 0, failed = 0;
  for (int m = 0; m < messages; ++m)
    for (int f = 0; f < frames; ++f) {
      const bool last = f + 1 == frames;
      if (last && unfinished && m + 1 == messages) break;  // never finish the last message
      if (d.send(frame, !last)) ++sent_frames;
      else ++failed;
    }
  const double took = since(t0);
  std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, hold_s - took)));
  std::printf("messages=%d frames_per_message=%d frame_bytes=%zu frames_queued=%lld send_failures=%lld "
              "unfinished=%d send_seconds=%.2f\n",
              messages, frames, frame_bytes, sent_frames, failed, unfinished ? 1 : 0, took);
  return 0;
}

// ---------------------------------------------------------------------------------------------------------------
int hello(const std::string& endpoint, const std::string& key, const std::string& pub, const std::string& fp,
          int learner, int count, double hold_s) {
  deloco::MessageHeader h;
  h.kind = deloco::MessageKind::kHello;
  h.fingerprint = deloco::parse_fingerprint_hex(fp);
  h.learner_id = static_cast<uint32_t>(learner);
  // The body of protocol.h's Hello; every one from the same process instance, as a retrying learner would.
  const std::string body = nlohmann::json{{"learner", learner}, {"instance", "00000000000000aa"}, {"step", 0},
                                          {"want_state", true}}
                               .dump();
  h.element_count = body.size();
  const std::string msg = deloco::encode_message(h, body);
  const std::string head = msg.substr(0, deloco::kWireHeaderBytes), payload = msg.substr(deloco::kWireHeaderBytes);
  Dealer d(endpoint, key, pub);  // after the frames it sends without copying
  const auto t0 = Clock::now();
  int sent = 0;
  for (int i = 0; i < count; ++i)
    if (d.send(head, true) && d.send(payload, false)) ++sent;
  const double took = since(t0);
  std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, hold_s - took)));
  std::printf("hellos=%d sent=%d send_seconds=%.2f (nothing read back)\n", count, sent, took);
  return 0;
}

// ---------------------------------------------------------------------------------------------------------------
std::string http_get(const std::string& host, int port, double timeout_s) {
  const int fd = tcp_connect(host, port);
  const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (auto t0 = Clock::now(); since(t0) < timeout_s;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

int slowloris(const std::string& hp, int connections, double seconds, int scrapes) {
  const size_t c = hp.rfind(':');
  const std::string host = hp.substr(0, c);
  const int port = std::stoi(hp.substr(c + 1));
  struct Slow {
    int fd;
    bool open = true;
    double cut_at = -1;
  };
  std::vector<Slow> slow;
  const auto t0 = Clock::now();
  for (int i = 0; i < connections; ++i) {
    Slow s{tcp_connect(host, port)};
    ::send(s.fd, "GET /metrics HTTP/1.1\r\nX-Slow: ", 31, MSG_NOSIGNAL);
    slow.push_back(s);
  }
  // The slow clients' trickle runs on its own thread while this one scrapes.
  std::thread trickle([&] {
    double next = 1.5;
    while (since(t0) < seconds) {
      for (auto& s : slow) {
        if (!s.open) continue;
        char buf[512];
        const ssize_t n = ::recv(s.fd, buf, sizeof buf, MSG_DONTWAIT);
        bool closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
        if (!closed && since(t0) >= next) closed = ::send(s.fd, "a", 1, MSG_NOSIGNAL) != 1;
        if (closed) {
          s.open = false;
          s.cut_at = since(t0);
        }
      }
      if (since(t0) >= next) next += 1.5;
      std::this_thread::sleep_for(20ms);
    }
  });
  std::vector<double> lat;  // of the successful scrapes
  int ok = 0;
  for (int i = 0; i < scrapes; ++i) {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, seconds * i / scrapes - since(t0))));
    const auto s0 = Clock::now();
    const std::string r = http_get(host, port, 30);
    if (r.find(" 200 ") != std::string::npos) {
      ++ok;
      lat.push_back(since(s0));
    }
  }
  trickle.join();
  int cut = 0;
  double last_cut = 0;
  for (auto& s : slow) {
    cut += !s.open;
    last_cut = std::max(last_cut, s.cut_at);
    ::close(s.fd);
  }
  std::sort(lat.begin(), lat.end());
  std::printf("slow_clients=%d cut_by_server=%d last_cut_s=%.2f scrapes=%d ok=%d scrape_median_ms=%.1f "
              "scrape_max_ms=%.1f\n",
              connections, cut, last_cut, scrapes, ok, lat.empty() ? 0 : 1000 * lat[lat.size() / 2],
              lat.empty() ? 0 : 1000 * lat.back());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.size() == 6 && a[0] == "handshake")
      return handshake(a[1], std::stoi(a[2]), std::stoull(a[3]), std::stoull(a[4]), std::stod(a[5]));
    if ((a.size() == 8 || a.size() == 9) && a[0] == "multiframe")
      return multiframe(a[1], a[2], a[3], std::stoi(a[4]), std::stoull(a[5]), std::stoi(a[6]), std::stod(a[7]),
                        a.size() == 9 && a[8] == "unfinished");
    if (a.size() == 8 && a[0] == "hello")
      return hello(a[1], a[2], a[3], a[4], std::stoi(a[5]), std::stoi(a[6]), std::stod(a[7]));
    if (a.size() == 5 && a[0] == "slowloris")
      return slowloris(a[1], std::stoi(a[2]), std::stod(a[3]), std::stoi(a[4]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flood_attack: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: see the top of bench/flood_attack.cpp\n");
  return 2;
}
