// The syncer's standby pair (src/roles/syncer_node_impl.h; docs/reliability.md, "A standby syncer"): the journal
// every core change goes through, the leader's side (a standby follows: an image, then every entry; leases), the
// standby's side (apply, check, acknowledge; take over when the lease lapses) and fencing by epoch.
#include <algorithm>

#include <torch/torch.h>

#include "syncer_node_impl.h"
#include "util/text.h"

namespace deloco {

using proto::RejectReason;
using syncer_detail::Peer;

namespace {
// The CURVE allow-list name a standby syncer's key must have ("" in plaintext: no identities).
constexpr const char* kSyncerIdentity = "syncer";
}  // namespace

repl::Applied SyncerNode::Impl::journal(repl::Entry e) {
  return jrnl.record(*core, layouts, std::move(e), epoch(), pair.leads() && !standby_route.empty(), fingerprint,
                     replica_limits);
}

void SyncerNode::Impl::flush_journal() {
  if (group.due()) return;  // a merge reaches the standby after its checkpoint (the group commit's)
  const std::vector<proto::Frame> frames = jrnl.take_frames();
  if (!standby_route.empty())
    for (const proto::Frame& f : frames) tx->send(standby_route, f.header, f.payload);
}

void SyncerNode::Impl::on_replica_message(const Envelope& env, const MessageHeader& h) {
  if (!env.identity.empty() && env.identity != kSyncerIdentity)
    return reject(env.peer, -1, -1, RejectReason::kUnboundKey,
                  "key '" + env.identity + "' may not replicate this syncer (only the key named '" + kSyncerIdentity +
                      "' in net.allow may)");
  repl::Entry e;
  try {
    e = repl::decode(h, env.payload, M, static_cast<int64_t>(layouts.size()));
  } catch (const WireError& x) {
    return reject(env.peer, -1, -1, RejectReason::kMalformedFrame, x.what());
  }
  if (!dial_peer) return reject(env.peer, -1, -1, RejectReason::kOther, "this syncer has no standby pair (net.standby)");
  // A newer epoch from the other syncer: it leads now (its lease, sent while no standby follows it), or it follows
  // a newer leader. This one was replaced while it could not hear (paused, partitioned).
  if (e.epoch > epoch() && pair.leads())
    step_down(e.epoch, e.kind == repl::EntryKind::kLease
                           ? "the other syncer of the pair leads epoch " + std::to_string(e.epoch)
                           : "a standby that follows epoch " + std::to_string(e.epoch) + " asked to follow this syncer");
  if (pair.follows()) {
    // A leader no standby follows tells this syncer its epoch every lease: it is alive, so nobody takes over.
    if (e.kind == repl::EntryKind::kLease && e.epoch >= epoch()) {
      upstream_heard = now();
      peer_asks_first = -1;
    }
    if (e.kind == repl::EntryKind::kFollow) note_peer_asks(e);
    return;
  }
  if (e.kind != repl::EntryKind::kFollow && e.kind != repl::EntryKind::kAck) return;  // a leader's: nothing to do
  const double t = now();
  if (env.peer == standby_route) standby_heard = t;  // not the end of a hold: this ack may have waited in the queue
  if (e.kind == repl::EntryKind::kAck && env.peer != standby_route) {
    // A standby this leader dropped (it was silent past the lease: paused, say) still believes it follows. Unanswered
    // it would take over beside this live leader after a lease; a fresh image makes it a replica again instead.
    rec::Standby sb;
    sb.event = "dropped_standby_heard";
    sb.epoch = epoch();
    sb.journal = static_cast<int64_t>(jrnl.seq());
    sb.merges = merges;
    sb.detail = "a standby this leader no longer replicates to acknowledged entry " + std::to_string(e.seq) +
                ": it follows again from a new image";
    emit(std::move(sb));
  } else if (e.kind == repl::EntryKind::kAck) {
    if (e.seq > standby_acked) {
      standby_acked = e.seq;
      for (int64_t m = 0; m < M; ++m) pump(m);
    }
    return;
  }
  peer_link.reset();  // a standby follows: it hears this leader's epoch in every lease
  // A repeated request while the image sent to this standby may still be on its way (a large model on a slow link):
  // answered by that image. A standby that acknowledged it and asks again (it found a gap or a mismatch) gets a new one.
  if (env.peer == standby_route && standby_acked < image_seq && t - image_sent < 10 * lease) return;
  // kFollow: a resync point. Both cores resync from one image, which drops their rounds; the pushes that waited
  // in them are received again right after it (on both), so no learner waits for a push that is gone.
  std::vector<repl::Entry> waiting = jrnl.waiting_pushes(*core, static_cast<int64_t>(layouts.size()));
  jrnl.drop_frames();  // entries for a standby that was replaced: the image covers them
  standby_route = env.peer;
  standby_identity = env.identity;
  standby_acked = 0;
  standby_heard = t;
  lease_sent = -1e9;
  ++standby_follows;
  repl::Entry im;
  im.kind = repl::EntryKind::kImage;
  im.image = core->image();
  im.counters = counters();
  journal(std::move(im));
  image_seq = jrnl.seq();
  image_sent = t;
  for (repl::Entry& w : waiting) {  // (the image dropped what the journal held: these are held again)
    w.results.clear();
    journal(w);
  }
  resync_replayed += static_cast<int64_t>(waiting.size());
  for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) try_merge(p);  // re-arms the grace timers
  const int64_t dropped = 0;
  rec::Standby sb;
  sb.event = "following";
  sb.epoch = epoch();
  sb.journal = static_cast<int64_t>(jrnl.seq());
  sb.merges = merges;
  sb.dropped = dropped;
  sb.detail = "a standby follows from this image on; " + std::to_string(waiting.size()) +
              " waiting pushes received again after it";
  emit(std::move(sb));
}

proto::Frame SyncerNode::Impl::control_frame(repl::EntryKind kind) const {
  repl::Entry e;
  e.kind = kind;
  e.seq = jrnl.seq();
  e.epoch = epoch();
  if (kind == repl::EntryKind::kFollow) {  // this syncer's state, for a pair that has no leader
    e.merges = merges;
    e.slot = slot;
  }
  const repl::EncodedEntry enc = repl::encode(e, fingerprint);
  return proto::make_frame(enc.header, enc.payload, replica_limits);
}

void SyncerNode::Impl::note_peer_asks(const repl::Entry& e) {
  if (pair.following()) return;  // this syncer follows a leader: the other's request is stale or misdirected
  const double t = now();
  if (peer_asks_first < 0) peer_asks_first = t;
  peer_asks_last = t;
  peer_asks.epoch = e.epoch;
  peer_asks.merges = e.merges;
  peer_asks.slot = e.slot;
}

bool SyncerNode::Impl::leads_leaderless_pair(double t) const {
  if (pair.following() || peer_asks_first < 0 || peer_asks_last - peer_asks_first < lease || t - upstream_heard <= lease)
    return false;
  repl::PairState mine;
  mine.epoch = epoch();
  mine.merges = merges;
  mine.slot = slot;
  return repl::leads_leaderless(mine, peer_asks);
}

void SyncerNode::Impl::send_upstream(repl::EntryKind kind) {
  if (!upstream) return;
  const proto::Frame f = control_frame(kind);
  upstream->send(f.header, f.payload);
}

void SyncerNode::Impl::send_follow() {
  send_upstream(repl::EntryKind::kFollow);
  follow_sent = now();
}

void SyncerNode::Impl::on_upstream(const Envelope& env) {
  MessageHeader h;
  try {
    if (env.parts != 2 || env.header.size() != kWireHeaderBytes) throw WireError("frame layout");
    h = decode_header(env.header.data(), env.header.size(), replica_limits);
    verify_payload(h, env.payload.data(), env.payload.size());
    if (h.fingerprint != fingerprint)
      throw WireError("the leader serves another model: fingerprint " + fingerprint_hex(h.fingerprint));
  } catch (const WireError& x) {
    ++rejects["replica_malformed"];
    return;
  }
  if (h.kind == MessageKind::kReject) {  // the leader refused to be followed (our key, no pair configured)
    rec::Standby sb;
    sb.event = "refused";
    sb.detail = clip_utf8(std::string_view(env.payload.data(), env.payload.size()), 400);
    log_limited("standby_refused", std::move(sb));
    return;
  }
  if (h.kind != MessageKind::kReplica) return;
  repl::Entry e;
  try {
    e = repl::decode(h, env.payload, M, static_cast<int64_t>(layouts.size()));
  } catch (const WireError& x) {
    ++rejects["replica_malformed"];
    rec::Standby sb;
    sb.event = "malformed";
    sb.detail = clip_utf8(x.what(), 400);
    log_limited("standby_malformed", std::move(sb));
    pair.on(PairRole::Event::kReplicaBroken);  // what follows cannot be trusted to line up: ask for a fresh image
    send_follow();
    return;
  }
  if (e.epoch < epoch()) return;  // a leader older than the one this standby follows
  upstream_heard = now();
  peer_asks_first = -1;  // a leader exists
  pair.on(PairRole::Event::kNewerEpoch, e.epoch);  // its leader's epoch: never lower (checked above)
  const auto ack = [&] { send_upstream(repl::EntryKind::kAck); };
  if (e.kind == repl::EntryKind::kLease) return;
  if (e.kind == repl::EntryKind::kImage) {
    try {
      repl::apply(*core, e, layouts);
    } catch (const std::exception& x) {
      rec::Standby sb;
      sb.event = "image_refused";
      sb.detail = clip_utf8(x.what(), 400);
      emit(std::move(sb));
      return;
    }
    jrnl.follow(e, {});
    pair.on(PairRole::Event::kImage, e.epoch);  // follows from here
    ++images_applied;
    leader_counters = e.counters;
    merges = e.counters.value("merges", merges);
    if (e.counters.contains("retired") && e.counters["retired"].is_array() &&
        e.counters["retired"].size() == static_cast<size_t>(M))
      for (int64_t m = 0; m < M; ++m) retired[m] = e.counters["retired"][m].get<bool>();
    rebuild_latest();  // for learners that join after a takeover without a download
    rec::Standby sb;
    sb.event = "image";
    sb.epoch = epoch();
    sb.journal = static_cast<int64_t>(jrnl.seq());
    sb.merges = merges;
    sb.detail = "following the leader from this image";
    emit(std::move(sb));
    ack();
    return;
  }
  if (!pair.following()) return;  // entries before this standby's image
  if (e.kind == repl::EntryKind::kCounters) {
    leader_counters = e.counters;
    return;
  }
  if (e.seq != jrnl.seq() + 1) {
    rec::Standby sb;
    sb.event = "gap";
    sb.epoch = epoch();
    sb.journal = static_cast<int64_t>(jrnl.seq());
    sb.detail = "entry " + std::to_string(e.seq) + " after " + std::to_string(jrnl.seq()) + ": asking for a new image";
    emit(std::move(sb));
    pair.on(PairRole::Event::kReplicaBroken);
    send_follow();
    return;
  }
  repl::Applied a;
  try {
    a = repl::apply(*core, e, layouts);
  } catch (const std::exception& x) {
    rec::Standby sb;
    sb.event = "mismatch";
    sb.epoch = epoch();
    sb.journal = static_cast<int64_t>(jrnl.seq());
    sb.detail = clip_utf8(std::string("entry ") + repl::entry_kind_name(e.kind) + " failed here: " + x.what(), 400);
    emit(std::move(sb));
    ++replica_mismatches;
    pair.on(PairRole::Event::kReplicaBroken);
    send_follow();
    return;
  }
  jrnl.follow(e, a);
  // The node's own view of what the entry did (the leader's node did the same after applying it).
  switch (e.kind) {
    case repl::EntryKind::kReceive:
      if (a.received == SyncReject::kNone) answer_marks.accepted(e.learner, e.fragment, e.base);
      break;
    case repl::EntryKind::kRetire: retired[e.learner] = true; break;
    case repl::EntryKind::kDrain: drained = true; break;
    default: break;
  }
  std::string diff;
  for (size_t i = 0; i < a.rounds.size(); ++i) {
    const RoundResult& r = a.rounds[i];
    ++rounds_checked;
    if (i >= e.results.size()) {
      diff = "the leader reported " + std::to_string(e.results.size()) + " rounds, this standby ran more";
    } else if (diff.empty()) {
      diff = repl::compare(e.results[i], repl::check_of(r));
    }
    if (!r.merged()) continue;
    ++merges;
    answer_marks.merged(r.outcome.fragment, r.outcome.learners);
    MessageHeader bh;
    Bytes payload;
    if (encode_broadcast(r.outcome.fragment, r.outcome.version, r.flat, &bh, &payload)) {
      syncer_detail::Latest& b = latest[r.outcome.fragment];
      b = syncer_detail::Latest();
      b.version = r.outcome.version;
      b.header = bh;
      b.payload = payload;
      attach_delta(r.outcome.fragment, r.delta, &b);  // a takeover's first broadcasts may go as deltas
    }
  }
  if (diff.empty() && a.rounds.size() != e.results.size())
    diff = "the leader reported " + std::to_string(e.results.size()) + " rounds, this standby ran " +
           std::to_string(a.rounds.size());
  if (!diff.empty()) {
    ++replica_mismatches;
    rec::Standby sb;
    sb.event = "mismatch";
    sb.epoch = epoch();
    sb.journal = static_cast<int64_t>(jrnl.seq());
    sb.detail = clip_utf8(diff, 400);
    emit(std::move(sb));
    pair.on(PairRole::Event::kReplicaBroken);  // a replica that differs is no replica: start again from an image
    send_follow();
    return;
  }
  ack();
}

void SyncerNode::Impl::refuse_not_leader(const Envelope& env, const MessageHeader& h) {
  // The hello of a learner that dials both syncers of the pair: keep its route (checked as on_hello checks
  // identities) so a takeover can tell it at once. Not counted as a refusal: it is how a pair works.
  if (h.kind != MessageKind::kHello) return;
  int64_t m = -1;
  try {
    m = proto::parse_hello(env.payload.data(), env.payload.size()).learner;
  } catch (const WireError&) {
    return;
  }
  if (m < 0 || m >= M || static_cast<int64_t>(h.learner_id) != m) return;
  if (!env.identity.empty()) {
    const std::optional<int64_t> bound = proto::learner_of_key_name(env.identity);
    if (!bound || *bound != m) return;
  }
  standby_routes[m] = env.peer;
  send_not_leader(env.peer, m,
                  "not_leader: this syncer is the standby (epoch " + std::to_string(epoch()) +
                      "); it tells this learner when it takes over");
}

void SyncerNode::Impl::send_not_leader(const std::string& route, int64_t m, const std::string& text) {
  MessageHeader rh;
  rh.kind = MessageKind::kReject;
  rh.round = static_cast<uint64_t>(RejectReason::kNotLeader);
  rh.learner_id = static_cast<uint32_t>(m);
  rh.fragment_id = proto::kNoFragment;
  rh.fingerprint = fingerprint;
  const auto f = proto::make_frame(rh, text, limits);
  tx->send(route, f.header, f.payload);
}

void SyncerNode::Impl::refuse_newer_epoch(const Envelope& env, int64_t m, int64_t newer) {
  ++epoch_hints;
  rec::Standby sb;
  sb.event = "epoch_hint";
  sb.epoch = epoch();
  sb.journal = static_cast<int64_t>(jrnl.seq());
  sb.merges = merges;
  sb.detail = "learner " + std::to_string(m) + " says it joined a leader of epoch " + std::to_string(newer) +
              ", newer than this syncer's: its hello is refused; this syncer steps down only when the other syncer "
              "of the pair shows that epoch (its lease, or a follow request)";
  log_limited("standby_epoch_hint", std::move(sb));
  send_not_leader(env.peer, m,
                  "not_leader: this syncer leads epoch " + std::to_string(epoch()) + ", older than the one this learner joined");
}

double SyncerNode::Impl::pause_began(double t) {
  const double before = loop_tick;
  loop_tick = t;
  if (before < 0 || t - before <= lease / 2) return -1;
  ++pauses;
  rec::Standby sb;
  sb.event = "paused";
  sb.epoch = epoch();
  sb.journal = static_cast<int64_t>(jrnl.seq());
  sb.merges = merges;
  sb.detail = "this " + std::string(pair.leads() ? "leader" : "standby") + " did not come round its loop for " +
              std::to_string(t - before) + " s (a pause, or long work); the other syncer gets a full lease (" +
              std::to_string(lease) + " s) to be heard before this one acts on its silence";
  log_limited("standby_paused", std::move(sb));
  return before;
}

// The other syncer's silence over a pause of this process is this process's own: `heard` counts afresh from `t`, if
// it was heard within a lease before the pause. A peer already silent then gets no more: long work on every loop
// (a huge model's merge) never keeps a dead peer alive.
void SyncerNode::Impl::excuse_pause(double began, double t, double& heard) const {
  if (began >= 0 && heard >= began - lease) heard = std::max(heard, t);
}

void SyncerNode::Impl::tell_peer_epoch() {
  const double t = now();
  if (!dial_peer || t - epoch_told < lease) return;
  epoch_told = t;
  if (!peer_link) peer_link = dial_peer();
  const proto::Frame f = control_frame(repl::EntryKind::kLease);
  peer_link->send(f.header, f.payload);
}

void SyncerNode::Impl::follower_housekeeping() {
  const double t = now();
  const double paused = pause_began(t);
  if (paused >= 0) {
    // Tell the leader at once: one that dropped this standby meanwhile answers the acknowledgement with a new image.
    excuse_pause(paused, t, upstream_heard);
    lease_sent = -1e9;
  }
  // Before its first image a standby holds nothing to take over with, and a request sent before the leader listened
  // is lost (seen: the first image came 1.3-2 s after the start at the slower pace): it asks every quarter lease
  // then; the leader answers the first request and ignores repeats while its image is on the way. Afterwards a
  // lost image is asked for again at the slower pace.
  const double ask_every = images_applied == 0 ? lease / 4 : std::max(1.0, 2 * lease);
  if (!pair.following() && t - follow_sent >= ask_every) send_follow();
  if (pair.following() && t - lease_sent >= lease / 4) {  // the standby's own liveness for the leader
    send_upstream(repl::EntryKind::kAck);
    lease_sent = t;
  }
  if (pair.following() && t - upstream_heard > lease) {
    take_over(PairRole::Event::kLeaseLapsed, t - upstream_heard);
  } else if (leads_leaderless_pair(t)) {
    // Nobody leads: the other syncer has asked to follow this one for over a lease, and no leader was heard. This
    // one holds the newer state (or is the primary, on a tie), so it leads; the other follows it from an image.
    const int64_t tenths = static_cast<int64_t>((peer_asks_last - peer_asks_first) * 10 + 0.5);
    std::string why = "the pair had no leader: the other syncer (slot " + std::to_string(peer_asks.slot) +
                        ", epoch " + std::to_string(peer_asks.epoch) + ", " + std::to_string(peer_asks.merges) +
                        " merges) asked to follow this one for " + std::to_string(tenths / 10) + "." +
                        std::to_string(tenths % 10) + " s; this one (slot " + std::to_string(slot) + ", epoch " +
                        std::to_string(epoch()) + ", " + std::to_string(merges) + " merges" +
                        (images_applied == 0 ? ", no image held" : "") + ") holds the newer state";
    take_over(PairRole::Event::kElected, t - upstream_heard, peer_asks.epoch, std::move(why));
  }
  update_prometheus();
}

void SyncerNode::Impl::forget_learners() {
  core->drop_waiting();
  jrnl.forget_pushes();
  for (auto& tm : timers) tm = -1;
  route_to_id.clear();
  for (Peer& P : peers) {
    P.alive = false;
    P.route.clear();
    P.dl_sent = -1;
    reset_window(P);  // missed: a learner that comes back without a download gets every latest fragment
  }
}

void SyncerNode::Impl::take_over(PairRole::Event why, double silent, int64_t other_epoch, std::string detail) {
  const double t = now();
  const int64_t replayed = merges;
  const int64_t before = epoch();
  // The callers ask only from the state the table allows it from: from there only an exhausted epoch refuses.
  if (!pair.on(why, other_epoch) || !pair.leads()) {  // unreachable while every parse and load bounds epochs
    rec::Standby sb;
    sb.event = "epoch_exhausted";
    sb.epoch = epoch();
    sb.merges = merges;
    sb.detail = "cannot take over: the next epoch after " + std::to_string(std::max(before, other_epoch)) +
                " would pass 2^53 - 1, which learners refuse";
    log_limited("standby_epoch_exhausted", std::move(sb));
    return;
  }
  peer_asks_first = -1;
  ++takeovers;
  took_over_at = t;
  first_merge_pending = true;
  upstream.reset();
  // The leader's counters as last replicated (its learners' steps, tokens, busy time, refusals); the merges are this
  // replica's own count, exact. The silence before the takeover counts as stalled.
  if (leader_counters.is_object()) {
    try {
      load_counters(leader_counters, std::max(0.0, proto::unix_now() - leader_counters.value("unix_time", proto::unix_now())));
    } catch (const std::exception&) {  // a leader's counters that do not parse: keep this replica's own
    }
  }
  merges = replayed;  // (load_counters never lowers the epoch: the leader's is below this one's)
  merges_at_ckpt = -1;
  if (first_join < 0) first_join = t;
  // Pushes waiting at the old leader: their learners join afresh and count them refused (their progress goes in the
  // next push), so merging them here would count that progress twice.
  forget_learners();
  for (int64_t m = 0; m < M; ++m)
    if (!retired[m]) core_connected(m, false);
  // Every learner that said hello here hears it now, not after its own dead_after.
  int64_t told = 0;
  for (const auto& [m, route] : standby_routes) {
    proto::SyncerBeat b;
    b.leader_epoch = epoch();
    const auto f = beat_frame(m, b);
    told += tx->send(route, f.header, f.payload) ? 1 : 0;
  }
  rec::TakeOver to;
  to.epoch = epoch();
  to.merges = merges;
  to.journal = static_cast<int64_t>(jrnl.seq());
  to.rounds_checked = rounds_checked;
  to.mismatches = replica_mismatches;
  to.learners_told = told;
  to.silent_seconds = silent;
  to.detail = std::move(detail);
  {  // name order, as a checkpoint's safetensors lists them: anyone can recompute it from a checkpoint
    std::map<std::string, at::Tensor> by_name;
    for (const auto& [n, t] : core->global()) by_name.emplace(n, t);
    uint64_t h = kFnvOffset;
    for (const auto& [n, t] : by_name) {
      const at::Tensor c = t.detach().to(torch::kCPU).to(torch::kFloat).contiguous();
      h = fnv1a64(c.data_ptr<float>(), static_cast<size_t>(c.numel()) * sizeof(float), h);
    }
    to.model_hash = std::to_string(h);
  }
  emit(std::move(to));
  checkpoint();  // the new leader's state, durable before it merges
}

void SyncerNode::Impl::step_down(int64_t newer_epoch, const std::string& why) {
  if (!dial_peer || !pair.leads()) return;
  const int64_t was = epoch();
  if (!pair.on(PairRole::Event::kNewerEpoch, newer_epoch)) return;  // not newer: nothing to step down for
  rec::StepDown sd;
  sd.epoch = was;
  sd.newer_epoch = newer_epoch;
  sd.merges = merges;
  sd.detail = clip_utf8(why, 400);
  emit(std::move(sd));
  ++step_downs;
  standby_route.clear();
  jrnl.drop_frames();
  group.abandon();  // merges nobody saw and the disk lacks: the newer leader's learners join it afresh
  peer_link.reset();
  hold_until = -1;
  held_messages.clear();  // their learners join the leader of the newer epoch
  held_per_peer.clear();
  forget_learners();
  upstream = dial_peer();
  send_follow();
}

void SyncerNode::Impl::leader_tick() {
  if (!dial_peer) return;  // no pair: nobody can have taken over
  const double t = now();
  // A leader that did not run for a while may have been replaced meanwhile: it does not blame its standby for the
  // silence (dropping it would release the broadcasts held for its acknowledgement); the standby, or the newer
  // leader it became (whose epoch arrives right behind), gets a full lease to be heard. Until then it holds.
  const double began = pause_began(t);
  if (began < 0) return;
  excuse_pause(began, t, standby_heard);
  // Even with no standby following (dropped before the pause): one that still believed it followed may have taken
  // over meanwhile. Its epoch, sent every lease, arrives within the hold.
  hold_until = t + 2 * lease;  // the other syncer's epoch, if it leads now, comes every lease
}

void SyncerNode::Impl::hold(Envelope env) {
  int64_t& n = held_per_peer[env.peer];
  if (n >= syncer_receive_limit(cfg.sync.fragments)) {
    ++held_dropped;
    ++rejects["held_dropped"];
    rec::Standby sb;
    sb.event = "held_dropped";
    sb.epoch = epoch();
    sb.merges = merges;
    sb.detail = "a connection sent more than " + std::to_string(syncer_receive_limit(cfg.sync.fragments)) +
                " messages while this paused leader held them: the rest are dropped (" + std::to_string(held_dropped) +
                " so far)";
    log_limited("standby_held_dropped", std::move(sb));
    return;
  }
  ++n;
  held_messages.push_back(std::move(env));
}

void SyncerNode::Impl::release_held() {
  hold_until = -1;
  held_per_peer.clear();
  std::deque<Envelope> q;
  q.swap(held_messages);
  for (Envelope& env : q) {
    if (!pair.leads()) break;  // stepped down meanwhile: its learners join the new leader
    handle(env);
  }
}

void SyncerNode::Impl::leader_housekeeping() {
  const double t = now();
  if (holding() && t >= hold_until) release_held();
  if (standby_route.empty()) {
    tell_peer_epoch();
    return;
  }
  if (t - standby_heard > lease) {
    rec::Standby sb;
    sb.event = "dropped";
    sb.epoch = epoch();
    sb.journal = static_cast<int64_t>(jrnl.seq());
    sb.merges = merges;
    sb.detail = "the standby was silent for " + std::to_string(t - standby_heard) + " s (syncer.lease " +
                std::to_string(lease) + " s); merging goes on without it";
    emit(std::move(sb));
    standby_route.clear();
    jrnl.drop_frames();
    ++standby_dropped;
    for (int64_t m = 0; m < M; ++m) pump(m);  // broadcasts held for its acknowledgement go now
    return;
  }
  if (t - lease_sent >= lease / 4) {
    const proto::Frame f = control_frame(repl::EntryKind::kLease);
    tx->send(standby_route, f.header, f.payload);
    // The node's counters ride along once per lease: what the standby continues from if it takes over.
    repl::Entry c;
    c.kind = repl::EntryKind::kCounters;
    c.seq = jrnl.seq();
    c.epoch = epoch();
    c.counters = counters();
    const repl::EncodedEntry cenc = repl::encode(c, fingerprint);
    const proto::Frame cf = proto::make_frame(cenc.header, cenc.payload, replica_limits);
    tx->send(standby_route, cf.header, cf.payload);
    lease_sent = t;
  }
}

}  // namespace deloco
