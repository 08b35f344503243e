// The control bodies of the runtime protocol: round trips and refusal of malformed or hostile input.
#include <algorithm>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "deloco/config.h"
#include "protocol.h"
#include "util/text.h"

namespace deloco::proto {
namespace protocol_cases {

// A digest whose 32 bytes are all `b` (round trips only; real ones come from blake2b256).
Digest dg(unsigned char b) {
  Digest d;
  d.fill(b);
  return d;
}
const std::string kHex1 = std::string(63, '0') + "1";  // a well-formed digest on the wire

TEST(Protocol, HelloWelcomeBeatLeaveRoundTrip) {
  Hello h{3, 0xdeadbeefcafef00dull, 1234, false};
  auto s = encode_hello(h);
  Hello g = parse_hello(s.data(), s.size());
  EXPECT_EQ(g.learner, 3);
  EXPECT_EQ(g.instance, h.instance);
  EXPECT_EQ(g.step, 1234);
  EXPECT_FALSE(g.want_state);
  EXPECT_FALSE(g.state_hash);  // absent on the wire unless offered
  EXPECT_EQ(s.find("state_hash"), std::string::npos);
  h.want_state = true;
  h.state_hash = dg(0xa5);
  s = encode_hello(h);
  g = parse_hello(s.data(), s.size());
  ASSERT_TRUE(g.state_hash);
  EXPECT_EQ(*g.state_hash, dg(0xa5));

  Welcome w;
  w.round = 17;
  w.versions = {4, 5};
  w.resume_step = 99;
  w.chunks = 3;
  w.chunk_elements = 10;
  w.elements = 25;
  w.state_hash = blake2b256("abc", 3);
  s = encode_welcome(w);
  Welcome v = parse_welcome(s.data(), s.size());
  EXPECT_EQ(v.round, 17u);
  EXPECT_EQ(v.versions, w.versions);
  EXPECT_EQ(v.chunks, 3);
  EXPECT_EQ(v.state_hash, w.state_hash);
  EXPECT_FALSE(v.state_held);
  w.chunks = 0;
  w.state_held = true;
  s = encode_welcome(w);
  v = parse_welcome(s.data(), s.size());
  EXPECT_TRUE(v.state_held);
  EXPECT_EQ(v.chunks, 0);
  EXPECT_FALSE(v.marks_answers);  // absent on the wire: an older syncer
  EXPECT_EQ(s.find("marks_answers"), std::string::npos);
  w.marks_answers = true;
  s = encode_welcome(w);
  EXPECT_TRUE(parse_welcome(s.data(), s.size()).marks_answers);

  Beat b{10, 2560, 1.5, 0.02};
  s = encode_beat(b);
  Beat c = parse_beat(s.data(), s.size());
  EXPECT_EQ(c.step, 10);
  EXPECT_DOUBLE_EQ(c.busy_seconds, 1.5);
  EXPECT_EQ(c.push_bytes, -1);  // no push follows: absent on the wire
  EXPECT_EQ(s.find("push_bytes"), std::string::npos);
  b.push_bytes = 269640;  // the heartbeat right before a push announces its bytes
  s = encode_beat(b);
  EXPECT_EQ(parse_beat(s.data(), s.size()).push_bytes, 269640);
  EXPECT_EQ(parse_beat(s.data(), s.size()).unsent, -1);  // absent: an older learner
  b.unsent = 0;  // nothing left in its outbox (the final round's mark waits for this)
  s = encode_beat(b);
  EXPECT_EQ(parse_beat(s.data(), s.size()).unsent, 0);
  const std::string negative = R"({"step":1,"tokens":1,"busy_seconds":0,"step_time":0,"unsent":-1})";
  EXPECT_THROW(parse_beat(negative.data(), negative.size()), WireError);
  s = encode_leave("done");
  EXPECT_EQ(parse_leave(s.data(), s.size()), "done");
}

TEST(Protocol, RefusesMalformedBodiesNamingTheField) {
  auto expect_error = [](const std::string& body, const char* needle, auto parse) {
    try {
      parse(body.data(), body.size());
      ADD_FAILURE() << "accepted: " << body;
    } catch (const WireError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("not json", "not a JSON object", parse_hello);
  expect_error("[1,2]", "not a JSON object", parse_hello);
  expect_error(R"({"instance":"00000000000000aa","step":0,"want_state":true})", "'learner'", parse_hello);
  expect_error(R"({"learner":-1,"instance":"00000000000000aa","step":0,"want_state":true})", "out of range", parse_hello);
  expect_error(R"({"learner":1,"instance":"xyz","step":0,"want_state":true})", "", parse_hello);
  expect_error(R"({"learner":1,"instance":"00000000000000aa","step":0,"want_state":1})", "want_state", parse_hello);
  expect_error(R"({"learner":1,"instance":"00000000000000aa","step":0,"want_state":true,"state_hash":5})", "state_hash",
               parse_hello);
  expect_error(R"({"round":1,"versions":[1],"resume_step":0,"chunks":1,"chunk_elements":50,"elements":50,"state_hash":"0000000000000000000000000000000000000000000000000000000000000001","state_held":true})",
               "state_held", parse_welcome);
  expect_error(R"({"round":1,"versions":[1],"resume_step":0,"chunks":0,"chunk_elements":0,"elements":50,"state_hash":"0000000000000000000000000000000000000000000000000000000000000001","marks_answers":"yes"})",
               "marks_answers", parse_welcome);
  expect_error(R"({"round":1,"versions":[1],"resume_step":0,"chunks":0,"chunk_elements":0,"elements":50,"state_hash":"0000000000000000000000000000000000000000000000000000000000000001","state_held":1})",
               "state_held", parse_welcome);
  expect_error(R"({"step":1,"tokens":1,"busy_seconds":-1,"step_time":0})", "busy_seconds", parse_beat);
  expect_error(R"({"step":1,"tokens":1,"busy_seconds":0,"step_time":0,"push_bytes":-5})", "push_bytes", parse_beat);
  expect_error(R"({"reason":"explode"})", "leave reason", parse_leave);
  expect_error(std::string(kMaxControlBytes + 1, ' '), "exceeds", parse_hello);
  expect_error(std::string(kMaxWelcomeBytes + 1, ' '), "exceeds", parse_welcome);
  // Hashes that cross a trust boundary are BLAKE2b-256: a 64-bit FNV value is refused, naming the field.
  expect_error(R"({"learner":1,"instance":"00000000000000aa","step":0,"want_state":true,"state_hash":"00000000000000a5"})",
               "BLAKE2b-256", parse_hello);
  // chunks that do not cover the elements
  expect_error(R"({"round":1,"versions":[1],"resume_step":0,"chunks":2,"chunk_elements":10,"elements":50,"state_hash":"0000000000000000000000000000000000000000000000000000000000000001"})",
               "cover", parse_welcome);
}

// Issue 11 item 2: a leave reason whose 40-byte quote split a UTF-8 character made the syncer's reject record throw
// when dumped. The quote is now cut at a character boundary: the error text is valid UTF-8 and dumps.
TEST(Protocol, PeerTextQuotedInErrorsIsValidUtf8) {
  for (const std::string reason : {std::string(39, 'x') + "\xc3\xa9", std::string(38, 'x') + "\xe2\x82\xac!",
                                   std::string(100, 'a') + "\xf0\x9f\x98\x80"}) {
    nlohmann::json body{{"reason", reason}};
    const std::string s = body.dump();  // valid UTF-8: what a peer's JSON can carry
    try {
      parse_leave(s.data(), s.size());
      ADD_FAILURE() << "accepted " << s;
    } catch (const WireError& e) {
      EXPECT_TRUE(is_valid_utf8(e.what())) << e.what();
      EXPECT_NO_THROW((void)nlohmann::json(std::string(e.what())).dump());
    }
  }
}

TEST(Protocol, HeartbeatCarriesTheVerifiedStateRoundOptionally) {
  Beat b{10, 2560, 1.5, 0.02};
  auto s = encode_beat(b);
  EXPECT_EQ(s.find("state_round"), std::string::npos);
  EXPECT_EQ(parse_beat(s.data(), s.size()).state_round, -1);
  b.state_round = 7;
  s = encode_beat(b);
  EXPECT_EQ(parse_beat(s.data(), s.size()).state_round, 7);
  const std::string bad = R"({"step":1,"tokens":1,"busy_seconds":0,"step_time":0,"state_round":-3})";
  EXPECT_THROW(parse_beat(bad.data(), bad.size()), WireError);
}

// The two acknowledgements the send windows count on: the learner's highest broadcast sequence received (optional:
// absent from an older learner) and the syncer's count of pushes received (its heartbeat's body).
TEST(Protocol, HeartbeatsCarryTheDeliveryAcknowledgements) {
  Beat b{10, 2560, 1.5, 0.02};
  auto s = encode_beat(b);
  EXPECT_EQ(s.find("broadcasts"), std::string::npos);
  EXPECT_EQ(parse_beat(s.data(), s.size()).broadcasts, -1);
  b.broadcasts = 0;
  s = encode_beat(b);
  EXPECT_EQ(parse_beat(s.data(), s.size()).broadcasts, 0);
  b.broadcasts = 41;
  s = encode_beat(b);
  EXPECT_EQ(parse_beat(s.data(), s.size()).broadcasts, 41);
  const std::string bad = R"({"step":1,"tokens":1,"busy_seconds":0,"step_time":0,"broadcasts":-2})";
  EXPECT_THROW(parse_beat(bad.data(), bad.size()), WireError);

  Welcome w;
  w.versions = {1, 2};
  s = encode_welcome(w);
  EXPECT_EQ(s.find("pushes"), std::string::npos);
  EXPECT_EQ(parse_welcome(s.data(), s.size()).pushes, -1);
  w.pushes = 5;
  s = encode_welcome(w);
  EXPECT_EQ(parse_welcome(s.data(), s.size()).pushes, 5);

  SyncerBeat sb{12};
  s = encode_syncer_beat(sb);
  EXPECT_EQ(parse_syncer_beat(s.data(), s.size()).pushes, 12);
  EXPECT_EQ(parse_syncer_beat(s.data(), s.size()).patience, 0.0);
  sb.patience = 2.5;
  s = encode_syncer_beat(sb);
  EXPECT_EQ(parse_syncer_beat(s.data(), s.size()).patience, 2.5);
  EXPECT_EQ(parse_syncer_beat(s.data(), s.size()).sync_every, 0);  // absent: dynamic local updates off
  sb.sync_every = 17;
  s = encode_syncer_beat(sb);
  EXPECT_EQ(parse_syncer_beat(s.data(), s.size()).sync_every, 17);
  // net.encoding = auto: the push encoding and the stretched period; absent = 0.
  EXPECT_EQ(parse_syncer_beat(s.data(), s.size()).push_encoding, 0);
  EXPECT_EQ(parse_syncer_beat(s.data(), s.size()).period, 0);
  sb.push_encoding = static_cast<int64_t>(Encoding::kTopk2);
  sb.period = 55;
  s = encode_syncer_beat(sb);
  EXPECT_EQ(parse_syncer_beat(s.data(), s.size()).push_encoding, static_cast<int64_t>(Encoding::kTopk2));
  EXPECT_EQ(parse_syncer_beat(s.data(), s.size()).period, 55);
  for (const std::string bad : {std::string(R"({"pushes":1,"push_encoding":0})"),
                                R"({"pushes":1,"push_encoding":)" + std::to_string(kMaxEncoding + 1) + "}",
                                std::string(R"({"pushes":1,"period":0})")})
    EXPECT_THROW(parse_syncer_beat(bad.data(), bad.size()), WireError) << bad;
  for (const std::string bad : {std::string(R"({"pushes":1,"sync_every":0})"), std::string(R"({"pushes":1,"sync_every":2.5})")})
    EXPECT_THROW(parse_syncer_beat(bad.data(), bad.size()), WireError) << bad;
  const std::string negative = R"({"pushes":1,"patience":-1})";
  EXPECT_THROW(parse_syncer_beat(negative.data(), negative.size()), WireError);
  for (std::string junk : {std::string("{}"), std::string(R"({"pushes":-1})"), std::string(R"({"pushes":"3"})"),
                           std::string("[1]"), std::string("{")}) {
    try {
      parse_syncer_beat(junk.data(), junk.size());
      ADD_FAILURE() << "accepted " << junk;
    } catch (const WireError& e) {
      EXPECT_NE(std::string(e.what()).find("syncer heartbeat"), std::string::npos) << e.what();
    }
  }
}

TEST(Protocol, KeyNamesBindToOneLearnerId) {
  EXPECT_EQ(learner_of_key_name("learner-0"), 0);
  EXPECT_EQ(learner_of_key_name("learner-17"), 17);
  for (const char* other : {"learner-", "learner-01", "learner--1", "learner-+1", "learner-1x", "learner-1 ",
                            "Learner-1", "ops", "trainer", "learner-1234567890", ""})
    EXPECT_FALSE(learner_of_key_name(other).has_value()) << other;
}

TEST(Protocol, RejectCodesRoundTripAndUnboundKeysArePermanent) {
  for (uint64_t c = 0; c <= static_cast<uint64_t>(kLastRejectReason); ++c) {
    MessageHeader h;
    h.kind = MessageKind::kReject;
    h.round = c;
    EXPECT_EQ(static_cast<uint64_t>(reject_reason_of(h)), c);
    EXPECT_STRNE(reject_reason_name(static_cast<RejectReason>(c)), c == 0 ? "x" : "other");
  }
  EXPECT_STREQ(reject_reason_name(RejectReason::kUnboundKey), "unbound_key");
  EXPECT_STREQ(reject_reason_name(RejectReason::kHandlerError), "handler_error");
  EXPECT_TRUE(reject_is_permanent(RejectReason::kUnboundKey));
  EXPECT_FALSE(reject_is_permanent(RejectReason::kHandlerError));
}

TEST(Protocol, LayoutFlattensAndUnflattensExactly) {
  std::vector<at::Tensor> ts{torch::randn({3, 4}), torch::randn({5}), torch::randn({2, 2, 2})};
  Layout l = make_flat_layout({"a", "b", "c"}, ts);
  EXPECT_EQ(l.elements, 12 + 5 + 8);
  at::Tensor flat = torch::empty({l.elements});
  flatten_into(ts, flat.data_ptr<float>());
  auto back = unflatten(flat, l);
  ASSERT_EQ(back.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(back[i], ts[i]));
}

// What one shard serves, as every node computes it: its fragments (global ids), their layouts in local order, and
// its part of the model laid out as those fragments one after another.
TEST(Protocol, AShardPlanIsItsFragmentsLaidOutInOrder) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (int i = 0; i < 6; ++i) params.emplace_back("t" + std::to_string(i), torch::zeros({10 + i}));
  const ModelPlan plan = plan_model(params, 3, 6);
  int64_t total = 0;
  std::vector<int> seen(3, 0);
  for (int64_t s = 0; s < 2; ++s) {
    const ShardPlan sp = plan_shard(plan, 2, s);
    int64_t off = 0;
    for (size_t k = 0; k < sp.fragments.size(); ++k) {
      const int64_t p = sp.fragments[k];
      ++seen[static_cast<size_t>(p)];
      EXPECT_EQ(sp.owner[static_cast<size_t>(p)], s);
      EXPECT_EQ(sp.local[static_cast<size_t>(p)], static_cast<int64_t>(k));
      EXPECT_EQ(sp.local_fragments[k].id, static_cast<int64_t>(k));
      EXPECT_EQ(sp.local_fragments[k].offset, plan.fragments[static_cast<size_t>(p)].offset);  // the schedule is global
      const Layout& L = plan.fragment_layouts[static_cast<size_t>(p)];
      for (size_t i = 0; i < L.names.size(); ++i) {
        const auto at = std::find(sp.model.names.begin(), sp.model.names.end(), L.names[i]) - sp.model.names.begin();
        EXPECT_EQ(sp.model.offsets[static_cast<size_t>(at)], off + L.offsets[i]) << L.names[i];
      }
      off += L.elements;
    }
    EXPECT_EQ(sp.model.elements, off);
    total += off;
  }
  EXPECT_EQ(total, plan.model.elements);
  EXPECT_EQ(seen, (std::vector<int>{1, 1, 1}));
  EXPECT_THROW(plan_shard(plan, 4, 0), SyncError);
  EXPECT_THROW(plan_shard(plan, 2, 2), ConfigError);
}

// The code a core rejection travels with: delta_too_large exactly for the refusals the learner must drop its drift
// for, the shape and finiteness codes for theirs, refused_by_core for the rest (the text names the reason).
TEST(Protocol, CoreRejectionsMapToWireCodes) {
  for (int i = 0; i <= static_cast<int>(kLastSyncReject); ++i) {
    const auto why = static_cast<SyncReject>(i);
    EXPECT_EQ(reject_reason_from_core(why) == RejectReason::kDeltaTooLarge, refusal_drops_drift(why))
        << sync_reject_name(why);
  }
  EXPECT_EQ(reject_reason_from_core(SyncReject::kWrongTensorCount), RejectReason::kWrongShape);
  EXPECT_EQ(reject_reason_from_core(SyncReject::kWrongShape), RejectReason::kWrongShape);
  EXPECT_EQ(reject_reason_from_core(SyncReject::kNonFinite), RejectReason::kNonFinite);
  EXPECT_EQ(reject_reason_from_core(SyncReject::kUnknownFragment), RejectReason::kUnknownFragment);
  EXPECT_EQ(reject_reason_from_core(SyncReject::kUnknownLearner), RejectReason::kUnknownLearner);
  EXPECT_EQ(reject_reason_from_core(SyncReject::kCounterOutOfRange), RejectReason::kRefusedByCore);
  EXPECT_EQ(reject_reason_from_core(SyncReject::kMergeFailed), RejectReason::kRefusedByCore);
}

}  // namespace
}  // namespace deloco::proto

namespace deloco::proto {
namespace protocol_cases {

// Rejoin from peers: the hello's offer to serve, the welcome's donors and chunk hashes, and the state request.
TEST(Protocol, PeerFetchFieldsRoundTripAndHostileOnesAreRefused) {
  Hello h;
  h.learner = 2;
  h.instance = 7;
  h.serve = "tcp://198.18.0.3:6100";
  h.serve_key = std::string(40, 'a');
  h.serve_secret = dg(0x5e);
  const Hello h2 = parse_hello(encode_hello(h).data(), encode_hello(h).size());
  EXPECT_EQ(h2.serve, h.serve);
  EXPECT_EQ(h2.serve_key, h.serve_key);
  EXPECT_EQ(h2.serve_secret, h.serve_secret);
  Hello plain;  // absent on the wire: none
  const std::string pb = encode_hello(plain);
  EXPECT_EQ(pb.find("serve"), std::string::npos);
  EXPECT_TRUE(parse_hello(pb.data(), pb.size()).serve.empty());

  Welcome w;
  w.round = 9;
  w.versions = {3, 4};
  w.elements = 10;
  w.chunk_elements = 4;
  w.chunks = 3;
  w.state_hash = dg(11);
  w.fetch = true;
  w.donors = {{1, "ipc:///tmp/a.sock", "", dg(1)}, {3, "tcp://198.18.0.4:6100", std::string(40, 'k'), dg(3)}};
  w.chunk_hashes = {dg(0x1), dg(0xff), blake2b256("chunk", 5)};
  const std::string wb = encode_welcome(w);
  const Welcome w2 = parse_welcome(wb.data(), wb.size());
  EXPECT_TRUE(w2.fetch);
  ASSERT_EQ(w2.donors.size(), 2u);
  EXPECT_EQ(w2.donors[1].learner, 3);
  EXPECT_EQ(w2.donors[1].endpoint, "tcp://198.18.0.4:6100");
  EXPECT_EQ(w2.donors[1].key, std::string(40, 'k'));
  EXPECT_EQ(w2.donors[1].ticket, dg(3));
  EXPECT_EQ(w2.chunk_hashes, w.chunk_hashes);

  StateRequest r;
  r.shard = 1;
  r.elements = 10;
  r.chunk_elements = 4;
  r.versions = {3, 4};
  const std::string rb = encode_state_request(r);
  const StateRequest r2 = parse_state_request(rb.data(), rb.size());
  EXPECT_EQ(r2.shard, 1);
  EXPECT_EQ(r2.versions, r.versions);
  EXPECT_EQ(r2.learner, -1);  // to the syncer: no ticket
  EXPECT_FALSE(r2.ticket);
  r.learner = 5;
  r.ticket = dg(9);
  const std::string rt = encode_state_request(r);
  const StateRequest r3 = parse_state_request(rt.data(), rt.size());
  EXPECT_EQ(r3.learner, 5);
  ASSERT_TRUE(r3.ticket);
  EXPECT_EQ(*r3.ticket, dg(9));

  auto expect_error = [](const std::string& body, const char* needle, auto parse) {
    try {
      parse(body.data(), body.size());
      ADD_FAILURE() << "accepted: " << body;
    } catch (const WireError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string head = R"({"round":1,"versions":[1],"resume_step":0,"chunks":2,"chunk_elements":4,"elements":8,"state_hash":")" +
                           kHex1 + R"(","fetch":true,)";
  const std::string two = R"("chunk_hashes":[")" + kHex1 + R"(",")" + kHex1 + R"("]})";
  const std::string ticket = R"(,"ticket":")" + kHex1 + R"("})";
  expect_error(head + R"("donors":[],"chunk_hashes":[")" + kHex1 + R"("]})", "one hash per chunk", parse_welcome);
  expect_error(head + R"("donors":[{"learner":1,"endpoint":"http://x","key":"")" + ticket + "]," + two,
               "tcp:// or ipc://", parse_welcome);
  expect_error(head + R"("donors":[{"learner":1,"endpoint":"ipc:///a","key":"short")" + ticket + "]," + two, "z85",
               parse_welcome);
  expect_error(head + R"("donors":[{"learner":1,"endpoint":"ipc:///a","key":""}],)" + two, "ticket", parse_welcome);
  expect_error(head + R"("donors":[],"chunk_hashes":["01","02"]})", "BLAKE2b-256", parse_welcome);
  expect_error(head + two, "donors", parse_welcome);
  expect_error(R"({"learner":1,"instance":"00000000000000aa","step":0,"want_state":true,"serve":"ipc:///a"})",
               "serve_secret", parse_hello);
  expect_error(R"({"shard":0,"elements":8,"chunk_elements":4,"versions":[],"learner":1,"ticket":"ab"})", "ticket",
               parse_state_request);
  expect_error(R"({"learner":1,"instance":"00000000000000aa","step":0,"want_state":true,"serve":"ipc:///a b"})",
               "printable", parse_hello);
  expect_error(R"({"shard":0,"elements":0,"chunk_elements":4,"versions":[]})", "elements", parse_state_request);
  expect_error(R"({"shard":0,"elements":8,"chunk_elements":4,"versions":[-1]})", "versions", parse_state_request);
  EXPECT_STREQ(reject_reason_name(RejectReason::kNotHeld), "not_held");
  EXPECT_STREQ(reject_reason_name(RejectReason::kBusy), "busy");
}

// A fetch ticket is BLAKE2b-256 keyed with the donor's secret over (learner, shard, round, chunk_elements,
// elements): the reference is Python's hashlib (an independent implementation of RFC 7693), and changing any field
// or the key gives another ticket.
TEST(Protocol, AFetchTicketBindsEveryFieldAndTheDonorsKey) {
  Digest key;
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<unsigned char>(i);
  // /usr/bin/python3 -c "import hashlib,struct; print(hashlib.blake2b(b'deloco-fetch-v1\0' +
  //   struct.pack('<5Q', 2, 0, 7, 262144, 1000000), digest_size=32, key=bytes(range(32))).hexdigest())"
  const Digest t = fetch_ticket(key, 2, 0, 7, 262144, 1000000);
  EXPECT_EQ(digest_hex(t), "8f9a2ada5b4ad6bbc11d8e418df02ae7a7df9c8e1d9fc486bf48d7ca3be984d9");
  EXPECT_NE(fetch_ticket(key, 3, 0, 7, 262144, 1000000), t);
  EXPECT_NE(fetch_ticket(key, 2, 1, 7, 262144, 1000000), t);
  EXPECT_NE(fetch_ticket(key, 2, 0, 8, 262144, 1000000), t);
  EXPECT_NE(fetch_ticket(key, 2, 0, 7, 1000000, 1000000), t);  // a whole-state "chunk" is another ticket
  EXPECT_NE(fetch_ticket(key, 2, 0, 7, 262144, 1000001), t);
  Digest other = key;
  other[0] ^= 1;
  EXPECT_NE(fetch_ticket(other, 2, 0, 7, 262144, 1000000), t);
}

// Epochs stay in [1, 2^53 - 1]: parses refuse more (a learner cannot hand a syncer an epoch nobody accepts), and a
// takeover after the largest one is refused rather than overflowing.
TEST(Protocol, EpochsAreBoundedOnEveryParseAndIncrement) {
  EXPECT_EQ(kMaxEpoch, (int64_t{1} << 53) - 1);
  EXPECT_EQ(next_epoch(1, 0), 2);
  EXPECT_EQ(next_epoch(3, 7), 8);
  EXPECT_EQ(next_epoch(kMaxEpoch - 1, 0), kMaxEpoch);
  EXPECT_FALSE(next_epoch(kMaxEpoch, 0));
  EXPECT_FALSE(next_epoch(1, kMaxEpoch));
  EXPECT_FALSE(next_epoch(std::numeric_limits<int64_t>::max(), 1));  // was max(a, b) + 1: signed overflow
  EXPECT_FALSE(next_epoch(-1, 1));
  const auto hello_with = [](const std::string& epoch) {
    return R"({"learner":1,"instance":"00000000000000aa","step":0,"want_state":true,"epoch":)" + epoch + "}";
  };
  const std::string ok = hello_with(std::to_string(kMaxEpoch));
  EXPECT_EQ(parse_hello(ok.data(), ok.size()).epoch, kMaxEpoch);
  for (const std::string bad : {std::to_string(kMaxEpoch + 1), std::string("9223372036854775807"), std::string("0")}) {
    const std::string b = hello_with(bad);
    EXPECT_THROW(parse_hello(b.data(), b.size()), WireError) << b;
  }
  SyncerBeat sb;
  sb.leader_epoch = kMaxEpoch;
  const std::string e = encode_syncer_beat(sb);
  EXPECT_EQ(parse_syncer_beat(e.data(), e.size()).leader_epoch, kMaxEpoch);
  const std::string over = R"({"pushes":0,"leader_epoch":9007199254740992})";
  EXPECT_THROW(parse_syncer_beat(over.data(), over.size()), WireError);
}

}  // namespace
}  // namespace deloco::proto
