// ZeroMQ transports: a ROUTER socket on the server, a DEALER socket on each client (see deloco/transport.h).
//
// Wire: every logical message is two ZeroMQ frames, header then payload; the ROUTER adds the routing-id frame in
// front on the server side. Payloads are handed to ZeroMQ by reference (zmq_msg_init_data with a release
// function that drops our reference from the I/O thread) and received frames are wrapped, not copied.
//
// Bounds (the figures are in deloco/transport.h and docs/transport.md): ZMQ_MAXMSGSIZE bounds every frame, also
// during the handshake (libzmq checks the declared size before it buffers anything and drops the connection);
// ZMQ_HANDSHAKE_IVL bounds how long an unauthenticated connection may hold its one partial frame; ZMQ_RCVHWM
// bounds the complete messages queued per peer. Nothing in libzmq 4.3 bounds the frames of one multipart message,
// which it buffers whole before delivering; try_receive() at least closes every frame past the ones it keeps as
// soon as it reads it.
//
// Security: the server always enables ZAP (RFC 27) through a handler thread in its own context. With CURVE the
// handler admits a client only if its public key is in the allow-list and names it (User-Id). In plaintext the
// handler admits everyone; it is still installed because libzmq refuses ZMTP 1.0 peers whenever ZAP is on, and
// without that a stream of random bytes could be parsed as ZMTP 1.0 messages and delivered.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <zmq.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "deloco/transport.h"

namespace deloco {
namespace {

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

std::string zerr() { return zmq_strerror(zmq_errno()); }

// Counters shared between the owner's thread and the server's auth thread; stats() may read them from anywhere.
struct Counters {
  std::atomic<uint64_t> messages_in{0}, messages_out{0}, bytes_in{0}, bytes_out{0}, dropped_out{0}, auth_denied{0},
      handshake_failures{0}, connections{0}, disconnects{0};
  TransportStats snapshot() const {
    TransportStats s;
    s.messages_in = messages_in.load();
    s.messages_out = messages_out.load();
    s.bytes_in = bytes_in.load();
    s.bytes_out = bytes_out.load();
    s.dropped_out = dropped_out.load();
    s.auth_denied = auth_denied.load();
    s.handshake_failures = handshake_failures.load();
    s.connections = connections.load();
    s.disconnects = disconnects.load();
    return s;
  }
};

class Context {
 public:
  Context() : ctx_(zmq_ctx_new()) {
    if (ctx_ == nullptr) throw TransportError("cannot create a ZeroMQ context: " + zerr());
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

MsgPtr new_msg() {
  auto* m = new zmq_msg_t;
  zmq_msg_init(m);
  return MsgPtr(m, [](zmq_msg_t* p) {
    zmq_msg_close(p);
    delete p;
  });
}

Bytes wrap(const MsgPtr& m) {
  return Bytes(m, static_cast<const char*>(zmq_msg_data(m.get())), zmq_msg_size(m.get()));
}

void release_bytes(void* /*data*/, void* hint) { delete static_cast<Bytes*>(hint); }

// Fills `m` with `b`: a reference to the shared buffer for large frames, a copy for small ones.
bool init_frame(zmq_msg_t* m, const Bytes& b) {
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
bool send_frame(void* sock, const Bytes& b, int flags) {
  zmq_msg_t m;
  if (!init_frame(&m, b)) return false;
  if (zmq_msg_send(&m, sock, flags | ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&m);
    return false;
  }
  return true;
}

// Sends a small frame by copying it (routing ids: at most 255 bytes).
bool send_copy(void* sock, const std::string& s, int flags) {
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

bool try_receive(void* sock, size_t keep, std::vector<MsgPtr>* frames, int* total) {
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

bool receive_until(void* sock, size_t keep, std::chrono::milliseconds timeout, std::vector<MsgPtr>* frames,
                   int* total) {
  const auto deadline = Clock::now() + timeout;
  for (bool said_ready = false;; ) {
    if (try_receive(sock, keep, frames, total)) return true;
    // Readable, yet nothing to read: libzmq still reports the rest of a message cut off by a dropped connection
    // (see try_receive) until the next message arrives. Do not spin on it.
    if (said_ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    zmq_pollitem_t item{sock, 0, ZMQ_POLLIN, 0};
    const int ready = zmq_poll(&item, 1, static_cast<long>(left));
    if (ready < 0 && zmq_errno() != EINTR) return false;
    said_ready = ready > 0;
  }
}

// libzmq unlinks an existing ipc socket file when binding, silently stealing the address from a live server.
// Refuse instead when something still answers on it.
void check_ipc_free(const std::string& endpoint) {
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

int64_t max_msg_size(const TransportOptions& o) {
  if (o.max_frame_bytes == 0 || o.max_frame_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw TransportError("max_frame_bytes must be in [1, 2^63) (got " + std::to_string(o.max_frame_bytes) + ")");
  return static_cast<int64_t>(o.max_frame_bytes);
}

int handshake_ms(const TransportOptions& o) {
  if (o.handshake_timeout.count() <= 0 || o.handshake_timeout.count() > std::numeric_limits<int>::max())
    throw TransportError("handshake_timeout must be positive (got " + std::to_string(o.handshake_timeout.count()) +
                         " ms): without it an unauthenticated connection could hold a partial frame forever");
  return static_cast<int>(o.handshake_timeout.count());
}

int linger_ms(const TransportOptions& o) {
  if (o.linger.count() < 0 || o.linger.count() > std::numeric_limits<int>::max())
    throw TransportError("linger must be between 0 and 2^31 ms (got " + std::to_string(o.linger.count()) + " ms)");
  return static_cast<int>(o.linger.count());
}

int tcp_timeout_ms(const TransportOptions& o) {
  if (o.tcp_timeout.count() < 0 || o.tcp_timeout.count() > std::numeric_limits<int>::max())
    throw TransportError("tcp_timeout must be between 0 and 2^31 ms (got " + std::to_string(o.tcp_timeout.count()) + " ms)");
  return static_cast<int>(o.tcp_timeout.count());
}

std::string curve_missing(const char* option, const char* what) {
  return std::string("CURVE is on and ") + option + " (" + what + ") is not set; set it (keys come from `deloco keygen`)"
         " or set net.plaintext = true explicitly to run without authentication and encryption";
}

// ---------------------------------------------------------------------------------------------------------------
class ZmqServer final : public ServerTransport {
 public:
  ZmqServer(const std::string& endpoint, const TransportOptions& o) : curve_(!o.plaintext) {
    KeyPair own;
    if (curve_) {
      if (o.secret_key_file.empty()) throw TransportError(curve_missing("net.secret_key", "the server's .key file"));
      if (o.allow.empty()) throw TransportError(curve_missing("net.allow", "the allow-list of client keys"));
      own = read_secret_key_file(o.secret_key_file);
      allow_ = AllowList::load(o.allow);
    }
    // The ZAP handler must be bound before the server socket can see its first connection.
    zap_ = Socket(ctx_, ZMQ_REP);
    if (zmq_bind(zap_.get(), kZapEndpoint) != 0) throw TransportError("cannot bind the ZAP handler: " + zerr());

    router_ = Socket(ctx_, ZMQ_ROUTER);
    router_.set_int(ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY");  // unknown peer: EHOSTUNREACH, not silence
    router_.set_int(ZMQ_SNDHWM, o.queue_limit, "ZMQ_SNDHWM");
    router_.set_int(ZMQ_RCVHWM, o.receive_limit > 0 ? o.receive_limit : o.queue_limit, "ZMQ_RCVHWM");
    router_.set_int64(ZMQ_MAXMSGSIZE, max_msg_size(o), "ZMQ_MAXMSGSIZE");
    router_.set_int(ZMQ_HANDSHAKE_IVL, handshake_ms(o), "ZMQ_HANDSHAKE_IVL");
    router_.set_int(ZMQ_LINGER, linger_ms(o), "ZMQ_LINGER");
    if (tcp_timeout_ms(o) > 0) router_.set_int(ZMQ_TCP_MAXRT, tcp_timeout_ms(o), "ZMQ_TCP_MAXRT");
    router_.set_string(ZMQ_ZAP_DOMAIN, kZapDomain, "ZMQ_ZAP_DOMAIN");
    if (curve_) {
      router_.set_int(ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER");
      router_.set_z85(ZMQ_CURVE_SECRETKEY, own.secret_key, "ZMQ_CURVE_SECRETKEY");
    }
    if (zmq_socket_monitor(router_.get(), kMonitorEndpoint, kMonitoredEvents) != 0)
      throw TransportError("cannot monitor the server socket: " + zerr());
    monitor_ = Socket(ctx_, ZMQ_PAIR);
    if (zmq_connect(monitor_.get(), kMonitorEndpoint) != 0)
      throw TransportError("cannot connect the socket monitor: " + zerr());

    if (endpoint.rfind("ipc://", 0) == 0) check_ipc_free(endpoint);
    if (zmq_bind(router_.get(), endpoint.c_str()) != 0)
      throw TransportError("cannot bind " + endpoint + ": " + zerr());
    char last[1024];
    size_t n = sizeof last;
    endpoint_ = zmq_getsockopt(router_.get(), ZMQ_LAST_ENDPOINT, last, &n) == 0 ? std::string(last) : endpoint;

    thread_ = std::thread([this] { auth_loop(); });
  }

  ~ZmqServer() override {
    router_.close();  // first: its queued messages get their LINGER while the context still runs
    ctx_.shutdown();  // the auth thread's poll returns ETERM
    if (thread_.joinable()) thread_.join();
    monitor_.close();
    zap_.close();
    ctx_.term();
  }

  std::string endpoint() const override { return endpoint_; }

  bool receive(Envelope* out, std::chrono::milliseconds timeout) override {
    std::vector<MsgPtr> f;
    int total = 0;
    if (!receive_until(router_.get(), 3, timeout, &f, &total)) return false;
    out->peer.assign(static_cast<const char*>(zmq_msg_data(f[0].get())), zmq_msg_size(f[0].get()));
    out->parts = total - 1;  // the routing id is ROUTER bookkeeping, not a frame of the message
    out->header = f.size() > 1 ? wrap(f[1]) : Bytes();
    out->payload = f.size() > 2 ? wrap(f[2]) : Bytes();
    // The ZAP handler's User-Id travels as metadata on every frame that came from the connection.
    const char* user = f.size() > 1 ? zmq_msg_gets(f[1].get(), "User-Id") : nullptr;
    out->identity = user != nullptr ? user : "";
    c_.messages_in++;
    c_.bytes_in += out->header.size() + out->payload.size();
    return true;
  }

  bool send(const std::string& peer, const Bytes& header, const Bytes& payload) override {
    // With ROUTER_MANDATORY the routing-id frame is where an unknown peer (EHOSTUNREACH) or a full queue (EAGAIN)
    // is reported; once it is accepted the rest of the message goes to the same pipe.
    bool ok = send_copy(router_.get(), peer, ZMQ_SNDMORE) &&
              send_frame(router_.get(), header, ZMQ_SNDMORE) && send_frame(router_.get(), payload, 0);
    if (!ok) {
      c_.dropped_out++;
      return false;
    }
    c_.messages_out++;
    c_.bytes_out += header.size() + payload.size();
    return true;
  }

  TransportStats stats() const override { return c_.snapshot(); }

 private:
  // Runs on the auth thread: answers ZAP requests and counts failed handshakes until the context shuts down.
  void auth_loop() {
    zmq_pollitem_t items[2] = {{zap_.get(), 0, ZMQ_POLLIN, 0}, {monitor_.get(), 0, ZMQ_POLLIN, 0}};
    for (;;) {
      if (zmq_poll(items, 2, -1) < 0) {
        if (zmq_errno() == EINTR) continue;
        return;  // ETERM: the destructor is shutting us down
      }
      if ((items[0].revents & ZMQ_POLLIN) && !answer_zap()) return;
      if ((items[1].revents & ZMQ_POLLIN) && !read_monitor_event()) return;
    }
  }

  static bool recv_strings(void* sock, std::vector<std::string>* parts) {
    parts->clear();
    for (bool more = true; more;) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, sock, 0) < 0) {
        zmq_msg_close(&m);
        return false;
      }
      parts->emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m) != 0;
      zmq_msg_close(&m);
    }
    return true;
  }

  // RFC 27 request: version, request id, domain, address, routing id, mechanism, credentials...
  // Reply: version, request id, status code, status text, user id, metadata.
  bool answer_zap() {
    std::vector<std::string> req;
    if (!recv_strings(zap_.get(), &req)) return false;
    std::string status = "400", text = "refused", user;
    if (req.size() < 6 || req[0] != "1.0") {
      status = "500";
      text = "malformed ZAP request";
    } else if (!curve_ && req[5] == "NULL") {
      status = "200";
      text = "OK";
    } else if (curve_ && req[5] == "CURVE" && req.size() >= 7 && req[6].size() == 32) {
      char z85[41];
      zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(req[6].data()), 32);
      if (const std::string* name = allow_->name_of(z85)) {
        status = "200";
        text = "OK";
        user = *name;
      } else {
        text = "client key not in the allow-list";
      }
    }
    if (status != "200") c_.auth_denied++;
    const std::string reply[6] = {"1.0", req.size() > 1 ? req[1] : "", status, text, user, ""};
    for (int i = 0; i < 6; ++i)
      if (zmq_send(zap_.get(), reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0) < 0) return false;
    return true;
  }

  // A monitor event is two frames: 6 bytes (uint16 event, uint32 value) and the endpoint.
  bool read_monitor_event() {
    std::vector<std::string> ev;
    if (!recv_strings(monitor_.get(), &ev)) return false;
    if (!ev.empty() && ev[0].size() >= 2) {
      uint16_t event;
      std::memcpy(&event, ev[0].data(), sizeof event);
      if (event & kHandshakeFailureEvents) c_.handshake_failures++;
      if (event == ZMQ_EVENT_ACCEPTED) c_.connections++;
      if (event == ZMQ_EVENT_DISCONNECTED) c_.disconnects++;
    }
    return true;
  }

  const bool curve_;
  std::optional<AllowList> allow_;
  Context ctx_;  // declared before the sockets: destroyed after them
  Socket zap_, router_, monitor_;
  std::string endpoint_;
  Counters c_;
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------------------------------
class ZmqClient final : public ClientTransport {
 public:
  ZmqClient(const std::string& endpoint, const TransportOptions& o) {
    dealer_ = Socket(ctx_, ZMQ_DEALER);
    if (!o.plaintext) {
      if (o.secret_key_file.empty()) throw TransportError(curve_missing("net.secret_key", "this learner's .key file"));
      if (o.server_public_key_file.empty())
        throw TransportError(curve_missing("net.server_key", "the server's .pub file"));
      const KeyPair own = read_secret_key_file(o.secret_key_file);
      const std::string server = read_public_key_file(o.server_public_key_file);
      dealer_.set_z85(ZMQ_CURVE_SERVERKEY, server, "ZMQ_CURVE_SERVERKEY");
      dealer_.set_z85(ZMQ_CURVE_PUBLICKEY, own.public_key, "ZMQ_CURVE_PUBLICKEY");
      dealer_.set_z85(ZMQ_CURVE_SECRETKEY, own.secret_key, "ZMQ_CURVE_SECRETKEY");
    }
    // Not ZMQ_IMMEDIATE: with it, libzmq 4.3.4 terminates the pipe when the connection drops, discarding what was
    // received but not read yet and cutting a message being read (the next frame read then waits forever or
    // trips an assertion). Without it the pipe outlives reconnections; send() itself refuses while no handshake
    // is up (the monitor below), which is what ZMQ_IMMEDIATE was for.
    dealer_.set_int(ZMQ_RECONNECT_IVL, static_cast<int>(o.reconnect.count()), "ZMQ_RECONNECT_IVL");
    dealer_.set_int(ZMQ_RECONNECT_IVL_MAX, kReconnectMaxMs, "ZMQ_RECONNECT_IVL_MAX");
    dealer_.set_int(ZMQ_SNDHWM, o.queue_limit, "ZMQ_SNDHWM");
    dealer_.set_int(ZMQ_RCVHWM, o.queue_limit, "ZMQ_RCVHWM");
    dealer_.set_int64(ZMQ_MAXMSGSIZE, max_msg_size(o), "ZMQ_MAXMSGSIZE");
    dealer_.set_int(ZMQ_HANDSHAKE_IVL, handshake_ms(o), "ZMQ_HANDSHAKE_IVL");
    if (const int rt = tcp_timeout_ms(o); rt > 0) {
      dealer_.set_int(ZMQ_TCP_MAXRT, rt, "ZMQ_TCP_MAXRT");
      dealer_.set_int(ZMQ_CONNECT_TIMEOUT, std::max(1, rt / 2), "ZMQ_CONNECT_TIMEOUT");
    }
    if (zmq_socket_monitor(dealer_.get(), kClientMonitorEndpoint, kClientMonitoredEvents) != 0)
      throw TransportError(std::string("cannot monitor the client socket: ") + zerr());
    monitor_ = Socket(ctx_, ZMQ_PAIR);
    if (zmq_connect(monitor_.get(), kClientMonitorEndpoint) != 0)
      throw TransportError(std::string("cannot connect the client monitor: ") + zerr());
    if (zmq_connect(dealer_.get(), endpoint.c_str()) != 0)
      throw TransportError("cannot connect to " + endpoint + ": " + zerr());
  }

  ~ZmqClient() override {
    dealer_.close();
    monitor_.close();
    ctx_.term();
  }

  bool receive(Envelope* out, std::chrono::milliseconds timeout) override {
    std::vector<MsgPtr> f;
    int total = 0;
    if (!receive_until(dealer_.get(), 2, timeout, &f, &total)) return false;
    out->peer.clear();
    out->identity.clear();
    out->parts = total;
    out->header = wrap(f[0]);
    out->payload = f.size() > 1 ? wrap(f[1]) : Bytes();
    c_.messages_in++;
    c_.bytes_in += out->header.size() + out->payload.size();
    return true;
  }

  bool send(const Bytes& header, const Bytes& payload) override {
    // Refused while no handshake is up (a message sent just as the connection drops may still go out on the next
    // one), and when the queue is full (the header frame fails with EAGAIN; then the message is not sent at all).
    read_monitor_events();
    if (!connected_ || !(send_frame(dealer_.get(), header, ZMQ_SNDMORE) && send_frame(dealer_.get(), payload, 0))) {
      c_.dropped_out++;
      return false;
    }
    c_.messages_out++;
    c_.bytes_out += header.size() + payload.size();
    return true;
  }

  TransportStats stats() const override { return c_.snapshot(); }

 private:
  // Drains the monitor's events without waiting: a finished handshake means connected, a disconnect not.
  void read_monitor_events() {
    for (;;) {
      zmq_msg_t m[2];
      zmq_msg_init(&m[0]);
      zmq_msg_init(&m[1]);
      if (zmq_msg_recv(&m[0], monitor_.get(), ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m[0]);
        zmq_msg_close(&m[1]);
        return;
      }
      // Two frames (event, endpoint) over inproc, delivered together.
      if (zmq_msg_more(&m[0])) zmq_msg_recv(&m[1], monitor_.get(), 0);
      if (zmq_msg_size(&m[0]) >= 2) {
        uint16_t event;
        std::memcpy(&event, zmq_msg_data(&m[0]), sizeof event);
        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) connected_ = true;
        if (event == ZMQ_EVENT_DISCONNECTED) connected_ = false;
        if (event & kHandshakeFailureEvents) c_.handshake_failures++;
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) c_.auth_denied++;
      }
      zmq_msg_close(&m[0]);
      zmq_msg_close(&m[1]);
    }
  }

  Context ctx_;
  Socket dealer_;
  Socket monitor_;
  bool connected_ = false;
  Counters c_;
};

}  // namespace

std::unique_ptr<ServerTransport> make_zmq_server(const std::string& endpoint, const TransportOptions& opts) {
  return std::make_unique<ZmqServer>(endpoint, opts);
}

std::unique_ptr<ClientTransport> make_zmq_client(const std::string& endpoint, const TransportOptions& opts) {
  return std::make_unique<ZmqClient>(endpoint, opts);
}

}  // namespace deloco
