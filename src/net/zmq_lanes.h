// Internal to the ZeroMQ transports: lanes (TransportOptions::lanes > 1), a client's several connections to one
// server, with the tag frames, the cutting of a payload into parts, the per-key budget and the server's reassembly.
#pragma once

#include "net/zmq_internal.h"

namespace deloco::zmq_detail {

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

inline void put_u64(char* p, uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i)); }
inline uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

inline Bytes encode_tag(const Tag& t) {
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

inline bool decode_tag(zmq_msg_t* m, Tag* t) {
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
inline std::pair<size_t, size_t> part_range(size_t size, size_t k, size_t i) {
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
inline std::vector<Piece> cut(const std::vector<int>& usable, const Bytes& payload, uint64_t split_bytes, uint64_t seq) {
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
inline uint64_t lane_budget_bytes(uint64_t messages, uint64_t max_frame_bytes) {
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


inline bool is_lane_id(const std::string& rid) { return rid.size() == kLaneIdBytes && rid[0] == kLaneMark; }

inline std::string random_session() {
  std::random_device rd;  // getrandom(2) on Linux
  std::string s(kSessionBytes, '\0');
  for (size_t i = 0; i < kSessionBytes; i += 4) {
    const uint32_t v = rd();
    std::memcpy(&s[i], &v, 4);
  }
  return s;
}

inline int lanes_option(const TransportOptions& o) {
  if (o.lanes < 1 || o.lanes > kMaxLanes)
    throw TransportError("lanes must be in [1, " + std::to_string(kMaxLanes) + "] (got " + std::to_string(o.lanes) + ")");
  return o.lanes;
}

}  // namespace deloco::zmq_detail
