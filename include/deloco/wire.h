// deloco/wire.h — the wire protocol between learners and the syncer (docs/wire.md).
//
// The one place for the message schema. Every message is one frame: a fixed 72-byte header followed by a payload.
// All integers are little-endian and written byte by byte (never a memcpy of a struct), so the layout does not
// depend on the compiler, padding or host byte order. docs/wire.md has the byte table.
//
//   off size field           off size field
//    0   4  magic "DLCW"      24   8  round
//    4   2  version (u16)     32   8  c_steps   (inner steps behind this contribution; in a broadcast: its sequence number)
//    6   1  kind (u8)         40   8  c_tokens  (tokens behind this contribution)
//    7   1  encoding (u8)     48   8  element_count
//    8   4  learner_id (u32)  56   8  payload_bytes
//   12   4  fragment_id (u32) 64   8  checksum: FNV-1a-64 of the payload bytes
//   16   8  model fingerprint (u64; shown as 16 lowercase hex chars)
//
// Payload encodings (src/wire/quantize.h has the float codecs):
//   kRaw  opaque bytes (JSON, a reason text); element_count == payload_bytes
//   kFp32 4 bytes per element; kBf16 2 bytes per element (round to nearest even)
//   kInt8 / kInt4 / kInt2: ceil(n/64) fp32 block scales, then n int8 values / ceil(n/2) bytes of packed int4
//   values / ceil(n/4) bytes of packed ternary int2 values (src/wire/quantize.h)
//   kTopk8 / kTopk4 / kTopk2: sparse (src/wire/sparse.h): u32 k, the k kept values in kInt8 / kInt4 / kInt2, then
//   the k indices as LEB128 gaps; the size depends on the payload (max_encoded_bytes bounds it)
//   kTopk2b: the same with the values in SparseLoCo's 2-bit code (four bins per block of kept values, each decoded
//   as its bin's mean; src/wire/sparse.h)
// Kinds and their encodings: hello, welcome, heartbeat, leave and reject carry kRaw; state_chunk carries a dense
// float encoding (kFp32, kBf16, kInt8, kInt4, kInt2); fragment_push, final_state, fragment_broadcast and
// fragment_delta any float encoding, the sparse ones included.
//
// Contract
//  * decode_header() / decode_message() validate everything before trusting it, in this order: frame length ≥
//    header, magic, version (a stale or newer version is an error naming both), known kind, known encoding, the
//    kind's allowed encodings, element_count ≤ limits.max_elements, payload_bytes ≤ limits.max_payload_bytes,
//    payload_bytes == encoded_bytes(encoding, element_count), frame length == header + payload_bytes, checksum.
//    Nothing is allocated from a size read off the wire; sizes are compared against the limits first.
//  * Errors: every failure throws deloco::WireError (a deloco::Error, deloco/error.h) whose message names the field and the
//    values seen. Peers should count and log these, never crash on them.
//  * Ownership: DecodedMessage::payload points into the caller's buffer (zero copy); it is valid only while that
//    buffer is. encode_message() returns a new owning string; encode_header() lets a transport send the header
//    and a caller-owned payload as two frames without copying the payload.
//  * Threads: all functions are pure and reentrant; no global state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "deloco/error.h"

namespace deloco {

constexpr uint32_t kWireMagic = 0x57434C44u;  // bytes "DLCW" when written little-endian
constexpr uint16_t kWireVersion = 1;
constexpr size_t kWireHeaderBytes = 72;

enum class MessageKind : uint8_t {
  kHello = 1,              // learner -> syncer: join request; payload JSON (id, fingerprint, key, restart count)
  kWelcome = 2,            // syncer -> learner: global state description (round, chunks, state hash); JSON
  kStateChunk = 3,         // syncer -> learner: one chunk of the global parameters (fragment_id = chunk index)
  kFragmentPush = 4,       // learner -> syncer: outer gradient of one fragment
  kFragmentBroadcast = 5,  // syncer -> learner: merged global fragment
  kHeartbeat = 6,          // either way: liveness; payload may be empty
  kLeave = 7,              // learner -> syncer: clean goodbye; syncer -> learner: the goodbye was handled
  kReject = 8,             // syncer -> learner: refusal; payload is the reason text
  kReplica = 9,            // leader syncer <-> its standby: the journal (src/roles/replication.h)
  kStateRequest = 10,      // learner -> syncer or a donor learner: send chunk fragment_id of the state of welcome
                           // round `round` (rejoin from peers, docs/reliability.md); payload JSON
  kFragmentDelta = 11,     // syncer -> learner: merged fragment version `round` as its change against version
                           // round − 1, in any float encoding (net.broadcast_delta; the learner adds it in fp32)
  kFinalState = 12,        // learner -> syncer: its final state of one fragment after its last step, in a push's
                           // form and fields (sync.final_round: held for the final round, never merged as a push)
};
constexpr uint8_t kMaxMessageKind = 12;

enum class Encoding : uint8_t {
  kRaw = 0, kFp32 = 1, kBf16 = 2, kInt8 = 3, kInt4 = 4, kInt2 = 5,  // dense: the size follows from n
  kTopk8 = 6, kTopk4 = 7, kTopk2 = 8,                              // sparse: top-k entries, values in 8/4/2 bits
  kTopk2b = 9,                                                      // sparse, values in four bins (SparseLoCo's)
};
constexpr uint8_t kMaxEncoding = 9;
constexpr uint8_t kMaxDenseEncoding = 5;
// A sparse (top-k) encoding: its payload's size depends on what it holds.
inline bool is_sparse(Encoding e) {
  return e == Encoding::kTopk8 || e == Encoding::kTopk4 || e == Encoding::kTopk2 || e == Encoding::kTopk2b;
}
// The dense block encoding of a sparse encoding's values (kTopk4 → kInt4); `e` itself when it is not sparse or its
// values have a code of their own (kTopk2b: topk_values_bytes sizes them).
inline Encoding topk_values(Encoding e) {
  return e == Encoding::kTopk8 ? Encoding::kInt8 : e == Encoding::kTopk4 ? Encoding::kInt4
                                                 : e == Encoding::kTopk2 ? Encoding::kInt2 : e;
}
// The largest element count a sparse payload may describe (its k and indices are 32-bit).
constexpr uint64_t kMaxSparseElements = 0xffffffffull;

// What a sparse encoding keeps (src/wire/sparse.h).
struct TopkOptions {
  double density = 0.03;  // kept fraction, in (0, 1] (net.topk_density)
  int64_t chunk = 0;      // top-k per chunk of this many elements; 0: over the whole payload (net.topk_chunk)
};
// An encoding with what encoding needs besides it (a sparse encoding's density and chunk). Decoding needs only the
// encoding: a sparse payload carries its count.
struct Codec {
  Encoding encoding = Encoding::kFp32;
  TopkOptions topk;
  Codec() = default;
  Codec(Encoding e) : encoding(e) {}  // NOLINT(google-explicit-constructor): an encoding with the default options
  Codec(Encoding e, TopkOptions t) : encoding(e), topk(t) {}
};

struct MessageHeader {
  MessageKind kind = MessageKind::kHeartbeat;
  Encoding encoding = Encoding::kRaw;
  uint16_t version = kWireVersion;  // encode_message always writes kWireVersion; decode reports what it read
  uint32_t learner_id = 0;
  uint32_t fragment_id = 0;
  uint64_t fingerprint = 0;  // model fingerprint: hash of parameter names, shapes and dtypes
  uint64_t round = 0;
  uint64_t c_steps = 0;
  uint64_t c_tokens = 0;
  uint64_t element_count = 0;
  uint64_t payload_bytes = 0;  // filled in by encode_message / encode_header from the payload
  uint64_t checksum = 0;       // filled in by encode_message / encode_header from the payload
};

struct WireLimits {
  uint64_t max_payload_bytes = uint64_t{1} << 30;  // 1 GiB: hard bound on any payload read from the wire
  uint64_t max_elements = uint64_t{1} << 28;       // 268M floats (1 GiB of fp32)
};

struct DecodedMessage {
  MessageHeader header;
  const char* payload = nullptr;  // view into the decoded buffer (zero copy)
  size_t payload_size = 0;
};

// FNV-1a, 64-bit, over n bytes; `seed` lets a caller hash in pieces (pass the previous result).
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t fnv1a64(const void* data, size_t n, uint64_t seed = kFnvOffset);

// Bytes of a payload of n elements in a dense encoding e (kRaw: n). Throws WireError on an unknown or a sparse
// encoding (whose size depends on the payload) or overflow.
size_t encoded_bytes(Encoding e, uint64_t n);
// Bytes of the values section of a sparse payload in encoding e holding k entries: encoded_bytes(topk_values(e), k),
// or for kTopk2b 16 bytes (four fp32 levels) per block of up to kBinBlock values and ceil(k/4) bytes of 2-bit codes.
size_t topk_values_bytes(Encoding e, uint64_t k);
constexpr uint64_t kBinBlock = 1024;  // kTopk2b: kept values (in index order) sharing one set of four levels
// The most bytes a payload of n elements in encoding e can take: encoded_bytes for a dense encoding; for a sparse
// one 4 + topk_values_bytes(e, n) + 5·n (every element kept, every gap a 5-byte varint). What buffers and
// transport limits are sized by.
size_t max_encoded_bytes(Encoding e, uint64_t n);

const char* kind_name(MessageKind k);      // "hello", ..., or "unknown"
// "raw", "fp32", "bf16", "int8", "int4", "int2", "topk8", "topk4", "topk2", "topk2b", or "unknown"
const char* encoding_name(Encoding e);
Encoding parse_encoding(const std::string& name);  // inverse of encoding_name for the float encodings; throws

std::string fingerprint_hex(uint64_t fp);                // 16 lowercase hex chars
uint64_t parse_fingerprint_hex(const std::string& hex);  // exactly 16 hex chars; throws WireError

// Header bytes for `h` with payload_bytes = payload_size and checksum over the payload; validates the header the
// same way decode does (with default limits unless given). Send it followed by the payload bytes.
std::array<char, kWireHeaderBytes> encode_header(const MessageHeader& h, const void* payload, size_t payload_size,
                                                 const WireLimits& limits = {});
// One owning frame: encode_header(...) followed by the payload.
std::string encode_message(const MessageHeader& h, const void* payload, size_t payload_size,
                           const WireLimits& limits = {});
inline std::string encode_message(const MessageHeader& h, const std::string& payload,
                                  const WireLimits& limits = {}) {
  return encode_message(h, payload.data(), payload.size(), limits);
}

// Parses and validates the first kWireHeaderBytes of `data` (everything but the frame length and the checksum).
MessageHeader decode_header(const void* data, size_t n, const WireLimits& limits = {});
// Validates a whole frame (header + payload, nothing after it) and returns a view of it.
DecodedMessage decode_message(const void* data, size_t n, const WireLimits& limits = {});
// Validates a payload received separately from its header (two-frame sends): size and checksum.
void verify_payload(const MessageHeader& h, const void* payload, size_t payload_size);

}  // namespace deloco
