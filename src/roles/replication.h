// src/roles/replication.h — the standby syncer's journal (docs/reliability.md, "A standby syncer").
//
// The leader syncer runs every call that changes its Syncer core (deloco/sync.h) as a journal entry: it applies the
// entry to its own core with apply() and sends the same entry to its standby, which applies it to a core built
// from the same config. The core's contract (no I/O, no clock: the same calls in the same order give bit-identical
// results) makes the standby's Θ, outer state, kept versions and statistics the leader's, merge for merge; each
// round entry carries the leader's result (version and FNV-1a-64 of the new Θ_p) and the standby checks its own
// against it. A standby that follows late starts from an image (Syncer::image(), a resync point the leader also
// applies to itself) and then the entries after it.
//
// Wire: every entry is one frame of MessageKind::kReplica (kRaw). Header: round = the entry's sequence number
// (1, 2, … from the image), c_steps = the leader's epoch (its fencing token), fragment_id = the entry's kind.
// Payload: u32 little-endian length n, n bytes of a JSON object with the entry's scalars, then the entry's binary
// part (a push's encoded bytes; an image's tensors as safetensors). The standby's own messages to the leader are
// kReplica frames too: kFollow (asks for an image) and kAck (entries applied up to `round`).
//
// Contract: decode() takes untrusted bytes and throws WireError naming the field for anything missing, of the
// wrong type, or out of range; apply() throws SyncError/WireError for an entry its core cannot take (a push that
// does not decode, an unknown fragment) — on a standby that means the journal is not this config's, and it asks
// for a fresh image. Pure; no I/O.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deloco/sync.h"
#include "deloco/transport.h"
#include "deloco/wire.h"
#include "protocol.h"

namespace deloco::repl {

enum class EntryKind : uint32_t {
  kImage = 1,        // a resync point: the whole core state (Syncer::Image) and the node's counters
  kReceive = 2,      // Syncer::receive of one push (its encoded bytes)
  kRound = 3,        // Syncer::on_round, with the leader's result
  kConnected = 4,    // Syncer::set_connected
  kRetire = 5,       // Syncer::retire
  kJoined = 6,       // Syncer::note_joined
  kObserveSync = 7,  // Syncer::observe_sync
  kDrain = 8,        // Syncer::drain, with the leader's results
  kCounters = 9,     // the node's counters (not the core's): what a standby that takes over continues from
  kLease = 10,       // leader → standby: "still leading" (not journaled: seq is the last entry's)
  kFollow = 11,      // standby → leader: send me an image and the journal after it
  kAck = 12,         // standby → leader: entries applied up to `seq`
  kFinal = 13,       // Syncer::final_round (sync.final_round), with the leader's results
  kFinished = 14,    // Syncer::set_finished (sync.final_round: a learner took its last step)
};
constexpr uint32_t kLastEntryKind = 14;
const char* entry_kind_name(EntryKind k);

// A round's outcome as the leader saw it: what the standby checks its own against.
struct RoundCheck {
  int64_t fragment = 0;  // local
  bool merged = false;
  int64_t version = 0;   // the fragment's version after the round
  uint64_t hash = 0;     // FNV-1a-64 of the new Θ_p's fp32 bytes (merged only)
};

struct Entry {
  EntryKind kind = EntryKind::kLease;
  uint64_t seq = 0;
  int64_t epoch = 0;
  double t = 0;                 // the leader's `now` for the call (kReceive, kRound, kRetire, kDrain)
  int64_t learner = -1;
  int64_t fragment = -1;        // local fragment
  // kReceive: the push as the leader read it (decode_push's arguments) and the step it credited.
  Encoding encoding = Encoding::kFp32;
  int64_t base = 0, c_steps = 0, c_tokens = 0, step = -1;
  double step_time = 0;
  bool flag = false;            // kConnected: connected; kReceive: a final state (Syncer::receive_final)
  double upload = 0, merge = 0, broadcast = 0;  // kObserveSync
  std::vector<RoundCheck> results;              // kRound (one), kDrain (one per fragment merged or rolled back)
  // kRound, kDrain: the encoding the delta broadcast's next deltas use (net.broadcast_encoding = auto,
  // Syncer::use_delta_encoding; 0: unchanged, not on the wire).
  int64_t delta_encoding = 0;
  // kRound: the longest live learner's fitted sync period, the span of a rebasing learner's grace window
  // (net.encoding = auto, Syncer::set_link_period; -1: unchanged, not on the wire).
  int64_t link_period = -1;
  nlohmann::json counters;      // kCounters, kImage: the node's counters (SyncerNode's checkpoint "counters")
  Syncer::Image image;          // kImage
  Bytes payload;                // kReceive: the push's encoded bytes
  // kFollow: the asking syncer's own state, for a pair that has no leader (leads_leaderless): its merge count and
  // its slot in the pair (0: the primary, net.address; 1: the standby, net.standby). -1: not said (an older peer).
  int64_t merges = -1, slot = -1;
};

// The frame of an entry (header and payload) under `fingerprint`.
struct EncodedEntry {
  MessageHeader header;
  Bytes payload;
};
EncodedEntry encode(const Entry& e, uint64_t fingerprint);
// Decodes the payload of a kReplica frame whose header was already checked (decode_header, verify_payload).
// `learners` and `fragments` bound the ids; a kImage's tensors are checked by Syncer::resync when applied.
Entry decode(const MessageHeader& h, const Bytes& payload, int64_t learners, int64_t fragments);

// Applies entry `e` to `core`, whose fragment p has flat layout layouts[p]. Returns the rounds it ran (kRound: one;
// kDrain: each fragment merged or rolled back) and a receive's verdict. kCounters, kLease, kFollow and kAck do not touch the
// core. Both the leader and the standby change their core only through this function.
struct Applied {
  std::vector<RoundResult> rounds;
  SyncReject received = SyncReject::kNone;  // kReceive: the core's answer
};
Applied apply(Syncer& core, const Entry& e, const std::vector<FlatLayout>& layouts);

// A pair with no leader: both syncers are down to asking each other to be followed (the leader died before its
// standby held an image, then came back as a standby; or both restarted). The one holding the newer state leads:
// the higher epoch (it led, or followed a leader, more recently), then more merges, then the primary (slot 0).
// True when `mine` outranks `other`; false for both when their slots are equal or unknown (a misconfigured pair
// never elects two leaders: it keeps waiting, as before).
struct PairState {
  int64_t epoch = 0, merges = 0, slot = -1;
};
bool leads_leaderless(const PairState& mine, const PairState& other);

// What the leader records of a round for its standby to check.
RoundCheck check_of(const RoundResult& r);
// "" when `mine` (the standby's round) matches `leader`'s, else a sentence naming the difference.
std::string compare(const RoundCheck& leader, const RoundCheck& mine);

// The leader's journal: every call that changes its core, applied here (apply()) and numbered, queued for the
// standby while one follows, and the pushes its rounds still wait on, kept as their entries so that they can be
// received again right after an image (a resync point drops the cores' rounds on both syncers). The follower numbers
// what it applied with follow(). Not thread-safe.
class Journal {
 public:
  // Applies `e` to `core` (throws as apply() does, before anything here changes), then numbers it (seq, epoch, the
  // rounds' results for the standby to check), keeps an accepted push until a round merges or rolls it back, and,
  // with `replicate`, queues its frame (under `fingerprint`, within `limits`) for the standby.
  Applied record(Syncer& core, const std::vector<FlatLayout>& layouts, Entry e, int64_t epoch, bool replicate,
                 uint64_t fingerprint, const WireLimits& limits);
  uint64_t seq() const { return seq_; }
  // A follower applied the leader's entry `e` (apply() answered `a`; an image: nothing): numbered as the leader
  // numbered it, and the pushes and final states it holds kept as the leader keeps them, so that a takeover finds
  // them (waiting_pushes) as the replaced leader would have.
  void follow(const Entry& e, const Applied& a);
  // The entries of the pushes the core's rounds wait on now, fragment by fragment (core.waiting order), then the
  // final states it holds (sync.final_round) the same way.
  std::vector<Entry> waiting_pushes(const Syncer& core, int64_t fragments) const;
  // Forgets the pushes held (the core dropped its rounds: a takeover). The final states stay: the core keeps them
  // through drop_waiting(). (An image, recorded or followed, drops both: what waited is journaled again after it.)
  void forget_pushes() { held_pushes_.clear(); }
  // The frames queued for the standby, handed over (flush) or dropped (no standby, or a new one: an image covers them).
  std::vector<proto::Frame> take_frames() {
    std::vector<proto::Frame> f;
    f.swap(out_);
    return f;
  }
  void drop_frames() { out_.clear(); }

 private:
  // What `e` did to the pushes and final states held (record() and follow() alike).
  void hold(const Entry& e, const Applied& a);

  uint64_t seq_ = 0;  // entries journaled (leader) or applied (follower)
  std::map<std::pair<int64_t, int64_t>, Entry> held_pushes_;  // (learner, local fragment) → its accepted push
  std::map<std::pair<int64_t, int64_t>, Entry> held_finals_;  // the same for final states, until the final round
  std::vector<proto::Frame> out_;
};

}  // namespace deloco::repl
