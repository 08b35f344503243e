// The standby syncer's journal: entries, their frames, and the one function that applies them (replication.h).
#include "replication.h"

#include <cstring>
#include <limits>

#include <torch/torch.h>

#include "deloco/learner.h"
#include "deloco/safetensors.h"
#include "protocol.h"

namespace deloco::repl {
namespace {

constexpr size_t kMaxJsonBytes = size_t{16} << 20;

using nlohmann::json;

json ema_json(const Ema& e) { return json::array({e.value, e.seeded}); }

Ema ema_of(const json& j, const char* what) {
  if (!j.is_array() || j.size() != 2 || !j[0].is_number() || !j[1].is_boolean())
    throw WireError(std::string("replica image field '") + what + "' is not [value, seeded]");
  Ema e;
  e.value = j[0].get<double>();
  e.seeded = j[1].get<bool>();
  return e;
}

const json& field(const json& j, const char* key, const char* what) {
  auto it = j.find(key);
  if (it == j.end()) throw WireError(std::string("replica ") + what + " lacks field '" + key + "'");
  return *it;
}

int64_t int_field(const json& j, const char* key, const char* what, int64_t lo, int64_t hi) {
  const json& v = field(j, key, what);
  if (!v.is_number_integer()) throw WireError(std::string("replica ") + what + " field '" + key + "' is not an integer");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw WireError(std::string("replica ") + what + " field '" + key + "' = " + std::to_string(x) + " is out of range");
  return x;
}

double num_field(const json& j, const char* key, const char* what) {
  const json& v = field(j, key, what);
  if (!v.is_number()) throw WireError(std::string("replica ") + what + " field '" + key + "' is not a number");
  return v.get<double>();
}

template <class T> std::vector<T> list_field(const json& j, const char* key, const char* what, size_t n) {
  const json& v = field(j, key, what);
  if (!v.is_array() || v.size() != n)
    throw WireError(std::string("replica ") + what + " field '" + key + "' is not a list of " + std::to_string(n));
  try {
    return v.get<std::vector<T>>();
  } catch (const json::exception&) {
    throw WireError(std::string("replica ") + what + " field '" + key + "' has an element of the wrong type");
  }
}

json checks_json(const std::vector<RoundCheck>& rs) {
  json a = json::array();
  for (const auto& r : rs)
    a.push_back({{"fragment", r.fragment}, {"merged", r.merged}, {"version", r.version}, {"hash", std::to_string(r.hash)}});
  return a;
}

std::vector<RoundCheck> checks_of(const json& a, int64_t fragments) {
  if (!a.is_array() || a.size() > static_cast<size_t>(fragments)) throw WireError("replica round results are not a list");
  std::vector<RoundCheck> out;
  for (const auto& j : a) {
    if (!j.is_object()) throw WireError("replica round result is not an object");
    RoundCheck r;
    r.fragment = int_field(j, "fragment", "round result", 0, fragments - 1);
    const json& m = field(j, "merged", "round result");
    if (!m.is_boolean()) throw WireError("replica round result field 'merged' is not a boolean");
    r.merged = m.get<bool>();
    r.version = int_field(j, "version", "round result", 0, std::numeric_limits<int64_t>::max());
    const json& h = field(j, "hash", "round result");
    if (!h.is_string()) throw WireError("replica round result field 'hash' is not a string");
    try {
      size_t used = 0;
      r.hash = std::stoull(h.get<std::string>(), &used);
      if (used != h.get<std::string>().size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      throw WireError("replica round result field 'hash' is not a decimal number");
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace

const char* entry_kind_name(EntryKind k) {
  switch (k) {
    case EntryKind::kImage: return "image";
    case EntryKind::kReceive: return "receive";
    case EntryKind::kRound: return "round";
    case EntryKind::kConnected: return "connected";
    case EntryKind::kRetire: return "retire";
    case EntryKind::kJoined: return "joined";
    case EntryKind::kObserveSync: return "observe_sync";
    case EntryKind::kDrain: return "drain";
    case EntryKind::kCounters: return "counters";
    case EntryKind::kLease: return "lease";
    case EntryKind::kFollow: return "follow";
    case EntryKind::kAck: return "ack";
    case EntryKind::kFinal: return "final";
    case EntryKind::kFinished: return "finished";
  }
  return "unknown";
}

EncodedEntry encode(const Entry& e, uint64_t fingerprint) {
  json j;
  std::string binary;
  switch (e.kind) {
    case EntryKind::kImage: {
      const Syncer::Image& im = e.image;
      std::vector<json> steps;
      for (const auto& s : im.learner_step) steps.push_back(ema_json(s));
      j = {{"versions", im.versions},
           {"merged", im.merged},
           {"connected", std::vector<bool>(im.connected.begin(), im.connected.end())},
           {"retired", std::vector<bool>(im.retired.begin(), im.retired.end())},
           {"finished", std::vector<bool>(im.finished.begin(), im.finished.end())},
           {"learner_step", steps},
           {"stats", {ema_json(im.stats.step), ema_json(im.stats.quorum), ema_json(im.stats.sync)}},
           {"fused_merges", im.fused_merges},
           {"general_merges", im.general_merges},
           {"stale_bases", im.stale_bases},
           {"rejected", im.rejected},
           {"counters", e.counters}};
      TensorFile tf;
      for (const auto& [n, t] : im.global) tf.tensors["theta/" + n] = t.detach().to(torch::kCPU).contiguous();
      for (const auto& [n, t] : im.outer)
        if (t.defined()) tf.tensors["outer/" + n] = t.detach().to(torch::kCPU).contiguous();
      for (size_t f = 0; f < im.broadcast_residual.size(); ++f)  // the delta broadcast's e_p (sync.h)
        tf.tensors["residual/" + std::to_string(f)] = im.broadcast_residual[f].detach().to(torch::kCPU).contiguous();
      binary = encode_safetensors(tf);
      break;
    }
    case EntryKind::kReceive:
      j = {{"t", e.t}, {"learner", e.learner}, {"fragment", e.fragment}, {"encoding", static_cast<int>(e.encoding)},
           {"base", e.base}, {"c_steps", e.c_steps}, {"c_tokens", e.c_tokens}, {"step", e.step},
           {"step_time", e.step_time}};
      if (e.flag) j["final"] = true;
      binary = e.payload.str();
      break;
    case EntryKind::kRound:
      j = {{"t", e.t}, {"fragment", e.fragment}, {"results", checks_json(e.results)}};
      if (e.delta_encoding > 0) j["delta_encoding"] = e.delta_encoding;
      if (e.link_period >= 0) j["link_period"] = e.link_period;
      break;
    case EntryKind::kConnected: j = {{"learner", e.learner}, {"connected", e.flag}}; break;
    case EntryKind::kRetire: j = {{"t", e.t}, {"learner", e.learner}}; break;
    case EntryKind::kFinished: j = {{"t", e.t}, {"learner", e.learner}, {"finished", e.flag}}; break;
    case EntryKind::kJoined: j = {{"learner", e.learner}}; break;
    case EntryKind::kObserveSync: j = {{"upload", e.upload}, {"merge", e.merge}, {"broadcast", e.broadcast}}; break;
    case EntryKind::kDrain:
      j = {{"t", e.t}, {"results", checks_json(e.results)}};
      if (e.delta_encoding > 0) j["delta_encoding"] = e.delta_encoding;
      break;
    case EntryKind::kFinal: j = {{"t", e.t}, {"results", checks_json(e.results)}}; break;
    case EntryKind::kCounters: j = {{"counters", e.counters}}; break;
    case EntryKind::kFollow:
      j = json::object();
      if (e.merges >= 0) j["merges"] = e.merges;
      if (e.slot >= 0) j["slot"] = e.slot;
      break;
    case EntryKind::kLease:
    case EntryKind::kAck: j = json::object(); break;
  }
  const std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string body(4 + text.size() + binary.size(), '\0');
  const uint32_t n = static_cast<uint32_t>(text.size());
  for (int i = 0; i < 4; ++i) body[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(body.data() + 4, text.data(), text.size());
  if (!binary.empty()) std::memcpy(body.data() + 4 + text.size(), binary.data(), binary.size());
  EncodedEntry out;
  out.header.kind = MessageKind::kReplica;
  out.header.encoding = Encoding::kRaw;
  out.header.fingerprint = fingerprint;
  out.header.round = e.seq;
  out.header.c_steps = static_cast<uint64_t>(e.epoch);
  out.header.fragment_id = static_cast<uint32_t>(e.kind);
  out.payload = Bytes::from_string(std::move(body));
  return out;
}

Entry decode(const MessageHeader& h, const Bytes& payload, int64_t learners, int64_t fragments) {
  if (h.kind != MessageKind::kReplica) throw WireError("not a replica frame");
  if (h.fragment_id == 0 || h.fragment_id > kLastEntryKind)
    throw WireError("replica entry kind " + std::to_string(h.fragment_id) + " is unknown");
  if (h.c_steps > static_cast<uint64_t>(proto::kMaxEpoch))
    throw WireError("replica epoch " + std::to_string(h.c_steps) + " is out of range (at most 2^53 - 1)");
  Entry e;
  e.kind = static_cast<EntryKind>(h.fragment_id);
  e.seq = h.round;
  e.epoch = static_cast<int64_t>(h.c_steps);
  const char* what = entry_kind_name(e.kind);
  if (payload.size() < 4) throw WireError(std::string("replica ") + what + " entry is shorter than its length prefix");
  const auto* p = reinterpret_cast<const unsigned char*>(payload.data());
  const size_t n = static_cast<size_t>(p[0]) | static_cast<size_t>(p[1]) << 8 | static_cast<size_t>(p[2]) << 16 |
                   static_cast<size_t>(p[3]) << 24;
  if (n > kMaxJsonBytes || n > payload.size() - 4)
    throw WireError(std::string("replica ") + what + " entry's JSON length " + std::to_string(n) + " overruns the frame");
  const json j = json::parse(payload.data() + 4, payload.data() + 4 + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw WireError(std::string("replica ") + what + " entry is not a JSON object");
  const size_t bin_at = 4 + n, bin_n = payload.size() - bin_at;
  const size_t M = static_cast<size_t>(learners);
  switch (e.kind) {
    case EntryKind::kImage: {
      Syncer::Image& im = e.image;
      im.versions = list_field<int64_t>(j, "versions", what, static_cast<size_t>(fragments));
      for (int64_t v : im.versions)
        if (v < 0) throw WireError("replica image has a negative fragment version");
      im.merged = int_field(j, "merged", what, 0, std::numeric_limits<int64_t>::max());
      const auto con = list_field<bool>(j, "connected", what, M), ret = list_field<bool>(j, "retired", what, M);
      im.connected.assign(con.begin(), con.end());
      im.retired.assign(ret.begin(), ret.end());
      if (j.contains("finished")) {  // an image from before sync.final_round marked finished learners has none
        const auto fin = list_field<bool>(j, "finished", what, M);
        im.finished.assign(fin.begin(), fin.end());
      }
      const json& steps = field(j, "learner_step", what);
      if (!steps.is_array() || steps.size() != M) throw WireError("replica image field 'learner_step' is not a list of M");
      for (const auto& s : steps) im.learner_step.push_back(ema_of(s, "learner_step"));
      const json& st = field(j, "stats", what);
      if (!st.is_array() || st.size() != 3) throw WireError("replica image field 'stats' is not [step, quorum, sync]");
      im.stats.step = ema_of(st[0], "stats");
      im.stats.quorum = ema_of(st[1], "stats");
      im.stats.sync = ema_of(st[2], "stats");
      im.fused_merges = int_field(j, "fused_merges", what, 0, std::numeric_limits<int64_t>::max());
      im.general_merges = int_field(j, "general_merges", what, 0, std::numeric_limits<int64_t>::max());
      im.stale_bases = int_field(j, "stale_bases", what, 0, std::numeric_limits<int64_t>::max());
      try {
        im.rejected = field(j, "rejected", what).get<std::map<std::string, int64_t>>();
      } catch (const json::exception&) {
        throw WireError("replica image field 'rejected' is not a map of counts");
      }
      e.counters = field(j, "counters", what);
      if (!e.counters.is_object()) throw WireError("replica image field 'counters' is not an object");
      TensorFile tf;
      try {
        tf = decode_safetensors(std::string(payload.data() + bin_at, bin_n), "replica image");
      } catch (const std::exception& x) {
        throw WireError(std::string("replica image tensors: ") + x.what());
      }
      std::map<int64_t, at::Tensor> residual;
      for (auto& [name, t] : tf.tensors) {
        if (name.rfind("theta/", 0) == 0) {
          im.global[name.substr(6)] = t;
        } else if (name.rfind("outer/", 0) == 0) {
          im.outer[name.substr(6)] = t;
        } else if (name.rfind("residual/", 0) == 0) {
          int64_t f = -1;
          try {
            f = std::stoll(name.substr(9));
          } catch (const std::exception&) {
          }
          if (f < 0 || f >= fragments || std::to_string(f) != name.substr(9))
            throw WireError("replica image tensor '" + name.substr(0, 80) + "' names no fragment");
          residual[f] = t;
        } else {
          throw WireError("replica image tensor '" + name.substr(0, 80) + "' is neither theta/, outer/ nor residual/");
        }
      }
      if (!residual.empty()) {
        if (static_cast<int64_t>(residual.size()) != fragments)
          throw WireError("replica image holds the broadcast residual of " + std::to_string(residual.size()) + " of " +
                          std::to_string(fragments) + " fragments");
        for (auto& [f, t] : residual) im.broadcast_residual.push_back(t);
      }
      break;
    }
    case EntryKind::kReceive: {
      e.t = num_field(j, "t", what);
      e.learner = int_field(j, "learner", what, 0, learners - 1);
      e.fragment = int_field(j, "fragment", what, 0, fragments - 1);
      const int64_t enc = int_field(j, "encoding", what, 1, kMaxEncoding);
      e.encoding = static_cast<Encoding>(enc);
      e.base = int_field(j, "base", what, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
      e.c_steps = int_field(j, "c_steps", what, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
      e.c_tokens = int_field(j, "c_tokens", what, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
      e.step = int_field(j, "step", what, -1, std::numeric_limits<int64_t>::max());
      e.step_time = num_field(j, "step_time", what);
      if (j.contains("final")) {
        const json& f = j["final"];
        if (!f.is_boolean()) throw WireError("replica receive entry field 'final' is not a boolean");
        e.flag = f.get<bool>();
      }
      e.payload = payload.slice(bin_at, bin_n);
      break;
    }
    case EntryKind::kRound:
      e.t = num_field(j, "t", what);
      e.fragment = int_field(j, "fragment", what, 0, fragments - 1);
      e.results = checks_of(field(j, "results", what), fragments);
      if (e.results.size() != 1) throw WireError("replica round entry must carry one result");
      if (j.contains("delta_encoding")) e.delta_encoding = int_field(j, "delta_encoding", what, 1, kMaxEncoding);
      if (j.contains("link_period")) e.link_period = int_field(j, "link_period", what, 0, int64_t{1} << 40);
      break;
    case EntryKind::kConnected: {
      e.learner = int_field(j, "learner", what, 0, learners - 1);
      const json& c = field(j, "connected", what);
      if (!c.is_boolean()) throw WireError("replica connected entry field 'connected' is not a boolean");
      e.flag = c.get<bool>();
      break;
    }
    case EntryKind::kRetire:
      e.t = num_field(j, "t", what);
      e.learner = int_field(j, "learner", what, 0, learners - 1);
      break;
    case EntryKind::kFinished: {
      e.t = num_field(j, "t", what);
      e.learner = int_field(j, "learner", what, 0, learners - 1);
      const json& f = field(j, "finished", what);
      if (!f.is_boolean()) throw WireError("replica finished entry field 'finished' is not a boolean");
      e.flag = f.get<bool>();
      break;
    }
    case EntryKind::kJoined: e.learner = int_field(j, "learner", what, 0, learners - 1); break;
    case EntryKind::kObserveSync:
      e.upload = num_field(j, "upload", what);
      e.merge = num_field(j, "merge", what);
      e.broadcast = num_field(j, "broadcast", what);
      break;
    case EntryKind::kDrain:
      e.t = num_field(j, "t", what);
      e.results = checks_of(field(j, "results", what), fragments);
      if (j.contains("delta_encoding")) e.delta_encoding = int_field(j, "delta_encoding", what, 1, kMaxEncoding);
      break;
    case EntryKind::kFinal:
      e.t = num_field(j, "t", what);
      e.results = checks_of(field(j, "results", what), fragments);
      break;
    case EntryKind::kCounters:
      e.counters = field(j, "counters", what);
      if (!e.counters.is_object()) throw WireError("replica counters entry is not an object");
      break;
    case EntryKind::kFollow:  // the sender's state: optional (older syncers send none), in range when given
      if (j.contains("merges")) e.merges = int_field(j, "merges", what, 0, std::numeric_limits<int64_t>::max());
      if (j.contains("slot")) e.slot = int_field(j, "slot", what, 0, 1);
      break;
    case EntryKind::kLease:
    case EntryKind::kAck: break;
  }
  return e;
}

bool leads_leaderless(const PairState& mine, const PairState& other) {
  if (mine.slot < 0 || other.slot < 0 || mine.slot == other.slot) return false;
  if (mine.epoch != other.epoch) return mine.epoch > other.epoch;
  if (mine.merges != other.merges) return mine.merges > other.merges;
  return mine.slot < other.slot;
}

Applied apply(Syncer& core, const Entry& e, const std::vector<FlatLayout>& layouts) {
  switch (e.kind) {
    case EntryKind::kImage: core.resync(e.image); return {};
    case EntryKind::kReceive: {
      if (e.fragment < 0 || e.fragment >= static_cast<int64_t>(layouts.size()))
        throw SyncError("replica receive names fragment " + std::to_string(e.fragment));
      auto keep = std::make_shared<Bytes>(e.payload);
      Contribution c = decode_push(e.learner, e.fragment, layouts[static_cast<size_t>(e.fragment)], e.encoding,
                                   keep->data(), keep->size(), e.base, e.c_steps, e.c_tokens, e.step_time, keep);
      c.step = e.step;
      Applied a;
      a.received = e.flag ? core.receive_final(std::move(c)) : core.receive(e.t, std::move(c));
      return a;
    }
    case EntryKind::kRound:
      if (e.delta_encoding > 0) core.use_delta_encoding(static_cast<Encoding>(e.delta_encoding));
      if (e.link_period >= 0) core.set_link_period(e.link_period);
      return {{core.on_round(e.t, e.fragment)}, SyncReject::kNone};
    case EntryKind::kConnected: core.set_connected(e.learner, e.flag); return {};
    case EntryKind::kRetire: core.retire(e.t, e.learner); return {};
    case EntryKind::kFinished: core.set_finished(e.t, e.learner, e.flag); return {};
    case EntryKind::kJoined: core.note_joined(e.learner); return {};
    case EntryKind::kObserveSync: core.observe_sync(e.upload, e.merge, e.broadcast); return {};
    case EntryKind::kDrain:
      if (e.delta_encoding > 0) core.use_delta_encoding(static_cast<Encoding>(e.delta_encoding));
      return {core.drain(e.t), SyncReject::kNone};
    case EntryKind::kFinal: return {core.final_round(), SyncReject::kNone};
    case EntryKind::kCounters:
    case EntryKind::kLease:
    case EntryKind::kFollow:
    case EntryKind::kAck: return {};
  }
  return {};
}

RoundCheck check_of(const RoundResult& r) {
  RoundCheck c;
  c.fragment = r.outcome.fragment;
  c.merged = r.merged();
  c.version = r.outcome.version;
  if (c.merged && r.flat.defined())
    c.hash = fnv1a64(r.flat.data_ptr<float>(), static_cast<size_t>(r.flat.numel()) * sizeof(float));
  return c;
}

std::string compare(const RoundCheck& leader, const RoundCheck& mine) {
  if (leader.fragment != mine.fragment)
    return "the leader's round was of fragment " + std::to_string(leader.fragment) + ", this standby's of " +
           std::to_string(mine.fragment);
  if (leader.merged != mine.merged)
    return std::string("the leader ") + (leader.merged ? "merged" : "did not merge") + " fragment " +
           std::to_string(leader.fragment) + ", this standby " + (mine.merged ? "merged it" : "did not");
  if (leader.version != mine.version)
    return "fragment " + std::to_string(leader.fragment) + ": the leader is at version " + std::to_string(leader.version) +
           ", this standby at " + std::to_string(mine.version);
  if (leader.hash != mine.hash)
    return "fragment " + std::to_string(leader.fragment) + " version " + std::to_string(leader.version) +
           ": the merged parameters differ (FNV-1a-64 " + std::to_string(leader.hash) + " at the leader, " +
           std::to_string(mine.hash) + " here)";
  return "";
}

Applied Journal::record(Syncer& core, const std::vector<FlatLayout>& layouts, Entry e, int64_t epoch, bool replicate,
                        uint64_t fingerprint, const WireLimits& limits) {
  Applied a = apply(core, e, layouts);  // throws before journaling: nothing was applied
  e.seq = ++seq_;
  e.epoch = epoch;
  for (const RoundResult& r : a.rounds) e.results.push_back(check_of(r));
  hold(e, a);
  if (replicate) {
    const EncodedEntry enc = encode(e, fingerprint);
    out_.push_back(proto::make_frame(enc.header, enc.payload, limits));
  }
  return a;
}

void Journal::follow(const Entry& e, const Applied& a) {
  seq_ = e.seq;
  hold(e, a);
}

void Journal::hold(const Entry& e, const Applied& a) {
  if (e.kind == EntryKind::kImage) {  // the cores' rounds are dropped; the leader journals what waited again after it
    held_pushes_.clear();
    held_finals_.clear();
    return;
  }
  if (e.kind == EntryKind::kReceive && a.received == SyncReject::kNone)
    (e.flag ? held_finals_ : held_pushes_)[{e.learner, e.fragment}] = e;
  if (e.kind == EntryKind::kFinal) held_finals_.clear();
  for (const RoundResult& r : a.rounds)
    if (r.decision.kind == RoundDecision::kMerge)  // merged or rolled back: those pushes no longer wait
      for (int64_t m : r.outcome.learners) held_pushes_.erase({m, r.outcome.fragment});
}

std::vector<Entry> Journal::waiting_pushes(const Syncer& core, int64_t fragments) const {
  std::vector<Entry> waiting;
  for (int64_t p = 0; p < fragments; ++p)
    for (int64_t m : core.waiting(p))
      if (auto it = held_pushes_.find({m, p}); it != held_pushes_.end()) waiting.push_back(it->second);
  for (int64_t p = 0; p < fragments; ++p)
    for (int64_t m : core.final_learners(p))
      if (auto it = held_finals_.find({m, p}); it != held_finals_.end()) waiting.push_back(it->second);
  return waiting;
}

}  // namespace deloco::repl
