// The message codec: fixed little-endian header, validation before trust (contract in include/deloco/wire.h).
#include "deloco/wire.h"
#include "util/checked.h"
#include "wire/le.h"

#include <cstring>
#include <limits>

namespace deloco {
namespace {

using le::put_u16;
using le::put_u32;
using le::put_u64;
uint64_t get_le(const unsigned char* p, int bytes) { return le::get(p, bytes); }

bool is_float_encoding(Encoding e) { return e != Encoding::kRaw; }

bool carries_floats(MessageKind k) {
  return k == MessageKind::kStateChunk || k == MessageKind::kFragmentPush || k == MessageKind::kFragmentBroadcast ||
         k == MessageKind::kFragmentDelta || k == MessageKind::kFinalState;
}

std::string u64s(uint64_t v) { return std::to_string(v); }

// Everything about a header that does not need the payload (used by encode and decode alike).
void validate_header(const MessageHeader& h, const WireLimits& limits) {
  const uint8_t k = static_cast<uint8_t>(h.kind);
  if (k == 0 || k > kMaxMessageKind) throw WireError("wire: unknown message kind " + std::to_string(k));
  const uint8_t e = static_cast<uint8_t>(h.encoding);
  if (e > kMaxEncoding) throw WireError("wire: unknown payload encoding " + std::to_string(e));
  if (carries_floats(h.kind) != is_float_encoding(h.encoding) ||
      (is_sparse(h.encoding) && (h.kind == MessageKind::kStateChunk || h.kind == MessageKind::kFragmentBroadcast)))
    throw WireError(std::string("wire: message kind ") + kind_name(h.kind) + " cannot carry encoding " +
                    encoding_name(h.encoding));
  if (h.element_count > limits.max_elements)
    throw WireError("wire: element_count " + u64s(h.element_count) + " exceeds the limit " +
                    u64s(limits.max_elements));
  if (h.payload_bytes > limits.max_payload_bytes)
    throw WireError("wire: payload_bytes " + u64s(h.payload_bytes) + " exceeds the limit " +
                    u64s(limits.max_payload_bytes));
  if (is_sparse(h.encoding)) {
    if (h.element_count > kMaxSparseElements)
      throw WireError("wire: element_count " + u64s(h.element_count) + " exceeds the " + u64s(kMaxSparseElements) +
                      " a " + encoding_name(h.encoding) + " payload can index");
    const size_t most = max_encoded_bytes(h.encoding, h.element_count);
    if (h.payload_bytes < 4 || h.payload_bytes > most)
      throw WireError("wire: payload_bytes " + u64s(h.payload_bytes) + " outside [4, " + u64s(most) + "] for " +
                      u64s(h.element_count) + " elements in " + encoding_name(h.encoding));
    return;
  }
  const size_t want = encoded_bytes(h.encoding, h.element_count);
  if (h.payload_bytes != want)
    throw WireError("wire: payload_bytes " + u64s(h.payload_bytes) + " does not match element_count " +
                    u64s(h.element_count) + " in " + encoding_name(h.encoding) + " (expected " + u64s(want) + ")");
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t seed) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

size_t encoded_bytes(Encoding e, uint64_t n) {
  // 2^60 elements keeps every product below 2^64 and is far above any limit.
  if (n > (uint64_t{1} << 60)) throw WireError("wire: element count " + u64s(n) + " is absurd");
  const uint64_t blocks = (n + 63) / 64;
  uint64_t b = 0;
  switch (e) {
    case Encoding::kRaw: b = n; break;
    case Encoding::kFp32: b = 4 * n; break;
    case Encoding::kBf16: b = 2 * n; break;
    case Encoding::kInt8: b = 4 * blocks + n; break;
    case Encoding::kInt4: b = 4 * blocks + (n + 1) / 2; break;
    case Encoding::kInt2: b = 4 * blocks + (n + 3) / 4; break;
    case Encoding::kTopk8:
    case Encoding::kTopk4:
    case Encoding::kTopk2:
    case Encoding::kTopk2b:
      throw WireError(std::string("wire: a ") + encoding_name(e) +
                      " payload's size depends on what it holds (max_encoded_bytes bounds it)");
    default: throw WireError("wire: unknown payload encoding " + std::to_string(static_cast<int>(e)));
  }
  if (b > std::numeric_limits<size_t>::max()) throw WireError("wire: payload of " + u64s(n) + " elements too big");
  return static_cast<size_t>(b);
}

size_t topk_values_bytes(Encoding e, uint64_t k) {
  if (e != Encoding::kTopk2b) return encoded_bytes(topk_values(e), k);
  if (k > (uint64_t{1} << 60)) throw WireError("wire: payload of " + u64s(k) + " elements too big");
  const uint64_t b = 16 * ((k + kBinBlock - 1) / kBinBlock) + (k + 3) / 4;
  if (b > std::numeric_limits<size_t>::max()) throw WireError("wire: payload of " + u64s(k) + " elements too big");
  return static_cast<size_t>(b);
}

size_t max_encoded_bytes(Encoding e, uint64_t n) {
  if (!is_sparse(e)) return encoded_bytes(e, n);
  const uint64_t b = 4 + static_cast<uint64_t>(topk_values_bytes(e, n)) + 5 * n;  // n ≤ 2^60: no overflow
  if (b > std::numeric_limits<size_t>::max()) throw WireError("wire: payload of " + u64s(n) + " elements too big");
  return static_cast<size_t>(b);
}

const char* kind_name(MessageKind k) {
  switch (k) {
    case MessageKind::kHello: return "hello";
    case MessageKind::kWelcome: return "welcome";
    case MessageKind::kStateChunk: return "state_chunk";
    case MessageKind::kFragmentPush: return "fragment_push";
    case MessageKind::kFragmentBroadcast: return "fragment_broadcast";
    case MessageKind::kHeartbeat: return "heartbeat";
    case MessageKind::kLeave: return "leave";
    case MessageKind::kReject: return "reject";
    case MessageKind::kReplica: return "replica";
    case MessageKind::kStateRequest: return "state_request";
    case MessageKind::kFragmentDelta: return "fragment_delta";
    case MessageKind::kFinalState: return "final_state";
  }
  return "unknown";
}

const char* encoding_name(Encoding e) {
  switch (e) {
    case Encoding::kRaw: return "raw";
    case Encoding::kFp32: return "fp32";
    case Encoding::kBf16: return "bf16";
    case Encoding::kInt8: return "int8";
    case Encoding::kInt4: return "int4";
    case Encoding::kInt2: return "int2";
    case Encoding::kTopk8: return "topk8";
    case Encoding::kTopk4: return "topk4";
    case Encoding::kTopk2: return "topk2";
    case Encoding::kTopk2b: return "topk2b";
  }
  return "unknown";
}

Encoding parse_encoding(const std::string& name) {
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4, Encoding::kInt2,
                     Encoding::kTopk8, Encoding::kTopk4, Encoding::kTopk2, Encoding::kTopk2b})
    if (name == encoding_name(e)) return e;
  throw WireError("wire: unknown encoding '" + name +
                  "' (expected fp32, bf16, int8, int4, int2, topk8, topk4, topk2 or topk2b)");
}

std::string fingerprint_hex(uint64_t fp) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, fp >>= 4) s[i] = digits[fp & 0xf];
  return s;
}

uint64_t parse_fingerprint_hex(const std::string& hex) {
  if (hex.size() != 16)
    throw WireError("wire: fingerprint '" + hex + "' must be 16 hex chars, has " + std::to_string(hex.size()));
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else throw WireError("wire: fingerprint '" + hex + "' has a non-hex character");
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

std::array<char, kWireHeaderBytes> encode_header(const MessageHeader& in, const void* payload, size_t payload_size,
                                                 const WireLimits& limits) {
  MessageHeader h = in;
  h.version = kWireVersion;
  h.payload_bytes = payload_size;
  h.checksum = fnv1a64(payload, payload_size);
  validate_header(h, limits);
  std::array<char, kWireHeaderBytes> b{};
  char* p = b.data();
  put_u32(p + 0, kWireMagic);
  put_u16(p + 4, h.version);
  p[6] = static_cast<char>(h.kind);
  p[7] = static_cast<char>(h.encoding);
  put_u32(p + 8, h.learner_id);
  put_u32(p + 12, h.fragment_id);
  put_u64(p + 16, h.fingerprint);
  put_u64(p + 24, h.round);
  put_u64(p + 32, h.c_steps);
  put_u64(p + 40, h.c_tokens);
  put_u64(p + 48, h.element_count);
  put_u64(p + 56, h.payload_bytes);
  put_u64(p + 64, h.checksum);
  return b;
}

std::string encode_message(const MessageHeader& h, const void* payload, size_t payload_size,
                           const WireLimits& limits) {
  const auto head = encode_header(h, payload, payload_size, limits);
  std::string out;
  out.reserve(kWireHeaderBytes + payload_size);
  out.append(head.data(), head.size());
  if (payload_size > 0) out.append(static_cast<const char*>(payload), payload_size);
  return out;
}

MessageHeader decode_header(const void* data, size_t n, const WireLimits& limits) {
  if (data == nullptr || n < kWireHeaderBytes)
    throw WireError("wire: frame of " + std::to_string(n) + " bytes is shorter than the " +
                    std::to_string(kWireHeaderBytes) + "-byte header");
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const uint32_t magic = static_cast<uint32_t>(get_le(p, 4));
  if (magic != kWireMagic)
    throw WireError("wire: bad magic 0x" + fingerprint_hex(magic).substr(8) + " (expected 0x" +
                    fingerprint_hex(kWireMagic).substr(8) + ", \"DLCW\")");
  MessageHeader h;
  h.version = static_cast<uint16_t>(get_le(p + 4, 2));
  if (h.version != kWireVersion)
    throw WireError("wire: protocol version " + std::to_string(h.version) + " from peer, this build speaks version " +
                    std::to_string(kWireVersion) + (h.version < kWireVersion ? " (peer is stale)" : " (peer is newer)"));
  h.kind = static_cast<MessageKind>(p[6]);
  h.encoding = static_cast<Encoding>(p[7]);
  h.learner_id = static_cast<uint32_t>(get_le(p + 8, 4));
  h.fragment_id = static_cast<uint32_t>(get_le(p + 12, 4));
  h.fingerprint = get_le(p + 16, 8);
  h.round = get_le(p + 24, 8);
  h.c_steps = get_le(p + 32, 8);
  h.c_tokens = get_le(p + 40, 8);
  h.element_count = get_le(p + 48, 8);
  h.payload_bytes = get_le(p + 56, 8);
  h.checksum = get_le(p + 64, 8);
  validate_header(h, limits);
  return h;
}

void verify_payload(const MessageHeader& h, const void* payload, size_t payload_size) {
  if (payload_size != h.payload_bytes)
    throw WireError("wire: payload of " + std::to_string(payload_size) + " bytes, header says payload_bytes " +
                    u64s(h.payload_bytes));
  const uint64_t sum = fnv1a64(payload, payload_size);
  if (sum != h.checksum)
    throw WireError("wire: checksum mismatch: header " + fingerprint_hex(h.checksum) + ", payload " +
                    fingerprint_hex(sum));
}

DecodedMessage decode_message(const void* data, size_t n, const WireLimits& limits) {
  DecodedMessage m;
  m.header = decode_header(data, n, limits);
  // payload_bytes is bounded by limits.max_payload_bytes, which a caller may set to anything: checked.
  uint64_t want = 0;
  if (!checked_add(kWireHeaderBytes, m.header.payload_bytes, &want) || n != want)
    throw WireError("wire: frame of " + std::to_string(n) + " bytes, header + payload_bytes is " + u64s(want) +
                    (n < want ? " (truncated)" : " (trailing bytes)"));
  m.payload = static_cast<const char*>(data) + kWireHeaderBytes;
  m.payload_size = static_cast<size_t>(m.header.payload_bytes);
  verify_payload(m.header, m.payload, m.payload_size);
  return m;
}

}  // namespace deloco
