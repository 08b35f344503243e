// src/roles/protocol.h — the JSON bodies of the control messages (hello, welcome, heartbeat, leave) and the
// helpers both roles use to build and check frames. The byte layout of every frame is deloco/wire.h; this file
// adds what the kRaw payloads mean (the table at the top of deloco/runtime.h) and how a model is cut into the flat
// fp32 vectors the float payloads carry.
//
// Contract: parse_* functions take untrusted bytes and throw WireError naming the field for anything missing,
// of the wrong type or out of range; they never allocate more than the payload's size, and any peer text they
// quote in a message is cut with clip_utf8 (util/text.h), so the message is valid UTF-8. Pure and reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deloco/learner.h"
#include "deloco/sync.h"
#include "deloco/transport.h"
#include "deloco/wire.h"
#include "util/clock.h"
#include "util/hash.h"

namespace deloco::proto {

constexpr size_t kMaxControlBytes = 64 * 1024;  // hello/heartbeat/leave/reject bodies
constexpr size_t kMaxWelcomeBytes = 256 * 1024;  // a welcome body (up to kMaxFetchChunks chunk hashes)
// Payloads of at least this many bytes the ZeroMQ transport sends by reference (src/net/zmq_internal.h, kCopyBelow):
// their owner is released once the transport has written them (or dropped them with their connection), which is how
// a node learns that a message has left. Smaller ones are copied when queued.
constexpr size_t kByReferenceBytes = 1024;

// A standby pair's epochs (its fencing tokens) lie in [1, kMaxEpoch]: every parse (hello, welcome, syncer beat,
// replica entry), every checkpoint load and every increment keeps them there, so an epoch is exact as a JSON
// number (2^53 - 1 is the largest integer every JSON parser keeps) and max(a, b) + 1 never overflows.
constexpr int64_t kMaxEpoch = (int64_t{1} << 53) - 1;
// The epoch a takeover leads: one above both `mine` and `other`; nullopt when that would pass kMaxEpoch (or either
// is out of range), so the caller refuses to take over rather than lead an epoch nobody accepts.
std::optional<int64_t> next_epoch(int64_t mine, int64_t other);

struct Hello {
  int64_t learner = 0;
  uint64_t instance = 0;   // random per learner process: tells a restart from a duplicate
  int64_t step = 0;        // the learner's inner step when it says hello
  bool want_state = true;  // download the global parameters
  // With want_state: the BLAKE2b-256 of the fp32 parameters the learner holds for this syncer's part (model_layout
  // order), e.g. its seeded initialisation. Optional on the wire (absent: none). A syncer whose state has this hash
  // sends no chunks (Welcome::state_held): the learner installs what it holds.
  std::optional<Digest> state_hash;
  // A standby pair (docs/reliability.md): the highest leader epoch this learner has joined (0 = none, absent on the
  // wire; at most kMaxEpoch). A hint only: a syncer leading an older epoch refuses the hello (not_leader) and
  // records it, but steps down only on the other syncer's own word (its lease or a follow request at that epoch).
  int64_t epoch = 0;
  // Rejoin from peers (docs/reliability.md): where this learner serves chunks of the state it holds to joining
  // learners (net.serve; "" : it does not), and the CURVE public key (z85) its server authenticates with ("" in
  // plaintext). Optional on the wire.
  std::string serve, serve_key;
  // With `serve`: the key this learner's server checks fetch tickets with (fetch_ticket; random per process). Only
  // syncers see it (the hello goes to them alone, encrypted under CURVE); required on the wire with `serve`.
  Digest serve_secret{};
};
std::string encode_hello(const Hello& h);
Hello parse_hello(const char* data, size_t n);

struct Welcome {
  uint64_t round = 0;                // total merges so far (identifies the snapshot the chunks belong to)
  std::vector<int64_t> versions;     // per fragment
  int64_t resume_step = 0;           // the last step the syncer heard from this learner id (0: none)
  int64_t chunks = 0;                // state_chunk messages that follow (0: no download)
  int64_t chunk_elements = 0;
  int64_t elements = 0;              // total fp32 elements of the model
  Digest state_hash{};               // BLAKE2b-256 of the elements' fp32 bytes
  // The pushes the syncer read on this connection between its previous hello and this one (-1: unknown, absent on
  // the wire: another connection, another process, or an older syncer). Pushes arrive in order, so the learner's
  // first `pushes` sends since its previous welcome reached the syncer (they will be answered); the rest were lost.
  int64_t pushes = -1;
  // The hello's state_hash equals state_hash: the learner holds this state already, no chunks follow (chunks = 0).
  // Optional on the wire (absent: false).
  bool state_held = false;
  // The syncer marks each broadcast it sends this learner with the push it answers (MessageHeader::c_tokens of a
  // fragment_broadcast: 1 + the base version of the latest push of that fragment from this learner process merged
  // into it, 0 = none; LearnerCore::receive's `covers`). Optional on the wire (absent: false, an older syncer:
  // any newer version answers a push).
  bool marks_answers = false;
  // The leader's epoch (its fencing token; 0 = absent: a syncer without a standby pair). A learner takes a welcome
  // only from a syncer whose epoch is at least the highest it has seen.
  int64_t epoch = 0;
  // Rejoin from peers: with `fetch`, the syncer sends no chunks on its own. The learner asks for each chunk
  // (kStateRequest), from the donors listed and from the syncer, and checks every chunk against chunk_hashes
  // (BLAKE2b-256 of its fp32 bytes, computed by the syncer from its own state: a donor is a peer, not trusted, and
  // must not be able to plant a chunk). Each donor serves only with the ticket listed for it (fetch_ticket).
  // Optional on the wire.
  struct Donor {
    int64_t learner = 0;
    std::string endpoint, key;  // key: z85, "" in plaintext
    Digest ticket{};            // fetch_ticket(the donor's serve_secret, this learner, ...): the donor checks it
  };
  bool fetch = false;
  std::vector<Donor> donors;
  std::vector<Digest> chunk_hashes;
};
std::string encode_welcome(const Welcome& w);
Welcome parse_welcome(const char* data, size_t n);

// A state request (kStateRequest; header: fragment_id = chunk, round = the welcome's round): the state it belongs to,
// so a donor serves a chunk only when it holds exactly those fragment versions.
struct StateRequest {
  int64_t shard = 0;
  int64_t elements = 0, chunk_elements = 0;
  std::vector<int64_t> versions;  // per local fragment of the shard, as the welcome listed them
  // To a donor (absent when asking the syncer): the asking learner and the ticket its welcome gave for this donor.
  int64_t learner = -1;
  std::optional<Digest> ticket;
};
std::string encode_state_request(const StateRequest& r);
StateRequest parse_state_request(const char* data, size_t n);
// Welcomes list chunk hashes only up to this many chunks (the welcome is a body of at most kMaxWelcomeBytes);
// a larger state is downloaded from the syncer alone.
constexpr int64_t kMaxFetchChunks = 2048;
// Chunks a joining learner asks of one source at a time; a donor serves no requester more than this many at once
// (queued or on their way), and refuses the rest as busy.
constexpr int64_t kFetchWindow = 4;
// The ticket a syncer's welcome gives a joining learner for one donor: BLAKE2b-256 keyed with the donor's
// serve_secret over (learner, shard, round, chunk_elements, elements). A donor serves a state request only when its
// ticket is this value for the request's own fields, so it serves only learners the syncer introduced, at the chunk
// size the welcome named, for the state of that welcome.
Digest fetch_ticket(const Digest& serve_secret, int64_t learner, int64_t shard, uint64_t round, int64_t chunk_elements,
                    int64_t elements);

struct Beat {
  int64_t step = 0;
  int64_t tokens = 0;
  double busy_seconds = 0;  // seconds this learner process spent in completed inner steps
  double step_time = 0;     // recent mean seconds per inner step
  // The welcome round of the last global-state download this learner process verified (-1: none yet). Optional on
  // the wire (absent = -1): it tells the syncer the download it sent has arrived (see on_hello in syncer_node.cpp).
  int64_t state_round = -1;
  // The highest broadcast sequence number (the broadcast header's c_steps) received on this link (-1: absent on
  // the wire, an older learner). The learner sends a heartbeat as soon as a broadcast arrives, so this is the
  // syncer's delivery acknowledgement: its send window (syncer_node.cpp, pump()) and its measured broadcast time.
  int64_t broadcasts = -1;
  // The delta broadcast (net.broadcast_delta): fragments (global ids) whose fragment_delta this learner could not
  // apply, not holding the version it is based on: the syncer sends the whole fragment next. Optional on the wire
  // (absent = none); at most kMaxResend.
  std::vector<int64_t> resend;
  // The bytes of the fragment push that follows this heartbeat on the connection (learner_link.cpp, send_push;
  // -1: none, or absent on the wire). A push on a slow link is silence while it crosses: before any push of the link
  // was measured, the syncer allows for an announced one up to its patience cap (syncer_timers.cpp).
  int64_t push_bytes = -1;
  // The pushes still waiting in the learner's outbox when this heartbeat was sent (the push it announces, if any,
  // included): they follow it (with a sharded syncer the count is over every link's, so a shard may wait for
  // another's pushes: a later mark, never an early one). Under sync.final_round the syncer marks a learner past its last
  // step only on a heartbeat with none (-1: absent on the wire, an older learner: its step alone decides).
  int64_t unsent = -1;
};
constexpr size_t kMaxResend = 4096;
std::string encode_beat(const Beat& b);
Beat parse_beat(const char* data, size_t n);

// The body of the syncer's heartbeat (empty from an older syncer): how many fragment pushes the syncer received on
// this connection since it accepted the connection's latest hello. Sent after every push it reads and with every
// periodic heartbeat; the learner's send window for pushes (learner_node.cpp) counts against it.
// `patience`: the silence (seconds) the syncer's own traffic can cause on this link beyond net.dead_after: the
// broadcasts a heartbeat may queue behind (the send window), at their measured time on this link. The learner waits
// that much longer before it counts the syncer gone (optional: absent = 0).
struct SyncerBeat {
  int64_t pushes = 0;
  double patience = 0;
  // sync.dynamic_local_updates: the receiving learner's sync period H_m (Syncer::local_updates); 0 = absent (off, or
  // an older syncer). Optional on the wire.
  int64_t sync_every = 0;
  // A standby that has just taken over tells the learners that said hello to it: "I lead epoch E now" (0 = absent).
  // A learner that has seen no higher epoch moves its connection for this shard to the sender and joins it.
  int64_t leader_epoch = 0;
  // net.encoding = auto (sync/codec_fit.h): the encoding the receiving learner's pushes of this shard's fragments
  // use from now on (a top-k encoding with the learner's own net.topk_* options), and its sync period stretched
  // for a link too slow for every codec (the learner bounds it: [H, 8H]). 0 = absent. Optional on the wire.
  int64_t push_encoding = 0;
  int64_t period = 0;
};
std::string encode_syncer_beat(const SyncerBeat& b);
SyncerBeat parse_syncer_beat(const char* data, size_t n);

// leave: "done" (finished train.steps; retires the learner) or "stop" (interrupted). Anything else throws
// WireError quoting at most 40 bytes of it.
std::string encode_leave(const std::string& reason);
std::string parse_leave(const char* data, size_t n);

// A frame ready for a transport: header + payload (shared, zero copy). For kRaw payloads element_count is set
// to the payload size.
struct Frame {
  Bytes header;
  Bytes payload;
};
Frame make_frame(const MessageHeader& h, Bytes payload, const WireLimits& limits);
inline Frame make_frame(const MessageHeader& h, const std::string& payload, const WireLimits& limits) {
  return make_frame(h, Bytes::from_string(payload), limits);
}

// How a list of tensors maps onto one flat fp32 vector: deloco/sync.h (FlatLayout, flatten_into, unflatten), as is
// the model plan every node cuts the model by (ModelPlan, plan_model, ShardPlan, plan_shard).
using Layout = FlatLayout;

// Wire limits sized to the model: no float payload above the whole model's elements (at least 2^16).
WireLimits wire_limits(const ModelPlan& plan);

// Why the syncer refused a message. A reject frame carries the code in its header's `round` field and a text
// "name: detail" as its payload; learners act on the code, people read the text.
enum class RejectReason : uint8_t {
  kOther = 0,
  kMalformedFrame = 1,
  kFingerprintMismatch = 2,
  kNotJoined = 3,
  kLearnerIdMismatch = 4,
  kUnknownLearner = 5,
  kKeyIdMismatch = 6,
  kDuplicateId = 7,
  kUnexpectedKind = 8,
  kUnknownFragment = 9,
  kWrongShape = 10,
  kNonFinite = 11,
  kRefusedByCore = 12,  // the syncer core's own checks (deloco/sync.h): named in the text
  kUnboundKey = 13,     // CURVE key whose allow-list name is not learner-N: it may not join as any learner
  kHandlerError = 14,   // handling the message failed inside the syncer (counted and logged; the syncer carries on)
  kDeltaTooLarge = 15,  // the core's norm bounds (norm_bound, norm_ratio, norm_outlier): a refusal that would repeat,
                        // so the learner drops its drift of the fragment (LearnerCore::drop_drift)
  kNotLeader = 16,      // a standby syncer answering a learner's hello: it follows the leader (docs/reliability.md)
  kNotHeld = 17,        // a state request for a chunk the answering node does not hold (another round or versions)
  kBusy = 18,           // a donor already serves this requester kFetchWindow chunks: it asks the syncer instead
};
constexpr RejectReason kLastRejectReason = RejectReason::kBusy;
// A reject frame's fragment_id: the fragment of the refused push, or kNoFragment when the reject is not about one.
constexpr uint32_t kNoFragment = 0xffffffffu;
const char* reject_reason_name(RejectReason r);  // "malformed_frame", ... ("other" for kOther)
// The code a core rejection (deloco/sync.h) is sent with: wrong_shape (also wrong_tensor_count), non_finite,
// unknown_fragment, unknown_learner, delta_too_large for the norm bounds (refusal_drops_drift), else
// kRefusedByCore (the frame's text names the core's reason).
RejectReason reject_reason_from_core(SyncReject why);
// The code of a reject frame's header (kOther for an unknown value).
RejectReason reject_reason_of(const MessageHeader& h);
// Refusals that retrying cannot fix: the learner stops.
bool reject_is_permanent(RejectReason r);

// Identity binding (CURVE): the learner id an allow-list name stands for. "learner-N" with N a plain decimal
// (no sign, no leading zero, at most 9 digits) binds the key to learner N; any other name binds it to none.
std::optional<int64_t> learner_of_key_name(const std::string& name);

// Seconds since the Unix epoch: the "t" of every metrics record (util/clock.h).
using ::deloco::unix_now;

}  // namespace deloco::proto
