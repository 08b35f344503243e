// A learner's peer serving: see donor_server.h for the contract.
#include "donor_server.h"

#include <algorithm>
#include <cstring>

#include <torch/torch.h>

#include "deloco/error.h"
#include "util/text.h"

namespace deloco {

using proto::RejectReason;

// This learner's copy of one shard's part of the syncer's state (the verified download or held initial state, then
// every fp32 broadcast), its per-local-fragment versions, and where each local fragment's elements lie in it (part
// offset, fragment offset, count).
struct DonorServer::Copy {
  const ShardPlan* plan = nullptr;
  at::Tensor served;
  std::vector<int64_t> versions;
  // While a joining learner fetches from this copy it stays at the versions it asked for (kServeFreeze after its
  // latest request): newer broadcasts wait here (the latest per local fragment) and go in when it thaws.
  double frozen_until = -1;
  std::map<int64_t, std::pair<int64_t, at::Tensor>> deferred;
  std::vector<std::vector<std::array<int64_t, 3>>> segments;
  // The version each local fragment had before its latest broadcast (-1: none) and its elements (fragment order).
  std::vector<int64_t> prev_versions;
  std::vector<at::Tensor> prev;
};

// Whether this learner holds a requested chunk at the versions asked for: each fragment with elements in it at its
// current version or the one before (Copy::prev); kNewer: some fragment is asked at a version newer than held.
struct DonorServer::Holding {
  enum What { kYes, kNewer, kNo } what = kNo;
  Copy* C = nullptr;
  int64_t first = 0, n = 0;
  std::vector<size_t> from_prev;  // fragments served from their previous version
};

DonorServer::DonorServer(Context ctx, std::unique_ptr<ServerTransport> server)
    : ctx_(std::move(ctx)), tx_(std::move(server)), secret_(random_key()) {
  ChunkServer::Options o;
  o.rate_mbit = ctx_.serve_rate;
  o.max_queue = 64;
  o.max_waiting = 64;
  o.max_wait = kServeWait;
  o.fingerprint = ctx_.fingerprint;
  o.limits = ctx_.limits;
  o.answer_as = ctx_.id;
  o.reject_names_chunk = true;
  chunks_ = ChunkServer(o, [this](const std::string& route, const proto::Frame& f) { return tx_->send(route, f.header, f.payload); });
  // Where each local fragment's tensors lie in the shard's part (model_layout order), by name.
  copies_.resize(ctx_.shards.size());
  for (size_t s = 0; s < ctx_.shards.size(); ++s) {
    Copy& C = copies_[s];
    C.plan = &ctx_.shards[s];
    std::map<std::string, int64_t> at;
    for (size_t t = 0; t < C.plan->model.names.size(); ++t) at[C.plan->model.names[t]] = C.plan->model.offsets[t];
    C.segments.assign(C.plan->fragment_layouts.size(), {});
    for (size_t k = 0; k < C.plan->fragment_layouts.size(); ++k) {
      const FlatLayout& fl = C.plan->fragment_layouts[k];
      for (size_t t = 0; t < fl.names.size(); ++t) {
        const int64_t n = t + 1 < fl.names.size() ? fl.offsets[t + 1] - fl.offsets[t] : fl.elements - fl.offsets[t];
        C.segments[k].push_back({at.at(fl.names[t]), fl.offsets[t], n});
      }
    }
  }
}

DonorServer::~DonorServer() = default;

DonorServer::Copy* DonorServer::copy_of(int64_t shard) {
  Copy* out = nullptr;
  for (auto& C : copies_)
    if (C.plan->shard == shard) out = &C;
  return out;
}

// ---- the copy ----
void DonorServer::set_served(int64_t shard, const at::Tensor& flat, const std::vector<int64_t>& versions) {
  Copy* C = copy_of(shard);
  if (!C || versions.size() != C->segments.size() || flat.numel() != C->plan->model.elements) return;
  C->served = flat.clone();
  C->versions = versions;
  C->prev_versions.assign(versions.size(), -1);
  C->prev.assign(versions.size(), at::Tensor());
}

void DonorServer::drop(int64_t shard) {
  if (Copy* C = copy_of(shard)) C->served = at::Tensor();
}

// Whether C.served may be written now: no reply points into it, or it could be replaced by a copy (the old one stays
// alive, pinned, while replies hold it; at most kMaxPinned such copies at a time).
bool DonorServer::writable(Copy& C) {
  if (C.served.use_count() == 1) return true;
  pinned_.erase(std::remove_if(pinned_.begin(), pinned_.end(), [](const at::Tensor& t) { return t.use_count() == 1; }),
                pinned_.end());
  if (pinned_.size() >= kMaxPinned) return false;
  pinned_.push_back(C.served);
  C.served = C.served.clone();
  return true;
}

void DonorServer::broadcast(int64_t shard, int64_t p, int64_t version, const at::Tensor& flat) {
  Copy* Cp = copy_of(shard);
  if (!Cp || !Cp->served.defined()) return;
  Copy& C = *Cp;
  const int64_t k = C.plan->local[static_cast<size_t>(p)];
  if (k < 0 || version <= C.versions[static_cast<size_t>(k)]) return;
  if (ctx_.now() < C.frozen_until || !writable(C)) {  // a fetch is reading this copy, or replies pin it: later
    auto it = C.deferred.find(k);
    if (it == C.deferred.end() || it->second.first < version) C.deferred[k] = {version, flat};
    return;
  }
  float* dst = C.served.data_ptr<float>();
  const float* src = flat.data_ptr<float>();
  at::Tensor& old = C.prev[static_cast<size_t>(k)];
  if (!old.defined() || old.numel() != flat.numel()) old = torch::empty({flat.numel()}, torch::kFloat);
  float* keep = old.data_ptr<float>();
  for (const auto& [part, frag, n] : C.segments[static_cast<size_t>(k)]) {
    std::memcpy(keep + frag, dst + part, static_cast<size_t>(n) * sizeof(float));
    std::memcpy(dst + part, src + frag, static_cast<size_t>(n) * sizeof(float));
  }
  C.prev_versions[static_cast<size_t>(k)] = C.versions[static_cast<size_t>(k)];
  C.versions[static_cast<size_t>(k)] = version;
}

// ---- serving ----
void DonorServer::refused(Refusal why, const std::string& detail) {
  const int64_t n = ++refused_by_[why];
  if ((n & (n - 1)) != 0) return;
  rec::ServeRefused r;
  r.reason = kRefusalNames[why];
  r.count = n;
  r.detail = clip_utf8(detail, 300);
  if (ctx_.record) ctx_.record(r);
}

void DonorServer::tend() {
  const double t0s = ctx_.now();
  for (auto& C : copies_)  // thawed: the broadcasts that waited go in
    if (!C.deferred.empty() && t0s >= C.frozen_until) {
      std::map<int64_t, std::pair<int64_t, at::Tensor>> d;
      d.swap(C.deferred);
      for (auto& [k, vf] : d) broadcast(C.plan->shard, C.plan->fragments[static_cast<size_t>(k)], vf.first, vf.second);
    }
  if (t0s - requesters_swept_ > 1) {  // requesters with nothing queued or on its way, quiet for a while, are forgotten
    requesters_swept_ = t0s;
    for (auto it = requesters_.begin(); it != requesters_.end();)
      it = it->second.queued == 0 && it->second.in_flight->load() == 0 && t0s - it->second.last > 30 ? requesters_.erase(it)
                                                                                                 : std::next(it);
    for (auto it = fetch_first_.begin(); it != fetch_first_.end();)
      it = t0s - it->second > 600 ? fetch_first_.erase(it) : std::next(it);
  }
  admit();
  // Waiting requests whose broadcasts came (or whose wait is over) go first; then the new ones. The rate bound:
  // net.serve_rate.
  const auto resolve = [this](const ChunkServer::Request& q) {
    const Holding held = holding(q);
    if (held.what == Holding::kYes) {
      const int64_t learner = q.learner;
      const uint64_t round = q.h.round;
      return ChunkServer::Resolution::serve(held.n, [this, learner, round, held] {
        // The rest of this fetch finds these versions, for kServeFreezeMax at most from its first request here.
        const double t = ctx_.now();
        auto [ff, fresh] = fetch_first_.try_emplace({learner, round}, t);
        held.C->frozen_until = std::max(held.C->frozen_until, std::min(t + kServeFreeze, ff->second + kServeFreezeMax));
        return chunk_bytes(requesters_[learner].in_flight, held);
      });
    }
    ChunkServer::Resolution no = ChunkServer::Resolution::refuse(
        RejectReason::kNotHeld, "not_held: this learner holds other versions of that chunk");
    if (held.what == Holding::kNewer) no.kind = ChunkServer::Resolution::Kind::kWait;  // its broadcast may come
    return no;
  };
  chunks_.pump(ctx_.now(), resolve, [this](const ChunkServer::Request& q, ChunkServer::Outcome out, const ChunkServer::Resolution& res) {
    if (out == ChunkServer::Outcome::kServed) {
      ++served_chunks_;
      served_bytes_ += res.elements * 4;
    } else if (out == ChunkServer::Outcome::kRefused) {
      refused(kNotHeldHere, "learner " + std::to_string(q.learner) + " asked for chunk " + std::to_string(q.h.fragment_id) +
                                " at versions this learner does not hold");
    }
    if (auto it = requesters_.find(q.learner); it != requesters_.end() && it->second.queued > 0) --it->second.queued;
  });
}

// New state requests, at most 16 per call and while the queue has room: checked, and queued or refused.
void DonorServer::admit() {
  Envelope env;
  for (int n = 0; n < 16 && !chunks_.full() && tx_->receive(&env, std::chrono::milliseconds(0)); ++n) {
    ChunkServer::Request q;
    q.route = env.peer;
    try {
      if (env.parts != 2 || env.header.size() != kWireHeaderBytes) throw WireError("frame layout");
      q.h = decode_header(env.header.data(), env.header.size(), ctx_.limits);
      verify_payload(q.h, env.payload.data(), env.payload.size());
      if (q.h.kind != MessageKind::kStateRequest || q.h.fingerprint != ctx_.fingerprint)
        throw WireError("not a state request for this model");
      q.r = proto::parse_state_request(env.payload.data(), env.payload.size());
    } catch (const WireError& e) {
      refused(kMalformed, e.what());  // a joining learner treats silence as a slow donor; nothing to say to a stranger
      continue;
    }
    const proto::StateRequest& r = q.r;
    q.learner = r.learner;
    // Only learners the syncer introduced: the ticket its welcome gave for this server, for the request's own
    // learner, shard, round and chunk size, from a connection whose key (CURVE) is that learner's.
    if (!r.ticket || r.learner < 0) {
      refused(kStranger, "a state request without a ticket (only learners a syncer's welcome names this server to are served)");
      continue;
    }
    if (!env.identity.empty()) {
      const std::optional<int64_t> bound = proto::learner_of_key_name(env.identity);
      if (!bound || *bound != r.learner) {
        refused(kStranger, "key '" + env.identity + "' asked with learner " + std::to_string(r.learner) + "'s ticket");
        continue;
      }
    }
    if (!digests_equal(*r.ticket, proto::fetch_ticket(secret_, r.learner, r.shard, q.h.round, r.chunk_elements, r.elements))) {
      refused(kBadTicket, "learner " + std::to_string(r.learner) + "'s ticket is not the one a syncer gave it for this server, "
                          "round " + std::to_string(q.h.round) + " and chunks of " + std::to_string(r.chunk_elements) + " elements");
      continue;
    }
    Requester& R = requesters_[r.learner];
    R.last = ctx_.now();
    if (R.queued + R.in_flight->load() >= proto::kFetchWindow) {
      chunks_.refuse(q, RejectReason::kBusy,
                     "busy: this learner serves at most " + std::to_string(proto::kFetchWindow) + " chunks at a time to one learner");
      refused(kBusy, "learner " + std::to_string(r.learner) + " asked for more than " + std::to_string(proto::kFetchWindow) +
                         " chunks at a time");
      continue;
    }
    ++R.queued;
    chunks_.offer(std::move(q), ctx_.now());
  }
}

DonorServer::Holding DonorServer::holding(const ChunkServer::Request& q) {
  Holding out;
  const int64_t first = static_cast<int64_t>(q.h.fragment_id) * q.r.chunk_elements;
  out.C = copy_of(q.r.shard);
  Copy* C = out.C;
  if (!C || !C->served.defined() || q.r.elements != C->plan->model.elements || q.r.chunk_elements <= 0 || first < 0 ||
      first >= q.r.elements || q.r.versions.size() != C->versions.size())
    return out;
  out.first = first;
  out.n = std::min(q.r.chunk_elements, q.r.elements - first);
  bool newer = false;
  for (size_t f = 0; f < C->segments.size(); ++f) {
    bool touches = false;
    for (const auto& [part, frag, cnt] : C->segments[f]) touches = touches || (part < first + out.n && part + cnt > first);
    if (!touches) continue;
    const int64_t want = q.r.versions[f];
    if (want == C->versions[f]) continue;
    if (want == C->prev_versions[f] && C->prev[f].defined()) out.from_prev.push_back(f);
    else if (want > C->versions[f]) newer = true;
    else return out;  // older than this learner keeps
  }
  out.what = newer ? Holding::kNewer : Holding::kYes;
  return out;
}

namespace {
// What a reply's payload points into, and the count of its requester's replies on their way: released (the count
// taken back) when the transport has sent or dropped the reply.
struct ServeHold {
  at::Tensor copy;             // the served copy (zero copy), or
  std::vector<float> patched;  // a chunk with parts from previous versions
  std::shared_ptr<std::atomic<int64_t>> in_flight;
  ServeHold(at::Tensor t, std::vector<float> v, std::shared_ptr<std::atomic<int64_t>> n)
      : copy(std::move(t)), patched(std::move(v)), in_flight(std::move(n)) {
    ++*in_flight;
  }
  ~ServeHold() { --*in_flight; }
  ServeHold(const ServeHold&) = delete;
  ServeHold& operator=(const ServeHold&) = delete;
};
}  // namespace

// The chunk's bytes: a view of the served copy, or the current copy with the parts of fragments asked at their
// previous version from Copy::prev (and, in the fault drill, one flipped bit in the first element).
Bytes DonorServer::chunk_bytes(const std::shared_ptr<std::atomic<int64_t>>& count, const Holding& held) {
  Copy* C = held.C;
  const int64_t first = held.first, n = held.n;
  if (held.from_prev.empty() && !ctx_.serve_corrupt) {
    auto hold = std::make_shared<ServeHold>(C->served, std::vector<float>(), count);
    return Bytes(hold, reinterpret_cast<const char*>(C->served.data_ptr<float>() + first), static_cast<size_t>(n) * 4);
  }
  std::vector<float> chunk(C->served.data_ptr<float>() + first, C->served.data_ptr<float>() + first + n);
  for (size_t f : held.from_prev) {
    const float* old = C->prev[f].data_ptr<float>();
    for (const auto& [part, frag, cnt] : C->segments[f]) {
      const int64_t a = std::max(part, first), b = std::min(part + cnt, first + n);
      if (a < b) std::memcpy(chunk.data() + (a - first), old + frag + (a - part), static_cast<size_t>(b - a) * 4);
    }
  }
  if (ctx_.serve_corrupt) {  // the fault drill: one flipped bit in the first element
    uint32_t bits;
    std::memcpy(&bits, chunk.data(), 4);
    bits ^= 1;
    std::memcpy(chunk.data(), &bits, 4);
  }
  auto hold = std::make_shared<ServeHold>(at::Tensor(), std::move(chunk), count);
  return Bytes(hold, reinterpret_cast<const char*>(hold->patched.data()), static_cast<size_t>(n) * 4);
}

void DonorServer::report(rec::LearnerDone& d) const {
  d.served_chunks = served_chunks_.load();
  d.served_bytes = served_bytes_.load();
  nlohmann::json by = nlohmann::json::object();
  for (int r = 0; r < kRefusals; ++r) by[kRefusalNames[r]] = refused_by_[static_cast<size_t>(r)].load();
  d.serve_refused = std::move(by);
}

}  // namespace deloco
