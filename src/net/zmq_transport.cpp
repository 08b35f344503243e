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
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
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
  std::atomic<uint64_t> messages_in{0}, messages_out{0}, bytes_in{0}, bytes_out{0}, dropped_out{0}, dropped_in{0}, auth_denied{0},
      handshake_failures{0}, connections{0}, disconnects{0}, lane_refused{0}, lane_sessions{0}, lane_held_bytes{0},
      lanes_up{0};
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

// Waits until `deadline` for one whole message from any of `socks` (tried in turn from `*next`, so that one busy
// socket does not starve the others); `*which` tells which socket it came from.
bool receive_any(const std::vector<void*>& socks, size_t* next, size_t keep, Clock::time_point deadline,
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

// ---------------------------------------------------------------------------------------------------------------
// Lanes (TransportOptions::lanes > 1; docs/transport.md). A client opens several DEALER sockets ("lanes") to the
// server, each one ZeroMQ connection with its own CURVE handshake. Lane i's routing id is kLaneMark, a 16-byte random
// session id and i: the server groups a client's lanes by session and answers on them. Every message of a laned
// session carries a tag frame (below); a payload of at least split_bytes is cut into contiguous parts:
//   lane 0 ("lead"):  header | part 0 | tag(lead: seq, parts, lane mask, total bytes)
//   lane i ("part"):  tag(part: seq, index, offset) | part
//   lane i ("hello"): tag(hello, seq = the sender's last seq, offset = greeting number), sent by the client once per
//                     handshake of lane i, so that the server learns the lane and may use it; the server answers
//                     with its own hello echoing the number, once the session's lane 0 has spoken, and only then
//                     does the client send parts on the lane (the server keeps no part of a session without lane 0)
// Each lane is FIFO, so the receiver matches the oldest lead with the oldest part on each lane the lead names. A part
// is lost only with its connection; then the lead is discarded and counted: a part newer than the lead shows it, and
// so does a hello on the part's lane (a new connection: nothing sent up to the hello's seq is still coming there).
constexpr char kLaneMark = 'L';               // first byte of a lane's routing id (auto ids start with 0)
constexpr size_t kSessionBytes = 16;
constexpr size_t kLaneIdBytes = 1 + kSessionBytes + 1;  // mark, session, lane index
constexpr char kTagMagic[4] = {'D', 'L', 'N', '1'};
constexpr size_t kTagBytes = 36;
constexpr int kMaxLanes = TransportOptions::kMaxLanes;
// Pending parts of a session with no frame from it for this long are discarded (a client that vanished mid-message).
constexpr auto kStalePending = std::chrono::seconds(120);
// The server looks for sessions whose connections have all closed after each disconnect (at most every kSweepGap)
// and every kSweepEvery (a disconnect is reported just before its descriptor closes).
constexpr auto kSweepGap = std::chrono::milliseconds(10);
constexpr auto kSweepEvery = std::chrono::seconds(1);

enum class TagKind : uint8_t { kLead = 1, kPart = 2, kHello = 3 };

struct Tag {
  TagKind kind = TagKind::kLead;
  uint8_t index = 0;   // part: its index (1 .. count - 1)
  uint8_t count = 1;   // lead: parts, its own included; part i travels on the (i mod lanes)-th lane of the mask
  uint32_t mask = 1;   // lead: lanes carrying parts, bit 0 (the lead's own lane) always set
  uint64_t seq = 0;    // per session and direction, from 1
  uint64_t offset = 0; // part: where it starts in the payload
  uint64_t total = 0;  // lead: the whole payload's size
};

void put_u64(char* p, uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i)); }
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

Bytes encode_tag(const Tag& t) {
  std::string s(kTagBytes, '\0');
  std::memcpy(&s[0], kTagMagic, 4);
  s[4] = static_cast<char>(t.kind);
  s[5] = static_cast<char>(t.index);
  s[6] = static_cast<char>(t.count);
  for (int i = 0; i < 4; ++i) s[8 + i] = static_cast<char>(t.mask >> (8 * i));
  put_u64(&s[12], t.seq);
  put_u64(&s[20], t.offset);
  put_u64(&s[28], t.total);
  return Bytes::from_string(std::move(s));
}

bool decode_tag(zmq_msg_t* m, Tag* t) {
  if (zmq_msg_size(m) != kTagBytes) return false;
  const char* p = static_cast<const char*>(zmq_msg_data(m));
  if (std::memcmp(p, kTagMagic, 4) != 0) return false;
  const auto kind = static_cast<uint8_t>(p[4]);
  if (kind < 1 || kind > 3) return false;
  t->kind = static_cast<TagKind>(kind);
  t->index = static_cast<uint8_t>(p[5]);
  t->count = static_cast<uint8_t>(p[6]);
  t->mask = 0;
  for (int i = 0; i < 4; ++i) t->mask |= uint32_t{static_cast<uint8_t>(p[8 + i])} << (8 * i);
  t->seq = get_u64(p + 12);
  t->offset = get_u64(p + 20);
  t->total = get_u64(p + 28);
  if (t->kind == TagKind::kLead)
    return (t->mask & 1) && t->mask < (1u << kMaxLanes) && t->count >= __builtin_popcount(t->mask);
  return t->kind == TagKind::kPart ? t->index >= 1 : t->index < kMaxLanes;
}

// Part i of `size` bytes cut in `k` nearly equal parts.
std::pair<size_t, size_t> part_range(size_t size, size_t k, size_t i) {
  const size_t base = size / k, extra = size % k;
  const size_t off = i * base + std::min(i, extra);
  return {off, base + (i < extra ? 1 : 0)};
}

constexpr size_t kMaxParts = 255;  // a tag's count byte

// One message of a laned session as pieces to send: parts of about split_bytes each (frames that size are cheaper
// to encrypt and decrypt than one huge frame: the buffers stay in cache), dealt round-robin over the usable lanes
// (lane 0 first) with part 0 in the lead. Parts come first, in index order, the lead last: a message whose parts
// could not all be queued is never announced.
struct Piece {
  int lane;
  Bytes tag, bytes;
};
std::vector<Piece> cut(const std::vector<int>& usable, const Bytes& payload, uint64_t split_bytes, uint64_t seq) {
  const size_t size = payload.size();
  size_t k = 1;
  if (split_bytes > 0 && size >= split_bytes)
    k = static_cast<size_t>(std::min<uint64_t>(kMaxParts, (size + split_bytes - 1) / split_bytes));
  const size_t n = std::min(usable.size(), k);
  Tag lead;
  lead.seq = seq;
  lead.count = static_cast<uint8_t>(k);
  lead.total = size;
  lead.mask = 0;
  for (size_t i = 0; i < n; ++i) lead.mask |= 1u << usable[i];
  std::vector<Piece> pieces;
  for (size_t i = 1; i < k; ++i) {
    const auto [off, len] = part_range(size, k, i);
    Tag t;
    t.kind = TagKind::kPart;
    t.index = static_cast<uint8_t>(i);
    t.seq = seq;
    t.offset = off;
    pieces.push_back({usable[i % n], encode_tag(t), payload.slice(off, len)});
  }
  const auto [off0, len0] = part_range(size, k, 0);
  pieces.push_back({0, encode_tag(lead), payload.slice(off0, len0)});
  return pieces;
}

// Bytes held for incomplete laned messages against a limit: on the server one budget per key, shared by the key's
// sessions; on a client one for its session. `gauge` (TransportStats::lane_held_bytes) follows the sum of the
// budgets that share it. Every frame held is charged its size plus kPieceOverhead.
constexpr uint64_t kPieceOverhead = 256;  // per frame held: its zmq_msg_t, its tag, the queue entry, the identity

class LaneBudget {
 public:
  LaneBudget(uint64_t limit, std::atomic<uint64_t>* gauge) : limit_(limit), gauge_(gauge) {}
  LaneBudget(const LaneBudget&) = delete;
  LaneBudget& operator=(const LaneBudget&) = delete;
  // Takes `n` bytes when they fit under the limit; false, taking nothing, when they do not.
  bool take(uint64_t n) {
    if (n > limit_ - held_) return false;
    held_ += n;
    *gauge_ += n;
    return true;
  }
  void give(uint64_t n) {
    held_ -= n;
    *gauge_ -= n;
  }

 private:
  const uint64_t limit_;
  uint64_t held_ = 0;
  std::atomic<uint64_t>* gauge_;
};

// (receive_limit + 1) × max_frame_bytes, saturating: what one key may hold in incomplete laned messages.
uint64_t lane_budget_bytes(uint64_t messages, uint64_t max_frame_bytes) {
  const uint64_t n = messages + 1;
  return max_frame_bytes > std::numeric_limits<uint64_t>::max() / n ? std::numeric_limits<uint64_t>::max()
                                                                     : n * max_frame_bytes;
}

// One laned peer's receiving side: leads and parts as they arrive, complete messages out, in order. What it holds
// is charged to a LaneBudget; a frame that does not fit is refused (counted), never kept. Leads arrive in seq order
// on lane 0 and each lane's parts in seq order, so a part older than the newest lead whose lead is not waiting, or
// not newer than its lane's floor, can never complete a message: it is refused too.
class Reassembler {
 public:
  struct Done {
    MsgPtr header;
    Bytes payload;
    std::string identity;
  };

  // bound: whole messages a peer may have waiting; max_payload: the largest payload a lead may announce.
  Reassembler(size_t bound, uint64_t max_payload, LaneBudget* budget)
      : bound_(std::max<size_t>(bound, 1)), max_payload_(max_payload), budget_(budget) {}
  ~Reassembler() { discard(); }
  Reassembler(const Reassembler&) = delete;
  Reassembler& operator=(const Reassembler&) = delete;

  // Returns the messages the new frame completed (appended to `out`), counting what it had to discard.
  void lead(const Tag& t, MsgPtr header, MsgPtr part0, std::string identity, std::deque<Done>* out) {
    touched_ = Clock::now();
    if (t.seq <= settled_ || t.seq <= newest_lead_) {  // a replay, or a sender that restarted its count: not ours
      ++dropped_;
      return;
    }
    const uint64_t previous = newest_lead_;
    newest_lead_ = t.seq;
    erase_parts(previous, t.seq - 1);  // orphans: their leads, older than this one, will never come
    if (leads_.size() >= bound_) {     // the oldest waits for a part that may never come: make room
      release(leads_.front().cost);
      leads_.pop_front();
      ++dropped_;
    }
    const uint64_t cost = zmq_msg_size(header.get()) + zmq_msg_size(part0.get()) + kPieceOverhead;
    if (!budget_->take(cost)) {  // over the key's budget: the message is lost, and so are its parts
      ++dropped_;
      ++refused_;
      erase_parts(t.seq - 1, t.seq);
    } else {
      leads_.push_back({t, std::move(header), std::move(part0), std::move(identity), cost});
    }
    settle(out);
  }
  // A hello on `lane`: a new connection, on which nothing up to `seq` will arrive any more.
  void reset_lane(int lane, uint64_t seq, std::deque<Done>* out) {
    touched_ = Clock::now();
    floor_[lane] = std::max(floor_[lane], seq);
    settle(out);
  }
  void part(int lane, const Tag& t, MsgPtr data, std::string identity, std::deque<Done>* out) {
    touched_ = Clock::now();
    auto& q = parts_[lane];
    if (t.seq <= settled_ || t.seq <= floor_[lane] || (!q.empty() && t.seq < q.back().t.seq) ||
        (t.seq <= newest_lead_ && !lead_waiting(t.seq))) {
      ++refused_;  // belonged to a lead settled or discarded, or out of order: it can complete nothing
      return;
    }
    const uint64_t cost = zmq_msg_size(data.get()) + kPieceOverhead;
    if (!budget_->take(cost)) {
      refuse_part(lane, t.seq);
      settle(out);
      return;
    }
    q.push_back({t, std::move(data), std::move(identity), cost});
    settle(out);
  }
  // A part not kept (the caller's bounds, or the budget's): its message cannot complete; nothing up to its seq is
  // kept on `lane` any more, so a lead waiting for it is discarded instead of waiting.
  void refuse_part(int lane, uint64_t seq) {
    ++refused_;
    floor_[lane] = std::max(floor_[lane], seq);
  }
  bool pending() const {
    if (!leads_.empty()) return true;
    for (const auto& q : parts_) if (!q.empty()) return true;
    return false;
  }
  // Discards what waited longer than kStalePending since the peer's last frame.
  void expire(Clock::time_point now) {
    if (!pending() || now - touched_ < kStalePending) return;
    dropped_ += discard();
  }
  // Releases everything held; returns the incomplete messages (leads) it discarded.
  size_t discard() {
    const size_t leads = leads_.size();
    for (const Lead& l : leads_) release(l.cost);
    leads_.clear();
    for (auto& q : parts_) {
      for (const Part& p : q) release(p.cost);
      q.clear();
    }
    return leads;
  }
  uint64_t take_dropped() { return std::exchange(dropped_, 0); }
  uint64_t take_denied() { return std::exchange(denied_, 0); }
  uint64_t take_refused() { return std::exchange(refused_, 0); }

 private:
  struct Lead {
    Tag t;
    MsgPtr header, part0;
    std::string identity;
    uint64_t cost;
  };
  struct Part {
    Tag t;
    MsgPtr data;
    std::string identity;
    uint64_t cost;
  };

  void release(uint64_t cost) { budget_->give(cost); }

  bool lead_waiting(uint64_t seq) const {
    const auto it = std::lower_bound(leads_.begin(), leads_.end(), seq,
                                     [](const Lead& l, uint64_t s) { return l.t.seq < s; });
    return it != leads_.end() && it->t.seq == seq;
  }

  // Erases the parts with lo < seq <= hi from every lane (each lane's parts are in seq order).
  void erase_parts(uint64_t lo, uint64_t hi) {
    if (hi <= lo) return;
    auto by_seq = [](uint64_t s, const Part& p) { return s < p.t.seq; };
    for (auto& q : parts_) {
      const auto first = std::upper_bound(q.begin(), q.end(), lo, by_seq);
      const auto last = std::upper_bound(first, q.end(), hi, by_seq);
      for (auto it = first; it != last; ++it) release(it->cost);
      q.erase(first, last);
    }
  }

  void pop_part(int lane) {
    release(parts_[lane].front().cost);
    parts_[lane].pop_front();
  }

  // The lanes of a lead's mask, lane 0 first; part i travels on lanes[i % lanes.size()].
  static std::vector<int> lanes_of(const Tag& t) {
    std::vector<int> lanes;
    for (int lane = 0; lane < kMaxLanes; ++lane)
      if (t.mask & (1u << lane)) lanes.push_back(lane);
    return lanes;
  }

  void settle(std::deque<Done>* out) {
    while (!leads_.empty()) {
      Lead& l = leads_.front();
      for (int lane = 0; lane < kMaxLanes; ++lane)  // orphans of discarded leads
        while (!parts_[lane].empty() && parts_[lane].front().t.seq < l.t.seq) pop_part(lane);
      const std::vector<int> lanes = lanes_of(l.t);
      size_t need[kMaxLanes] = {};
      for (size_t i = 1; i < l.t.count; ++i) ++need[lanes[i % lanes.size()]];
      bool waiting = false, lost = l.t.total > max_payload_;
      for (int lane : lanes) {
        const auto& q = parts_[lane];
        size_t have = 0;
        while (have < q.size() && have < need[lane] && q[have].t.seq == l.t.seq) ++have;
        if (have == need[lane]) continue;
        if (have < q.size() || l.t.seq <= floor_[lane]) lost = true;  // a newer part came, or a new connection
        else waiting = true;
      }
      if (waiting && !lost) return;
      settled_ = l.t.seq;
      if (lost || !assemble(l, lanes, need, out)) ++dropped_;
      for (int lane : lanes)
        for (size_t i = 0; i < need[lane] && !parts_[lane].empty() && parts_[lane].front().t.seq == l.t.seq; ++i)
          pop_part(lane);
      release(l.cost);
      leads_.pop_front();
    }
  }

  // Checks that the parts tile the payload and come from the lead's key; copies them into one buffer.
  bool assemble(const Lead& l, const std::vector<int>& lanes, const size_t* need, std::deque<Done>* out) {
    std::vector<const Part*> ps;
    size_t taken[kMaxLanes] = {};
    for (size_t i = 1; i < l.t.count; ++i) {
      const int lane = lanes[i % lanes.size()];
      if (taken[lane] >= need[lane]) return false;
      ps.push_back(&parts_[lane][taken[lane]++]);
    }
    uint64_t at = zmq_msg_size(l.part0.get());
    for (size_t i = 0; i < ps.size(); ++i) {
      if (ps[i]->identity != l.identity) { ++denied_; return false; }
      if (ps[i]->t.index != i + 1 || ps[i]->t.offset != at) return false;
      at += zmq_msg_size(ps[i]->data.get());
    }
    if (at != l.t.total) return false;
    Done d{l.header, Bytes(), l.identity};
    if (ps.empty()) {
      d.payload = Bytes(l.part0, static_cast<const char*>(zmq_msg_data(l.part0.get())), zmq_msg_size(l.part0.get()));
    } else {
      std::shared_ptr<char> buf(new char[std::max<uint64_t>(at, 1)], std::default_delete<char[]>());
      size_t pos = 0;
      auto put = [&](zmq_msg_t* m) {
        if (zmq_msg_size(m) > 0) std::memcpy(buf.get() + pos, zmq_msg_data(m), zmq_msg_size(m));
        pos += zmq_msg_size(m);
      };
      put(l.part0.get());
      for (const Part* p : ps) put(p->data.get());
      d.payload = Bytes(buf, buf.get(), at);
    }
    out->push_back(std::move(d));
    return true;
  }

  size_t bound_;
  uint64_t max_payload_;
  LaneBudget* budget_;
  std::deque<Lead> leads_;
  std::deque<Part> parts_[kMaxLanes];
  uint64_t floor_[kMaxLanes] = {};
  uint64_t settled_ = 0, newest_lead_ = 0, dropped_ = 0, denied_ = 0, refused_ = 0;
  Clock::time_point touched_ = Clock::now();
};

std::string random_session() {
  std::random_device rd;  // getrandom(2) on Linux
  std::string s(kSessionBytes, '\0');
  for (size_t i = 0; i < kSessionBytes; i += 4) {
    const uint32_t v = rd();
    std::memcpy(&s[i], &v, 4);
  }
  return s;
}

bool is_lane_id(const std::string& rid) { return rid.size() == kLaneIdBytes && rid[0] == kLaneMark; }

int lanes_option(const TransportOptions& o) {
  if (o.lanes < 1 || o.lanes > kMaxLanes)
    throw TransportError("lanes must be in [1, " + std::to_string(kMaxLanes) + "] (got " + std::to_string(o.lanes) + ")");
  return o.lanes;
}

int io_threads_option(const TransportOptions& o) {
  if (o.io_threads < 1 || o.io_threads > 64)
    throw TransportError("io_threads must be in [1, 64] (got " + std::to_string(o.io_threads) + ")");
  return o.io_threads;
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
  ZmqServer(const std::string& endpoint, const TransportOptions& o)
      : curve_(!o.plaintext),
        split_bytes_(o.split_bytes),
        pending_bound_(static_cast<size_t>(o.receive_limit > 0 ? o.receive_limit : o.queue_limit)),
        max_payload_(o.max_frame_bytes),
        budget_bytes_(lane_budget_bytes(pending_bound_, o.max_frame_bytes)),
        ctx_(io_threads_option(o)) {
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

// ---------------------------------------------------------------------------------------------------------------
class ZmqClient final : public ClientTransport {
 public:
  ZmqClient(const std::string& endpoint, const TransportOptions& o)
      : ctx_(io_threads_option(o)),
        split_bytes_(o.split_bytes),
        budget_(lane_budget_bytes(static_cast<uint64_t>(std::max(1, o.queue_limit)), o.max_frame_bytes),
                &c_.lane_held_bytes),
        rx_(static_cast<size_t>(std::max(1, o.queue_limit)), o.max_frame_bytes, &budget_) {
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
      if (lanes_.size() > 1) read_monitor_events();
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
  std::deque<Envelope> ready_;
};

}  // namespace

std::unique_ptr<ServerTransport> make_zmq_server(const std::string& endpoint, const TransportOptions& opts) {
  return std::make_unique<ZmqServer>(endpoint, opts);
}

std::unique_ptr<ClientTransport> make_zmq_client(const std::string& endpoint, const TransportOptions& opts) {
  return std::make_unique<ZmqClient>(endpoint, opts);
}

}  // namespace deloco
