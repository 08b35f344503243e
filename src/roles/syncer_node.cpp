// The syncer process on the wall clock: the Syncer core of deloco/sync.h behind a ServerTransport.
//
// Read run() top to bottom: wait for one message (or the next timer) → handle it (hello / push / heartbeat / leave,
// each validated before anything is trusted) → housekeeping (peers gone silent, heartbeats, merge timers from the
// grace window, evaluation, status, checkpoints) → stop once every learner retired. A merge broadcasts the new Θ_p
// to every live learner with one shared payload (zero copy). Every rejection is counted by reason, logged as a
// "reject" record and answered with a reject frame so the learner knows. Whatever a message's handling throws is
// contained in handle() (handler_error): one peer's message cannot end the syncer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <mutex>
#include <set>
#include <sstream>

#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "deloco/runtime.h"
#include "protocol.h"
#include "records/round_record.h"
#include "report/report.h"
#include "syncer_node_impl.h"
#include "util/checkpoint_store.h"
#include "util/fs.h"
#include "util/text.h"
#include "wire/quantize.h"

namespace deloco {
namespace fs = std::filesystem;

using proto::RejectReason;
using proto::unix_now;
using syncer_detail::Peer;

namespace {
// The fp32 wire encoding is little-endian IEEE binary32: on such a host it is the floats' own bytes.
bool host_is_little_endian() {
  const uint32_t one = 1;
  unsigned char c;
  std::memcpy(&c, &one, 1);
  return c == 1;
}
}  // namespace

int64_t SyncerNode::Impl::log_turn(const std::string& key) {
  // At most 20 records per key and 10 s window (log_limited), so a flood of garbage cannot fill the disk; the
  // counters (summary, Prometheus) stay exact.
  auto& [window, logged] = reject_log[key];
  const double t = now();
  if (t - window > 10.0) window = t, logged = 0;
  return ++logged;
}

void SyncerNode::Impl::reject(const std::string& route, int64_t learner, int64_t fragment, RejectReason code,
                              const std::string& detail, const std::string& counter) {
  const std::string reason = counter.empty() ? proto::reject_reason_name(code) : counter;
  ++rejects[reason];
  if (in_hello) {
    ++joins_refused;
    ++joins_refused_by[reason];
  }
  const std::string text = clip_utf8(detail, 400);  // may quote the peer
  rec::Reject rj;
  rj.learner = learner;
  rj.fragment = fragment;
  rj.reason = reason;
  rj.detail = text;
  if (in_hello || (code == RejectReason::kNotJoined && fragment < 0)) rj.join = true;
  log_limited(reason, std::move(rj));
  if (route.empty()) return;
  MessageHeader h;
  h.kind = MessageKind::kReject;
  h.round = static_cast<uint64_t>(code);
  h.learner_id = learner >= 0 ? static_cast<uint32_t>(learner) : 0;
  h.fragment_id = fragment >= 0 ? static_cast<uint32_t>(fragment) : proto::kNoFragment;  // the learner stops waiting
  h.fingerprint = fingerprint;
  auto f = proto::make_frame(h, reason + ": " + text, limits);
  tx->send(route, f.header, f.payload);
}

// The answer to a leave: the learner closes its connection only once it holds this, so a goodbye still in its
// socket's queue is never discarded by the close (the syncer would wait for a learner that had left).
void SyncerNode::Impl::ack_leave(const std::string& route, const MessageHeader& leave, const std::string& reason) {
  MessageHeader h;
  h.kind = MessageKind::kLeave;
  h.learner_id = leave.learner_id;
  h.fingerprint = fingerprint;
  h.round = static_cast<uint64_t>(merges);
  // The answer's payload counts itself in goodbyes_unsent until the transport lets go of it (written to the
  // connection, or dropped with it): the end of the run waits for that, not for acknowledgements of broadcasts.
  struct Goodbye {
    std::string body;
    std::shared_ptr<std::atomic<int64_t>> unsent;
    Goodbye(std::string b, std::shared_ptr<std::atomic<int64_t>> n) : body(std::move(b)), unsent(std::move(n)) { ++*unsent; }
    ~Goodbye() { --*unsent; }
    Goodbye(const Goodbye&) = delete;
    Goodbye& operator=(const Goodbye&) = delete;
  };
  // Padded with JSON whitespace to proto::kByReferenceBytes: the ZeroMQ transport copies smaller payloads when it
  // queues them (so their release would say nothing) and sends larger ones by reference, releasing them once written.
  std::string text = proto::encode_leave(reason);
  if (text.size() < proto::kByReferenceBytes) text.resize(proto::kByReferenceBytes, ' ');
  auto g = std::make_shared<Goodbye>(std::move(text), goodbyes_unsent);
  const Bytes body(g, g->body.data(), g->body.size());
  g.reset();
  auto f = proto::make_frame(h, body, limits);
  tx->send(route, f.header, f.payload);
}

void SyncerNode::Impl::handler_error(const Envelope& env, const std::string& what) noexcept {
  try {
    auto it = route_to_id.find(env.peer);
    // The fragment of a push whose handling failed, so its sender stops waiting for the answer.
    int64_t fragment = -1;
    try {
      const MessageHeader h = decode_header(env.header.data(), env.header.size(), limits);
      if (h.kind == MessageKind::kFragmentPush) fragment = static_cast<int64_t>(h.fragment_id);
    } catch (const WireError&) {
    }
    reject(env.peer, it == route_to_id.end() ? -1 : it->second, fragment, RejectReason::kHandlerError,
           "the syncer failed handling this message and dropped it: " + what);
  } catch (...) {  // even the reject failed (out of memory?): the count is what is left
    try {
      ++rejects[proto::reject_reason_name(RejectReason::kHandlerError)];
    } catch (...) {
    }
  }
}

void SyncerNode::Impl::retire(int64_t m, const char* how) {
  if (retired[m]) return;
  // The core first: if it throws, the node still counts the learner as active, as the core does.
  core_retire(now(), m);
  retired[m] = true;
  peers[m].alive = false;
  peers[m].dl_sent = -1;
  peers[m].fetch_snap.reset();
  peers[m].pending.clear();  // what is in flight stays counted: the end of the run waits for it (run())
  rec::Retired rt;
  rt.learner = m;
  rt.how = how;
  emit(rt);
  for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) try_merge(p);
  if (cfg.syncer.checkpoint_every > 0) checkpoint();
}

void SyncerNode::Impl::handle(const Envelope& env) {
  try {
    dispatch(env);
  } catch (const std::exception& e) {
    handler_error(env, e.what());
  } catch (...) {
    handler_error(env, "an exception of unknown type");
  }
}

void SyncerNode::Impl::dispatch(const Envelope& env) {
  const double t = now();
  if (env.parts != 2) {
    reject(env.peer, -1, -1, RejectReason::kMalformedFrame, "message has " + std::to_string(env.parts) + " frames, not 2");
    return;
  }
  MessageHeader h;
  try {
    h = decode_header(env.header.data(), env.header.size(), limits);
    if (env.header.size() != kWireHeaderBytes)
      throw WireError("header frame has " + std::to_string(env.header.size()) + " bytes");
    verify_payload(h, env.payload.data(), env.payload.size());
  } catch (const WireError& e) {
    reject(env.peer, -1, -1, RejectReason::kMalformedFrame, e.what());
    return;
  }
  // Every reject names the fragment its message carried (a push's), so the learner settles that push: it stops
  // waiting for an answer that will not come (issue 29, defect 0).
  const int64_t carried = h.kind == MessageKind::kFragmentPush ? static_cast<int64_t>(h.fragment_id) : -1;
  if (h.fingerprint != fingerprint) {
    reject(env.peer, h.learner_id, carried, RejectReason::kFingerprintMismatch,
           "peer model " + fingerprint_hex(h.fingerprint) + " differs from the syncer's " + fingerprint_hex(fingerprint));
    return;
  }
  if (h.kind == MessageKind::kReplica) return on_replica_message(env, h);
  if (role == Role::kFollower) return refuse_not_leader(env, h);
  if (h.kind == MessageKind::kHello) return on_hello(env, h, t);
  auto it = route_to_id.find(env.peer);
  if (it == route_to_id.end() && h.kind == MessageKind::kLeave) {
    // A goodbye repeated after its answer was lost (the first one released the connection's id): nothing to do
    // but say so again. A leave moves nobody without a joined connection.
    try {
      ack_leave(env.peer, h, proto::parse_leave(env.payload.data(), env.payload.size()));
      last_leave_heard = t;
    } catch (const WireError& e) {
      reject(env.peer, h.learner_id, carried, RejectReason::kMalformedFrame, e.what());
    }
    return;
  }
  if (it == route_to_id.end()) {
    reject(env.peer, h.learner_id, carried, RejectReason::kNotJoined, "say hello first");
    // A heartbeat (not a push) from a connection that has not joined: typically one queued before a cut, arriving on
    // the learner's new connection ahead of its hello. The answer tells it to say hello: part of rejoining, counted
    // with the refused joins, not as a refused contribution.
    if (carried < 0) {
      ++joins_refused;
      ++joins_refused_by[proto::reject_reason_name(RejectReason::kNotJoined)];
    }
    return;
  }
  const int64_t m = it->second;
  if (static_cast<int64_t>(h.learner_id) != m) {
    reject(env.peer, h.learner_id, carried, RejectReason::kLearnerIdMismatch,
           "connection joined as learner " + std::to_string(m) + " but sent id " + std::to_string(h.learner_id));
    return;
  }
  Peer& P = peers[m];
  P.heard(t);
  P.bytes_up += static_cast<int64_t>(env.header.size() + env.payload.size());
  if (!P.alive && !retired[m]) {
    P.alive = true;
    core_connected(m, true);
    catch_up(m);  // what it missed while counted lost (a hello after this finds nothing more to send)
  }
  try {
    switch (h.kind) {
      case MessageKind::kFragmentPush: {
        // The learner sends a heartbeat right before each push, on the same connection: the time between the two
        // arriving is the push's time on the wire (upload), ξ_sync's first term.
        ++P.pushes_rx;
        if (P.last_beat >= 0 && t >= P.last_beat) {
          upload_time.add(t - P.last_beat, cfg.sync.ema);
          P.upload_time.add(t - P.last_beat, cfg.sync.ema);
          ++uploads_measured;
          // No broadcast measured on this link yet and no download to seed it (a fresh join that held the state):
          // the push's rate gives the first estimate, as a download's would.
          seed_broadcast_time(P, static_cast<double>(env.header.size() + env.payload.size()), t - P.last_beat);
        }
        P.last_beat = -1;
        send_beat(m);  // the receipt: the learner's push window opens as soon as the bytes are here
        on_push(env, h, m, t);
        // Dynamic local updates: the push's step time may change this learner's period; tell it now, not a heartbeat later.
        if (cfg.sync.dynamic_local_updates && core->local_updates(m) != P.sync_every_told) send_beat(m);
        return;
      }
      case MessageKind::kHeartbeat: {
        if (env.payload.empty()) return;
        auto b = proto::parse_beat(env.payload.data(), env.payload.size());
        P.last_beat = t;
        if (b.step > P.step) P.advanced_at = t;
        P.step = std::max(P.step, b.step);  // a just-restarted process beats step 0 before it resumes
        P.tokens = std::max(P.tokens, b.tokens);
        P.busy = b.busy_seconds;
        P.step_time = b.step_time;
        const bool download_done = P.dl_sent >= 0 && b.state_round >= P.dl_round;
        // The download's rate on this link gives the first estimate of a broadcast's time on it.
        if (download_done) seed_broadcast_time(P, static_cast<double>(model_layout.elements) * 4, t - P.dl_sent);
        if (download_done) {  // the download arrived and verified
          P.dl_sent = -1;
          P.fetch_snap.reset();
        }
        if (b.broadcasts >= 0) {
          P.acks = true;
          acknowledge(m, b.broadcasts, t);
        }
        for (int64_t g : b.resend) {  // deltas it could not apply: the whole fragment, from its latest version
          if (g >= static_cast<int64_t>(shard.local.size()) || shard.local[static_cast<size_t>(g)] < 0) continue;
          const int64_t p = shard.local[static_cast<size_t>(g)];
          ++delta_resends;
          P.delta_held[static_cast<size_t>(p)] = -1;
          if (latest[p].version > 0) {
            auto it = P.pending.find(p);
            if (it == P.pending.end() || it->second.version < latest[p].version) queue_broadcast(m, p, latest[p]);
          }
        }
        if (download_done || b.broadcasts >= 0 || !b.resend.empty()) pump(m);
        return;
      }
      case MessageKind::kStateRequest: return on_state_request(env, h, m);
      case MessageKind::kLeave: {
        const std::string why = proto::parse_leave(env.payload.data(), env.payload.size());
        last_leave_heard = t;
        P.alive = false;
        P.dl_sent = -1;
        P.fetch_snap.reset();
        // Nothing more is sent to a learner that left: broadcasts still queued here are dropped, so the answer below
        // waits only behind what the transport already holds (the send window: at most two broadcasts).
        broadcasts_superseded += static_cast<int64_t>(P.queued());
        reset_window(P);
        if (why == "done") {  // the connection keeps its id: a goodbye repeated on it (answer lost) is answered again
          retire(m, "leave");
        } else {
          route_to_id.erase(P.route);
          P.route.clear();
          core_connected(m, false);
          rec::Lost lost;
          lost.learner = m;
          lost.reason = "leave";
          emit(lost);
        }
        ack_leave(env.peer, h, why);
        return;
      }
      default:
        reject(env.peer, m, -1, RejectReason::kUnexpectedKind, std::string("a learner may not send ") + kind_name(h.kind));
        return;
    }
  } catch (const WireError& e) {
    reject(env.peer, m, -1, RejectReason::kMalformedFrame, e.what());
  }
}

// One state download per learner. A download is *outstanding* from the moment its welcome and every chunk were
// queued (a download that could not be queued whole does not count: the learner will ask again) until the first of
//   * the learner's heartbeat on that connection reports the welcome's round as verified (Beat::state_round);
//   * the learner leaves or retires, or falls silent for net.dead_after (counted lost: its queue dies with it);
//   * the learner id moves to another connection (a hello accepted there);
//   * net.join_timeout seconds pass (a learner that never reports, e.g. an older build).
// While one is outstanding, a hello asking for the state gets no new copy when it comes on the same connection, or
// on another one while the download's connection still talks (heard within 2 net.heartbeat): it is dropped (the
// welcome already on its way answers the same process) and counted as state_requests_dropped, its record
// rate-limited. Once the download's connection went quiet that long, another connection may take the id (a
// restarted process, a reconnect: the duplicate-id rule uses the same test) and gets a download of its own.
// Every download sends the chunks of one shared snapshot per set of fragment versions (state_snapshot()), so a
// burst of joins costs one encoding and no copies. Memory: the newest snapshot (one fp32 copy of Θ) stays cached;
// an older one lives only while chunks queued for a slow learner still point into it.
bool SyncerNode::Impl::download_outstanding(const Peer& P, double t) const {
  return P.dl_sent >= 0 && t - P.dl_sent < cfg.net.join_timeout;
}

std::shared_ptr<const syncer_detail::StateSnapshot> SyncerNode::Impl::state_snapshot() {
  std::vector<int64_t> versions = core->versions();
  if (snapshot && snapshot->versions == versions && snapshot->round == merges) return snapshot;
  auto flat = std::make_shared<std::vector<float>>(static_cast<size_t>(model_layout.elements));
  std::vector<at::Tensor> ts;
  for (const auto& [n, tensor] : core->global()) ts.push_back(tensor);
  flatten_into(ts, flat->data());
  auto snap = std::make_shared<syncer_detail::StateSnapshot>();
  snap->versions = std::move(versions);
  snap->round = merges;
  snap->hash = blake2b256(flat->data(), flat->size() * sizeof(float));
  snap->bytes = Bytes(flat, reinterpret_cast<const char*>(flat->data()), flat->size() * sizeof(float));
  snapshot = std::move(snap);
  ++state_snapshots;
  return snapshot;
}

const std::vector<Digest>& syncer_detail::StateSnapshot::hashes(int64_t chunk_elements) const {
  if (hashed_chunk_elements != chunk_elements) {
    const int64_t elements = static_cast<int64_t>(bytes.size() / 4);
    chunk_hashes.clear();
    for (int64_t first = 0; first < elements; first += chunk_elements)
      chunk_hashes.push_back(blake2b256(bytes.data() + first * 4, static_cast<size_t>(std::min(chunk_elements, elements - first)) * 4));
    hashed_chunk_elements = chunk_elements;
  }
  return chunk_hashes;
}

// A joining learner fetching its download (Welcome::fetch) asks for a chunk: queued, and answered (serve_chunks) from
// the snapshot its welcome described at no more than net.serve_rate, or refused (not_held) when that download is no
// longer outstanding (the learner then says hello again).
void SyncerNode::Impl::on_state_request(const Envelope& env, const MessageHeader& h, int64_t m) {
  ChunkServer::Request q;
  q.route = env.peer;
  q.h = h;
  q.learner = m;
  if (!chunk_queue.offer(std::move(q), now())) return;  // a learner asking far past its window: the rest it asks again
  serve_chunks();
}

void SyncerNode::Impl::serve_chunks() {
  const int64_t chunk_elements = std::max<int64_t>(1, cfg.net.chunk_bytes / 4);
  const auto resolve = [&](const ChunkServer::Request& q) {
    const Peer& P = peers[q.learner];
    if (!P.fetch_snap || P.route != q.route || static_cast<int64_t>(q.h.round) != P.fetch_snap->round)
      return ChunkServer::Resolution::refuse(RejectReason::kNotHeld, "not_held: no download of round " + std::to_string(q.h.round) +
                                                                        " is outstanding for this learner; say hello again");
    const int64_t elements = static_cast<int64_t>(P.fetch_snap->bytes.size() / 4);
    const int64_t c = static_cast<int64_t>(q.h.fragment_id), first = c * chunk_elements;
    if (first >= elements) {  // counted and recorded as every reject is; the chunk server sends the frame
      const std::string detail = "state request for chunk " + std::to_string(c) + " past the state's end";
      reject("", q.learner, -1, RejectReason::kMalformedFrame, detail);
      return ChunkServer::Resolution::refuse(RejectReason::kMalformedFrame,
                                             std::string(proto::reject_reason_name(RejectReason::kMalformedFrame)) + ": " +
                                                 clip_utf8(detail, 400));
    }
    const int64_t n = std::min(chunk_elements, elements - first);
    const std::shared_ptr<const syncer_detail::StateSnapshot> snap = P.fetch_snap;
    return ChunkServer::Resolution::serve(
        n, [snap, first, n] { return snap->bytes.slice(static_cast<size_t>(first) * 4, static_cast<size_t>(n) * 4); });
  };
  chunk_queue.pump(now(), resolve, [&](const ChunkServer::Request& q, ChunkServer::Outcome out, const ChunkServer::Resolution&) {
    if (out == ChunkServer::Outcome::kRefused) return;
    ++peers[q.learner].fetch_chunks_sent;
    ++fetch_chunks_sent;
  });
}

void SyncerNode::Impl::on_hello(const Envelope& env, const MessageHeader& h, double t) {
  in_hello = true;
  struct Leave {
    bool& flag;
    ~Leave() { flag = false; }
  } leave{in_hello};
  proto::Hello hello;
  try {
    hello = proto::parse_hello(env.payload.data(), env.payload.size());
  } catch (const WireError& e) {
    return reject(env.peer, h.learner_id, -1, RejectReason::kMalformedFrame, e.what());
  }
  // ---- checks: nothing changes until all pass ----
  const int64_t m = hello.learner;
  if (static_cast<int64_t>(h.learner_id) != m)
    return reject(env.peer, h.learner_id, -1, RejectReason::kLearnerIdMismatch,
                  "hello header says learner " + std::to_string(h.learner_id) + " but its body says learner " +
                      std::to_string(m));
  if (m >= M)
    return reject(env.peer, m, -1, RejectReason::kUnknownLearner,
                  "learner id " + std::to_string(m) + " is not in [0, " + std::to_string(M) + ")");
  // CURVE: the key's allow-list name says which learner it is; a name that is not learner-N speaks for nobody.
  // (Plaintext has no identities: env.identity is empty and anyone may claim any id.)
  if (!env.identity.empty()) {
    const std::optional<int64_t> bound = proto::learner_of_key_name(env.identity);
    if (!bound)
      return reject(env.peer, m, -1, RejectReason::kUnboundKey,
                    "key '" + env.identity + "' is in the allow-list but its name is not learner-N, so it may not "
                    "join as any learner (name its .pub file learner-" + std::to_string(m) + ".pub to bind it to learner " +
                    std::to_string(m) + ")");
    if (*bound != m)
      return reject(env.peer, m, -1, RejectReason::kKeyIdMismatch,
                    "key '" + env.identity + "' may only join as learner " + std::to_string(*bound) + ", not as learner " +
                        std::to_string(m));
  }
  // A learner that has joined a leader of a newer epoch: this syncer may have been replaced (cut off, or a restarted
  // old leader). A learner's word is only a hint (any learner key could send any number): the hello is refused and
  // recorded, and this syncer steps down only on the other syncer's own word, its lease or a follow request at the
  // newer epoch, which a leader no standby follows sends every lease (on_replica_message).
  if (dial_peer && hello.epoch > epoch) return refuse_newer_epoch(env, m, hello.epoch);
  if (auto it = route_to_id.find(env.peer); it != route_to_id.end() && it->second != m)
    return reject(env.peer, m, -1, RejectReason::kLearnerIdMismatch,
                  "this connection joined as learner " + std::to_string(it->second) +
                      "; a connection's learner id never changes");
  Peer& P = peers[m];
  const bool other_route = !P.route.empty() && P.route != env.peer;
  // Another process on another connection while this id's connection spoke within net.dead_after (or 2 heartbeats,
  // whichever is longer: the liveness the syncer itself judges learners by).
  const bool other_live = P.alive && other_route && P.instance != hello.instance &&
                          t - P.last_heard < std::max(2 * cfg.net.heartbeat, cfg.net.dead_after);
  if (other_live) {
    // A fast restart or a duplicate: the hello waits (retry_waiting_hellos). A dead process says nothing more, so its
    // connection goes quiet and the hello is taken once it has been for net.dead_after; one that still speaks after
    // this hello came, a heartbeat on, is another live process with this id (a live but loaded learner may be quiet
    // for 2 heartbeats; for net.dead_after it would count as gone anyway).
    if (P.waiting_since < 0 || (P.waiting_hello && P.waiting_hello->peer != env.peer)) {
      P.waiting_since = t;
      P.waiting_drained = -1;
    }
    // Spoke after the hello came: after the inbox was next found empty (a busy syncer's queue may still hold what the
    // old process sent before it died; handled after the hello, it once got a restarted learner refused).
    const bool old_spoke = P.waiting_drained >= 0 && P.last_spoke > P.waiting_drained;
    if (!old_spoke || t - P.waiting_since < cfg.net.heartbeat) {
      P.waiting_hello = env;
      P.waiting_tried = t;
      return;
    }
    P.waiting_hello.reset();
    P.waiting_since = -1;
    return reject(env.peer, m, -1, RejectReason::kDuplicateId,
                  "learner " + std::to_string(m) + " is held by a live connection (another process with this id?)");
  }
  if (P.waiting_hello && P.waiting_hello->peer == env.peer) P.waiting_hello.reset();
  P.waiting_since = -1;
  // Another connection gets a download of its own only once the one holding the id went quiet (or is gone).
  const bool quiet = !P.alive || t - P.last_heard >= 2 * cfg.net.heartbeat;
  if (hello.want_state && download_outstanding(P, t) && (!other_route || !quiet)) {
    ++state_requests_dropped;
    if (P.route == env.peer) P.heard(t);
    rec::StateRequestDropped d;
    d.learner = m;
    d.detail = "a state download to this connection is outstanding; no new copy";
    log_limited("state_request_dropped", std::move(d));
    return;
  }

  // ---- prepare what will be sent (may throw; no state changed yet) ----
  const int64_t resume_step = std::max(P.step, hello.step);
  proto::Welcome w;
  w.resume_step = resume_step;
  w.elements = model_layout.elements;
  std::shared_ptr<const syncer_detail::StateSnapshot> snap;
  // A learner that offers the hash of the parameters it holds (its seeded initialisation at a run's start) and holds
  // exactly this state gets no chunks: it installs what it has (a fresh run's joins cost no download).
  bool held = false;
  if (hello.want_state) {
    snap = state_snapshot();
    w.round = static_cast<uint64_t>(snap->round);
    w.versions = snap->versions;
    w.state_hash = snap->hash;
    held = hello.state_hash && digests_equal(*hello.state_hash, snap->hash);
    w.state_held = held;
    if (!held) {
      w.chunk_elements = std::max<int64_t>(1, cfg.net.chunk_bytes / 4);
      w.chunks = (w.elements + w.chunk_elements - 1) / w.chunk_elements;
      // Rejoin from peers: learners that hold the state and serve it share the download (their chunks are checked
      // against this syncer's hashes). Only with fp32 broadcasts: a donor's copy of Θ is what the broadcasts carried.
      // (The delta broadcast keeps it exact too: its Θ is what learners hold.)
      if (cfg.net.donors > 0 && (broadcast_enc == Encoding::kFp32 || delta_on) && w.chunks <= proto::kMaxFetchChunks) {
        ++donor_rotation;
        for (int64_t i = 0; i < M && static_cast<int64_t>(w.donors.size()) < cfg.net.donors; ++i) {
          const int64_t n = static_cast<int64_t>((donor_rotation + static_cast<uint64_t>(i)) % static_cast<uint64_t>(M));
          const Peer& D = peers[n];
          if (n == m || !D.alive || retired[n] || D.serve.empty() || D.dl_sent >= 0 || D.route.empty()) continue;
          w.donors.push_back(proto::Welcome::Donor{
              n, D.serve, D.serve_key,
              proto::fetch_ticket(D.serve_secret, m, shard.shard, snap->round, w.chunk_elements, w.elements)});
        }
        if (!w.donors.empty()) {
          w.fetch = true;
          w.chunk_hashes = snap->hashes(w.chunk_elements);
        }
      }
    }
  } else {
    w.round = static_cast<uint64_t>(merges);
    w.versions = core->versions();
  }
  // The pushes read on this connection since the previous hello, when it is the same process on the same
  // connection: the learner then knows which of its pushes arrived (the others it counts as refused).
  if (P.route == env.peer && P.instance == hello.instance) w.pushes = P.pushes_rx;
  w.marks_answers = true;
  if (dial_peer) w.epoch = epoch;
  std::vector<proto::Frame> frames;
  frames.reserve(static_cast<size_t>(w.chunks) + 1);
  MessageHeader wh;
  wh.kind = MessageKind::kWelcome;
  wh.learner_id = static_cast<uint32_t>(m);
  wh.fingerprint = fingerprint;
  wh.round = w.round;
  frames.push_back(proto::make_frame(wh, proto::encode_welcome(w), limits));
  const std::shared_ptr<const void> owner = w.chunks > 0 ? owner_of(snap->bytes) : nullptr;  // chunks point into the snapshot
  for (int64_t c = 0; c < (w.fetch ? 0 : w.chunks); ++c) {  // fetch: the learner asks for each chunk
    const int64_t first = c * w.chunk_elements, n = std::min(w.chunk_elements, w.elements - first);
    Bytes chunk(owner, snap->bytes.data() + first * 4, static_cast<size_t>(n) * 4);
    MessageHeader ch;
    ch.kind = MessageKind::kStateChunk;
    ch.encoding = Encoding::kFp32;
    ch.learner_id = static_cast<uint32_t>(m);
    ch.fragment_id = static_cast<uint32_t>(c);
    ch.fingerprint = fingerprint;
    ch.round = w.round;
    ch.element_count = static_cast<uint64_t>(n);
    frames.push_back(proto::make_frame(ch, chunk, limits));
  }

  // ---- send, then commit, then record: a send that throws leaves the state untouched (the learner says hello
  // again); one that fails (queue full) only means the download does not count as outstanding ----
  bool queued = true;
  for (const auto& f : frames) queued = tx->send(env.peer, f.header, f.payload) && queued;
  // The same process saying hello again on the connection that holds its id, while joined: not a new join.
  const bool repeat = !P.route.empty() && P.route == env.peer && P.instance == hello.instance && (P.alive || retired[m]);
  const bool restart = P.joins > 0 && P.instance != hello.instance;
  if (!P.route.empty() && P.route != env.peer) route_to_id.erase(P.route);
  if (P.instance != hello.instance) {
    P.busy_done += P.busy;
    P.busy = 0;
    answer_marks.forget(m);  // another process: its pushes start afresh (the same one keeps them across hellos)
  }
  if (other_route) P.dl_sent = -1;  // the id moves to this connection: a download on the old one no longer counts
  // A (re)join starts the connection's counts afresh: pushes read since this hello, broadcasts in flight (what the
  // old connection still held is its own). Broadcasts queued for it and not yet sent are dropped when the welcome
  // carries a download (it holds those versions or newer); without one, they go out after the welcome.
  P.pushes_rx = 0;
  P.last_beat = -1;
  P.in_flight.clear();
  P.in_flight_bytes = 0;
  if (hello.want_state) {
    broadcasts_superseded += static_cast<int64_t>(P.queued());
    P.drop_queued();
  }
  P.delta_held.assign(layouts.size(), -1);  // a new connection: the next broadcast of each fragment goes whole
  P.route = env.peer;
  P.identity = env.identity;
  P.instance = hello.instance;
  // Its offer to serve joining learners: under CURVE only with the key its connection authenticated with (a
  // learner cannot send others to a server that is not its own).
  P.serve.clear();
  P.serve_key.clear();
  if (!hello.serve.empty()) {
    const bool plain = env.identity.empty();
    const std::string* name = allow_list && !hello.serve_key.empty() ? allow_list->name_of(hello.serve_key) : nullptr;
    if (plain ? hello.serve_key.empty() : name && *name == env.identity) {
      P.serve = hello.serve;
      P.serve_key = hello.serve_key;
      P.serve_secret = hello.serve_secret;
    } else {
      ++serve_offers_refused;
    }
  }
  P.fetch_snap = w.fetch ? snap : nullptr;
  P.alive = !retired[m];
  P.heard(t);
  P.step = resume_step;
  if (!repeat) {
    ++P.joins;
    P.advanced_at = t;  // a (re)join starts its patience afresh
  }
  route_to_id[env.peer] = m;
  if (!retired[m]) core_connected(m, true);
  if (first_join < 0) first_join = t;

  if (hello.want_state) {
    core_joined(m);  // it will hold every fragment's version of the snapshot
    if (held) {
      ++states_held;
    } else {
      ++state_downloads;
      if (w.fetch) ++fetch_downloads;
    }
    if (queued && !held) {
      P.dl_sent = t;
      P.dl_round = snap->round;
    }
  }
  // Back from a loss without a download: it missed the broadcasts made meanwhile (a download carries them).
  if (hello.want_state) P.missed = false;
  else catch_up(m);
  pump(m);
  const int64_t state_bytes = hello.want_state && !held ? model_layout.elements * 4 : 0;
  // The same fields as a first join ("join") or, for a repeated hello, as "rejoin".
  const auto fill = [&](auto& j) {
    j.learner = m;
    j.instance = fingerprint_hex(hello.instance);
    j.restart = restart;
    j.step = P.step;
    j.state_bytes = state_bytes;
    j.identity = env.identity;
  };
  if (!repeat) {
    rec::Join j;
    fill(j);
    emit(std::move(j));
  } else {  // rate-limited: a flood of hellos cannot fill the disk
    rec::Rejoin j;
    fill(j);
    log_limited("rejoin", std::move(j));
  }
}

void SyncerNode::Impl::on_push(const Envelope& env, const MessageHeader& h, int64_t m, double t) {
  const int64_t g = h.fragment_id;  // global: the model's fragment id
  const int64_t P = static_cast<int64_t>(shard.local.size());
  if (g >= P || shard.local[static_cast<size_t>(g)] < 0)
    return reject(env.peer, m, g, RejectReason::kUnknownFragment,
                  g >= P ? "fragment " + std::to_string(g) + " of " + std::to_string(P)
                         : "fragment " + std::to_string(g) + " is served by shard " +
                               std::to_string(shard.owner[static_cast<size_t>(g)]) + ", not by this shard " +
                               std::to_string(shard.shard));
  const int64_t p = shard.local[static_cast<size_t>(g)];
  const proto::Layout& L = layouts[p];
  if (static_cast<int64_t>(h.element_count) != L.elements)
    return reject(env.peer, m, g, RejectReason::kWrongShape,
                  "fragment " + std::to_string(g) + " has " + std::to_string(L.elements) + " elements, push has " +
                      std::to_string(h.element_count));
  if (h.encoding == Encoding::kRaw) return reject(env.peer, m, g, RejectReason::kMalformedFrame, "push must carry floats");
  // One journal entry (replication.h): decoded into a contribution (held in its wire encoding until the merge, no
  // copy) and received by the core, here and on a standby alike.
  repl::Entry e;
  e.kind = repl::EntryKind::kReceive;
  e.t = t;
  e.learner = m;
  e.fragment = p;
  e.encoding = h.encoding;
  e.base = static_cast<int64_t>(h.round);
  e.c_steps = static_cast<int64_t>(h.c_steps);
  e.c_tokens = static_cast<int64_t>(h.c_tokens);
  e.step_time = peers[m].step_time;
  e.step = peers[m].step;  // the highest step it reported (its heartbeat right before this push included)
  e.payload = env.payload;
  SyncReject why = SyncReject::kNone;
  try {
    why = journal(std::move(e)).received;
  } catch (const NonFiniteError& x) {  // NaN/Inf values or block scales (wire/quantize.h)
    return reject(env.peer, m, g, RejectReason::kNonFinite, x.what());
  } catch (const WireError& x) {
    return reject(env.peer, m, g, RejectReason::kMalformedFrame, x.what());
  }
  if (why != SyncReject::kNone) {
    const RejectReason code = proto::reject_reason_from_core(why);
    if (code == RejectReason::kDeltaTooLarge) ++drift_resets;  // the learner drops its drift of g when told
    return reject(env.peer, m, g, code,
                  std::string("refused by the syncer core: ") + sync_reject_name(why) +
                      (code == RejectReason::kDeltaTooLarge ? " (drop your drift of this fragment)" : ""),
                  sync_reject_name(why));
  }
  answer_marks.accepted(m, p, static_cast<int64_t>(h.round));
  try_merge(p);
}

void SyncerNode::Impl::send_beat(int64_t m) {
  MessageHeader h;
  h.kind = MessageKind::kHeartbeat;
  h.learner_id = static_cast<uint32_t>(m);
  h.fingerprint = fingerprint;
  h.round = static_cast<uint64_t>(merges);
  proto::SyncerBeat b;
  b.pushes = peers[m].pushes_rx;
  b.patience = patience(peers[m].broadcast_time);
  if (cfg.sync.dynamic_local_updates) b.sync_every = peers[m].sync_every_told = core->local_updates(m);
  send_to(m, proto::make_frame(h, proto::encode_syncer_beat(b), limits));
}

void SyncerNode::Impl::attach_delta(int64_t p, const std::shared_ptr<const std::string>& delta,
                                    syncer_detail::Latest* b) const {
  b->has_delta = false;
  if (!delta_on || !delta) return;
  b->delta_header = b->header;
  b->delta_header.kind = MessageKind::kFragmentDelta;
  b->delta_header.encoding = broadcast_enc;
  b->delta = Bytes(delta, delta->data(), delta->size());
  b->has_delta = true;
  (void)p;
}

void SyncerNode::Impl::queue_broadcast(int64_t m, int64_t p, const syncer_detail::Latest& b) {
  const int64_t version = b.version;
  Peer& P = peers[m];
  auto [it, fresh] = P.pending.try_emplace(p);
  if (!fresh) {
    if (it->second.version >= version) return;
    if (!standby_route.empty() && it->second.journal > standby_acked && !P.awaiting_standby.count(p))
      P.awaiting_standby[p] = std::move(it->second);  // still waits for the standby: kept (awaiting_standby)
    else
      ++broadcasts_superseded;  // never sent: the learner gets the newer Θ_p instead
  }
  it->second.version = version;
  it->second.order = static_cast<uint64_t>(merges);
  it->second.journal = journal_seq;
  it->second.header = b.header;
  // The push of p from m this version answers (queued right after its merge, or the latest version by catch_up:
  // either way the marks as they stand now are this version's).
  it->second.header.c_tokens = static_cast<uint64_t>(answer_marks.mark(m, p));
  it->second.payload = b.payload;
  it->second.has_delta = b.has_delta;
  it->second.delta_header = b.delta_header;
  it->second.delta_header.c_tokens = it->second.header.c_tokens;
  it->second.delta = b.delta;
  pump(m);
}

void SyncerNode::Impl::catch_up(int64_t m) {
  Peer& P = peers[m];
  if (!P.missed || retired[m]) return;
  P.missed = false;
  for (size_t p = 0; p < latest.size(); ++p)
    if (latest[p].version > 0)
      queue_broadcast(m, static_cast<int64_t>(p), latest[p]);
}

void SyncerNode::Impl::pump(int64_t m) {
  Peer& P = peers[m];
  if (!P.alive || retired[m] || P.route.empty()) return;
  if (download_outstanding(P, now())) return;
  using Queue = std::map<int64_t, syncer_detail::Peer::Pending>;
  const auto acked = [&](const syncer_detail::Peer::Pending& e) {
    return standby_route.empty() || e.journal <= standby_acked;
  };
  while (P.queued() > 0) {
    // The oldest merge queued, whether kept back for the standby or not.
    Queue* from = nullptr;
    Queue::iterator next;
    for (Queue* q : {&P.pending, &P.awaiting_standby})
      for (auto it = q->begin(); it != q->end(); ++it)
        if (!from || it->second.order < next->second.order) next = it, from = q;
    if (from == &P.awaiting_standby) {
      const auto newer = P.pending.find(next->first);
      if (newer != P.pending.end() && acked(newer->second)) {  // the newer one may go now: the older is superseded
        P.awaiting_standby.erase(next);
        ++broadcasts_superseded;
        continue;
      }
    }
    // The delta broadcast: the fragment_delta when the learner holds the version it is based on, else the whole.
    const int64_t fp = next->first;
    int64_t& held = P.delta_held[static_cast<size_t>(fp)];
    const bool as_delta = next->second.has_delta && held == next->second.version - 1;
    const Bytes& body = as_delta ? next->second.delta : next->second.payload;
    const size_t bytes = body.size() + kWireHeaderBytes;
    if (P.acks && !P.in_flight.empty() && P.in_flight_bytes + bytes > send_window) return;
    // A standby follows: no learner sees a merge before the standby holds it (a takeover then loses none).
    if (!acked(next->second)) return;
    MessageHeader h = as_delta ? next->second.delta_header : next->second.header;
    h.learner_id = static_cast<uint32_t>(m);
    h.c_steps = ++P.seq;  // the delivery sequence number the learner acknowledges (Beat::broadcasts)
    const int64_t version = next->second.version;
    const proto::Frame f = proto::make_frame(h, body, limits);
    from->erase(next);
    if (!tx->send(P.route, f.header, f.payload)) {  // the transport's queue is full: dropped (counted there)
      held = -1;  // it may lack this version: the next one goes whole
      continue;
    }
    held = version;
    P.bytes_down += static_cast<int64_t>(bytes);
    if (as_delta) ++deltas_sent;
    ++broadcasts_sent;
    if (P.acks) {
      P.in_flight.push_back({P.seq, bytes, now()});
      P.in_flight_bytes += bytes;
    }
  }
}

void SyncerNode::Impl::acknowledge(int64_t m, int64_t seq, double t) {
  Peer& P = peers[m];
  while (!P.in_flight.empty() && P.in_flight.front().seq <= static_cast<uint64_t>(seq)) {
    broadcast_time.add(t - P.in_flight.front().sent, cfg.sync.ema);
    P.broadcast_time.add(t - P.in_flight.front().sent, cfg.sync.ema);
    ++broadcasts_measured;
    ++broadcasts_acked;
    P.in_flight_bytes -= P.in_flight.front().bytes;
    P.in_flight.pop_front();
  }
}

bool SyncerNode::Impl::encode_broadcast(int64_t p, int64_t version, const at::Tensor& flat, MessageHeader* h,
                                        Bytes* payload) {
  const proto::Layout& L = layouts[p];
  MessageHeader& bh = *h;
  bh = MessageHeader();
  bh.kind = MessageKind::kFragmentBroadcast;
  // The delta broadcast sends a whole fragment only to a learner without the previous version: exact, in fp32.
  const Encoding enc = delta_on ? Encoding::kFp32 : broadcast_enc;
  bh.encoding = enc;
  bh.fragment_id = static_cast<uint32_t>(global_id(p));
  bh.fingerprint = fingerprint;
  bh.round = static_cast<uint64_t>(version);
  bh.element_count = static_cast<uint64_t>(L.elements);
  try {
    if (enc == Encoding::kFp32 && host_is_little_endian()) {
      // fp32 on a little-endian host is Θ_p's own bytes: share the buffer (the core never writes it again).
      auto keep = std::make_shared<at::Tensor>(flat);
      *payload = Bytes(keep, static_cast<const char*>(keep->data_ptr()), static_cast<size_t>(keep->nbytes()));
    } else {
      *payload = Bytes::from_string(
          encode_floats(flat.data_ptr<float>(), static_cast<size_t>(flat.numel()), enc));
    }
  } catch (const WireError& e) {
    // Cannot happen for the finite Θ_p the core guarantees; if it did, it is the syncer's failure, not a pusher's
    // malformed frame: say so, and let the learners catch up with the next merge or a state download.
    rec::BroadcastFailed bf;
    bf.fragment = global_id(p);
    bf.version = version;
    bf.detail = e.what();
    emit(std::move(bf));
    return false;
  }
  return true;
}

void SyncerNode::Impl::try_merge(int64_t p) {
  const double t = now();
  const auto start = std::chrono::steady_clock::now();
  const RoundResult r = core_round(t, p);
  timers[p] = r.decision.kind == RoundDecision::kWaitUntil ? r.decision.until : -1;
  finish_round(p, t, start, r);
}

void SyncerNode::Impl::finish_round(int64_t p, double t, std::chrono::steady_clock::time_point start,
                                    const RoundResult& r) {
  const MergeOutcome& out = r.outcome;
  if (r.rolled_back()) {
    // Θ, momentum and version unchanged: nothing is checkpointed or broadcast, and each contributor is told why its
    // push was dropped. The core counted them; so does the node's reject().
    rec::MergeRolledBack rb;
    rb.fragment = global_id(p);
    rb.version = out.version;
    rb.learners = out.learners;
    rb.reason = sync_reject_name(out.rejected);
    rb.detail = out.detail;
    emit(std::move(rb));
    for (int64_t m : out.learners)
      reject(peers[m].alive ? peers[m].route : std::string(), m, global_id(p), RejectReason::kRefusedByCore,
             "the merge of this round was rolled back: " + out.detail, sync_reject_name(out.rejected));
    return;
  }
  if (!r.merged()) return;
  ++merges;
  last_merge_t = t;
  if (first_merge_pending) {  // the first merge of a standby that took over: the failover's end
    first_merge_pending = false;
    rec::FailoverMerge fm;
    fm.epoch = epoch;
    fm.fragment = global_id(p);
    fm.version = out.version;
    fm.seconds_after_takeover = t - took_over_at;
    emit(std::move(fm));
  }
  if (r.grace_wait > 1e-3) {
    ++grace_waits;
    grace_wait_total += r.grace_wait;
  }
  // Durable before anyone sees it: with checkpoint_every = 1 no merge a learner received can be lost.
  if (cfg.syncer.checkpoint_every > 0 && merges - merges_at_ckpt >= cfg.syncer.checkpoint_every) checkpoint();
  const auto merged_at = std::chrono::steady_clock::now();
  // Broadcast Θ_p: encode once, share the payload with every live learner.
  MessageHeader bh;
  Bytes payload;
  const bool encoded = encode_broadcast(p, out.version, r.flat, &bh, &payload);
  answer_marks.merged(p, out.learners);
  if (encoded) {
    latest[p] = syncer_detail::Latest();
    latest[p].version = out.version;
    latest[p].header = bh;
    latest[p].payload = payload;
    attach_delta(p, r.delta, &latest[p]);
  }
  for (int64_t m = 0; m < M && encoded; ++m) {
    if (!peers[m].alive || retired[m]) continue;
    queue_broadcast(m, p, latest[p]);
  }
  // ξ_sync = upload + merge + broadcast, the transfers as measured on the links (a push: its heartbeat to its
  // arrival; a broadcast: hand-off to acknowledgement; moving averages over every learner). Until one of each was
  // measured, the time to encode and hand this broadcast to the transport stands in for it.
  const double handoff_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - merged_at).count();
  const double upload_s = upload_time.seeded ? upload_time.value : handoff_s;
  const double broadcast_s = broadcast_time.seeded ? broadcast_time.value : handoff_s;
  core_observe(upload_s, std::chrono::duration<double>(merged_at - start).count(), broadcast_s);
  rec::Merge mr = rec::merge_record(r, global_id(p), total_tokens());
  mr.merges = merges;
  mr.upload_seconds = upload_s;
  mr.broadcast_seconds = broadcast_s;
  emit(std::move(mr));
}

void SyncerNode::Impl::evaluate(bool final) {
  if (!evaluator) return;  // a shard other than 0
  const double start = now();
  torch::NoGradGuard ng;
  auto& params = evaluator->parameters();
  std::map<std::string, at::Tensor> own;
  for (const auto& [n, t] : core->global()) own.emplace(n, t);
  // A sharded syncer: the other shards' fragments from their latest checkpoints (shard_dirs). Which versions the
  // evaluation saw is in the record.
  std::map<std::string, at::Tensor> others;
  nlohmann::json sources = nlohmann::json::array();
  if (shard.shards > 1) {
    for (int64_t k = 0; k < shard.shards; ++k) {
      if (k == shard.shard) {
        sources.push_back({{"shard", k}, {"merges", merges}});
        continue;
      }
      const std::string dir = k < static_cast<int64_t>(cfg.syncer.shard_dirs.size()) ? cfg.syncer.shard_dirs[k] : "";
      nlohmann::json src{{"shard", k}, {"merges", 0}};
      // A standby pair writes two folders (the standby's is DIR/standby): the newer checkpoint of the two, by merges.
      int64_t best = -1;
      for (const std::string& d : {dir, dir.empty() ? dir : (fs::path(dir) / "standby").string()}) {
        try {
          if (d.empty() || !has_committed_checkpoint(d)) continue;
          Checkpoint ck = read_checkpoint(d, /*with_optimizer=*/false);
          const int64_t step = ck.manifest.value("step", int64_t{0});
          if (ck.manifest.value("fingerprint", std::string()) != fingerprint_hex(fingerprint) || step <= best) continue;
          for (auto& [n, t] : ck.model.tensors) others[n] = t;
          best = step;
          src["merges"] = step;
        } catch (const std::exception& e) {  // being written, or damaged: the other folder, or version 0 this time
          src["error"] = clip_utf8(e.what(), 200);
        }
      }
      sources.push_back(src);
    }
  }
  for (auto& [n, p] : params) {
    if (auto it = own.find(n); it != own.end()) {
      p.copy_(it->second);
    } else if (auto jt = others.find(n); jt != others.end() && jt->second.sizes() == p.sizes()) {
      p.copy_(jt->second);
    } else if (auto kt = initial.find(n); kt != initial.end()) {
      p.copy_(kt->second);
    }
  }
  last_eval_result = evaluator->evaluate();
  have_eval = true;
  ++evals;
  last_eval = now();
  excuse_peers(last_eval - start);
  rec::Eval ev;
  ev.val_loss = last_eval_result.loss;
  ev.val_bpb = last_eval_result.bpb;
  ev.loss_unit = last_eval_result.loss_unit;
  ev.tokens = total_tokens();
  ev.merges = merges;
  if (shard.shards > 1) ev.shards = std::move(sources);
  if (final) {
    rec::FinalEval fe;
    static_cast<rec::Eval&>(fe) = std::move(ev);
    emit(std::move(fe));
  } else {
    emit(std::move(ev));
  }
}

bool SyncerNode::Impl::blocked_learners(double t) const {
  bool any = false;
  for (int64_t m = 0; m < M; ++m) {
    const syncer_detail::Peer& P = peers[m];
    // A learner still downloading the state (slow on a slow link) is not stuck.
    if (!P.alive || retired[m] || P.step >= cfg.run.train.steps || download_outstanding(P, t)) continue;
    any = true;
    const double patience = std::max(4 * cfg.net.dead_after, 20 * P.step_time);
    if (t - P.advanced_at <= patience) return false;
  }
  return any;
}

double SyncerNode::Impl::goodput() const {
  double busy = 0;
  for (const auto& p : peers) busy += p.busy + p.busy_done;
  return run_goodput(busy, M, elapsed());
}

void SyncerNode::Impl::retry_waiting_hellos(double t) {
  for (int64_t m = 0; m < M; ++m) {
    Peer& P = peers[m];
    if (!P.waiting_hello || t - P.waiting_tried < 0.05) continue;
    Envelope env = std::move(*P.waiting_hello);
    P.waiting_hello.reset();
    try {
      const MessageHeader h = decode_header(env.header.data(), env.header.size(), limits);
      on_hello(env, h, t);
    } catch (const std::exception& e) {
      handler_error(env, e.what());
    }
  }
}

void SyncerNode::Impl::housekeeping() {
  leader_housekeeping();
  // A leader holding after a pause (leader_tick) merges nothing, not even on a grace timer, and counts no learner
  // silent (their messages wait in the hold) until it knows it still leads.
  if (holding()) return;
  if (role == Role::kLeader) retry_waiting_hellos(now());
  if (!chunk_queue.empty()) serve_chunks();
  const double t = now();
  // Uptime: global training is stalled while a fragment waits below its quorum, no learner is connected, or every
  // connected learner stopped advancing (blocked_learners). The clock starts with the first learner's hello (a
  // syncer waiting for its cluster to boot is not down).
  const bool now_blocked = blocked_learners(t);
  if (now_blocked != blocked) {
    blocked = now_blocked;
    if (blocked) {
      ++blocked_spells;
      std::vector<int64_t> who;
      for (int64_t m = 0; m < M; ++m)
        if (peers[m].alive && !retired[m]) who.push_back(m);
      rec::LearnersBlocked lb;
      lb.learners = std::move(who);
      lb.detail = "no connected learner has advanced its step within max(4 net.dead_after, 20 step times) "
                  "although nothing waits at the syncer; counted as stalled";
      emit(std::move(lb));
    } else {
      emit(rec::LearnersAdvancing{});
    }
  }
  const bool stall = !all_retired() && (core->stalled() || alive_count() == 0 || blocked);
  // CURVE refusals happen inside the transport (no message reaches us): say so in the records, rate-limited.
  if (const uint64_t denied = tx->stats().auth_denied; denied > auth_denied_seen) {
    rec::AuthDenied ad;
    ad.total = static_cast<int64_t>(denied);
    ad.fresh = static_cast<int64_t>(denied - auth_denied_seen);
    ad.detail = "refused a CURVE handshake: the client's public key is not in net.allow (" + cfg.net.allow + ")";
    log_limited("auth_denied", std::move(ad));
    auth_denied_seen = denied;
  }
  if (stall && first_join >= 0) stalled += t - last_account;
  last_account = t;
  for (int64_t m = 0; m < M; ++m) {
    Peer& P = peers[m];
    // A push on a slow link is silence while it crosses: allow two (the learner's push window) at its measured time.
    if (P.alive && t - P.last_heard > cfg.net.dead_after + patience(P.upload_time)) {
      P.alive = false;
      P.dl_sent = -1;  // a silent connection's download is moot (see on_hello)
      P.fetch_snap.reset();
      reset_window(P);
      core_connected(m, false);
      rec::Lost lost;
      lost.learner = m;
      lost.reason = "silent";
      lost.silent_seconds = t - P.last_heard;
      emit(std::move(lost));
      // Its last heartbeat said it had finished: its goodbye was lost (e.g. sent while the syncer was down).
      if (P.step >= cfg.run.train.steps) retire(m, "finished_silently");
      for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) try_merge(p);
    }
    if (P.alive && t - P.last_beat_sent >= cfg.net.heartbeat) {
      MessageHeader h;
      h.kind = MessageKind::kHeartbeat;
      h.learner_id = static_cast<uint32_t>(m);
      h.fingerprint = fingerprint;
      h.round = static_cast<uint64_t>(merges);
      send_beat(m);
      P.last_beat_sent = t;
    }
  }
  for (int64_t p = 0; p < static_cast<int64_t>(timers.size()); ++p)
    if (timers[p] >= 0 && t >= timers[p]) try_merge(p);
  // A sharded syncer's shard 0 evaluates the global model (assembled, see evaluate()); the other shards do not.
  if (cfg.syncer.eval_interval > 0 && t - last_eval >= cfg.syncer.eval_interval && merges > 0 && shard.shard == 0)
    evaluate(/*final=*/false);
  if (t - last_status >= 1.0) {
    last_status = t;
    std::vector<int64_t> connected;
    for (int64_t m = 0; m < M; ++m)
      if (peers[m].alive) connected.push_back(m);
    const auto st = tx->stats();
    rec::Status sr;
    sr.alive = alive_count();
    sr.connected = std::move(connected);
    sr.stalled = stall;
    sr.blocked = blocked;
    sr.uptime = uptime();
    sr.goodput = goodput();
    sr.merges = merges;
    sr.rejected = contribution_rejects();
    sr.joins_refused = joins_refused;
    sr.bytes_in = static_cast<int64_t>(st.bytes_in);
    sr.bytes_out = static_cast<int64_t>(st.bytes_out);
    sr.tokens = total_tokens();
    emit(std::move(sr));
  }
  update_prometheus();
}

double SyncerNode::Impl::next_wakeup() const {
  double next = now() + (chunk_queue.empty() ? 0.05 : 0.002);
  for (double u : timers)
    if (u >= 0) next = std::min(next, u);
  return next;
}

SyncerNode::SyncerNode(const RuntimeConfig& cfg_in, std::unique_ptr<ServerTransport> transport,
                       std::shared_ptr<const Corpus> corpus, bool resume, RecordSink record)
    : SyncerNode(cfg_in, std::move(transport), gpt_workloads(cfg_in.run, std::move(corpus))(0, 1), resume,
                 std::move(record)) {}

SyncerNode::SyncerNode(const RuntimeConfig& cfg_in, std::unique_ptr<ServerTransport> transport,
                       std::unique_ptr<Workload> evaluator, bool resume, RecordSink record)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.cfg = cfg_in;
  I.cfg.resolve();
  I.cfg.validate();
  I.M = I.cfg.resolved_learners();
  I.cfg.sync.learners = I.M;
  I.cfg.sync.learners_auto_ok = false;
  I.record = std::move(record);
  I.evaluator = std::move(evaluator);
  I.fingerprint = parse_fingerprint_hex(I.evaluator->fingerprint());
  std::vector<std::pair<std::string, at::Tensor>> global;
  for (const auto& [n, t] : I.evaluator->parameters()) global.emplace_back(n, t.detach().to(torch::kCPU));
  const ModelPlan plan = plan_model(global, I.cfg.sync.fragments, I.cfg.sync.sync_every);
  I.shard = plan_shard(plan, I.cfg.syncer.shards, I.cfg.syncer.shard);
  // The core holds this shard's fragments only (all of them when unsharded), in the shard's layout order.
  std::map<std::string, at::Tensor> by_name(global.begin(), global.end());
  std::vector<std::pair<std::string, at::Tensor>> own;
  for (const auto& n : I.shard.model.names) own.emplace_back(n, by_name.at(n));
  I.core = std::make_unique<Syncer>(I.cfg.sync, I.shard.local_fragments, own, I.cfg.merge_plan(), I.cfg.outer);
  I.core->share_flat(true);  // the broadcast reads the new Θ_p in place (finish_round)
  I.delta_on = I.cfg.delta_broadcast();
  if (I.delta_on) I.core->set_delta_broadcast(I.cfg.answer_codec());
  for (int64_t m = 0; m < I.M; ++m)
    I.core->set_budget(m, learner_budget(*I.evaluator, m, I.M, I.cfg.run.train.steps, I.cfg.learner.ranks));
  // Shard 0 evaluates the whole model: the other shards' fragments start at version 0, the evaluator's own values.
  if (I.shard.shards > 1 && I.shard.shard == 0) {
    std::set<std::string> mine(I.shard.model.names.begin(), I.shard.model.names.end());
    for (const auto& [n, t] : global)
      if (!mine.count(n)) I.initial[n] = t.detach().clone();
  }
  I.layouts = I.shard.fragment_layouts;
  I.model_layout = I.shard.model;
  I.limits = proto::wire_limits(plan);
  I.replica_limits = I.limits;
  I.replica_limits.max_payload_bytes = static_cast<uint64_t>(plan.model.elements) * 4 * 4 + (uint64_t{1} << 20);
  I.replica_limits.max_elements = I.replica_limits.max_payload_bytes;
  I.lease = I.cfg.syncer.lease;
  I.broadcast_enc = I.cfg.answer_encoding();
  // Rejoin from peers: a learner's offer to serve names its server's key, checked against the allow-list name its
  // connection authenticated with.
  if (!I.cfg.net.plaintext && !I.cfg.net.allow.empty()) {
    try {
      I.allow_list = AllowList::load(I.cfg.net.allow);
    } catch (const std::exception&) {  // the transport reports an unreadable allow-list itself; no donors then
    }
  }
  for (const auto& L : I.layouts)
    I.send_window = std::max(I.send_window, 2 * (max_encoded_bytes(I.broadcast_enc, static_cast<uint64_t>(L.elements)) +
                                                 kWireHeaderBytes));
  I.peers.resize(static_cast<size_t>(I.M));
  for (auto& P : I.peers) P.delta_held.assign(I.layouts.size(), -1);
  I.retired.assign(static_cast<size_t>(I.M), false);
  I.timers.assign(I.layouts.size(), -1.0);
  I.latest.resize(I.layouts.size());
  for (int64_t m = 0; m < I.M; ++m) I.core->set_connected(m, false);
  if (I.cfg.syncer.out_dir.empty()) throw ConfigError("syncer.out_dir must name the syncer's run folder");
  if (resume) I.restore_from(I.cfg.syncer.out_dir);
  I.model_fingerprint = I.evaluator->fingerprint();
  // Only shard 0 evaluates: the other shards needed the replica for the model's names, shapes and fingerprint, and
  // free it now (4 bytes per parameter of the whole model).
  if (I.shard.shards > 1 && I.shard.shard != 0) I.evaluator.reset();
  I.tx = std::move(transport);
  ChunkServer::Options co;  // rejoin from peers: the syncer's share of fetched downloads
  co.rate_mbit = I.cfg.net.serve_rate;
  co.max_queue = 4096;
  co.fingerprint = I.fingerprint;
  co.limits = I.limits;
  I.chunk_queue = ChunkServer(co, [&I](const std::string& route, const proto::Frame& f) { return I.tx->send(route, f.header, f.payload); });
  if (!I.cfg.syncer.metrics.empty())
    I.metrics = std::make_unique<MetricsServer>(I.cfg.syncer.metrics, [this] { return prometheus(); });
  I.update_prometheus();
}

SyncerNode::~SyncerNode() = default;

void SyncerNode::serve_dashboard(std::string page_html) {
  Impl& I = *impl_;
  if (!I.metrics) return;
  // A shard's folder is RUN/shard-s: the run's records (every shard's, the learners') are one level up.
  const std::string dir = I.shard.shards > 1 ? std::filesystem::path(I.cfg.syncer.out_dir).parent_path().string()
                                             : I.cfg.syncer.out_dir;
  auto page = std::make_shared<const std::string>(std::move(page_html));
  I.metrics->add_get("/", [page](const std::string&) {
    return MetricsServer::Reply{200, "text/html; charset=utf-8", *page};
  });
  // One reader for every request, so each poll reads only what the records gained since the last. The metrics
  // server's workers may answer two requests at once: they take turns.
  struct Shared {
    explicit Shared(const std::string& d) : reader(d) {}
    std::mutex mu;
    ReportRunReader reader;
  };
  auto shared = std::make_shared<Shared>(dir);
  I.metrics->add_get("/api/data", [shared](const std::string&) {
    std::lock_guard<std::mutex> lock(shared->mu);
    ReportRun run;
    try {
      run = shared->reader.load();
    } catch (const IoError&) {  // no records yet; its message would name the folder's absolute path
      return MetricsServer::Reply{503, "text/plain", "the run folder holds no records yet\n"};
    }
    run.dir = ".";  // the data names paths relative to the run folder, never the absolute one
    return MetricsServer::Reply{200, "application/json",
                                report_data({run}, kLiveReportPoints).dump(-1, ' ', false,
                                                                           nlohmann::json::error_handler_t::replace)};
  });
}

int SyncerNode::metrics_port() const { return impl_->metrics ? impl_->metrics->port() : 0; }

std::string SyncerNode::metrics_warning() const {
  return impl_->metrics ? impl_->metrics->exposure_warning() : std::string();
}

void SyncerNode::pair(std::function<std::unique_ptr<ClientTransport>()> dial, bool follow, int slot) {
  Impl& I = *impl_;
  if (slot != 0 && slot != 1) throw ConfigError("a standby pair's slot is 0 (the primary) or 1 (the standby), not " + std::to_string(slot));
  I.dial_peer = std::move(dial);
  I.slot = slot;
  if (!follow) return;
  I.role = Impl::Role::kFollower;
  I.upstream = I.dial_peer();
  I.upstream_heard = I.now();  // a leader gets a full lease from this start to be heard
}

std::string SyncerNode::prometheus() const {
  std::lock_guard<std::mutex> lock(impl_->prom_mu);
  return impl_->prom_text;
}

nlohmann::json SyncerNode::run(const std::atomic<bool>& stop) {
  Impl& I = *impl_;
  const auto start = std::chrono::steady_clock::now();
  {
    rec::Started st;
    st.resumed = I.resumed;
    st.follows = I.role == Impl::Role::kFollower;
    st.merges = I.merges;
    st.endpoint = I.tx->endpoint();
    st.metrics_port = I.metrics ? I.metrics->port() : 0;
    st.learners = I.M;
    st.fingerprint = fingerprint_hex(I.fingerprint);
    st.versions = I.core->versions();
    st.shard = I.shard.shard;  // this syncer's shard
    st.shards = I.shard.shards;
    st.fragments = I.shard.fragments;
    st.metrics_warning = I.metrics ? I.metrics->exposure_warning() : std::string();
    I.emit(std::move(st));
  }
  // A standby follows until the leader's run ended (its drain applied) or it takes over.
  const auto done = [&] { return I.all_retired() && (I.role == Impl::Role::kLeader || I.drained); };
  while (!stop.load() && !done()) {
    if (I.role == Impl::Role::kFollower) {
      Envelope env;
      if (I.tx->receive(&env, std::chrono::milliseconds(2))) I.handle(env);  // learners: not_leader, routes kept
      if (I.upstream && I.upstream->receive(&env, std::chrono::milliseconds(5))) {
        do {
          try {
            I.on_upstream(env);
          } catch (const std::exception& e) {  // contained like a learner's message: the standby asks again
            ++I.rejects["replica_handler_error"];
            I.following = false;
          }
        } while (I.role == Impl::Role::kFollower && I.upstream && I.upstream->receive(&env, std::chrono::milliseconds(0)));
      }
      if (I.role == Impl::Role::kFollower) I.follower_housekeeping();
      continue;
    }
    const double wait = std::max(0.0, I.next_wakeup() - I.now());
    Envelope env;
    const bool got = I.tx->receive(&env, std::chrono::milliseconds(static_cast<int64_t>(wait * 1000) + 1));
    if (!got) I.inbox_empty(I.now());
    I.leader_tick();  // after the wait, before anything is handled: a pause during either shows here
    if (got) {
      bool replica = false;
      if (I.holding()) try {
          replica = env.parts == 2 && decode_header(env.header.data(), env.header.size(), I.limits).kind == MessageKind::kReplica;
        } catch (const WireError&) {
        }
      if (!I.holding() || replica) I.handle(env);
      else I.hold(std::move(env));
    }
    // Again before the housekeeping: a pause while a message was handled (a SIGSTOP in the middle of a merge) must
    // start the hold before the standby's silence is judged. Without it, the standby that took over meanwhile was
    // dropped as silent and the broadcasts held for its acknowledgement (the replaced leader's last merge) went out.
    I.leader_tick();
    I.housekeeping();
    I.flush_journal();  // after the checkpoints the handling wrote: durable first, then replicated, then visible
  }
  // Merge whatever still waits (the learners that finished cannot send again), then evaluate and checkpoint.
  if (I.all_retired()) {
    const double t = I.now();
    const auto start = std::chrono::steady_clock::now();
    repl::Entry e;
    e.kind = repl::EntryKind::kDrain;
    e.t = t;
    for (const RoundResult& r : I.journal(std::move(e)).rounds) {
      I.timers[r.outcome.fragment] = -1;
      I.finish_round(r.outcome.fragment, t, start, r);
    }
    // The drain goes to the standby now (its merges are checkpointed): the final evaluation below can take longer
    // than a lease, and a standby that heard nothing meanwhile took over from a leader that was only finishing.
    I.flush_journal();
  }
  if (I.shard.shard == 0) I.evaluate(/*final=*/true);
  I.checkpoint(/*final=*/I.all_retired());
  I.flush_journal();
  I.update_prometheus();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  nlohmann::json s = I.summary(wall);
  I.emit_json(rec::done_record(s, stop.load()));
  // The answers to the last goodbyes are queued behind the broadcasts the transport already held for those learners:
  // on a slow link they take longer than the transport's linger. Keep reading (a goodbye repeated is answered again)
  // until the transport has let go of every answer (written, or dropped with its connection), while some learner
  // still waits for one (it repeats its goodbye every net.heartbeat: none repeated for 3 heartbeats, none waits), and
  // for net.join_timeout (the learners' own patience for that answer) at most.
  if (I.all_retired()) {
    const double until = I.now() + I.cfg.net.join_timeout;
    const auto in_flight = [&] {
      return I.goodbyes_unsent->load() > 0 && I.now() - I.last_leave_heard < 3 * I.cfg.net.heartbeat;
    };
    while (!stop.load() && I.now() < until && in_flight()) {
      Envelope env;
      if (I.tx->receive(&env, std::chrono::milliseconds(50))) I.handle(env);
    }
  }
  return s;
}

}  // namespace deloco
