// src/roles/chunk_server.h — the state-chunk server of rejoin from peers (docs/reliability.md): how state requests
// (kStateRequest) are queued, paced and answered. One class for both servers: the syncer's share of a fetched
// download (syncer_node.cpp, serve_chunks) and a donor learner's (donor_server.cpp).
//
// Contract
//  * Requests. offer() queues one (stamping `since`); it refuses (false, nothing sent) when max_queue requests are
//    queued already. Who may ask is the owner's question (a donor's tickets and per-requester window): ChunkServer
//    admits whatever it is offered.
//  * Answering. pump(t, resolve, answered) first puts the waiting requests back at the head of the queue in their
//    order, then takes the queue from its head, asking `resolve` about each request:
//      - serve(elements, payload): charged elements × 4 bytes to a token bucket of options.rate_mbit
//        (TokenBucket::mbit: a tenth of a second of burst). When the bucket cannot pay, pump stops there: that
//        request and the ones behind it stay queued, in order, for the next pump (which asks resolve again). Once
//        paid, payload() is called (once) for the elements × 4 bytes of fp32 — a Bytes that may own a hold, kept
//        alive until the transport lets go of it — and sent as a kStateChunk frame.
//      - refuse(reason, text): a kReject frame, at once (no charge).
//      - wait(reason, text): the data asked for is on its way. The request goes to the waiting list when it came
//        less than options.max_wait seconds ago and fewer than options.max_waiting wait; otherwise it is refused
//        with (reason, text) at once. Waiting requests are asked about again at the next pump, ahead of new ones.
//    After each request leaves (served or refused; not while waiting or unpaid) `answered(request, outcome, res)`
//    says how: kServed (the transport took the chunk), kUnsent (it refused the send), kRefused (a reject went).
//    So resolve may be called several times for one request; answered is called exactly once.
//  * Frames (all replies to the request's route, through the send hook; options.fingerprint, options.limits):
//      - chunk: kind kStateChunk, encoding kFp32, learner_id = reply_learner (below), fragment_id = the request's
//        fragment_id (the chunk), round = the request's round, element_count = elements; payload = the fp32 bytes.
//      - reject: kind kReject, round = the RejectReason code (a reject's round is its code), learner_id =
//        reply_learner, fragment_id = the request's fragment_id when options.reject_names_chunk, else
//        proto::kNoFragment; payload = the text as given.
//    reply_learner is options.answer_as when it is >= 0 (a donor writes in its own name), else the request's
//    learner (the syncer writes to each learner in that learner's name).
//  * refuse(request, reason, text) sends such a reject at once, outside the queue (a donor's admission refusals).
//  * Time is the owner's: `t` and `since` are seconds on one monotonic clock. Not thread-safe (one owner thread).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "protocol.h"
#include "util/token_bucket.h"

namespace deloco {

class ChunkServer {
 public:
  struct Options {
    double rate_mbit = 0;     // net.serve_rate (<= 0: unbounded)
    size_t max_queue = 4096;  // requests queued (not counting the waiting ones)
    size_t max_waiting = 0;   // requests waiting for their data at once (0: none wait)
    double max_wait = 0;      // seconds a request may wait for its data, counted from its offer
    uint64_t fingerprint = 0;
    WireLimits limits;
    int64_t answer_as = -1;           // learner_id of every reply; -1: the requester's (Request::learner)
    bool reject_names_chunk = false;  // a reject's fragment_id: the chunk asked (true) or proto::kNoFragment
  };
  struct Request {
    std::string route;       // the asking connection
    MessageHeader h;         // its header: fragment_id = the chunk, round = the welcome's round
    int64_t learner = -1;    // who asks (the syncer: its connection's learner; a donor: the ticket's learner)
    proto::StateRequest r;   // its body (a donor's requests; the syncer's use none)
    double since = 0;        // when it was offered
  };
  struct Resolution {
    enum class Kind { kServe, kRefuse, kWait };
    Kind kind = Kind::kRefuse;
    int64_t elements = 0;              // kServe: fp32 elements (element_count; elements × 4 bytes are charged)
    std::function<Bytes()> payload;    // kServe: the elements × 4 bytes, made once the rate allows
    proto::RejectReason reason = proto::RejectReason::kNotHeld;  // kRefuse; kWait: if the wait ends unanswered
    std::string text;
    static Resolution serve(int64_t elements, std::function<Bytes()> payload);
    static Resolution refuse(proto::RejectReason reason, std::string text);
    static Resolution wait(proto::RejectReason reason, std::string text);
  };
  enum class Outcome { kServed, kUnsent, kRefused };
  using Send = std::function<bool(const std::string& route, const proto::Frame& frame)>;
  using Resolve = std::function<Resolution(const Request&)>;
  using Answered = std::function<void(const Request&, Outcome, const Resolution&)>;

  ChunkServer() = default;  // unbounded, sends nothing: assign a configured one before use
  ChunkServer(Options options, Send send);

  bool offer(Request q, double t);
  void pump(double t, const Resolve& resolve, const Answered& answered);
  void refuse(const Request& q, proto::RejectReason reason, const std::string& text);

  size_t queued() const { return queue_.size(); }
  size_t waiting() const { return waiting_.size(); }
  bool full() const { return queue_.size() >= opt_.max_queue; }
  bool empty() const { return queue_.empty() && waiting_.empty(); }

 private:
  uint32_t reply_learner(const Request& q) const;
  bool send_chunk(const Request& q, int64_t elements, Bytes payload);

  Options opt_;
  Send send_;
  TokenBucket tokens_;
  std::deque<Request> queue_, waiting_;
};

}  // namespace deloco
