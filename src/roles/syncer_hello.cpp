// The syncer's admission of a learner (src/roles/syncer_node_impl.h): a hello checked before anything is trusted
// (ids, keys, epochs, a fast restart's old connection), then the welcome with its download or its donors. A hello
// that waits for an old connection is retried by retry_waiting_hellos().
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "deloco/runtime.h"
#include "hello_admission.h"
#include "protocol.h"
#include "records/round_record.h"
#include "report/report.h"
#include "syncer_node_impl.h"
#include "util/fs.h"
#include "util/text.h"
#include "wire/quantize.h"

namespace deloco {
namespace fs = std::filesystem;

using proto::RejectReason;
using proto::unix_now;
using syncer_detail::Peer;

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
  HelloFacts facts;
  facts.header_learner = h.learner_id;
  facts.body_learner = hello.learner;
  facts.learners = M;
  facts.identity = env.identity;
  facts.paired = static_cast<bool>(dial_peer);
  facts.hello_epoch = hello.epoch;
  facts.epoch = epoch();
  if (auto it = route_to_id.find(env.peer); it != route_to_id.end()) facts.connection_learner = it->second;
  const HelloVerdict verdict = check_hello(facts);
  const int64_t m = hello.learner;
  if (verdict.kind == HelloVerdict::kRefuse) return reject(env.peer, verdict.learner, -1, verdict.reason, verdict.detail);
  if (verdict.kind == HelloVerdict::kNewerEpoch) return refuse_newer_epoch(env, m, hello.epoch);
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
  if (dial_peer) w.epoch = epoch();
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
  P.dl_busy_from = -1;
  P.dl_bytes = P.dl_seconds = 0;
  P.in_flight_bytes = 0;
  if (hello.want_state) {
    broadcasts_superseded += static_cast<int64_t>(P.queued());
    P.drop_queued();
  }
  // A new connection: the next broadcast of each fragment goes whole, unless the welcome leaves the learner holding
  // the snapshot's versions (a download, or the state it offered): the learner keeps those exact (seed_exact in
  // learner_fetch.cpp), so deltas against them apply. A download still in flight is fine: the learner applies a delta
  // only to the version it holds, and the download comes ahead of any broadcast on this connection.
  P.delta_held.assign(layouts.size(), -1);
  if (hello.want_state && snap && delta_on)
    for (size_t p = 0; p < layouts.size() && p < snap->versions.size(); ++p) P.delta_held[p] = snap->versions[p];
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
  P.finish_by = -1;  // back: the usual rules of silence apply
  P.heard(t);
  P.step = resume_step;
  if (cfg.sync.final_round && core->finished(m) && !retired[m] && resume_step < cfg.run.train.steps)
    core_finished(t, m, false, resume_step);  // it resumed from an earlier step: it pushes again
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

}  // namespace deloco
