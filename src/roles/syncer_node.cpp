// The syncer process on the wall clock: the Syncer core of deloco/sync.h behind a ServerTransport.
//
// Read run() top to bottom: wait for one message (or the next timer) → handle it (hello / push / heartbeat / leave,
// each validated before anything is trusted) → housekeeping (peers gone silent, heartbeats, merge timers from the
// grace window, evaluation, status, checkpoints) → stop once every learner retired. A merge broadcasts the new Θ_p
// to every live learner with one shared payload (zero copy). Every rejection is counted by reason, logged as a
// "reject" record and answered with a reject frame so the learner knows. Whatever a message's handling throws is
// contained in handle() (handler_error): one peer's message cannot end the syncer.
// The Impl's parts live beside this file: syncer_hello.cpp (admission), syncer_broadcast.cpp (merges, broadcasts),
// syncer_timers.cpp (housekeeping, wake-ups, evaluation), syncer_standby.cpp (the pair), syncer_checkpoint.cpp,
// syncer_metrics.cpp.
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
  if (!in_hello && fragment >= 0) ++push_rejects[reason];  // a push (a contribution) refused, or its round rolled back
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
  if (pair.follows()) return refuse_not_leader(env, h);
  if (h.kind == MessageKind::kHello) return on_hello(env, h, t);
  auto it = route_to_id.find(env.peer);
  if (it == route_to_id.end() && h.kind == MessageKind::kLeave) {
    // A goodbye repeated after its answer was lost (the first one released the connection's id): nothing to do
    // but say so again. A leave moves nobody without a joined connection.
    try {
      ack_leave(env.peer, h, proto::parse_leave(env.payload.data(), env.payload.size()));
      last_leave_heard = last_goodbye_repeat = t;
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
        P.last_push_at = t;
        P.push_announced = 0;
        if (P.last_beat >= 0 && t >= P.last_beat) {
          upload_time.add(t - P.last_beat, cfg.sync.ema);
          P.upload_time.add(t - P.last_beat, cfg.sync.ema);
          ++uploads_measured;
          // No broadcast measured on this link yet and no download to seed it (a fresh join that held the state):
          // the push's rate gives the first estimate, as a download's would.
          seed_broadcast_time(P, static_cast<double>(env.header.size() + env.payload.size()), t - P.last_beat);
          if (fitter) fitter->observe_upload(m, static_cast<double>(env.header.size() + env.payload.size()), t - P.last_beat);
        }
        P.last_beat = -1;
        send_beat(m);  // the receipt: the learner's push window opens as soon as the bytes are here
        on_push(env, h, m, t);
        // Dynamic local updates: the push's step time may change this learner's period; tell it now, not a heartbeat later.
        if (cfg.sync.dynamic_local_updates && core->local_updates(m) != P.sync_every_told) send_beat(m);
        if (fitter) refit_codecs(m);
        return;
      }
      case MessageKind::kFinalState:
        ++P.pushes_rx;  // counted in the learner's push window like a push
        send_beat(m);   // the receipt: the window opens for its next final state
        if (!cfg.sync.final_round) {
          ++finals_refused;
          return reject(env.peer, m, static_cast<int64_t>(h.fragment_id), RejectReason::kUnexpectedKind,
                        "final_state, but this syncer runs without sync.final_round (set it on the syncer and every "
                        "learner alike)");
        }
        on_push(env, h, m, t, /*final=*/true);
        return;
      case MessageKind::kHeartbeat: {
        if (env.payload.empty()) return;
        auto b = proto::parse_beat(env.payload.data(), env.payload.size());
        P.last_beat = t;
        P.last_beat_step = b.step;
        P.push_announced = std::max<int64_t>(0, b.push_bytes);
        if (b.step > P.step) P.advanced_at = t;
        P.step = std::max(P.step, b.step);  // a just-restarted process beats step 0 before it resumes
        // Under the final round a learner's last step pushes nothing: once it beats that step with no push left
        // in its outbox (those follow this beat) no round waits for its push (its peers' answers would sit out a
        // grace window for a push that will not come).
        if (cfg.sync.final_round && !core->finished(m) && !retired[m] && cfg.run.train.steps > 0 &&
            b.step >= cfg.run.train.steps && b.unsent <= 0) {
          core_finished(t, m, true, b.step);
          for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) try_merge(p);
        }
        P.tokens = std::max(P.tokens, b.tokens);
        P.busy = b.busy_seconds;
        P.step_time = b.step_time;
        const bool download_done = P.dl_sent >= 0 && b.state_round >= P.dl_round;
        // The download's rate on this link gives the first estimate of a broadcast's time on it.
        if (download_done) seed_broadcast_time(P, static_cast<double>(model_layout.elements) * 4, t - P.dl_sent);
        if (download_done && fitter)
          fitter->observe_download(m, static_cast<double>(model_layout.elements) * 4, t - P.dl_sent);
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
        if (retired[m]) last_goodbye_repeat = t;  // answered before: that answer has not reached it (yet)
        P.alive = false;
        P.dl_sent = -1;
        P.fetch_snap.reset();
        // Nothing more is sent to a learner that left: broadcasts still queued here are dropped, so the answer below
        // waits only behind what the transport already holds (the send window: at most two broadcasts). While any
        // of those is unacknowledged the answer may sit behind it in the kernel's buffer: the end of the run waits
        // for such a link's measured broadcast time (patience) and a heartbeat, even before the learner repeats.
        if (!P.in_flight.empty())
          goodbye_linger_until = std::max(goodbye_linger_until, t + patience(P.broadcast_time) + cfg.net.heartbeat);
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

void SyncerNode::Impl::on_push(const Envelope& env, const MessageHeader& h, int64_t m, double t, bool final) {
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
  // The step the push was taken at: its heartbeat's (learner_link.cpp, send_push), which may lag the highest step
  // heard when the push waited in the learner's outbox. The core counts the learner's next push of the fragment
  // from it (Syncer::receive, counter_out_of_range): credited from the highest step instead, a learner that
  // rebases (its counters run from the push) was refused after its pushes waited on a slow link.
  e.step = std::min(peers[m].step, peers[m].last_beat_step);
  e.payload = env.payload;
  e.flag = final;
  const bool replaces = !final && core->holds(p, m);
  SyncReject why = SyncReject::kNone;
  try {
    why = journal(std::move(e)).received;
  } catch (const NonFiniteError& x) {  // NaN/Inf values or block scales (wire/quantize.h)
    finals_refused += final ? 1 : 0;
    return reject(env.peer, m, g, RejectReason::kNonFinite, x.what());
  } catch (const WireError& x) {
    finals_refused += final ? 1 : 0;
    return reject(env.peer, m, g, RejectReason::kMalformedFrame, x.what());
  }
  if (final) {
    if (why == SyncReject::kNone) {
      ++finals_received;
      return;
    }
    ++finals_refused;
  }
  if (why != SyncReject::kNone) {
    const RejectReason code = proto::reject_reason_from_core(why);
    if (code == RejectReason::kDeltaTooLarge) ++drift_resets;  // the learner drops its drift of g when told
    return reject(env.peer, m, g, code,
                  std::string("refused by the syncer core: ") + sync_reject_name(why) +
                      (code == RejectReason::kDeltaTooLarge ? " (drop your drift of this fragment)" : ""),
                  sync_reject_name(why));
  }
  if (replaces) {  // the learner's earlier push of this fragment waited for the quorum; this one took its place
    ++contributions_replaced;
    rec::ContributionUnmerged r;
    r.learner = m;
    r.fragment = g;
    r.reason = "replaced";
    emit(r);
  }
  answer_marks.accepted(m, p, static_cast<int64_t>(h.round));
  try_merge(p);
}

void SyncerNode::Impl::final_round() {
  repl::Entry e;
  e.kind = repl::EntryKind::kFinal;
  e.t = now();
  for (const RoundResult& r : journal(std::move(e)).rounds) {
    const int64_t g = shard.fragments[static_cast<size_t>(r.outcome.fragment)];  // global id, as in the other records
    if (r.merged()) {
      ++final_fragments;
      rec::FinalMerge f = rec::final_merge_record(r);
      f.fragment = g;
      emit(std::move(f));
      continue;
    }
    emit(rec::rolled_back_record(r, g));
  }
  // The final states exist nowhere else (the learners have retired): durable before the final evaluation, which can
  // take long. A syncer killed during it resumes from this checkpoint, not from one without them.
  if (final_fragments > 0 || group.due()) commit();
  flush_journal();
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
  // Two of the largest frames a broadcast can be: a delta broadcast sends a learner without the previous version the
  // whole fragment in fp32.
  for (const auto& L : I.layouts) {
    size_t largest = max_encoded_bytes(I.broadcast_enc, static_cast<uint64_t>(L.elements));
    if (I.delta_on) largest = std::max(largest, max_encoded_bytes(Encoding::kFp32, static_cast<uint64_t>(L.elements)));
    I.send_window = std::max(I.send_window, 2 * (largest + kWireHeaderBytes));
  }
  I.peers.resize(static_cast<size_t>(I.M));
  for (auto& P : I.peers) P.delta_held.assign(I.layouts.size(), -1);
  {
    std::vector<int64_t> elements;
    for (const auto& L : I.layouts) elements.push_back(L.elements);
    I.fitter = make_codec_fitter(I.cfg, elements, I.M);
    if (I.cfg.broadcast_auto()) {  // int4 first (answer_codec), as the fitter's broadcast() before any fit
      I.core->set_delta_codecs(broadcast_codecs(I.cfg));
      I.delta_choice = start_index(I.fitter->broadcast_ladder());
    }
  }
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
    } catch (const std::exception&) {  // a folder removed or unreadable (std::filesystem): same, no path shown
      return MetricsServer::Reply{503, "text/plain", "the run folder cannot be read\n"};
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
  I.pair.start_following();
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
    st.follows = I.pair.follows();
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
  const auto done = [&] { return I.all_retired() && (I.pair.leads() || I.drained); };
  while (!stop.load() && !done()) {
    if (I.pair.follows()) {
      Envelope env;
      if (I.tx->receive(&env, std::chrono::milliseconds(2))) I.handle(env);  // learners: not_leader, routes kept
      if (I.upstream && I.upstream->receive(&env, std::chrono::milliseconds(5))) {
        do {
          try {
            I.on_upstream(env);
          } catch (const std::exception& e) {  // contained like a learner's message: the standby asks again
            ++I.rejects["replica_handler_error"];
            I.pair.on(PairRole::Event::kReplicaBroken);
          }
        } while (I.pair.follows() && I.upstream && I.upstream->receive(&env, std::chrono::milliseconds(0)));
      }
      if (I.pair.follows()) I.follower_housekeeping();
      continue;
    }
    // A due commit (group commit, syncer_node_impl.h) waits for nothing: gathering ends when the inbox is empty.
    const double wait = std::max(0.0, I.next_wakeup() - I.now());
    Envelope env;
    const bool got = I.tx->receive(
        &env, std::chrono::milliseconds(I.group.due() ? 0 : static_cast<int64_t>(wait * 1000) + 1));
    if (!got) I.inbox_empty(I.now());
    I.leader_tick();  // after the wait, before anything is handled: a pause during either shows here
    if (got) {
      if (I.group.due() && !I.may_gather(env)) I.commit();  // only pushes and heartbeats before the merges are durable
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
    if (I.group.due() && (!got || I.group.gathered_enough(I.now()))) I.commit();
    I.flush_journal();  // after the checkpoints the handling wrote: durable first, then replicated, then visible
  }
  // Merge whatever still waits (the learners that finished cannot send again), then evaluate and checkpoint.
  if (I.all_retired()) {
    const double t = I.now();
    const auto start = std::chrono::steady_clock::now();
    repl::Entry e;
    e.kind = repl::EntryKind::kDrain;
    e.t = t;
    e.delta_encoding = I.next_delta_encoding();
    for (const RoundResult& r : I.journal(std::move(e)).rounds) {
      I.timers[r.outcome.fragment] = -1;
      I.finish_round(r.outcome.fragment, t, start, r);
    }
    // The drain goes to the standby now (its merges are checkpointed): the final evaluation below can take longer
    // than a lease, and a standby that heard nothing meanwhile took over from a leader that was only finishing.
    if (I.group.due()) I.commit();
    I.flush_journal();
  }
  if (I.all_retired() && I.cfg.sync.final_round) I.final_round();
  // What still waits for a quorum (the syncer stopped before every learner retired): accepted, never merged.
  for (int64_t p = 0; p < static_cast<int64_t>(I.shard.local_fragments.size()); ++p)
    for (int64_t m : I.core->waiting_learners(p)) {
      ++I.contributions_pending_at_end;
      rec::ContributionUnmerged r;
      r.learner = m;
      r.fragment = I.shard.fragments[static_cast<size_t>(p)];  // global id, as in the other records
      r.reason = "pending_at_end";
      I.emit(r);
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
  // for net.join_timeout (the learners' own patience for that answer) at most. "Let go" is not "arrived": the answer
  // may still sit in the kernel's send buffer behind broadcasts, and a process that exits with the learner's repeats
  // unread resets the connection, discarding it (the learner then waited net.join_timeout for nothing: 55 s of an
  // 80 s run on a 10 Mbit/s link). So a goodbye repeated after its answer keeps the syncer reading until the repeats
  // stop for 2 heartbeats (the answer arrived). A goodbye answered while broadcasts to its learner were unacknowledged
  // keeps it reading for that link's measured broadcast time too (goodbye_linger_until): the syncer may finish
  // before the learner's first repeat could arrive (1 run in 3 of the demo at 10 Mbit/s waited 60 s without it).
  if (I.all_retired()) {
    const double until = I.now() + I.cfg.net.join_timeout;
    const auto in_flight = [&] {
      const double t = I.now(), hb = I.cfg.net.heartbeat;
      return (I.goodbyes_unsent->load() > 0 && t - I.last_leave_heard < 3 * hb) || t - I.last_goodbye_repeat < 2 * hb ||
             t < I.goodbye_linger_until;
    };
    while (!stop.load() && I.now() < until && in_flight()) {
      Envelope env;
      if (I.tx->receive(&env, std::chrono::milliseconds(50))) I.handle(env);
    }
  }
  return s;
}

}  // namespace deloco
