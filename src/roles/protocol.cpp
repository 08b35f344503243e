// JSON control bodies and flat-vector layouts (see protocol.h).
#include "protocol.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <cstring>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/sync.h"
#include "util/text.h"

namespace deloco::proto {
namespace {

nlohmann::json parse_object(const char* data, size_t n, const char* what, size_t max = kMaxControlBytes) {
  if (n > max)
    throw WireError(std::string(what) + " body of " + std::to_string(n) + " bytes exceeds " + std::to_string(max));
  nlohmann::json j = nlohmann::json::parse(data, data + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw WireError(std::string(what) + " body is not a JSON object");
  return j;
}

int64_t get_int(const nlohmann::json& j, const char* key, const char* what, int64_t lo, int64_t hi) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer())
    throw WireError(std::string(what) + " field '" + key + "' is missing or not an integer");
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    throw WireError(std::string(what) + " field '" + key + "' = " + std::to_string(v) + " is out of range");
  return v;
}

double get_double(const nlohmann::json& j, const char* key, const char* what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) throw WireError(std::string(what) + " field '" + key + "' is missing or not a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < 0) throw WireError(std::string(what) + " field '" + key + "' must be finite and ≥ 0");
  return v;
}

uint64_t get_hex(const nlohmann::json& j, const char* key, const char* what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) throw WireError(std::string(what) + " field '" + key + "' is missing or not a string");
  return parse_fingerprint_hex(it->get<std::string>());
}

constexpr int64_t kMaxI = int64_t{1} << 53;

Digest get_digest(const nlohmann::json& j, const char* key, const char* what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) throw WireError(std::string(what) + " field '" + key + "' is missing or not a string");
  const std::optional<Digest> d = parse_digest_hex(it->get_ref<const std::string&>());
  if (!d) throw WireError(std::string(what) + " field '" + key + "' is not a BLAKE2b-256 digest (64 hex digits)");
  return *d;
}

// An optional string field of at most `max` bytes of printable ASCII ("" when absent).
std::string get_short_string(const nlohmann::json& j, const char* key, const char* what, size_t max) {
  auto it = j.find(key);
  if (it == j.end()) return "";
  if (!it->is_string()) throw WireError(std::string(what) + " field '" + key + "' is not a string");
  std::string s = it->get<std::string>();
  if (s.size() > max) throw WireError(std::string(what) + " field '" + key + "' is longer than " + std::to_string(max));
  for (unsigned char c : s)
    if (c < 0x21 || c > 0x7e) throw WireError(std::string(what) + " field '" + key + "' holds a character outside printable ASCII");
  return s;
}

}  // namespace

std::optional<int64_t> next_epoch(int64_t mine, int64_t other) {
  if (mine < 0 || other < 0 || mine > kMaxEpoch || other > kMaxEpoch) return std::nullopt;
  const int64_t top = std::max(mine, other);
  if (top >= kMaxEpoch) return std::nullopt;
  return top + 1;
}

std::string encode_hello(const Hello& h) {
  nlohmann::json j{{"learner", h.learner}, {"instance", fingerprint_hex(h.instance)}, {"step", h.step},
                   {"want_state", h.want_state}};
  if (h.state_hash) j["state_hash"] = digest_hex(*h.state_hash);
  if (h.epoch > 0) j["epoch"] = h.epoch;
  if (!h.serve.empty()) {
    j["serve"] = h.serve;
    j["serve_secret"] = digest_hex(h.serve_secret);
  }
  if (!h.serve_key.empty()) j["serve_key"] = h.serve_key;
  return j.dump();
}

Hello parse_hello(const char* data, size_t n) {
  auto j = parse_object(data, n, "hello");
  Hello h;
  h.learner = get_int(j, "learner", "hello", 0, 1 << 20);
  h.instance = get_hex(j, "instance", "hello");
  h.step = get_int(j, "step", "hello", 0, kMaxI);
  auto it = j.find("want_state");
  if (it == j.end() || !it->is_boolean()) throw WireError("hello field 'want_state' is missing or not a boolean");
  h.want_state = it->get<bool>();
  if (j.contains("state_hash")) h.state_hash = get_digest(j, "state_hash", "hello");
  if (j.contains("epoch")) h.epoch = get_int(j, "epoch", "hello", 1, kMaxEpoch);
  h.serve = get_short_string(j, "serve", "hello", 256);
  h.serve_key = get_short_string(j, "serve_key", "hello", 40);
  if (!h.serve.empty() && h.serve.rfind("tcp://", 0) != 0 && h.serve.rfind("ipc://", 0) != 0)
    throw WireError("hello field 'serve' must start with tcp:// or ipc://");
  if (!h.serve_key.empty() && h.serve_key.size() != 40) throw WireError("hello field 'serve_key' is not a z85 public key");
  if (!h.serve.empty()) h.serve_secret = get_digest(j, "serve_secret", "hello");
  return h;
}

std::string encode_welcome(const Welcome& w) {
  nlohmann::json j{{"round", w.round},
                   {"versions", w.versions},
                   {"resume_step", w.resume_step},
                   {"chunks", w.chunks},
                   {"chunk_elements", w.chunk_elements},
                   {"elements", w.elements},
                   {"state_hash", digest_hex(w.state_hash)}};
  if (w.pushes >= 0) j["pushes"] = w.pushes;
  if (w.state_held) j["state_held"] = true;
  if (w.marks_answers) j["marks_answers"] = true;
  if (w.epoch > 0) j["epoch"] = w.epoch;
  if (w.fetch) {
    j["fetch"] = true;
    nlohmann::json d = nlohmann::json::array();
    for (const auto& x : w.donors)
      d.push_back({{"learner", x.learner}, {"endpoint", x.endpoint}, {"key", x.key}, {"ticket", digest_hex(x.ticket)}});
    j["donors"] = std::move(d);
    nlohmann::json h = nlohmann::json::array();
    for (const Digest& v : w.chunk_hashes) h.push_back(digest_hex(v));
    j["chunk_hashes"] = std::move(h);
  }
  return j.dump();
}

Welcome parse_welcome(const char* data, size_t n) {
  auto j = parse_object(data, n, "welcome", kMaxWelcomeBytes);
  Welcome w;
  w.round = static_cast<uint64_t>(get_int(j, "round", "welcome", 0, kMaxI));
  auto it = j.find("versions");
  if (it == j.end() || !it->is_array() || it->size() > 4096) throw WireError("welcome field 'versions' is missing or not a short array");
  for (const auto& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) throw WireError("welcome field 'versions' holds a non-integer");
    w.versions.push_back(v.get<int64_t>());
  }
  w.resume_step = get_int(j, "resume_step", "welcome", 0, kMaxI);
  w.chunks = get_int(j, "chunks", "welcome", 0, 1 << 24);
  w.chunk_elements = get_int(j, "chunk_elements", "welcome", 0, int64_t{1} << 28);
  w.elements = get_int(j, "elements", "welcome", 0, int64_t{1} << 34);
  w.state_hash = get_digest(j, "state_hash", "welcome");
  if (j.contains("pushes")) w.pushes = get_int(j, "pushes", "welcome", 0, kMaxI);
  if (auto held = j.find("state_held"); held != j.end()) {
    if (!held->is_boolean()) throw WireError("welcome field 'state_held' is not a boolean");
    w.state_held = held->get<bool>();
  }
  if (auto marks = j.find("marks_answers"); marks != j.end()) {
    if (!marks->is_boolean()) throw WireError("welcome field 'marks_answers' is not a boolean");
    w.marks_answers = marks->get<bool>();
  }
  if (j.contains("epoch")) w.epoch = get_int(j, "epoch", "welcome", 1, kMaxEpoch);
  if (auto f = j.find("fetch"); f != j.end()) {
    if (!f->is_boolean()) throw WireError("welcome field 'fetch' is not a boolean");
    w.fetch = f->get<bool>();
  }
  if (w.fetch) {
    auto d = j.find("donors");
    if (d == j.end() || !d->is_array() || d->size() > 64) throw WireError("welcome field 'donors' is missing or not a short array");
    for (const auto& x : *d) {
      if (!x.is_object()) throw WireError("welcome field 'donors' holds a non-object");
      Welcome::Donor don;
      don.learner = get_int(x, "learner", "welcome donor", 0, 1 << 20);
      don.endpoint = get_short_string(x, "endpoint", "welcome donor", 256);
      don.key = get_short_string(x, "key", "welcome donor", 40);
      if (don.endpoint.rfind("tcp://", 0) != 0 && don.endpoint.rfind("ipc://", 0) != 0)
        throw WireError("welcome donor endpoint must start with tcp:// or ipc://");
      if (!don.key.empty() && don.key.size() != 40) throw WireError("welcome donor key is not a z85 public key");
      don.ticket = get_digest(x, "ticket", "welcome donor");
      w.donors.push_back(std::move(don));
    }
    auto h = j.find("chunk_hashes");
    if (h == j.end() || !h->is_array() || static_cast<int64_t>(h->size()) != w.chunks || w.chunks > kMaxFetchChunks)
      throw WireError("welcome field 'chunk_hashes' is missing or does not list one hash per chunk");
    for (const auto& x : *h) {
      const std::optional<Digest> d = x.is_string() ? parse_digest_hex(x.get_ref<const std::string&>()) : std::nullopt;
      if (!d) throw WireError("welcome field 'chunk_hashes' holds something other than a BLAKE2b-256 digest");
      w.chunk_hashes.push_back(*d);
    }
    if (w.chunks == 0) throw WireError("welcome: fetch without chunks");
  }
  if (w.state_held && w.chunks != 0) throw WireError("welcome: state_held with chunks to download");
  if (w.chunks > 0 && (w.chunk_elements == 0 || (w.chunks - 1) * w.chunk_elements >= w.elements ||
                       w.chunks * w.chunk_elements < w.elements))
    throw WireError("welcome: chunks × chunk_elements does not cover elements");
  return w;
}

std::string encode_state_request(const StateRequest& r) {
  nlohmann::json j{{"shard", r.shard}, {"elements", r.elements}, {"chunk_elements", r.chunk_elements},
                   {"versions", r.versions}};
  if (r.learner >= 0) j["learner"] = r.learner;
  if (r.ticket) j["ticket"] = digest_hex(*r.ticket);
  return j.dump();
}

Digest fetch_ticket(const Digest& serve_secret, int64_t learner, int64_t shard, uint64_t round, int64_t chunk_elements,
                    int64_t elements) {
  // A fixed-layout message: a domain tag, then the five fields as little-endian 64-bit integers.
  unsigned char msg[16 + 5 * 8] = {'d', 'e', 'l', 'o', 'c', 'o', '-', 'f', 'e', 't', 'c', 'h', '-', 'v', '1', 0};
  const uint64_t fields[5] = {static_cast<uint64_t>(learner), static_cast<uint64_t>(shard), round,
                              static_cast<uint64_t>(chunk_elements), static_cast<uint64_t>(elements)};
  for (size_t f = 0; f < 5; ++f)
    for (size_t b = 0; b < 8; ++b) msg[16 + 8 * f + b] = static_cast<unsigned char>(fields[f] >> (8 * b));
  return blake2b256_keyed(serve_secret.data(), serve_secret.size(), msg, sizeof(msg));
}

StateRequest parse_state_request(const char* data, size_t n) {
  auto j = parse_object(data, n, "state request");
  StateRequest r;
  r.shard = get_int(j, "shard", "state request", 0, 1 << 16);
  r.elements = get_int(j, "elements", "state request", 1, int64_t{1} << 34);
  r.chunk_elements = get_int(j, "chunk_elements", "state request", 1, int64_t{1} << 28);
  auto it = j.find("versions");
  if (it == j.end() || !it->is_array() || it->size() > 4096)
    throw WireError("state request field 'versions' is missing or not a short array");
  for (const auto& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) throw WireError("state request field 'versions' holds a non-integer");
    r.versions.push_back(v.get<int64_t>());
  }
  if (j.contains("learner")) r.learner = get_int(j, "learner", "state request", 0, 1 << 20);
  if (j.contains("ticket")) r.ticket = get_digest(j, "ticket", "state request");
  return r;
}

std::string encode_beat(const Beat& b) {
  nlohmann::json j{{"step", b.step}, {"tokens", b.tokens}, {"busy_seconds", b.busy_seconds}, {"step_time", b.step_time}};
  if (b.state_round >= 0) j["state_round"] = b.state_round;
  if (b.broadcasts >= 0) j["broadcasts"] = b.broadcasts;
  if (!b.resend.empty()) j["resend"] = b.resend;
  if (b.push_bytes >= 0) j["push_bytes"] = b.push_bytes;
  if (b.unsent >= 0) j["unsent"] = b.unsent;
  return j.dump();
}

Beat parse_beat(const char* data, size_t n) {
  auto j = parse_object(data, n, "heartbeat");
  Beat b;
  b.step = get_int(j, "step", "heartbeat", 0, kMaxI);
  b.tokens = get_int(j, "tokens", "heartbeat", 0, kMaxI);
  b.busy_seconds = get_double(j, "busy_seconds", "heartbeat");
  b.step_time = get_double(j, "step_time", "heartbeat");
  if (j.contains("state_round")) b.state_round = get_int(j, "state_round", "heartbeat", 0, kMaxI);
  if (j.contains("broadcasts")) b.broadcasts = get_int(j, "broadcasts", "heartbeat", 0, kMaxI);
  if (j.contains("push_bytes")) b.push_bytes = get_int(j, "push_bytes", "heartbeat", 0, kMaxI);
  if (j.contains("unsent")) b.unsent = get_int(j, "unsent", "heartbeat", 0, kMaxI);
  if (j.contains("resend")) {
    const auto& r = j["resend"];
    if (!r.is_array() || r.size() > kMaxResend)
      throw WireError("heartbeat field 'resend' is not a list of at most " + std::to_string(kMaxResend) + " fragments");
    for (const auto& v : r) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 0xffffffffll)
        throw WireError("heartbeat field 'resend' holds something other than a fragment id");
      b.resend.push_back(v.get<int64_t>());
    }
  }
  return b;
}

std::string encode_syncer_beat(const SyncerBeat& b) {
  nlohmann::json j{{"pushes", b.pushes}};
  if (b.patience > 0) j["patience"] = b.patience;
  if (b.sync_every > 0) j["sync_every"] = b.sync_every;
  if (b.leader_epoch > 0) j["leader_epoch"] = b.leader_epoch;
  if (b.push_encoding > 0) j["push_encoding"] = b.push_encoding;
  if (b.period > 0) j["period"] = b.period;
  return j.dump();
}

SyncerBeat parse_syncer_beat(const char* data, size_t n) {
  auto j = parse_object(data, n, "syncer heartbeat");
  SyncerBeat b;
  b.pushes = get_int(j, "pushes", "syncer heartbeat", 0, kMaxI);
  if (j.contains("patience")) b.patience = get_double(j, "patience", "syncer heartbeat");
  if (j.contains("sync_every")) b.sync_every = get_int(j, "sync_every", "syncer heartbeat", 1, kMaxI);
  if (j.contains("leader_epoch")) b.leader_epoch = get_int(j, "leader_epoch", "syncer heartbeat", 1, kMaxEpoch);
  if (j.contains("push_encoding"))
    b.push_encoding = get_int(j, "push_encoding", "syncer heartbeat", 1, static_cast<int64_t>(kMaxEncoding));
  if (j.contains("period")) b.period = get_int(j, "period", "syncer heartbeat", 1, kMaxI);
  return b;
}

std::string encode_leave(const std::string& reason) { return nlohmann::json{{"reason", reason}}.dump(); }

std::string parse_leave(const char* data, size_t n) {
  auto j = parse_object(data, n, "leave");
  auto it = j.find("reason");
  if (it == j.end() || !it->is_string()) throw WireError("leave field 'reason' is missing or not a string");
  std::string r = it->get<std::string>();
  if (r != "done" && r != "stop") throw WireError("leave reason must be done or stop (got '" + clip_utf8(r, 40) + "')");
  return r;
}

Frame make_frame(const MessageHeader& h_in, Bytes payload, const WireLimits& limits) {
  MessageHeader h = h_in;
  if (h.encoding == Encoding::kRaw) h.element_count = payload.size();
  auto head = encode_header(h, payload.data(), payload.size(), limits);
  return Frame{Bytes::copy(head.data(), head.size()), std::move(payload)};
}

WireLimits wire_limits(const ModelPlan& plan) {
  WireLimits limits;
  limits.max_elements = static_cast<uint64_t>(std::max<int64_t>(plan.model.elements, 1 << 16));
  limits.max_payload_bytes = limits.max_elements * 4 + 4096;
  return limits;
}

const char* reject_reason_name(RejectReason r) {
  switch (r) {
    case RejectReason::kMalformedFrame: return "malformed_frame";
    case RejectReason::kFingerprintMismatch: return "fingerprint_mismatch";
    case RejectReason::kNotJoined: return "not_joined";
    case RejectReason::kLearnerIdMismatch: return "learner_id_mismatch";
    case RejectReason::kUnknownLearner: return "unknown_learner";
    case RejectReason::kKeyIdMismatch: return "key_id_mismatch";
    case RejectReason::kDuplicateId: return "duplicate_id";
    case RejectReason::kUnexpectedKind: return "unexpected_kind";
    case RejectReason::kUnknownFragment: return "unknown_fragment";
    case RejectReason::kWrongShape: return "wrong_shape";
    case RejectReason::kNonFinite: return "non_finite";
    case RejectReason::kRefusedByCore: return "refused_by_core";
    case RejectReason::kUnboundKey: return "unbound_key";
    case RejectReason::kHandlerError: return "handler_error";
    case RejectReason::kDeltaTooLarge: return "delta_too_large";
    case RejectReason::kNotLeader: return "not_leader";
    case RejectReason::kNotHeld: return "not_held";
    case RejectReason::kBusy: return "busy";
    case RejectReason::kOther: break;
  }
  return "other";
}

RejectReason reject_reason_from_core(SyncReject why) {
  switch (why) {
    case SyncReject::kWrongShape:
    case SyncReject::kWrongTensorCount: return RejectReason::kWrongShape;
    case SyncReject::kNonFinite: return RejectReason::kNonFinite;
    case SyncReject::kUnknownFragment: return RejectReason::kUnknownFragment;
    case SyncReject::kUnknownLearner: return RejectReason::kUnknownLearner;
    case SyncReject::kNormBound:
    case SyncReject::kNormRatio:
    case SyncReject::kNormOutlier: return RejectReason::kDeltaTooLarge;  // exactly refusal_drops_drift (a test says so)
    case SyncReject::kNone:
    case SyncReject::kFutureBase:
    case SyncReject::kCounterOutOfRange:
    case SyncReject::kMergeNonFinite:
    case SyncReject::kMergeFailed: break;
  }
  return RejectReason::kRefusedByCore;
}

RejectReason reject_reason_of(const MessageHeader& h) {
  if (h.kind != MessageKind::kReject || h.round > static_cast<uint64_t>(kLastRejectReason))
    return RejectReason::kOther;
  return static_cast<RejectReason>(h.round);
}

bool reject_is_permanent(RejectReason r) {
  return r == RejectReason::kFingerprintMismatch || r == RejectReason::kKeyIdMismatch ||
         r == RejectReason::kUnknownLearner || r == RejectReason::kLearnerIdMismatch ||
         r == RejectReason::kUnboundKey;
}

std::optional<int64_t> learner_of_key_name(const std::string& name) {
  static const std::string prefix = "learner-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 9 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  int64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

}  // namespace deloco::proto
