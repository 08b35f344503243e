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
// This file: the server (ZmqServer); the client is zmq_client.cpp, the shared parts zmq_internal.h and zmq_lanes.h.
#include "net/zmq_internal.h"
#include "net/zmq_lanes.h"

namespace deloco {
namespace zmq_detail {
namespace {

// ---------------------------------------------------------------------------------------------------------------
class ZmqServer final : public ServerTransport {
 public:
  ZmqServer(const std::string& endpoint, const TransportOptions& o)
      : curve_(!o.plaintext),
        split_bytes_(o.split_bytes),
        pending_bound_(static_cast<size_t>(o.receive_limit > 0 ? o.receive_limit : o.queue_limit)),
        max_payload_(o.max_frame_bytes),
        budget_bytes_(lane_budget_bytes(pending_bound_, o.max_frame_bytes)),
        tcp_(std::chrono::milliseconds(tcp_timeout_ms(o)), o.tcp_congestion),
        ctx_(io_threads_option(o)) {
    if (const std::string why = net::TcpTuner::unavailable(o.tcp_congestion); !why.empty()) throw TransportError(why);
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
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      sweep_sessions();
      if (c_.pop(ready_, out)) return true;
      std::vector<MsgPtr> f;
      int total = 0;
      size_t next = 0, which = 0;
      if (!receive_any({router_.get()}, &next, 4, deadline, &which, &f, &total)) {
        sweep_sessions();
        return false;
      }
      take(f, total);
    }
  }

  bool send(const std::string& peer, const Bytes& header, const Bytes& payload) override {
    const auto it = is_lane_id(peer) ? sessions_.find(peer.substr(1, kSessionBytes)) : sessions_.end();
    const bool ok = it == sessions_.end() ? send_plain(peer, header, payload) : send_laned(it->second, peer, header, payload);
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

  // A connection as a frame it carried shows it: its descriptor (ZMQ_SRCFD) and that socket's inode, so that the
  // descriptor number reused by a later connection is not taken for it.
  struct Conn {
    int fd = -1;
    dev_t dev = 0;
    ino_t ino = 0;
  };
  static Conn conn_of(zmq_msg_t* m) {
    Conn c;
    const int fd = zmq_msg_get(m, ZMQ_SRCFD);
    struct stat st;
    if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) {
      c.fd = fd;
      c.dev = st.st_dev;
      c.ino = st.st_ino;
    }
    return c;
  }
  static bool is_open(const Conn& c) {
    struct stat st;
    return c.fd >= 0 && ::fstat(c.fd, &st) == 0 && st.st_ino == c.ino && st.st_dev == c.dev;
  }

  // What a key's laned sessions hold (docs/transport.md, lanes' bounds).
  struct KeyState {
    KeyState(uint64_t limit, std::atomic<uint64_t>* gauge) : budget(limit, gauge) {}
    LaneBudget budget;
    size_t sessions = 0;
  };

  // A laned client (routing ids kLaneMark + session + lane): its lanes known to be up, and its reassembly.
  struct Session {
    Session(std::string key_, KeyState* ks_, std::string identity_, size_t bound, uint64_t max_payload)
        : key(std::move(key_)), ks(ks_), identity(std::move(identity_)), rx(bound, max_payload, &ks_->budget) {}
    const std::string key;       // what it is charged to: the identity with CURVE, the session id in plaintext
    KeyState* const ks;
    const std::string identity;  // the allow-list name of its first frame; every lane must carry the same
    Reassembler rx;
    bool known[kMaxLanes] = {};  // lanes whose hello we answered and that have not failed a send since
    bool lead_heard = false;     // lane 0 has spoken: parts on other lanes are kept, hellos answered
    bool answer_due[kMaxLanes] = {};    // hellos heard before lane 0 spoke: answered when it does
    uint64_t greeting[kMaxLanes] = {};  // each lane's last hello's greeting number, echoed in our answer
    Conn conn[kMaxLanes];               // the connection each lane's last frame came on
    Clock::time_point heard = Clock::now();  // its last frame
  };

  static bool any_open(const Session& s) {
    for (const Conn& c : s.conn)
      if (is_open(c)) return true;
    return false;
  }

  // Collects a session's counts into the transport's.
  void count(Session& s) {
    c_.dropped_in += s.rx.take_dropped();
    c_.auth_denied += s.rx.take_denied();
    c_.lane_refused += s.rx.take_refused();
  }

  using SessionIt = std::map<std::string, Session>::iterator;

  // Forgets a session; what it still held is discarded (counted in dropped_in). Returns the next one.
  SessionIt remove_session(SessionIt it) {
    Session& s = it->second;
    c_.dropped_in += s.rx.discard();
    count(s);
    KeyState* ks = s.ks;
    const std::string key = s.key;
    it = sessions_.erase(it);
    if (--ks->sessions == 0) keys_.erase(key);
    c_.lane_sessions = sessions_.size();
    return it;
  }

  // A new session for `sid`, after making room: with CURVE the key's sessions with no connection open go, then its
  // least recently heard while it has kLaneSessionsPerKey; in plaintext (every session its own key) the same over
  // all sessions, once there are kPlaintextLaneSessions.
  SessionIt open_session(const std::string& sid, const std::string& identity) {
    const std::string key = curve_ ? identity : sid;
    const size_t cap = curve_ ? TransportOptions::kLaneSessionsPerKey : TransportOptions::kPlaintextLaneSessions;
    auto shares = [&](const Session& s) { return !curve_ || s.key == key; };
    size_t n = 0;
    for (const auto& [id, s] : sessions_) n += shares(s) ? 1 : 0;
    if (curve_ || n >= cap) {
      for (auto it = sessions_.begin(); it != sessions_.end();) {
        if (shares(it->second) && !any_open(it->second)) {
          it = remove_session(it);
          --n;
        } else {
          ++it;
        }
      }
    }
    while (n >= cap) {
      SessionIt oldest = sessions_.end();
      for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
        if (shares(it->second) && (oldest == sessions_.end() || it->second.heard < oldest->second.heard)) oldest = it;
      remove_session(oldest);
      --n;
    }
    KeyState& ks = keys_.try_emplace(key, budget_bytes_, &c_.lane_held_bytes).first->second;
    ++ks.sessions;
    const SessionIt it = sessions_.try_emplace(sid, key, &ks, identity, pending_bound_, max_payload_).first;
    c_.lane_sessions = sessions_.size();
    return it;
  }

  // Removes the sessions none of whose connections is open any more, and discards what silent ones held: after a
  // disconnect (at most every kSweepGap) and every kSweepEvery.
  void sweep_sessions() {
    if (sessions_.empty()) return;
    const auto now = Clock::now();
    const uint64_t disconnects = c_.disconnects.load();
    if (now - swept_at_ < (disconnects != swept_disconnects_ ? kSweepGap : kSweepEvery)) return;
    swept_at_ = now;
    swept_disconnects_ = disconnects;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (!any_open(it->second)) {
        it = remove_session(it);
        continue;
      }
      it->second.rx.expire(now);
      count(it->second);
      ++it;
    }
  }

  // Our hello on `lane`, echoing its greeting: the client may now send parts there. Its seq tells the client that
  // nothing we sent up to it is still coming on the lane's earlier connections.
  void answer_hello(Session& s, const std::string& sid, int lane) {
    Tag back;
    back.kind = TagKind::kHello;
    back.index = static_cast<uint8_t>(lane);
    back.seq = seq_;
    back.offset = s.greeting[lane];
    s.answer_due[lane] = false;
    s.known[lane] = send_copy(router_.get(), lane_id(sid, lane), ZMQ_SNDMORE) &&
                    send_frame(router_.get(), encode_tag(back), 0);
  }

  static std::string lane_id(const std::string& session, int lane) {
    return std::string(1, kLaneMark) + session + static_cast<char>(lane);
  }

  void deliver(std::string peer, std::string identity, MsgPtr header, Bytes payload, int parts) {
    Envelope e;
    e.peer = std::move(peer);
    e.identity = std::move(identity);
    e.header = header ? wrap(header) : Bytes();
    e.payload = std::move(payload);
    e.parts = parts;
    ready_.push_back(std::move(e));
  }

  // Files one raw message (routing id first): delivers it, or hands it to its session's reassembly.
  void take(const std::vector<MsgPtr>& f, int total) {
    std::string rid(static_cast<const char*>(zmq_msg_data(f[0].get())), zmq_msg_size(f[0].get()));
    // The ZAP handler's User-Id travels as metadata on every frame that came from the connection.
    const char* user = f.size() > 1 ? zmq_msg_gets(f[1].get(), "User-Id") : nullptr;
    std::string identity = user != nullptr ? user : "";
    tune_tcp(&tcp_, &c_, f.size() > 1 ? f[1].get() : f[0].get());
    if (!is_lane_id(rid)) {  // a client without lanes: the message as it came
      deliver(std::move(rid), std::move(identity), f.size() > 1 ? f[1] : nullptr, f.size() > 2 ? wrap(f[2]) : Bytes(),
              total - 1);
      return;
    }
    const std::string sid = rid.substr(1, kSessionBytes);
    const int lane = static_cast<uint8_t>(rid.back());
    if (lane >= kMaxLanes) {
      c_.lane_refused++;
      return;
    }
    auto it = sessions_.find(sid);
    if (it == sessions_.end()) it = open_session(sid, identity);
    Session& s = it->second;
    if (identity != s.identity) {  // a lane under another key than its session's: refused, whatever it carries
      c_.auth_denied++;
      return;
    }
    s.heard = Clock::now();
    s.conn[lane] = conn_of(f.size() > 1 ? f[1].get() : f[0].get());
    Tag t;
    std::deque<Reassembler::Done> done;
    if (lane == 0) {
      if (!s.lead_heard) {  // the session is established: answer the hellos that came first
        s.lead_heard = true;
        for (int i = 1; i < kMaxLanes; ++i)
          if (s.answer_due[i]) answer_hello(s, sid, i);
      }
      if (total == 4 && decode_tag(f[3].get(), &t) && t.kind == TagKind::kLead) {
        s.rx.lead(t, f[1], f[2], identity, &done);
      } else if (total == 3 && decode_tag(f[1].get(), &t) && t.kind == TagKind::kPart) {
        s.rx.part(0, t, f[2], identity, &done);
      } else {  // not what a laned client sends: delivered with its frame count for the role to judge
        deliver(std::move(rid), std::move(identity), f.size() > 1 ? f[1] : nullptr,
                f.size() > 2 ? wrap(f[2]) : Bytes(), total - 1);
      }
    } else if (total == 2 && decode_tag(f[1].get(), &t) && t.kind == TagKind::kHello) {
      s.rx.reset_lane(lane, t.seq, &done);
      s.greeting[lane] = t.offset;
      s.known[lane] = false;
      if (s.lead_heard)
        answer_hello(s, sid, lane);
      else
        s.answer_due[lane] = true;
    } else if (total == 3 && decode_tag(f[1].get(), &t) && t.kind == TagKind::kPart) {
      if (s.lead_heard)
        s.rx.part(lane, t, f[2], identity, &done);
      else
        s.rx.refuse_part(lane, t.seq);  // no lane 0 yet: nothing to complete, and nothing kept for it
    } else {
      c_.dropped_in++;  // a malformed lane message: nothing to deliver it as
    }
    count(s);
    for (auto& d : done) deliver(lane_id(sid, 0), std::move(d.identity), d.header, std::move(d.payload), 2);
  }

  bool send_plain(const std::string& peer, const Bytes& header, const Bytes& payload) {
    // With ROUTER_MANDATORY the routing-id frame is where an unknown peer (EHOSTUNREACH) or a full queue (EAGAIN)
    // is reported; once it is accepted the rest of the message goes to the same pipe.
    return send_copy(router_.get(), peer, ZMQ_SNDMORE) && send_frame(router_.get(), header, ZMQ_SNDMORE) &&
           send_frame(router_.get(), payload, 0);
  }

  // The pieces of cut(), on the lanes the session has up. A lane that has gone (EHOSTUNREACH) is forgotten and the
  // message cut again without it; what was already queued for it is discarded by the client as orphans.
  bool send_laned(Session& s, const std::string& peer, const Bytes& header, const Bytes& payload) {
    const std::string sid = peer.substr(1, kSessionBytes);
    for (;;) {
      std::vector<int> usable;
      for (int lane = 0; lane < kMaxLanes; ++lane)
        if (lane == 0 || s.known[lane]) usable.push_back(lane);
      const std::vector<Piece> pieces = cut(usable, payload, split_bytes_, ++seq_);
      bool retry = false;
      for (size_t i = 0; i + 1 < pieces.size() && !retry; ++i) {
        const Piece& p = pieces[i];
        if (!send_copy(router_.get(), lane_id(sid, p.lane), ZMQ_SNDMORE)) {
          if (zmq_errno() != EHOSTUNREACH || p.lane == 0) return false;  // queue full, or the client is gone
          s.known[p.lane] = false;
          retry = true;
        } else if (!(send_frame(router_.get(), p.tag, ZMQ_SNDMORE) && send_frame(router_.get(), p.bytes, 0))) {
          return false;
        }
      }
      if (retry) continue;
      const Piece& lead = pieces.back();
      return send_copy(router_.get(), peer, ZMQ_SNDMORE) && send_frame(router_.get(), header, ZMQ_SNDMORE) &&
             send_frame(router_.get(), lead.bytes, ZMQ_SNDMORE) && send_frame(router_.get(), lead.tag, 0);
    }
  }

  Counters c_;  // declared first: the sessions' budgets report to it until they are gone
  const bool curve_;
  const uint64_t split_bytes_;
  const size_t pending_bound_;
  const uint64_t max_payload_;  // a split payload is held to the bound of one frame
  const uint64_t budget_bytes_;  // what one key's incomplete laned messages may hold
  net::TcpTuner tcp_;            // each connection's TCP settings, fitted as its frames arrive
  std::optional<AllowList> allow_;
  std::map<std::string, KeyState> keys_;     // laned clients' keys; declared before the sessions charged to them
  std::map<std::string, Session> sessions_;  // laned clients by session id
  // The seq of our last laned message, over all sessions, started from the clock: a session that is removed and
  // comes back (its client reconnected), or a restarted server, goes on above what the client has seen.
  uint64_t seq_ = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  uint64_t swept_disconnects_ = 0;
  Clock::time_point swept_at_{};
  std::deque<Envelope> ready_;               // complete messages not yet returned by receive()
  Context ctx_;  // declared before the sockets: destroyed after them
  Socket zap_, router_, monitor_;
  std::string endpoint_;
  std::thread thread_;
};

}  // namespace
}  // namespace zmq_detail


std::unique_ptr<ServerTransport> make_zmq_server(const std::string& endpoint, const TransportOptions& opts) {
  return std::make_unique<zmq_detail::ZmqServer>(endpoint, opts);
}

}  // namespace deloco
