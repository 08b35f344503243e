// Tests for the message codec: round trips and every kind of bad frame a peer (or an attacker) can send.
#include "deloco/wire.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "wire/quantize.h"

namespace deloco {
namespace wire_cases {

MessageHeader sample_header() {
  MessageHeader h;
  h.kind = MessageKind::kFragmentPush;
  h.encoding = Encoding::kFp32;
  h.learner_id = 0xA1B2C3D4u;
  h.fragment_id = 0x01020304u;
  h.fingerprint = 0x0123456789abcdefull;
  h.round = 0xFEDCBA9876543210ull;
  h.c_steps = 123456789012345ull;
  h.c_tokens = 0x8000000000000001ull;
  return h;
}

std::string sample_frame(size_t n = 10) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = 0.25f * static_cast<float>(i) - 1.f;
  MessageHeader h = sample_header();
  h.element_count = n;
  return encode_message(h, encode_floats(x.data(), n, Encoding::kFp32));
}

void put_le(std::string& s, size_t off, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s[off + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Expects decode_message to throw a WireError whose message contains `needle`.
void expect_rejected(const std::string& frame, const std::string& needle, const WireLimits& limits = {}) {
  try {
    decode_message(frame.data(), frame.size(), limits);
    FAIL() << "accepted a bad frame; expected an error mentioning '" << needle << "'";
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Wire, HeaderFieldsRoundTripBitExact) {
  const std::string frame = sample_frame(10);
  ASSERT_EQ(frame.size(), kWireHeaderBytes + 40);
  EXPECT_EQ(frame.substr(0, 4), "DLCW");
  const DecodedMessage m = decode_message(frame.data(), frame.size());
  const MessageHeader want = sample_header();
  EXPECT_EQ(m.header.kind, want.kind);
  EXPECT_EQ(m.header.encoding, want.encoding);
  EXPECT_EQ(m.header.version, kWireVersion);
  EXPECT_EQ(m.header.learner_id, want.learner_id);
  EXPECT_EQ(m.header.fragment_id, want.fragment_id);
  EXPECT_EQ(m.header.fingerprint, want.fingerprint);
  EXPECT_EQ(m.header.round, want.round);
  EXPECT_EQ(m.header.c_steps, want.c_steps);
  EXPECT_EQ(m.header.c_tokens, want.c_tokens);
  EXPECT_EQ(m.header.element_count, 10u);
  EXPECT_EQ(m.header.payload_bytes, 40u);
  EXPECT_EQ(m.payload, frame.data() + kWireHeaderBytes);  // zero copy: a view into the frame
  EXPECT_EQ(m.payload_size, 40u);
  EXPECT_EQ(m.header.checksum, fnv1a64(m.payload, m.payload_size));
}

TEST(Wire, LayoutIsLittleEndianAtFixedOffsets) {
  const std::string f = sample_frame(3);
  auto le = [&](size_t off, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(f[off + i]);
    return v;
  };
  EXPECT_EQ(le(4, 2), kWireVersion);
  EXPECT_EQ(le(6, 1), static_cast<uint64_t>(MessageKind::kFragmentPush));
  EXPECT_EQ(le(7, 1), static_cast<uint64_t>(Encoding::kFp32));
  EXPECT_EQ(le(8, 4), 0xA1B2C3D4u);
  EXPECT_EQ(le(12, 4), 0x01020304u);
  EXPECT_EQ(le(16, 8), 0x0123456789abcdefull);
  EXPECT_EQ(le(24, 8), 0xFEDCBA9876543210ull);
  EXPECT_EQ(le(48, 8), 3u);
  EXPECT_EQ(le(56, 8), 12u);
}

TEST(Wire, EveryKindRoundTrips) {
  for (uint8_t k = 1; k <= kMaxMessageKind; ++k) {
    MessageHeader h;
    h.kind = static_cast<MessageKind>(k);
    const bool floats = h.kind == MessageKind::kStateChunk || h.kind == MessageKind::kFragmentPush ||
                        h.kind == MessageKind::kFragmentBroadcast || h.kind == MessageKind::kFragmentDelta ||
                        h.kind == MessageKind::kFinalState;
    std::string payload;
    if (floats) {
      const float x[5] = {1, -2, 3, -4, 5};
      h.encoding = Encoding::kInt4;
      h.element_count = 5;
      payload = encode_floats(x, 5, Encoding::kInt4);
    } else {
      payload = "{\"reason\":\"fingerprint mismatch\"}";
      h.element_count = payload.size();
    }
    const std::string f = encode_message(h, payload);
    const DecodedMessage m = decode_message(f.data(), f.size());
    EXPECT_EQ(m.header.kind, h.kind) << kind_name(h.kind);
    EXPECT_EQ(std::string(m.payload, m.payload_size), payload);
  }
}

TEST(Wire, EmptyHeartbeat) {
  MessageHeader h;
  h.kind = MessageKind::kHeartbeat;
  h.learner_id = 7;
  const std::string f = encode_message(h, nullptr, 0);
  ASSERT_EQ(f.size(), kWireHeaderBytes);
  const DecodedMessage m = decode_message(f.data(), f.size());
  EXPECT_EQ(m.header.learner_id, 7u);
  EXPECT_EQ(m.payload_size, 0u);
  EXPECT_EQ(m.header.checksum, kFnvOffset);
}

TEST(Wire, Fnv1aMatchesPublishedVectors) {
  EXPECT_EQ(fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar", 6), 0x85944171f73967e8ull);
  EXPECT_EQ(fnv1a64("bar", 3, fnv1a64("foo", 3)), fnv1a64("foobar", 6));  // hashing in pieces
}

TEST(Wire, FingerprintHex) {
  EXPECT_EQ(fingerprint_hex(0x0123456789abcdefull), "0123456789abcdef");
  EXPECT_EQ(parse_fingerprint_hex("0123456789ABCDEF"), 0x0123456789abcdefull);
  EXPECT_EQ(parse_fingerprint_hex(fingerprint_hex(42)), 42u);
  EXPECT_THROW(parse_fingerprint_hex("0123"), WireError);
  EXPECT_THROW(parse_fingerprint_hex("0123456789abcdeg"), WireError);
}

TEST(Wire, TruncatedFramesAtEveryLengthAreRejected) {
  const std::string f = sample_frame(20);
  for (size_t len = 0; len < f.size(); ++len) {
    const std::string cut = f.substr(0, len);
    EXPECT_THROW(decode_message(cut.data(), cut.size()), WireError) << "length " << len;
  }
  expect_rejected(f.substr(0, 10), "shorter than the 72-byte header");
  expect_rejected(f.substr(0, f.size() - 1), "truncated");
  expect_rejected(f + "x", "trailing bytes");
  EXPECT_NO_THROW(decode_message(f.data(), f.size()));
}

TEST(Wire, FlippedPayloadByteFailsTheChecksum) {
  const std::string f = sample_frame(20);
  for (size_t i = kWireHeaderBytes; i < f.size(); ++i) {
    std::string bad = f;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    expect_rejected(bad, "checksum mismatch");
  }
}

TEST(Wire, WrongMagic) {
  std::string f = sample_frame();
  f[0] = 'X';
  expect_rejected(f, "bad magic");
}

TEST(Wire, NewerAndOlderVersionsNameBothVersions) {
  std::string f = sample_frame();
  put_le(f, 4, kWireVersion + 1, 2);
  expect_rejected(f, "protocol version " + std::to_string(kWireVersion + 1) + " from peer, this build speaks version " +
                         std::to_string(kWireVersion) + " (peer is newer)");
  put_le(f, 4, kWireVersion - 1, 2);
  expect_rejected(f, "protocol version " + std::to_string(kWireVersion - 1) + " from peer, this build speaks version " +
                         std::to_string(kWireVersion) + " (peer is stale)");
}

TEST(Wire, UnknownKindAndEncoding) {
  std::string f = sample_frame();
  f[6] = 0;
  expect_rejected(f, "unknown message kind 0");
  f[6] = static_cast<char>(kMaxMessageKind + 1);
  expect_rejected(f, "unknown message kind " + std::to_string(kMaxMessageKind + 1));
  f = sample_frame();
  f[7] = static_cast<char>(kMaxEncoding + 1);
  expect_rejected(f, "unknown payload encoding " + std::to_string(kMaxEncoding + 1));
  f = sample_frame();
  f[7] = static_cast<char>(Encoding::kRaw);  // a fragment push cannot carry opaque bytes
  expect_rejected(f, "cannot carry encoding raw");
}

TEST(Wire, OversizedPayloadLengthIsRejectedBeforeAnyAllocation) {
  // A 72-byte frame whose header claims a 2^63-byte payload: the codec must fail on the limit, looking only at
  // the header (the frame here has no payload at all, so anything that trusted the field would read past it).
  std::string f = sample_frame(0);
  ASSERT_EQ(f.size(), kWireHeaderBytes);
  put_le(f, 56, uint64_t{1} << 63, 8);
  expect_rejected(f, "payload_bytes 9223372036854775808 exceeds the limit 1073741824");
  put_le(f, 56, 0, 8);
  put_le(f, 48, ~uint64_t{0}, 8);
  expect_rejected(f, "element_count 18446744073709551615 exceeds the limit");
  // Tighter limits from the caller apply too.
  const std::string ok = sample_frame(1000);
  WireLimits small;
  small.max_payload_bytes = 1000;
  expect_rejected(ok, "payload_bytes 4000 exceeds the limit 1000", small);
  small = WireLimits{};
  small.max_elements = 999;
  expect_rejected(ok, "element_count 1000 exceeds the limit 999", small);
}

TEST(Wire, ElementCountInconsistentWithLength) {
  std::string f = sample_frame(10);
  put_le(f, 48, 11, 8);
  expect_rejected(f, "payload_bytes 40 does not match element_count 11 in fp32 (expected 44)");
  f = sample_frame(10);
  f[7] = static_cast<char>(Encoding::kBf16);
  expect_rejected(f, "does not match element_count 10 in bf16 (expected 20)");
}

TEST(Wire, RandomBytesAreRejected) {
  std::mt19937_64 rng(1234);
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string s(rng() % 200, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    if (trial % 2 == 0 && s.size() >= 4) s.replace(0, 4, "DLCW");  // get past the magic half the time
    try {
      decode_message(s.data(), s.size());
      ++accepted;
    } catch (const WireError&) {
    }
  }
  EXPECT_EQ(accepted, 0);
}

TEST(Wire, RandomHeaderMutationsNeverCrashAndNeverPassUnnoticed) {
  // Flip random bits of a valid frame's header: each result either fails with WireError or decodes to a header
  // that differs only in fields the codec cannot check (ids, round, counters, fingerprint; some kind flips).
  const std::string good = sample_frame(33);
  std::mt19937 rng(99);
  for (int trial = 0; trial < 5000; ++trial) {
    std::string f = good;
    const size_t off = rng() % kWireHeaderBytes;
    f[off] = static_cast<char>(f[off] ^ (1u << (rng() % 8)));
    try {
      const DecodedMessage m = decode_message(f.data(), f.size());
      // kind 4 -> 5 (fragment_push -> fragment_broadcast) is a valid header too, and so is fp32 -> topk2b (1 -> 9):
      // a sparse payload's structure is its decoder's to check; the rest must be caught.
      EXPECT_TRUE(off == 6 || (off == 7 && is_sparse(m.header.encoding)) || (off >= 8 && off < 48))
          << "mutation at offset " << off << " accepted";
      EXPECT_EQ(m.payload_size, good.size() - kWireHeaderBytes);
    } catch (const WireError&) {
    }
  }
}

TEST(Wire, EncodeValidatesToo) {
  MessageHeader h = sample_header();
  h.element_count = 3;
  EXPECT_THROW(encode_message(h, std::string(11, 'x')), WireError);  // 3 fp32 = 12 bytes
  h.kind = static_cast<MessageKind>(200);
  EXPECT_THROW(encode_message(h, std::string(12, 'x')), WireError);
}

TEST(Wire, TwoFrameSendVerifiesPayloadSeparately) {
  MessageHeader h = sample_header();
  const float x[4] = {1, 2, 3, 4};
  const std::string payload = encode_floats(x, 4, Encoding::kBf16);
  h.encoding = Encoding::kBf16;
  h.element_count = 4;
  const auto head = encode_header(h, payload.data(), payload.size());
  const MessageHeader got = decode_header(head.data(), head.size());
  EXPECT_NO_THROW(verify_payload(got, payload.data(), payload.size()));
  std::string bad = payload;
  bad[0] ^= 1;
  EXPECT_THROW(verify_payload(got, bad.data(), bad.size()), WireError);
  EXPECT_THROW(verify_payload(got, payload.data(), payload.size() - 1), WireError);
}

TEST(Wire, EncodedBytes) {
  EXPECT_EQ(encoded_bytes(Encoding::kRaw, 5), 5u);
  EXPECT_EQ(encoded_bytes(Encoding::kFp32, 5), 20u);
  EXPECT_EQ(encoded_bytes(Encoding::kBf16, 5), 10u);
  EXPECT_EQ(encoded_bytes(Encoding::kInt8, 64), 68u);
  EXPECT_EQ(encoded_bytes(Encoding::kInt8, 65), 73u);
  EXPECT_EQ(encoded_bytes(Encoding::kInt4, 64), 36u);
  EXPECT_EQ(encoded_bytes(Encoding::kInt4, 65), 41u);
  EXPECT_EQ(encoded_bytes(Encoding::kInt4, 0), 0u);
  EXPECT_THROW(encoded_bytes(static_cast<Encoding>(9), 1), WireError);
  EXPECT_THROW(encoded_bytes(Encoding::kFp32, ~uint64_t{0}), WireError);
  EXPECT_EQ(parse_encoding("int4"), Encoding::kInt4);
  EXPECT_EQ(encoded_bytes(Encoding::kInt2, 64), 20u);
  EXPECT_EQ(encoded_bytes(Encoding::kInt2, 65), 25u);
  EXPECT_EQ(parse_encoding("int2"), Encoding::kInt2);
  EXPECT_THROW(parse_encoding("int3"), WireError);
}

}  // namespace
}  // namespace deloco
