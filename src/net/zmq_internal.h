// Internal to the ZeroMQ transports (zmq_server.cpp, zmq_client.cpp): the context and socket wrappers, the frame
// helpers (payloads handed to ZeroMQ by reference, received frames wrapped), the counters and the option helpers.
// Not a public header: see deloco/transport.h for the contract.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "deloco/transport.h"
#include "net/tcp_tune.h"

namespace deloco::zmq_detail {

using Clock = std::chrono::steady_clock;

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";  // fixed by RFC 27, per context
constexpr const char* kMonitorEndpoint = "inproc://deloco.server.monitor";
constexpr const char* kClientMonitorEndpoint = "inproc://deloco.client.monitor";  // one client per context
constexpr const char* kZapDomain = "deloco";
constexpr int kReconnectMaxMs = 2000;
// Frames smaller than this are copied into the ZeroMQ message: cheaper than a heap-allocated reference plus a
// release callback on the I/O thread (the 72-byte header always takes this path).
constexpr size_t kCopyBelow = 1024;
constexpr int kHandshakeFailureEvents =
    ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
constexpr int kMonitoredEvents = kHandshakeFailureEvents | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED;
constexpr int kClientMonitoredEvents = kHandshakeFailureEvents | ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED;

inline std::string zerr() { return zmq_strerror(zmq_errno()); }

// Counters shared between the owner's thread and the server's auth thread; stats() may read them from anywhere.
struct Counters {
  std::atomic<uint64_t> messages_in{0}, messages_out{0}, bytes_in{0}, bytes_out{0}, dropped_out{0}, dropped_in{0}, auth_denied{0},
      handshake_failures{0}, connections{0}, disconnects{0}, lane_refused{0}, lane_sessions{0}, lane_held_bytes{0},
      lanes_up{0}, tcp_timeout_ms{0}, tcp_congestion_set{0};
  TransportStats snapshot() const {
    TransportStats s;
    s.messages_in = messages_in.load();
    s.messages_out = messages_out.load();
    s.bytes_in = bytes_in.load();
    s.bytes_out = bytes_out.load();
    s.dropped_out = dropped_out.load();
    s.dropped_in = dropped_in.load();
    s.auth_denied = auth_denied.load();
    s.handshake_failures = handshake_failures.load();
    s.connections = connections.load();
    s.disconnects = disconnects.load();
    s.lane_refused = lane_refused.load();
    s.lane_sessions = lane_sessions.load();
    s.lane_held_bytes = lane_held_bytes.load();
    s.lanes_up = lanes_up.load();
    s.tcp_timeout_ms = tcp_timeout_ms.load();
    s.tcp_congestion_set = tcp_congestion_set.load();
    return s;
  }
  // Hands out the oldest complete message of `ready`, counted in; false when there is none.
  bool pop(std::deque<Envelope>& ready, Envelope* out) {
    if (ready.empty()) return false;
    *out = std::move(ready.front());
    ready.pop_front();
    messages_in++;
    bytes_in += out->header.size() + out->payload.size();
    return true;
  }
};

// A frame arrived on a connection: fits that connection's TCP settings to its link (net/tcp_tune.h) and reports them.
inline void tune_tcp(net::TcpTuner* tuner, Counters* c, zmq_msg_t* frame) {
  tuner->seen(zmq_msg_get(frame, ZMQ_SRCFD));
  c->tcp_timeout_ms = static_cast<uint64_t>(tuner->largest_timeout_ms());
  c->tcp_congestion_set = tuner->congestion_set();
}

class Context {
 public:
  explicit Context(int io_threads = 1) : ctx_(zmq_ctx_new()) {
    if (ctx_ == nullptr) throw TransportError("cannot create a ZeroMQ context: " + zerr());
    if (io_threads != 1 && zmq_ctx_set(ctx_, ZMQ_IO_THREADS, io_threads) != 0) {
      const std::string why = zerr();
      zmq_ctx_term(ctx_);
      throw TransportError("cannot set ZMQ_IO_THREADS to " + std::to_string(io_threads) + ": " + why);
    }
  }
  ~Context() { term(); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  void* get() const { return ctx_; }
  void shutdown() { if (ctx_ != nullptr) zmq_ctx_shutdown(ctx_); }  // wakes blocked calls with ETERM
  void term() {
    if (ctx_ != nullptr) zmq_ctx_term(ctx_);  // returns once every socket is closed and its LINGER passed
    ctx_ = nullptr;
  }

 private:
  void* ctx_;
};

class Socket {
 public:
  Socket() = default;
  Socket(const Context& ctx, int type) : s_(zmq_socket(ctx.get(), type)) {
    if (s_ == nullptr) throw TransportError("cannot create a ZeroMQ socket: " + zerr());
    set_int(ZMQ_LINGER, 0, "ZMQ_LINGER");  // a close drops unsent messages (a server may set TransportOptions::linger)
  }
  ~Socket() { close(); }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  Socket(Socket&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) { close(); s_ = o.s_; o.s_ = nullptr; }
    return *this;
  }
  void* get() const { return s_; }
  void close() {
    if (s_ != nullptr) zmq_close(s_);
    s_ = nullptr;
  }
  void set_int(int opt, int value, const char* name) { set_raw(opt, &value, sizeof value, name); }
  void set_int64(int opt, int64_t value, const char* name) { set_raw(opt, &value, sizeof value, name); }
  // Z85 keys are passed with their terminating NUL (41 bytes), the form every libzmq 4.x accepts.
  void set_z85(int opt, const std::string& key, const char* name) { set_raw(opt, key.c_str(), key.size() + 1, name); }
  void set_string(int opt, const std::string& v, const char* name) { set_raw(opt, v.data(), v.size(), name); }

 private:
  void set_raw(int opt, const void* v, size_t n, const char* name) {
    if (zmq_setsockopt(s_, opt, v, n) != 0) throw TransportError(std::string("cannot set ") + name + ": " + zerr());
  }
  void* s_ = nullptr;
};

// A received frame stays in its zmq_msg_t; the Bytes that views it keeps the message alive (no copy).
using MsgPtr = std::shared_ptr<zmq_msg_t>;

inline MsgPtr new_msg() {
  auto* m = new zmq_msg_t;
  zmq_msg_init(m);
  return MsgPtr(m, [](zmq_msg_t* p) {
    zmq_msg_close(p);
    delete p;
  });
}

inline Bytes wrap(const MsgPtr& m) {
  return Bytes(m, static_cast<const char*>(zmq_msg_data(m.get())), zmq_msg_size(m.get()));
}

inline void release_bytes(void* /*data*/, void* hint) { delete static_cast<Bytes*>(hint); }

// Fills `m` with `b`: a reference to the shared buffer for large frames, a copy for small ones.
inline bool init_frame(zmq_msg_t* m, const Bytes& b) {
  if (b.size() < kCopyBelow) {
    if (zmq_msg_init_size(m, b.size()) != 0) return false;
    if (b.size() > 0) std::memcpy(zmq_msg_data(m), b.data(), b.size());
    return true;
  }
  auto* keep = new Bytes(b);
  if (zmq_msg_init_data(m, const_cast<char*>(keep->data()), keep->size(), release_bytes, keep) != 0) {
    delete keep;
    return false;
  }
  return true;
}

// Sends one frame without blocking; the message is closed (and a referenced buffer released) on failure.
inline bool send_frame(void* sock, const Bytes& b, int flags) {
  zmq_msg_t m;
  if (!init_frame(&m, b)) return false;
  if (zmq_msg_send(&m, sock, flags | ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&m);
    return false;
  }
  return true;
}

// Sends a small frame by copying it (routing ids: at most 255 bytes).
inline bool send_copy(void* sock, const std::string& s, int flags) {
  return zmq_send(sock, s.data(), s.size(), flags | ZMQ_DONTWAIT) >= 0;
}

// Receives one whole multipart message if one is ready: keeps the first `keep` frames, counts all of them (the
// count saturates at INT_MAX) and closes every other frame as soon as it is read, so a message of many frames
// releases them one by one instead of being held.
// libzmq delivers multipart messages atomically, except when the connection drops while one is being read: 4.3.4
// then discards the rest (a DEALER with ZMQ_IMMEDIATE terminates its pipe at once), and a blocking read of the next
// frame would wait forever. So every frame is read without blocking; the rest of a message gets kRestOfMessage to
// show up, then what arrived is delivered with its count (a malformed message the caller refuses).
constexpr auto kRestOfMessage = std::chrono::milliseconds(200);

inline bool try_receive(void* sock, size_t keep, std::vector<MsgPtr>* frames, int* total) {
  frames->clear();
  *total = 0;
  zmq_msg_t extra;  // reused for the frames past `keep`
  zmq_msg_init(&extra);
  Clock::time_point stalled{};  // when the rest of this message first failed to be ready
  for (bool more = true; more;) {
    const bool kept = frames->size() < keep;
    MsgPtr m = kept ? new_msg() : nullptr;
    zmq_msg_t* into = kept ? m.get() : &extra;
    if (zmq_msg_recv(into, sock, ZMQ_DONTWAIT) < 0) {
      if (*total == 0) {
        zmq_msg_close(&extra);
        return false;  // EAGAIN: nothing ready (or ETERM while shutting down)
      }
      if (zmq_errno() != EAGAIN) break;  // shutting down: deliver what we have
      const auto t = Clock::now();
      if (stalled == Clock::time_point{}) stalled = t;
      if (t - stalled >= kRestOfMessage) break;  // the connection dropped mid-message: deliver what we have
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // zmq_poll would not wait: it reports "more"
      continue;
    }
    more = zmq_msg_more(into) != 0;
    if (kept) frames->push_back(std::move(m));
    if (*total < std::numeric_limits<int>::max()) ++*total;
  }
  zmq_msg_close(&extra);  // zmq_msg_recv released each earlier frame held here before reusing it
  return true;
}

// Waits until `deadline` for one whole message from any of `socks` (tried in turn from `*next`, so that one busy
// socket does not starve the others); `*which` tells which socket it came from.
inline bool receive_any(const std::vector<void*>& socks, size_t* next, size_t keep, Clock::time_point deadline,
                 size_t* which, std::vector<MsgPtr>* frames, int* total) {
  std::vector<zmq_pollitem_t> items;
  for (void* sock : socks) items.push_back({sock, 0, ZMQ_POLLIN, 0});
  for (bool said_ready = false;; ) {
    for (size_t i = 0; i < socks.size(); ++i) {
      const size_t k = (*next + i) % socks.size();
      if (try_receive(socks[k], keep, frames, total)) {
        *which = k;
        *next = k + 1;
        return true;
      }
    }
    // Readable, yet nothing to read: libzmq still reports the rest of a message cut off by a dropped connection
    // (see try_receive) until the next message arrives. Do not spin on it.
    if (said_ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    const int ready = zmq_poll(items.data(), static_cast<int>(items.size()), static_cast<long>(left));
    if (ready < 0 && zmq_errno() != EINTR) return false;
    said_ready = ready > 0;
  }
}




inline int io_threads_option(const TransportOptions& o) {
  if (o.io_threads < 1 || o.io_threads > 64)
    throw TransportError("io_threads must be in [1, 64] (got " + std::to_string(o.io_threads) + ")");
  return o.io_threads;
}

// libzmq unlinks an existing ipc socket file when binding, silently stealing the address from a live server.
// Refuse instead when something still answers on it.
inline void check_ipc_free(const std::string& endpoint) {
  const std::string path = endpoint.substr(6);  // after "ipc://"
  if (path.empty() || path[0] == '@') return;   // abstract namespace: bind itself reports EADDRINUSE
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) return;  // bind will report the problem
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  if (live) throw TransportError("cannot bind " + endpoint + ": address in use by a running server");
}

inline int64_t max_msg_size(const TransportOptions& o) {
  if (o.max_frame_bytes == 0 || o.max_frame_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw TransportError("max_frame_bytes must be in [1, 2^63) (got " + std::to_string(o.max_frame_bytes) + ")");
  return static_cast<int64_t>(o.max_frame_bytes);
}

inline int handshake_ms(const TransportOptions& o) {
  if (o.handshake_timeout.count() <= 0 || o.handshake_timeout.count() > std::numeric_limits<int>::max())
    throw TransportError("handshake_timeout must be positive (got " + std::to_string(o.handshake_timeout.count()) +
                         " ms): without it an unauthenticated connection could hold a partial frame forever");
  return static_cast<int>(o.handshake_timeout.count());
}

inline int linger_ms(const TransportOptions& o) {
  if (o.linger.count() < 0 || o.linger.count() > std::numeric_limits<int>::max())
    throw TransportError("linger must be between 0 and 2^31 ms (got " + std::to_string(o.linger.count()) + " ms)");
  return static_cast<int>(o.linger.count());
}

inline int tcp_timeout_ms(const TransportOptions& o) {
  if (o.tcp_timeout.count() < 0 || o.tcp_timeout.count() > std::numeric_limits<int>::max())
    throw TransportError("tcp_timeout must be between 0 and 2^31 ms (got " + std::to_string(o.tcp_timeout.count()) + " ms)");
  return static_cast<int>(o.tcp_timeout.count());
}

inline std::string curve_missing(const char* option, const char* what) {
  return std::string("CURVE is on and ") + option + " (" + what + ") is not set; set it (keys come from `deloco keygen`)"
         " or set net.plaintext = true explicitly to run without authentication and encryption";
}


}  // namespace deloco::zmq_detail
