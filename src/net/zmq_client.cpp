// ZeroMQ transports: the client, a DEALER socket per lane (see deloco/transport.h and the comment atop zmq_server.cpp).
#include "net/zmq_internal.h"
#include "net/zmq_lanes.h"

namespace deloco {
namespace zmq_detail {
namespace {

// ---------------------------------------------------------------------------------------------------------------
class ZmqClient final : public ClientTransport {
 public:
  ZmqClient(const std::string& endpoint, const TransportOptions& o)
      : ctx_(io_threads_option(o)),
        split_bytes_(o.split_bytes),
        budget_(lane_budget_bytes(static_cast<uint64_t>(std::max(1, o.queue_limit)), o.max_frame_bytes),
                &c_.lane_held_bytes),
        rx_(static_cast<size_t>(std::max(1, o.queue_limit)), o.max_frame_bytes, &budget_),
        tcp_(std::chrono::milliseconds(tcp_timeout_ms(o)), o.tcp_congestion) {
    if (const std::string why = net::TcpTuner::unavailable(o.tcp_congestion); !why.empty()) throw TransportError(why);
    const int lanes = lanes_option(o);
    KeyPair own;
    std::string server;
    if (!o.plaintext) {
      if (o.secret_key_file.empty()) throw TransportError(curve_missing("net.secret_key", "this learner's .key file"));
      if (o.server_public_key_file.empty() && o.server_public_key.empty())
        throw TransportError(curve_missing("net.server_key", "the server's .pub file"));
      own = read_secret_key_file(o.secret_key_file);
      server = !o.server_public_key.empty() ? o.server_public_key : read_public_key_file(o.server_public_key_file);
    }
    const std::string session = lanes > 1 ? random_session() : std::string();
    for (int i = 0; i < lanes; ++i) {
      Lane& l = lanes_.emplace_back();
      l.dealer = Socket(ctx_, ZMQ_DEALER);
      if (!o.plaintext) {
        l.dealer.set_z85(ZMQ_CURVE_SERVERKEY, server, "ZMQ_CURVE_SERVERKEY");
        l.dealer.set_z85(ZMQ_CURVE_PUBLICKEY, own.public_key, "ZMQ_CURVE_PUBLICKEY");
        l.dealer.set_z85(ZMQ_CURVE_SECRETKEY, own.secret_key, "ZMQ_CURVE_SECRETKEY");
      }
      if (lanes > 1) {
        l.dealer.set_string(ZMQ_ROUTING_ID, std::string(1, kLaneMark) + session + static_cast<char>(i),
                            "ZMQ_ROUTING_ID");
        l.dealer.set_int64(ZMQ_AFFINITY, int64_t{1} << (i % io_threads_option(o)), "ZMQ_AFFINITY");
      }
      // Not ZMQ_IMMEDIATE: with it, libzmq 4.3.4 terminates the pipe when the connection drops, discarding what was
      // received but not read yet and cutting a message being read (the next frame read then waits forever or
      // trips an assertion). Without it the pipe outlives reconnections; send() itself refuses while no handshake
      // is up (the monitor below), which is what ZMQ_IMMEDIATE was for.
      l.dealer.set_int(ZMQ_RECONNECT_IVL, static_cast<int>(o.reconnect.count()), "ZMQ_RECONNECT_IVL");
      l.dealer.set_int(ZMQ_RECONNECT_IVL_MAX, kReconnectMaxMs, "ZMQ_RECONNECT_IVL_MAX");
      l.dealer.set_int(ZMQ_SNDHWM, o.queue_limit, "ZMQ_SNDHWM");
      l.dealer.set_int(ZMQ_RCVHWM, o.queue_limit, "ZMQ_RCVHWM");
      l.dealer.set_int64(ZMQ_MAXMSGSIZE, max_msg_size(o), "ZMQ_MAXMSGSIZE");
      l.dealer.set_int(ZMQ_HANDSHAKE_IVL, handshake_ms(o), "ZMQ_HANDSHAKE_IVL");
      if (const int rt = tcp_timeout_ms(o); rt > 0) {
        l.dealer.set_int(ZMQ_TCP_MAXRT, rt, "ZMQ_TCP_MAXRT");
        l.dealer.set_int(ZMQ_CONNECT_TIMEOUT, std::max(1, rt / 2), "ZMQ_CONNECT_TIMEOUT");
      }
      const std::string monitor = std::string(kClientMonitorEndpoint) + (i > 0 ? "." + std::to_string(i) : "");
      if (zmq_socket_monitor(l.dealer.get(), monitor.c_str(), kClientMonitoredEvents) != 0)
        throw TransportError(std::string("cannot monitor the client socket: ") + zerr());
      l.monitor = Socket(ctx_, ZMQ_PAIR);
      if (zmq_connect(l.monitor.get(), monitor.c_str()) != 0)
        throw TransportError(std::string("cannot connect the client monitor: ") + zerr());
      socks_.push_back(l.dealer.get());
    }
    for (Lane& l : lanes_)
      if (zmq_connect(l.dealer.get(), endpoint.c_str()) != 0)
        throw TransportError("cannot connect to " + endpoint + ": " + zerr());
  }

  ~ZmqClient() override {
    for (Lane& l : lanes_) {
      l.dealer.close();
      l.monitor.close();
    }
    ctx_.term();
  }

  bool receive(Envelope* out, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      read_monitor_events();
      if (c_.pop(ready_, out)) return true;
      std::vector<MsgPtr> f;
      int total = 0;
      size_t which = 0;
      if (!receive_any(socks_, &next_, lanes_.size() > 1 ? 3 : 2, deadline, &which, &f, &total)) {
        rx_.expire(Clock::now());
        c_.dropped_in += rx_.take_dropped();
        return false;
      }
      take(static_cast<int>(which), f, total);
    }
  }

  bool send(const Bytes& header, const Bytes& payload) override {
    // Refused while no handshake is up (a message sent just as the connection drops may still go out on the next
    // one), and when the queue is full (the header frame fails with EAGAIN; then the message is not sent at all).
    read_monitor_events();
    if (!lanes_[0].connected || !(lanes_.size() > 1 ? send_laned(header, payload) : send_plain(header, payload))) {
      c_.dropped_out++;
      return false;
    }
    c_.messages_out++;
    c_.bytes_out += header.size() + payload.size();
    return true;
  }

  TransportStats stats() const override { return c_.snapshot(); }

 private:
  struct Lane {
    Socket dealer, monitor;
    bool connected = false;
    bool greeted = false;   // lanes past 0: this connection's hello is queued, so the server can use the lane
    bool answered = false;  // lanes past 0: the server answered that hello, so we may send parts on the lane
    uint64_t greeting = 0;  // lanes past 0: the number of this connection's hello (the server echoes it)
  };

  bool usable(size_t i) const {
    const Lane& l = lanes_[i];
    return l.connected && (i == 0 || (l.greeted && l.answered));
  }
  void count_lanes_up() {
    uint64_t n = 0;
    for (size_t i = 0; i < lanes_.size(); ++i) n += usable(i) ? 1 : 0;
    c_.lanes_up = n;
  }

  void deliver(MsgPtr header, Bytes payload, int parts) {
    Envelope e;
    e.header = header ? wrap(header) : Bytes();
    e.payload = std::move(payload);
    e.parts = parts;
    ready_.push_back(std::move(e));
  }

  void take(int lane, const std::vector<MsgPtr>& f, int total) {
    tune_tcp(&tcp_, &c_, f[0].get());
    if (lanes_.size() == 1) {
      deliver(f[0], f.size() > 1 ? wrap(f[1]) : Bytes(), total);
      return;
    }
    Tag t;
    std::deque<Reassembler::Done> done;
    if (lane == 0) {
      if (total == 3 && decode_tag(f[2].get(), &t) && t.kind == TagKind::kLead)
        rx_.lead(t, f[0], f[1], "", &done);
      else if (total == 2 && decode_tag(f[0].get(), &t) && t.kind == TagKind::kPart)
        rx_.part(0, t, f[1], "", &done);
      else  // not what a server sends to a laned client: delivered with its frame count for the role to judge
        deliver(f[0], f.size() > 1 ? wrap(f[1]) : Bytes(), total);
    } else if (total == 2 && decode_tag(f[0].get(), &t) && t.kind == TagKind::kPart) {
      rx_.part(lane, t, f[1], "", &done);
    } else if (total == 1 && decode_tag(f[0].get(), &t) && t.kind == TagKind::kHello) {
      rx_.reset_lane(lane, t.seq, &done);
      Lane& l = lanes_[lane];
      if (l.greeted && t.offset == l.greeting) {  // the answer to this connection's hello, not an earlier one's
        l.answered = true;
        count_lanes_up();
      }
    } else {
      c_.dropped_in++;
    }
    c_.dropped_in += rx_.take_dropped();
    c_.lane_refused += rx_.take_refused();
    for (auto& d : done) deliver(d.header, std::move(d.payload), 2);
  }

  bool send_plain(const Bytes& header, const Bytes& payload) {
    void* d = lanes_[0].dealer.get();
    return send_frame(d, header, ZMQ_SNDMORE) && send_frame(d, payload, 0);
  }

  // The pieces of cut(), on lane 0 and the lanes that are up and whose hello the server answered. A piece refused
  // (queue full) drops the message; pieces already queued are discarded by the server as orphans.
  bool send_laned(const Bytes& header, const Bytes& payload) {
    std::vector<int> lanes;
    for (size_t i = 0; i < lanes_.size(); ++i)
      if (i == 0 || usable(i)) lanes.push_back(static_cast<int>(i));
    const std::vector<Piece> pieces = cut(lanes, payload, split_bytes_, ++send_seq_);
    for (size_t i = 0; i + 1 < pieces.size(); ++i) {
      void* d = lanes_[pieces[i].lane].dealer.get();
      if (!(send_frame(d, pieces[i].tag, ZMQ_SNDMORE) && send_frame(d, pieces[i].bytes, 0))) return false;
    }
    void* d = lanes_[0].dealer.get();
    return send_frame(d, header, ZMQ_SNDMORE) && send_frame(d, pieces.back().bytes, ZMQ_SNDMORE) &&
           send_frame(d, pieces.back().tag, 0);
  }

  // Drains the monitors' events without waiting: a finished handshake means connected, a disconnect not. A lane
  // past 0 greets the server on every new connection (the hello tells the server it may use the lane).
  void read_monitor_events() {
    for (size_t i = 0; i < lanes_.size(); ++i) {
      Lane& l = lanes_[i];
      for (;;) {
        zmq_msg_t m[2];
        zmq_msg_init(&m[0]);
        zmq_msg_init(&m[1]);
        if (zmq_msg_recv(&m[0], l.monitor.get(), ZMQ_DONTWAIT) < 0) {
          zmq_msg_close(&m[0]);
          zmq_msg_close(&m[1]);
          break;
        }
        // Two frames (event, endpoint) over inproc, delivered together.
        if (zmq_msg_more(&m[0])) zmq_msg_recv(&m[1], l.monitor.get(), 0);
        if (zmq_msg_size(&m[0]) >= 2) {
          uint16_t event;
          std::memcpy(&event, zmq_msg_data(&m[0]), sizeof event);
          if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            if (i == 0) c_.connections++;  // a second one means a reconnection (TransportStats::connections)
            l.connected = true;
            l.greeted = false;
            l.answered = false;
          }
          if (event == ZMQ_EVENT_DISCONNECTED) l.connected = false;
          if (event & kHandshakeFailureEvents) c_.handshake_failures++;
          if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) c_.auth_denied++;
        }
        zmq_msg_close(&m[0]);
        zmq_msg_close(&m[1]);
      }
      if (i > 0 && l.connected && !l.greeted) {
        Tag hello;
        hello.kind = TagKind::kHello;
        hello.index = static_cast<uint8_t>(i);
        hello.seq = send_seq_;
        hello.offset = ++l.greeting;
        l.greeted = send_frame(l.dealer.get(), encode_tag(hello), 0);
      }
    }
    count_lanes_up();
  }

  Counters c_;  // declared first: the budget reports to it
  Context ctx_;  // declared before the sockets: destroyed after them
  std::deque<Lane> lanes_;
  std::vector<void*> socks_;
  size_t next_ = 0;
  const uint64_t split_bytes_;
  uint64_t send_seq_ = 0;
  LaneBudget budget_;
  Reassembler rx_;
  net::TcpTuner tcp_;  // each connection's TCP settings, fitted as its frames arrive
  std::deque<Envelope> ready_;
};

}  // namespace
}  // namespace zmq_detail


std::unique_ptr<ClientTransport> make_zmq_client(const std::string& endpoint, const TransportOptions& opts) {
  return std::make_unique<zmq_detail::ZmqClient>(endpoint, opts);
}

}  // namespace deloco
