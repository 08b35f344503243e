// The state-chunk server: see chunk_server.h for the contract.
#include "chunk_server.h"

#include <utility>

namespace deloco {

ChunkServer::Resolution ChunkServer::Resolution::serve(int64_t elements, std::function<Bytes()> payload) {
  Resolution r;
  r.kind = Kind::kServe;
  r.elements = elements;
  r.payload = std::move(payload);
  return r;
}

ChunkServer::Resolution ChunkServer::Resolution::refuse(proto::RejectReason reason, std::string text) {
  Resolution r;
  r.kind = Kind::kRefuse;
  r.reason = reason;
  r.text = std::move(text);
  return r;
}

ChunkServer::Resolution ChunkServer::Resolution::wait(proto::RejectReason reason, std::string text) {
  Resolution r = refuse(reason, std::move(text));
  r.kind = Kind::kWait;
  return r;
}

ChunkServer::ChunkServer(Options options, Send send)
    : opt_(std::move(options)), send_(std::move(send)), tokens_(TokenBucket::mbit(opt_.rate_mbit)) {}

bool ChunkServer::offer(Request q, double t) {
  if (full()) return false;
  q.since = t;
  queue_.push_back(std::move(q));
  return true;
}

uint32_t ChunkServer::reply_learner(const Request& q) const {
  return static_cast<uint32_t>(opt_.answer_as >= 0 ? opt_.answer_as : q.learner);
}

void ChunkServer::refuse(const Request& q, proto::RejectReason reason, const std::string& text) {
  MessageHeader h;
  h.kind = MessageKind::kReject;
  h.round = static_cast<uint64_t>(reason);  // a reject's round is its code
  h.learner_id = reply_learner(q);
  h.fragment_id = opt_.reject_names_chunk ? q.h.fragment_id : proto::kNoFragment;
  h.fingerprint = opt_.fingerprint;
  if (send_) send_(q.route, proto::make_frame(h, text, opt_.limits));
}

bool ChunkServer::send_chunk(const Request& q, int64_t elements, Bytes payload) {
  MessageHeader h;
  h.kind = MessageKind::kStateChunk;
  h.encoding = Encoding::kFp32;
  h.learner_id = reply_learner(q);
  h.fragment_id = q.h.fragment_id;
  h.fingerprint = opt_.fingerprint;
  h.round = q.h.round;
  h.element_count = static_cast<uint64_t>(elements);
  auto f = proto::make_frame(h, std::move(payload), opt_.limits);
  return send_ && send_(q.route, f);
}

void ChunkServer::pump(double t, const Resolve& resolve, const Answered& answered) {
  tokens_.refill(t);
  // The waiting requests first, in their order (their data may have come, or their wait be over); then the new ones.
  for (size_t i = waiting_.size(); i-- > 0;) queue_.push_front(std::move(waiting_[i]));
  waiting_.clear();
  while (!queue_.empty()) {
    Request& q = queue_.front();
    const Resolution res = resolve(q);
    Outcome out = Outcome::kRefused;
    if (res.kind == Resolution::Kind::kWait && t - q.since < opt_.max_wait && waiting_.size() < opt_.max_waiting) {
      waiting_.push_back(std::move(q));
      queue_.pop_front();
      continue;
    }
    if (res.kind == Resolution::Kind::kServe) {
      if (!tokens_.take(static_cast<double>(res.elements) * 4)) break;  // the rest when the bucket has refilled
      out = send_chunk(q, res.elements, res.payload()) ? Outcome::kServed : Outcome::kUnsent;
    } else {  // refused, or a wait that is over (or finds the waiting list full)
      refuse(q, res.reason, res.text);
    }
    const Request done = std::move(q);
    queue_.pop_front();
    if (answered) answered(done, out, res);
  }
}

}  // namespace deloco
