// The learner's comms thread (learner_node_impl.h): its links to the syncers (one per shard, a standby
// beside each), hellos and welcomes handed to learner_fetch.cpp, heartbeats, pushes, broadcasts and deltas into the
// inbox, syncer beats, rejects, failover to the standby.
#include "learner_node_impl.h"

namespace deloco {

void LearnerNode::Impl::handle_alt(Link& L, const Envelope& env) {
  MessageHeader h;
  try {
    if (env.parts != 2 || env.header.size() != kWireHeaderBytes) throw WireError("frame layout");
    h = decode_header(env.header.data(), env.header.size(), limits);
    verify_payload(h, env.payload.data(), env.payload.size());
    if (h.fingerprint != fingerprint) return;
    int64_t announced = 0;
    if (h.kind == MessageKind::kHeartbeat && !env.payload.empty())
      announced = proto::parse_syncer_beat(env.payload.data(), env.payload.size()).leader_epoch;
    else if (h.kind == MessageKind::kWelcome)
      announced = proto::parse_welcome(env.payload.data(), env.payload.size()).epoch;
    int64_t known;
    {
      std::lock_guard<std::mutex> lock(mu);
      known = L.epoch;
    }
    if (announced <= known) return;
    fail_over(L, announced);
    if (h.kind == MessageKind::kWelcome) handle(L, env);  // it answers a hello: take it on the new link
  } catch (const WireError& e) {
    emit(L, bad_frame(std::string("from the standby syncer: ") + e.what()));
  }
}

void LearnerNode::Impl::fail_over(Link& L, int64_t new_epoch) {
  std::swap(L.tx, L.alt);
  Comms& c = L.c;
  int64_t step;
  {
    std::lock_guard<std::mutex> lock(mu);
    L.epoch = new_epoch;
    L.joined = false;  // join the new leader now: its welcome settles what was pushed to the old one
    L.window.new_leader();
    step = beat.step;
    cv.notify_all();
  }
  c.syncer.failed_over(now());  // the old leader hears a hello again in a second (it may come back as the standby)
  c.connections_seen = L.tx->stats().connections;  // the new leader's link: its count, not a reconnection
  rec::SyncerFailover r;
  r.step = step;
  r.epoch = new_epoch;
  emit(L, r);
}

void LearnerNode::Impl::comms_loop() {
  for (auto& L : links) L.c.syncer.start(now());
  // With several shards, each link's receive waits a share of the 10 ms a single link waits.
  const int64_t wait_ms = std::max<int64_t>(1, 10 / static_cast<int64_t>(links.size()));
  for (;;) {
    std::optional<Push> out;
    std::string reason;
    proto::Beat b;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (comms_stop) break;
      // The oldest push whose link has room in its window (not joined: it goes at once, and counts refused).
      for (auto it = outbox.begin(); it != outbox.end(); ++it) {
        const Link& L = link_of(it->fragment);
        if (L.joined && L.window.full()) continue;
        out = std::move(*it);
        outbox.erase(it);
        break;
      }
      // Goodbye only once every push before it went out, so the syncer merges them before retiring us.
      if (!out && outbox.empty()) reason = leave_reason;
      b = beat;
      b.unsent = static_cast<int64_t>(outbox.size()) + (out ? 1 : 0);  // the one taken goes after this beat's tend
    }
    for (auto& L : links) tend(L, b, reason);
    if (out) {
      Link& L = link_of(out->fragment);
      bool is_joined;
      {
        std::lock_guard<std::mutex> lock(mu);
        is_joined = L.joined;
      }
      send_push(L, *out, b, is_joined);
    }
    // A push to send: no wait. A fetch or serving under way: 1 ms (donors' answers and the rate bound; a spin
    // would take a core from training, the donors' included when they share a machine).
    bool active = donor && donor->busy();
    for (auto& L : links) {
      tend_fetch(L);
      active = active || L.c.fetch;
    }
    if (donor) donor->tend();
    const int64_t wait = out ? 0 : active ? 1 : wait_ms;
    for (auto& L : links) {
      Envelope env;
      if (L.tx->receive(&env, std::chrono::milliseconds(wait))) {
        handle(L, env);
        // A download's chunks come back to back: take what is there now, up to a window's worth.
        for (int n = 0; n < 8 && L.c.dl && L.tx->receive(&env, std::chrono::milliseconds(0)); ++n) handle(L, env);
      }
      if (L.alt && L.alt->receive(&env, std::chrono::milliseconds(0))) handle_alt(L, env);
    }
  }
}

void LearnerNode::Impl::tend(Link& L, proto::Beat b, const std::string& reason) {
  Comms& c = L.c;
  const double t = now();
  const TransportStats link_stats = L.tx->stats();  // one snapshot for this tend's checks
  if (const uint64_t refused = link_stats.auth_denied; c.syncer.auth_refused(refused)) {
    rec::AuthRefused r;
    r.refusals = static_cast<int64_t>(refused);
    r.step = b.step;
    r.detail = std::string("the syncer") + (sharded() ? " shard " + std::to_string(L.plan.shard) : "") +
               " refused this learner's CURVE key (its public key is not in that syncer's net.allow folder); "
               "retrying with backoff" +
               (sharded() ? "; the fragments it serves are not merged meanwhile" : "");
    emit(L, r);
  }
  // The transport reconnected: what either side still held on the old connection is gone (broadcasts queued for it,
  // our pushes in flight), and a laned client keeps its routing id, so the syncer does not notice. Say hello again:
  // the welcome settles our pushes it never read and starts the push window afresh, as after any rejoin.
  if (const uint64_t conns = link_stats.connections; conns != c.connections_seen) {
    const bool again = c.connections_seen > 0 && conns > c.connections_seen;
    c.connections_seen = conns;
    bool was_joined = false;
    if (again) {
      std::lock_guard<std::mutex> lock(mu);
      was_joined = L.joined;
      L.joined = false;
      cv.notify_all();
    }
    if (was_joined) {
      c.syncer.hello_now();
      rec::Reconnected r;
      r.step = b.step;
      r.connections = static_cast<int64_t>(conns);
      emit(L, r);
    }
  }
  bool is_joined, want_leave;
  {
    std::lock_guard<std::mutex> lock(mu);
    is_joined = L.joined;
    want_leave = !reason.empty() && !L.left;
    b.state_round = L.state_round;
  }
  b.broadcasts = c.rx_seq;
  // The final counters first, so the syncer's token and goodput totals are complete. The goodbye counts as
  // delivered (left) only once the syncer answers it: a close discards what the socket has not sent yet, so
  // it is repeated every heartbeat until answered (the syncer answers repeats too).
  if (want_leave && is_joined && c.syncer.leave_due(t)) {
    send(L, header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
    send(L, header(MessageKind::kLeave), Bytes::from_string(proto::encode_leave(reason)));
    c.syncer.leave_sent(t);
  }
  // Leaving while the syncer is away: keep saying hello (below) so the goodbye is delivered when it is back.
  if (!is_joined && c.syncer.hello_due(t)) say_hello(L, b, t);
  // The same hello as to the active link: if the other syncer leads (this learner started, or restarted, while its
  // active link pointed at the standby), its welcome — with the state download this learner needs — moves the link.
  if (L.alt && c.syncer.standby_hello_due(t)) {
    send_on(*L.alt, header(MessageKind::kHello), Bytes::from_string(proto::encode_hello(make_hello(L, b))));
    c.syncer.standby_hello_sent(t);
  }
  // A download in progress is the syncer talking (its chunks may each take seconds on a slow link): the join's
  // own bound, net.join_timeout, applies to it instead.
  if (is_joined && c.syncer.lost(t, c.dl.has_value())) {
    std::lock_guard<std::mutex> lock(mu);
    L.joined = false;
    is_joined = false;
    c.syncer.leave_again();  // a goodbye waiting for its answer goes again as soon as we are back
    // A download in progress is kept: its chunks may still be on the way, and the syncer sends no second copy
    // while one is outstanding on this connection. The next welcome that carries chunks replaces it.
    cv.notify_all();
    rec::SyncerLost r;
    r.step = b.step;
    r.silent_seconds = c.syncer.silent_for(t);
    emit(L, r);
  }
  // A download that stopped making progress (a chunk lost on the way; the syncer sends no second copy on its own and
  // its heartbeats keep the link alive): drop it and ask again (syncer_link.h).
  if (is_joined && c.dl && c.syncer.download_stalled(t)) {
    rec::DownloadStalled r;
    r.step = b.step;
    r.chunks = c.dl->chunks;
    r.chunks_held = c.dl_count;
    r.idle_seconds = c.syncer.download_idle(t);
    {
      std::lock_guard<std::mutex> lock(mu);
      L.joined = false;
      is_joined = false;
      c.dl.reset();
      end_fetch(c);
      c.syncer.hello_now();
    }
    emit(L, r);
  }
  if (is_joined && c.syncer.beat_due(t)) {
    send(L, header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
    c.syncer.beat_sent(t);
  }
}

proto::Hello LearnerNode::Impl::make_hello(Link& L, const proto::Beat& b) {
  proto::Hello h;
  h.learner = id;
  h.instance = instance;
  h.step = b.step;
  std::lock_guard<std::mutex> lock(mu);
  h.want_state = !L.have_state;
  if (h.want_state && L.initial.defined()) h.state_hash = L.initial_hash;
  h.epoch = L.epoch;
  if (donor) {
    h.serve = donor->endpoint();
    h.serve_key = donor->key();
    h.serve_secret = donor->secret();
  }
  return h;
}

void LearnerNode::Impl::say_hello(Link& L, const proto::Beat& b, double t) {
  const proto::Hello h = make_hello(L, b);
  L.c.syncer.hello_sent(t, send(L, header(MessageKind::kHello), Bytes::from_string(proto::encode_hello(h))));
}

void LearnerNode::Impl::send_push(Link& L, const Push& p, proto::Beat b, bool is_joined) {
  bool sent = false;
  if (is_joined) {
    b.step_time = p.step_time;
    b.step = p.step;  // the step the push was taken at (it may have waited in the outbox): the syncer credits it
    b.push_bytes = static_cast<int64_t>(p.payload.size());  // what crosses the link next: the syncer waits for it
    {
      std::lock_guard<std::mutex> lock(mu);
      b.state_round = L.state_round;
    }
    b.broadcasts = L.c.rx_seq;
    send(L, header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
    L.c.syncer.beat_sent(now());
    MessageHeader h = header(p.final ? MessageKind::kFinalState : MessageKind::kFragmentPush);
    h.encoding = p.encoding;
    h.fragment_id = static_cast<uint32_t>(p.fragment);
    h.round = static_cast<uint64_t>(p.base_version);
    h.c_steps = static_cast<uint64_t>(p.c_steps);
    h.c_tokens = static_cast<uint64_t>(p.c_tokens);
    h.element_count = static_cast<uint64_t>(p.elements);
    const size_t bytes = p.payload.size() + kWireHeaderBytes;
    sent = send(L, h, Bytes::from_string(p.payload));
    if (sent) {
      rec::Push r;
      r.fragment = p.fragment;
      r.step = p.step;
      r.bytes = static_cast<int64_t>(bytes);
      r.base_version = p.base_version;
      r.encoding = encoding_name(p.encoding);
      if (p.final) r.final = true;
      emit(L, r);
    }
  }
  if (!sent) {  // its progress stays in θ: the next push of the fragment carries it
    rec::PushUnsent u;
    u.fragment = p.fragment;
    u.step = p.step;
    u.reason = is_joined ? "send_failed" : "not_joined";
    emit(L, u);
  }
  std::lock_guard<std::mutex> lock(mu);
  (sent ? pushes : pushes_dropped) += 1;
  if (sent) {
    L.window.sent(p.fragment, p.base_version);
    if (p.final) L.window.settle(p.fragment);  // a final state gets no answer
  } else {  // not sent (not joined, or the transport refused it): no answer will come for it
    refused_pushes.insert(p.fragment);
    cv.notify_all();
  }
}

void LearnerNode::Impl::handle(Link& L, const Envelope& env) {
  MessageHeader h;
  try {
    if (env.parts != 2 || env.header.size() != kWireHeaderBytes) throw WireError("frame layout");
    h = decode_header(env.header.data(), env.header.size(), limits);
    verify_payload(h, env.payload.data(), env.payload.size());
  } catch (const WireError& e) {
    emit(L, bad_frame(e.what()));
    return;
  }
  if (h.fingerprint != fingerprint && h.kind != MessageKind::kReject) {  // a reject says why itself
    std::lock_guard<std::mutex> lock(mu);
    fatal_refused = true;
    fatal = "the syncer serves another model: fingerprint " + fingerprint_hex(h.fingerprint) + ", ours " +
            fingerprint_hex(fingerprint) + " (fingerprint_mismatch; check the model section of both configs)";
    cv.notify_all();
    return;
  }
  L.c.syncer.heard(now());
  try {
    switch (h.kind) {
      case MessageKind::kWelcome: return on_welcome(L, env);
      case MessageKind::kStateChunk: return on_state_chunk(L, h, env);
      case MessageKind::kFragmentBroadcast: return on_broadcast(L, h, env);
      case MessageKind::kFragmentDelta: return on_delta(L, h, env);
      case MessageKind::kHeartbeat: return on_syncer_beat(L, env);
      case MessageKind::kLeave: {  // the syncer handled our goodbye
        proto::parse_leave(env.payload.data(), env.payload.size());
        std::lock_guard<std::mutex> lock(mu);
        if (!leave_reason.empty()) {
          L.left = true;
          cv.notify_all();
        }
        return;
      }
      case MessageKind::kReject: return on_reject(L, h, env);
      default: throw WireError(std::string("unexpected ") + kind_name(h.kind) + " from the syncer");
    }
  } catch (const WireError& e) {
    emit(L, bad_frame(e.what()));
  }
}

int64_t LearnerNode::Impl::broadcast_fragment(const Link& L, const MessageHeader& h, const char* what) const {
  const int64_t p = h.fragment_id;
  if (p >= static_cast<int64_t>(layouts.size())) throw WireError(std::string(what) + " of an unknown fragment");
  if (L.plan.local[static_cast<size_t>(p)] < 0)
    throw WireError(std::string(what) + " of fragment " + std::to_string(p) + ", which shard " +
                    std::to_string(L.plan.shard) + " does not serve");
  if (static_cast<int64_t>(h.element_count) != layouts[static_cast<size_t>(p)].elements)
    throw WireError(std::string(what) + " has the wrong size");
  return p;
}

void LearnerNode::Impl::on_broadcast(Link& L, const MessageHeader& h, const Envelope& env) {
  const int64_t p = broadcast_fragment(L, h, "broadcast");
  const int64_t n = layouts[static_cast<size_t>(p)].elements;
  at::Tensor flat = torch::empty({n}, torch::kFloat);
  decode_floats_into(env.payload.data(), env.payload.size(), h.encoding, static_cast<size_t>(n), flat.data_ptr<float>());
  if (h.encoding == Encoding::kFp32) {
    if (donor) donor->broadcast(L.plan.shard, p, static_cast<int64_t>(h.round), flat);
    if (cfg.delta_broadcast()) L.exact[p] = {static_cast<int64_t>(h.round), flat};  // never written: shared
  } else {
    if (donor) donor->drop(L.plan.shard);  // lossy broadcasts: this learner's copy is not the syncer's state
  }
  accept_answer(L, h, p, flat);
}

void LearnerNode::Impl::on_delta(Link& L, const MessageHeader& h, const Envelope& env) {
  const int64_t p = broadcast_fragment(L, h, "delta");
  const int64_t n = layouts[static_cast<size_t>(p)].elements;
  const int64_t version = static_cast<int64_t>(h.round);
  at::Tensor d = torch::empty({n}, torch::kFloat);
  decode_floats_into(env.payload.data(), env.payload.size(), h.encoding, static_cast<size_t>(n), d.data_ptr<float>());
  auto it = L.exact.find(p);
  if (it != L.exact.end() && it->second.first >= version) return accept_answer(L, h, p, at::Tensor());  // had it
  if (it == L.exact.end() || it->second.first != version - 1) {
    ++deltas_unapplied;
    L.resend.insert(p);
    return accept_answer(L, h, p, at::Tensor());
  }
  at::Tensor flat = add_delta(it->second.second, d);
  it->second = {version, flat};
  ++deltas_applied;
  if (donor) donor->broadcast(L.plan.shard, p, version, flat);
  accept_answer(L, h, p, flat);
}

void LearnerNode::Impl::accept_answer(Link& L, const MessageHeader& h, int64_t p, const at::Tensor& flat) {
  std::unique_lock<std::mutex> lock(mu);
  if (flat.defined()) {
    auto it = inbox.find(p);
    if (it == inbox.end() || it->second.version < static_cast<int64_t>(h.round))
      inbox[p] = Answer{static_cast<int64_t>(h.round), flat, L.marks_answers ? static_cast<int64_t>(h.c_tokens) : -1};
    // An answer for p that holds our push of p settles it (the core clears it when it applies).
    L.window.answered(p, L.marks_answers ? static_cast<int64_t>(h.c_tokens) : -1);
    ++broadcasts;
    cv.notify_all();
  }
  // The acknowledgement, at once: the syncer's send window and its measured broadcast time count on it.
  L.c.rx_seq = std::max(L.c.rx_seq, static_cast<int64_t>(h.c_steps));
  proto::Beat b = beat;
  b.state_round = L.state_round;
  b.broadcasts = L.c.rx_seq;
  b.resend.assign(L.resend.begin(), L.resend.end());
  L.resend.clear();
  b.unsent = static_cast<int64_t>(outbox.size());
  lock.unlock();
  send(L, header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
  L.c.syncer.beat_sent(now());
}

void LearnerNode::Impl::on_syncer_beat(Link& L, const Envelope& env) {
  if (env.payload.empty()) return;  // an older syncer
  const proto::SyncerBeat sb = proto::parse_syncer_beat(env.payload.data(), env.payload.size());
  L.c.syncer.set_patience(sb.patience);  // the syncer caps it too; a peer's value is bounded there
  std::lock_guard<std::mutex> lock(mu);
  L.window.acknowledged(sb.pushes);
  if (sb.sync_every > 0) sync_every_told = sb.sync_every;  // dynamic local updates: applied at the next boundary
  if (sb.push_encoding > 0) L.push_encoding_told = sb.push_encoding;
  if (sb.period > 0) L.period_told = sb.period;
}

void LearnerNode::Impl::on_reject(Link& L, const MessageHeader& h, const Envelope& env) {
  const std::string why = clip_utf8(std::string_view(env.payload.data(), env.payload.size()), 500);
  const RejectReason code = reject_reason_of(h);
  std::lock_guard<std::mutex> lock(mu);
  const bool join = h.fragment_id == proto::kNoFragment &&
                    (code == RejectReason::kDuplicateId || code == RejectReason::kNotLeader || code == RejectReason::kNotJoined ||
                     code == RejectReason::kKeyIdMismatch || code == RejectReason::kUnboundKey ||
                     code == RejectReason::kUnknownLearner || code == RejectReason::kLearnerIdMismatch);
  ++(join ? joins_refused : rejected);
  rec::Rejected r;
  r.reason = why;
  r.code = reject_reason_name(code);
  emit(L, r);
  if (code == RejectReason::kNotJoined) {
    L.joined = false;
    cv.notify_all();
  }
  // A refused push of fragment p: its answer will not come (the main thread tells the core, take_received).
  if (h.fragment_id != proto::kNoFragment && h.fragment_id < core->fragments().size()) {
    refused_pushes.insert(static_cast<int64_t>(h.fragment_id));
    L.window.settle(static_cast<int64_t>(h.fragment_id));
    if (code == RejectReason::kDeltaTooLarge) drop_drifts.insert(static_cast<int64_t>(h.fragment_id));
    cv.notify_all();
  }
  if (reject_is_permanent(code) || (code == RejectReason::kDuplicateId && now() - L.c.syncer.started() > cfg.net.join_timeout)) {
    fatal_refused = true;
    fatal = "the syncer" + (sharded() ? " shard " + std::to_string(L.plan.shard) : std::string()) +
            " refused learner " + std::to_string(id) + ": " + why;
    cv.notify_all();
  }
}

std::vector<int64_t> LearnerNode::Impl::take_received() {
  std::vector<std::pair<size_t, State>> states;
  std::map<int64_t, Answer> answers;
  std::set<int64_t> refused, drops;
  int64_t told = 0;
  std::vector<std::pair<int64_t, int64_t>> codec_told(links.size());  // per link: push encoding, period (0: none)
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t s = 0; s < links.size(); ++s) codec_told[s] = {links[s].push_encoding_told, links[s].period_told};
    for (size_t s = 0; s < links.size(); ++s)
      if (links[s].state_ready) {
        states.emplace_back(s, std::move(*links[s].state_ready));
        links[s].state_ready.reset();
      }
    answers.swap(inbox);
    refused.swap(refused_pushes);
    drops.swap(drop_drifts);
    told = sync_every_told;
  }
  // The syncer's period for this learner (sync.dynamic_local_updates), bounded here: a peer's value cannot stop us.
  if (told > 0 && cfg.sync.dynamic_local_updates)
    core->set_sync_every(std::clamp<int64_t>(told, cfg.sync.overlap + 1, cfg.sync.sync_every));
  // net.encoding = auto: each shard's syncer fits the pushes of its fragments to this learner's link; its codec is
  // one of the learner's own ladder (a top-k one with this learner's net.topk_* options), the period bounded here.
  if (cfg.push_auto()) {
    int64_t period = 0;
    for (size_t s = 0; s < links.size(); ++s) {
      const auto [enc, per] = codec_told[s];
      period = std::max(period, per);
      if (enc <= 0) continue;
      for (const Codec& c : push_ladder)
        if (static_cast<int64_t>(c.encoding) == enc) {
          for (int64_t p : links[s].plan.fragments)
            if (core->push_codec(p).encoding != c.encoding) core->set_push_codec(p, c);
        }
    }
    if (period > 0) {
      const int64_t H = cfg.sync.sync_every;
      const int64_t h = std::clamp<int64_t>(period, H, LearnerCore::kMaxLinkStretch * H);
      if (core->link_period() != (h > H ? h : 0)) core->set_link_period(h > H ? h : 0);
    }
  }
  std::vector<int64_t> installed;
  for (auto& [s, st] : states) {
    const auto& fr = links[s].plan.fragments;
    if (!sharded())
      core->install(st.flat, st.welcome.versions);  // the whole model (also resets the step-time estimate)
    else
      core->install_fragments(fr, st.flat, st.welcome.versions);
    installed.insert(installed.end(), fr.begin(), fr.end());
  }
  for (int64_t p : refused) {
    if (!drops.count(p)) {
      core->refused(p);
      continue;
    }
    // A norm bound refused it: the same drift would be refused again (deloco/sync.h, refusal_drops_drift).
    core->drop_drift(p);
    installed.push_back(p);
    rec::DriftDropped r;
    r.fragment = p;
    r.step = work->step();
    r.version = core->version(p);
    r.detail = "the syncer refused this fragment's push by a norm bound; its local drift is replaced by the global "
               "version held (optimizer state kept)";
    emit(r);
  }
  for (auto& [p, a] : answers) core->receive(p, a.version, a.flat, a.covers);
  return installed;
}

}  // namespace deloco
