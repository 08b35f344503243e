// ChunkServer (chunk_server.h) over the in-process transport, on a clock the test keeps: the rate bound, the queue
// bound, the waiting list (answered when its data comes, refused not_held after its wait, ahead of new requests),
// and what the reply frames carry (a reject's code in `round`, the learner id and fragment id each owner asks for).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "chunk_server.h"
#include "deloco/transport.h"
#include "deloco/wire.h"
#include "protocol.h"

namespace deloco {
namespace chunk_server_cases {

using proto::RejectReason;
using Res = ChunkServer::Resolution;

constexpr uint64_t kFingerprint = 0x1234abcdULL;
constexpr int64_t kChunk = 1024;  // elements per chunk: 4096 bytes

struct Reply {
  MessageHeader h;
  std::string payload;
};

// One server and one joining learner's connection to it, over the in-process hub.
class ChunkServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    hub_ = make_inproc_hub();
    server_ = make_inproc_server(hub_);
    client_ = make_inproc_client(hub_, "joiner");
    // The server learns the joiner's route from a message of it.
    ASSERT_TRUE(client_->send(Bytes::from_string("hi"), Bytes::from_string("")));
    Envelope env;
    ASSERT_TRUE(server_->receive(&env, std::chrono::seconds(5)));
    route_ = env.peer;
    // The state the chunks are cut from: element i holds i.
    state_.resize(64 * kChunk);
    for (size_t i = 0; i < state_.size(); ++i) state_[i] = static_cast<float>(i);
  }

  ChunkServer make(ChunkServer::Options o) {
    o.fingerprint = kFingerprint;
    return ChunkServer(o, [this](const std::string& route, const proto::Frame& f) {
      sent_bytes_ += f.payload.size();
      return server_->send(route, f.header, f.payload);
    });
  }

  ChunkServer::Request request(int64_t chunk, uint64_t round = 7, int64_t learner = 3) const {
    ChunkServer::Request q;
    q.route = route_;
    q.h.kind = MessageKind::kStateRequest;
    q.h.fragment_id = static_cast<uint32_t>(chunk);
    q.h.round = round;
    q.learner = learner;
    return q;
  }

  Res serve_chunk(int64_t chunk) {
    return Res::serve(kChunk, [this, chunk] {
      ++payloads_made_;
      return Bytes::copy(state_.data() + chunk * kChunk, kChunk * 4);
    });
  }

  // Every reply the joiner has now.
  std::vector<Reply> replies() {
    std::vector<Reply> out;
    Envelope env;
    while (client_->receive(&env, std::chrono::milliseconds(0))) {
      Reply r;
      r.h = decode_header(env.header.data(), env.header.size());
      verify_payload(r.h, env.payload.data(), env.payload.size());
      r.payload = env.payload.str();
      out.push_back(std::move(r));
    }
    return out;
  }

  std::shared_ptr<InprocHub> hub_;
  std::unique_ptr<ServerTransport> server_;
  std::unique_ptr<ClientTransport> client_;
  std::string route_;
  std::vector<float> state_;
  int64_t sent_bytes_ = 0, payloads_made_ = 0;
};

TEST_F(ChunkServerTest, ChunkFramesCarryTheRequestsChunkRoundAndTheOwnersLearnerId) {
  ChunkServer::Options o;
  o.answer_as = 9;  // a donor: replies in its own name
  ChunkServer s = make(o);
  ASSERT_TRUE(s.offer(request(5, 11, 3), 0));
  std::vector<ChunkServer::Outcome> outs;
  s.pump(0, [&](const ChunkServer::Request& q) { return serve_chunk(q.h.fragment_id); },
         [&](const ChunkServer::Request&, ChunkServer::Outcome out, const Res&) { outs.push_back(out); });
  ASSERT_EQ(outs, std::vector<ChunkServer::Outcome>{ChunkServer::Outcome::kServed});
  const auto got = replies();
  ASSERT_EQ(got.size(), 1u);
  const MessageHeader& h = got[0].h;
  EXPECT_EQ(h.kind, MessageKind::kStateChunk);
  EXPECT_EQ(h.encoding, Encoding::kFp32);
  EXPECT_EQ(h.learner_id, 9u);
  EXPECT_EQ(h.fragment_id, 5u);
  EXPECT_EQ(h.round, 11u);
  EXPECT_EQ(h.fingerprint, kFingerprint);
  EXPECT_EQ(h.element_count, static_cast<uint64_t>(kChunk));
  ASSERT_EQ(got[0].payload.size(), static_cast<size_t>(kChunk) * 4);
  float first;
  std::memcpy(&first, got[0].payload.data(), 4);
  EXPECT_EQ(first, static_cast<float>(5 * kChunk));

  // The syncer: replies in the requester's name.
  ChunkServer::Options so;
  ChunkServer syncer = make(so);
  ASSERT_TRUE(syncer.offer(request(2, 11, 3), 0));
  syncer.pump(0, [&](const ChunkServer::Request& q) { return serve_chunk(q.h.fragment_id); }, nullptr);
  const auto got2 = replies();
  ASSERT_EQ(got2.size(), 1u);
  EXPECT_EQ(got2[0].h.learner_id, 3u);
}

TEST_F(ChunkServerTest, RejectFramesCarryTheCodeInRoundAndTheText) {
  ChunkServer::Options syncer_opts;  // the syncer: the requester's id, no fragment
  ChunkServer syncer = make(syncer_opts);
  ASSERT_TRUE(syncer.offer(request(4, 7, 2), 0));
  syncer.pump(0, [](const ChunkServer::Request&) { return Res::refuse(RejectReason::kMalformedFrame, "malformed_frame: past the end"); },
              nullptr);
  ChunkServer::Options donor_opts;  // a donor: its own id, the chunk named
  donor_opts.answer_as = 6;
  donor_opts.reject_names_chunk = true;
  ChunkServer donor = make(donor_opts);
  donor.refuse(request(8, 7, 2), RejectReason::kBusy, "busy: come back later");  // at once, outside the queue
  EXPECT_EQ(donor.queued(), 0u);

  const auto got = replies();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].h.kind, MessageKind::kReject);
  EXPECT_EQ(got[0].h.round, static_cast<uint64_t>(RejectReason::kMalformedFrame));
  EXPECT_EQ(proto::reject_reason_of(got[0].h), RejectReason::kMalformedFrame);
  EXPECT_EQ(got[0].h.learner_id, 2u);
  EXPECT_EQ(got[0].h.fragment_id, proto::kNoFragment);
  EXPECT_EQ(got[0].h.fingerprint, kFingerprint);
  EXPECT_EQ(got[0].payload, "malformed_frame: past the end");
  EXPECT_EQ(got[1].h.kind, MessageKind::kReject);
  EXPECT_EQ(got[1].h.round, static_cast<uint64_t>(RejectReason::kBusy));
  EXPECT_EQ(got[1].h.learner_id, 6u);
  EXPECT_EQ(got[1].h.fragment_id, 8u);
  EXPECT_EQ(got[1].payload, "busy: come back later");
}

// A backlog served on a 1 MB/s bound, pumped every 10 ms for 3 s: the bytes sent by any time t are at most
// rate × t + one chunk, and in any one-second window at most the rate + one chunk; yet the bound is used (the
// server keeps up with it within a chunk or two).
TEST_F(ChunkServerTest, ServesAtMostTheRatePlusOneChunk) {
  ChunkServer::Options o;
  o.rate_mbit = 8;  // 1e6 bytes/s, a tenth of a second of burst
  const double rate = 1e6, chunk = kChunk * 4.0;
  ChunkServer s = make(o);
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE(s.offer(request(i % 64), 0));
  std::vector<std::pair<double, int64_t>> sent;  // (t, bytes sent by then)
  for (int k = 0; k <= 300; ++k) {
    const double t = k * 0.01;
    s.pump(t, [&](const ChunkServer::Request& q) { return serve_chunk(q.h.fragment_id); }, nullptr);
    sent.emplace_back(t, sent_bytes_);
    EXPECT_LE(sent_bytes_, rate * t + chunk) << "at t = " << t;
  }
  for (size_t a = 0; a < sent.size(); ++a)
    for (size_t b = a + 1; b < sent.size() && sent[b].first - sent[a].first <= 1.0 + 1e-9; ++b)
      EXPECT_LE(sent[b].second - sent[a].second, rate + chunk) << sent[a].first << " .. " << sent[b].first;
  EXPECT_GE(sent_bytes_, rate * 3.0 - 2 * chunk);
  // The joiner got exactly what was sent, and no payload was made for a request the bucket could not pay.
  int64_t received = 0;
  for (const Reply& r : replies()) {
    EXPECT_EQ(r.h.kind, MessageKind::kStateChunk);
    received += static_cast<int64_t>(r.payload.size());
  }
  EXPECT_EQ(received, sent_bytes_);
  EXPECT_EQ(payloads_made_ * kChunk * 4, sent_bytes_);
  EXPECT_GT(s.queued(), 0u);  // the rest waits for the bucket
}

// Requests the bucket cannot pay stay queued in their order: the next pump answers them first.
TEST_F(ChunkServerTest, AnUnpaidRequestKeepsItsPlace) {
  ChunkServer::Options o;
  o.rate_mbit = 8 * 4096.0 / 1e5;  // one 4096-byte chunk per 0.1 s
  ChunkServer s = make(o);
  for (int c = 0; c < 4; ++c) ASSERT_TRUE(s.offer(request(c), 0));
  std::vector<uint32_t> order;
  for (int k = 0; k <= 60 && order.size() < 4; ++k)
    s.pump(k * 0.01, [&](const ChunkServer::Request& q) { return serve_chunk(q.h.fragment_id); },
           [&](const ChunkServer::Request& q, ChunkServer::Outcome, const Res&) { order.push_back(q.h.fragment_id); });
  EXPECT_EQ(order, (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST_F(ChunkServerTest, TheQueueIsBounded) {
  ChunkServer::Options o;
  o.max_queue = 3;
  ChunkServer s = make(o);
  for (int c = 0; c < 3; ++c) EXPECT_TRUE(s.offer(request(c), 0));
  EXPECT_TRUE(s.full());
  EXPECT_FALSE(s.offer(request(3), 0));
  EXPECT_FALSE(s.offer(request(4), 0));
  EXPECT_EQ(s.queued(), 3u);
  int answered = 0;
  s.pump(0, [&](const ChunkServer::Request& q) { return serve_chunk(q.h.fragment_id); },
         [&](const ChunkServer::Request&, ChunkServer::Outcome, const Res&) { ++answered; });
  EXPECT_EQ(answered, 3);
  EXPECT_TRUE(s.empty());
  std::set<uint32_t> chunks;
  for (const Reply& r : replies()) chunks.insert(r.h.fragment_id);
  EXPECT_EQ(chunks, (std::set<uint32_t>{0, 1, 2}));
  EXPECT_TRUE(s.offer(request(5), 1));  // room again
}

// The donor's waiting list: a request for data not yet here waits; it is answered when the data comes (ahead of
// requests that came after it), and refused not_held once max_wait has passed since it came.
TEST_F(ChunkServerTest, AWaitingRequestIsAnsweredWhenItsDataComesOrRefusedAfterItsWait) {
  ChunkServer::Options o;
  o.max_waiting = 8;
  o.max_wait = 5;
  o.answer_as = 1;
  o.reject_names_chunk = true;
  ChunkServer s = make(o);
  std::set<int64_t> here = {10};  // chunks whose data is here
  const auto resolve = [&](const ChunkServer::Request& q) {
    if (here.count(q.h.fragment_id)) return serve_chunk(q.h.fragment_id);
    return Res::wait(RejectReason::kNotHeld, "not_held: other versions");
  };
  std::vector<std::pair<uint32_t, ChunkServer::Outcome>> outs;
  const auto answered = [&](const ChunkServer::Request& q, ChunkServer::Outcome out, const Res&) {
    outs.emplace_back(q.h.fragment_id, out);
  };
  ASSERT_TRUE(s.offer(request(1), 0.0));  // its data comes at t = 2
  ASSERT_TRUE(s.offer(request(2), 0.0));  // its data never comes
  s.pump(0.0, resolve, answered);
  EXPECT_TRUE(outs.empty());
  EXPECT_EQ(s.waiting(), 2u);
  EXPECT_EQ(s.queued(), 0u);
  EXPECT_FALSE(s.empty());
  s.pump(1.0, resolve, answered);
  EXPECT_TRUE(outs.empty());
  EXPECT_TRUE(replies().empty());

  here.insert(1);
  ASSERT_TRUE(s.offer(request(10), 2.0));  // new, servable: after the waiting one whose data came
  s.pump(2.0, resolve, answered);
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0], std::make_pair(1u, ChunkServer::Outcome::kServed));
  EXPECT_EQ(outs[1], std::make_pair(10u, ChunkServer::Outcome::kServed));
  auto got = replies();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].h.kind, MessageKind::kStateChunk);
  EXPECT_EQ(got[0].h.fragment_id, 1u);
  EXPECT_EQ(got[1].h.fragment_id, 10u);
  EXPECT_EQ(s.waiting(), 1u);

  s.pump(4.9, resolve, answered);  // chunk 2 still within its wait
  EXPECT_EQ(outs.size(), 2u);
  EXPECT_EQ(s.waiting(), 1u);
  s.pump(5.0, resolve, answered);  // its wait is over
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_EQ(outs[2], std::make_pair(2u, ChunkServer::Outcome::kRefused));
  EXPECT_TRUE(s.empty());
  got = replies();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].h.kind, MessageKind::kReject);
  EXPECT_EQ(got[0].h.round, static_cast<uint64_t>(RejectReason::kNotHeld));
  EXPECT_EQ(got[0].h.fragment_id, 2u);
  EXPECT_EQ(got[0].h.learner_id, 1u);
  EXPECT_EQ(got[0].payload, "not_held: other versions");
}

// The waiting list is bounded: a request that would wait when it is full is refused at once; one that may not wait
// at all (max_waiting 0, the syncer) too.
TEST_F(ChunkServerTest, TheWaitingListIsBounded) {
  ChunkServer::Options o;
  o.max_waiting = 1;
  o.max_wait = 5;
  ChunkServer s = make(o);
  int refused = 0;
  const auto resolve = [](const ChunkServer::Request&) { return Res::wait(RejectReason::kNotHeld, "not_held"); };
  const auto answered = [&](const ChunkServer::Request&, ChunkServer::Outcome out, const Res&) {
    refused += out == ChunkServer::Outcome::kRefused;
  };
  ASSERT_TRUE(s.offer(request(1), 0));
  ASSERT_TRUE(s.offer(request(2), 0));
  s.pump(0, resolve, answered);
  EXPECT_EQ(s.waiting(), 1u);
  EXPECT_EQ(refused, 1);
  const auto got = replies();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].h.fragment_id, proto::kNoFragment);
  EXPECT_EQ(got[0].h.round, static_cast<uint64_t>(RejectReason::kNotHeld));

  ChunkServer none = make(ChunkServer::Options{});
  ASSERT_TRUE(none.offer(request(3), 0));
  none.pump(0, resolve, answered);
  EXPECT_EQ(refused, 2);
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace deloco
