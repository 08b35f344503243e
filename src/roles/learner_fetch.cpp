// The learner's join download (learner_node_impl.h): a welcome's state in verified chunks, from the syncer or
// from donors (rejoin from peers) with the endgame, a liar caught by the chunk hashes.
#include "learner_node_impl.h"

namespace deloco {

void LearnerNode::Impl::on_welcome(Link& L, const Envelope& env) {
  Comms& c = L.c;
  auto w = proto::parse_welcome(env.payload.data(), env.payload.size());
  {
    std::lock_guard<std::mutex> lock(mu);
    if (w.epoch > 0 && w.epoch < L.epoch) return;  // a leader that was replaced (fenced): its welcome is void
    L.epoch = std::max(L.epoch, w.epoch);
  }
  if (w.versions.size() != L.plan.fragments.size())
    throw WireError("welcome lists " + std::to_string(w.versions.size()) + " fragments, we have " +
                    std::to_string(L.plan.fragments.size()) + " for this syncer" +
                    std::string(sharded() ? " shard" : "") +
                    " (sync.fragments or syncer.shards differs between the configs)");
  std::lock_guard<std::mutex> lock(mu);
  // A syncer that went back in time (resumed from an older checkpoint) no longer has the versions we hold: our
  // pushes would be refused (future_base). Download its state instead.
  if (w.chunks == 0 && L.have_state) {
    for (size_t k = 0; k < w.versions.size(); ++k) {
      const int64_t p = L.plan.fragments[k];
      if (p < static_cast<int64_t>(held_versions.size()) && w.versions[k] < held_versions[static_cast<size_t>(p)]) {
        L.have_state = false;
        rec::SyncerBehind r;
        r.fragment = p;
        r.syncer_version = static_cast<int64_t>(w.versions[k]);
        r.held_version = held_versions[static_cast<size_t>(p)];
        emit(L, r);
        c.syncer.hello_now();  // hello again at once, asking for the state
        return;
      }
    }
  }
  // The syncer says how many of our pushes on this connection it read before this hello (w.pushes): those will be
  // answered. The others never arrived: they count as refused (their progress goes in the next push). Unknown
  // (another connection, an older syncer): every unanswered push counts as refused.
  const std::vector<int64_t> settled = L.window.welcomed(L.joined, w.pushes);
  if (!settled.empty()) {
    refused_pushes.insert(settled.begin(), settled.end());
    rec::PushesSettled r;
    r.fragments = settled;
    r.detail = w.pushes >= 0 ? "joined again: pushes sent before the join that the syncer never read count as "
                               "refused (their progress goes in the next push)"
                             : "joined again: pushes sent before the join count as refused (their progress goes "
                               "in the next push)";
    emit(L, r);
  }
  L.marks_answers = w.marks_answers;
  c.rx_seq = 0;
  c.syncer.welcomed();
  L.joined = true;
  L.ever_joined = true;
  // Every shard remembers the learner's step: the highest of the first welcomes (before training starts) wins.
  if (!welcomed_once || !resume_step || *resume_step < w.resume_step) resume_step = w.resume_step;
  welcomed_once = true;
  if (w.state_held) {
    // The syncer's state is what this process started from (the hashes matched): install that, download nothing.
    if (!L.initial.defined() || !digests_equal(w.state_hash, L.initial_hash) || w.elements != L.plan.model.elements)
      throw WireError("welcome says this learner holds the state already, but it offered no parameters with that hash");
    c.dl.reset();
    end_fetch(c);
    if (donor) donor->set_served(L.plan.shard, L.initial, w.versions);
    seed_exact(L, L.initial, w.versions);
    L.state_ready = State{w, L.initial};
    L.have_state = true;
    L.state_round = static_cast<int64_t>(w.round);
    L.initial = at::Tensor();  // one copy of the part, kept only until the first state
    rec::Joined r;
    r.step = beat.step;
    r.syncer_round = static_cast<int64_t>(w.round);
    r.resume_step = w.resume_step;
    r.hello_seconds = now() - c.syncer.hello_sent_at();
    r.download_bytes = 0;
    r.state_held = true;
    emit(L, r);
    c.first_join_recorded = true;
    cv.notify_all();
    return;
  }
  if (w.chunks > 0) {
    if (w.elements != L.plan.model.elements) throw WireError("welcome describes another model size");
    c.dl = w;
    c.syncer.download_progress(now());
    c.dl_flat = torch::empty({w.elements}, torch::kFloat);
    c.dl_have.assign(static_cast<size_t>(w.chunks), false);
    c.dl_count = 0;
    end_fetch(c);
    if (w.fetch) start_fetch(L, w);
  }
  if (!c.first_join_recorded || w.chunks == 0) {
    rec::Joined r;  // a download follows: "welcome" now, "joined" when it is verified
    r.step = beat.step;
    r.syncer_round = static_cast<int64_t>(w.round);
    r.resume_step = w.resume_step;
    r.hello_seconds = now() - c.syncer.hello_sent_at();
    if (w.chunks > 0) emit(L, rec::Welcome{r});
    else emit(L, r);
  }
  c.first_join_recorded = true;
  cv.notify_all();
}

void LearnerNode::Impl::on_state_chunk(Link& L, const MessageHeader& h, const Envelope& env) {
  Comms& c = L.c;
  if (!c.dl || h.round != c.dl->round) return;  // a chunk of an abandoned download
  const int64_t k = h.fragment_id;
  if (k >= c.dl->chunks) throw WireError("state chunk index out of range");
  if (c.fetch) {
    if (!chunk_matches(L, k, h, env)) {  // the syncer's own chunk is not what its welcome said: start again
      emit(L, bad_frame("state chunk " + std::to_string(k) + " from the syncer does not match its hash; joining again"));
      std::lock_guard<std::mutex> lock(mu);
      L.joined = false;
      c.dl.reset();
      end_fetch(c);
      return;
    }
    c.fetch->answered(0, k, now(), !c.dl_have[static_cast<size_t>(k)]);
  }
  accept_chunk(L, k, h, env);
}

bool LearnerNode::Impl::little_endian() {
  const uint32_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

bool LearnerNode::Impl::chunk_matches(const Link& L, int64_t k, const MessageHeader& h, const Envelope& env) const {
  const proto::Welcome& w = *L.c.dl;
  const int64_t first = k * w.chunk_elements, n = std::min(w.chunk_elements, w.elements - first);
  if (h.encoding != Encoding::kFp32 || static_cast<int64_t>(h.element_count) != n ||
      env.payload.size() != static_cast<size_t>(n) * 4 || !little_endian())
    return false;
  return digests_equal(blake2b256(env.payload.data(), env.payload.size()), w.chunk_hashes[static_cast<size_t>(k)]);
}

void LearnerNode::Impl::accept_chunk(Link& L, int64_t k, const MessageHeader& h, const Envelope& env) {
  Comms& c = L.c;
  const int64_t first = k * c.dl->chunk_elements, n = std::min(c.dl->chunk_elements, c.dl->elements - first);
  if (static_cast<int64_t>(h.element_count) != n) throw WireError("state chunk has the wrong size");
  decode_floats_into(env.payload.data(), env.payload.size(), h.encoding, static_cast<size_t>(n),
                     c.dl_flat.data_ptr<float>() + first);
  if (!c.dl_have[static_cast<size_t>(k)]) {
    c.dl_have[static_cast<size_t>(k)] = true;
    ++c.dl_count;
    c.syncer.download_progress(now());
  }
  if (c.dl_count < c.dl->chunks) return;
  const Digest hash = blake2b256(c.dl_flat.data_ptr<float>(), static_cast<size_t>(c.dl->elements) * 4);
  std::lock_guard<std::mutex> lock(mu);
  if (!digests_equal(hash, c.dl->state_hash)) {
    emit(L, bad_frame("global state hash mismatch; downloading again"));
    L.joined = false;  // hello again with want_state
  } else {
    if (donor) donor->set_served(L.plan.shard, c.dl_flat, c.dl->versions);
    seed_exact(L, c.dl_flat, c.dl->versions);
    L.state_ready = State{*c.dl, c.dl_flat};
    L.have_state = true;
    L.initial = at::Tensor();
    L.state_round = static_cast<int64_t>(c.dl->round);  // tells the syncer the download arrived
    rec::Joined r;
    r.step = beat.step;
    r.syncer_round = static_cast<int64_t>(c.dl->round);
    r.download_bytes = c.dl->elements * 4;
    r.download_seconds = now() - c.syncer.hello_sent_at();
    r.resume_step = c.dl->resume_step;
    if (c.fetch) {
      const StateFetch& f = *c.fetch;
      r.peer_bytes = f.peer_bytes();
      r.donors = static_cast<int64_t>(f.sources().size()) - 1;
      r.donors_lied = f.liars();
      r.welcome_seconds = f.started() - c.syncer.hello_sent_at();
      std::vector<int64_t> got;
      std::vector<double> first;
      int64_t refused = 0, timeouts = 0;
      for (const auto& s : f.sources()) {
        got.push_back(s.got);
        first.push_back(s.first_at < 0 ? -1.0 : s.first_at - f.started());
        refused += s.refused;
        timeouts += s.timeouts;
      }
      r.source_chunks = std::move(got);
      r.source_first_seconds = std::move(first);
      r.donor_refused = refused;
      r.donor_timeouts = timeouts;
      r.endgame_asks = f.endgame_asks();
    }
    emit(L, r);
    cv.notify_all();
  }
  c.dl.reset();
  end_fetch(c);
}

void LearnerNode::Impl::start_fetch(Link& L, const proto::Welcome& w) {
  Comms& c = L.c;
  c.fetch = std::make_unique<StateFetch>(w.chunks, now(), proto::kFetchWindow);
  c.donors.clear();
  c.donors.emplace_back();  // source 0: the syncer, on the link itself
  if (donor_options)
    for (const auto& d : w.donors) {
      if (d.learner == id) continue;
      TransportOptions o = *donor_options;
      o.server_public_key = d.key;
      if (!o.plaintext && d.key.empty()) continue;
      Comms::Donor donor_link;
      donor_link.ticket = d.ticket;
      try {
        donor_link.tx = make_zmq_client(d.endpoint, o);
      } catch (const std::exception& e) {
        emit(L, bad_frame("cannot dial donor learner " + std::to_string(d.learner) + " at " + d.endpoint + ": " + e.what()));
        continue;
      }
      c.fetch->add_donor(d.learner);
      c.donors.push_back(std::move(donor_link));
    }
}

void LearnerNode::Impl::end_fetch(Comms& c) {
  c.fetch.reset();
  c.donors.clear();
}

bool LearnerNode::Impl::request_chunk(Link& L, size_t i, int64_t k) {
  Comms& c = L.c;
  ClientTransport* tx = c.donors[i].tx.get();
  MessageHeader h = header(MessageKind::kStateRequest);
  h.fragment_id = static_cast<uint32_t>(k);
  h.round = c.dl->round;
  proto::StateRequest r;
  r.shard = L.plan.shard;
  r.elements = c.dl->elements;
  r.chunk_elements = c.dl->chunk_elements;
  r.versions = c.dl->versions;
  if (tx) {  // a donor serves only with the ticket the welcome gave for it
    r.learner = id;
    r.ticket = c.donors[i].ticket;
  }
  Bytes body = Bytes::from_string(proto::encode_state_request(r));
  return tx ? send_on(*tx, h, std::move(body)) : send(L, h, std::move(body));
}

void LearnerNode::Impl::tend_fetch(Link& L) {
  Comms& c = L.c;
  if (!c.fetch || !c.dl) return;
  for (size_t i = 1; c.fetch && i < c.donors.size(); ++i) {
    Envelope env;
    for (int n = 0; n < 16 && c.fetch && c.donors[i].tx->receive(&env, std::chrono::milliseconds(0)); ++n)
      on_donor_message(L, i, env);
  }
  if (!c.fetch || !c.dl) return;
  c.fetch->schedule(now(), c.dl_have, [&](size_t i, int64_t k) { return request_chunk(L, i, k); });
}

void LearnerNode::Impl::on_donor_message(Link& L, size_t i, const Envelope& env) {
  Comms& c = L.c;
  StateFetch& f = *c.fetch;
  MessageHeader h;
  try {
    if (env.parts != 2 || env.header.size() != kWireHeaderBytes) throw WireError("frame layout");
    h = decode_header(env.header.data(), env.header.size(), limits);
    verify_payload(h, env.payload.data(), env.payload.size());
    if (h.fingerprint != fingerprint) throw WireError("another model's fingerprint");
  } catch (const WireError& e) {
    return caught_lying(L, i, -1, std::string("a malformed answer: ") + e.what());
  }
  const int64_t k = h.fragment_id;
  // An answer to an abandoned request (a reject's round is its code, so only the chunk names it).
  if ((h.kind != MessageKind::kReject && h.round != c.dl->round) || !f.outstanding(i, k)) return;
  if (h.kind == MessageKind::kReject)  // it holds other versions now, or is busy: the syncer serves the chunk
    return f.refused(i, k, proto::reject_reason_of(h) == RejectReason::kBusy);
  if (h.kind != MessageKind::kStateChunk) return caught_lying(L, i, k, std::string("answered with ") + kind_name(h.kind));
  if (!chunk_matches(L, k, h, env))
    return caught_lying(L, i, k, "chunk " + std::to_string(k) + " does not match the syncer's hash of it");
  f.answered(i, k, now(), true);
  f.add_peer_bytes(static_cast<int64_t>(env.payload.size()));
  accept_chunk(L, k, h, env);
}

void LearnerNode::Impl::caught_lying(Link& L, size_t i, int64_t k, const std::string& what) {
  L.c.fetch->lied(i, k);
  rec::PeerLied r;
  r.donor = L.c.fetch->sources()[i].donor;
  r.chunk = k;
  r.detail = clip_utf8(what, 300) + "; this donor is used no more, the syncer serves what it was asked";
  emit(L, r);
}

void LearnerNode::Impl::seed_exact(Link& L, const at::Tensor& flat, const std::vector<int64_t>& versions) {
  if (!cfg.delta_broadcast() || !flat.defined() || versions.size() != L.plan.fragments.size()) return;
  const FlatLayout& model = L.plan.model;
  std::map<std::string, int64_t> offset;
  for (size_t i = 0; i < model.names.size(); ++i) offset[model.names[i]] = model.offsets[i];
  const float* src = flat.data_ptr<float>();
  for (size_t k = 0; k < L.plan.fragments.size(); ++k) {
    const int64_t p = L.plan.fragments[k];
    const FlatLayout& fl = layouts[static_cast<size_t>(p)];
    at::Tensor out = torch::empty({fl.elements}, torch::kFloat);
    float* dst = out.data_ptr<float>();
    for (size_t i = 0; i < fl.names.size(); ++i) {
      const auto it = offset.find(fl.names[i]);
      if (it == offset.end()) return;  // not this link's part: leave the fragments whole-first, as before
      const int64_t n = (i + 1 < fl.names.size() ? fl.offsets[i + 1] : fl.elements) - fl.offsets[i];
      std::copy(src + it->second, src + it->second + n, dst + fl.offsets[i]);
    }
    L.exact[p] = {versions[k], out};
  }
}

}  // namespace deloco
