// The syncer's merges and broadcasts (src/roles/syncer_node_impl.h): a round's result checkpointed, journalled and
// encoded once; per learner the newest merge of each fragment queued and handed to the transport within its send
// window, never before the standby acknowledged it; heartbeats to learners.
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

namespace {
// The fp32 wire encoding is little-endian IEEE binary32: on such a host it is the floats' own bytes.
bool host_is_little_endian() {
  const uint32_t one = 1;
  unsigned char c;
  std::memcpy(&c, &one, 1);
  return c == 1;
}
}  // namespace

proto::Frame SyncerNode::Impl::beat_frame(int64_t m, const proto::SyncerBeat& b) const {
  MessageHeader h;
  h.kind = MessageKind::kHeartbeat;
  h.learner_id = static_cast<uint32_t>(m);
  h.fingerprint = fingerprint;
  h.round = static_cast<uint64_t>(merges);
  return proto::make_frame(h, proto::encode_syncer_beat(b), limits);
}

void SyncerNode::Impl::send_beat(int64_t m, bool broadcast_next) {
  proto::SyncerBeat b;
  b.pushes = peers[m].pushes_rx;
  b.patience = announced_patience(peers[m], broadcast_next);
  if (cfg.sync.dynamic_local_updates) b.sync_every = peers[m].sync_every_told = core->local_updates(m);
  if (fitter && cfg.push_auto() && fitter->choice(m).period > 0) {
    const CodecChoice& c = fitter->choice(m);
    b.push_encoding = static_cast<int64_t>(fitter->push_ladder().codecs.at(static_cast<size_t>(c.push)).encoding);
    b.period = c.period;
  }
  send_to(m, beat_frame(m, b));
}

void SyncerNode::Impl::attach_delta(int64_t p, const std::shared_ptr<const std::string>& delta,
                                    syncer_detail::Latest* b) const {
  b->has_delta = false;
  if (!delta_on || !delta) return;
  b->delta_header = b->header;
  b->delta_header.kind = MessageKind::kFragmentDelta;
  b->delta_header.encoding = core->delta_encoding();  // the codec this merge's delta was encoded in
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
  it->second.journal = jrnl.seq();
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

void SyncerNode::Impl::broadcast_latest(int64_t p) {
  for (int64_t m = 0; m < M; ++m)
    if (peers[m].alive && !retired[m]) queue_broadcast(m, p, latest[p]);
}

bool SyncerNode::Impl::may_gather(const Envelope& env) const {
  if (env.parts != 2) return false;
  try {
    const MessageHeader h = decode_header(env.header.data(), env.header.size(), limits);
    if (h.kind == MessageKind::kFragmentPush || h.kind == MessageKind::kHeartbeat) return true;
    // The standby's acknowledgements (each journal flush brings one) but not its request for an image.
    return h.kind == MessageKind::kReplica &&
           repl::decode(h, env.payload, M, static_cast<int64_t>(layouts.size())).kind == repl::EntryKind::kAck;
  } catch (const WireError&) {
    return true;  // refused as malformed: it shows nothing
  }
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
    // An idle link none of whose broadcasts was measured yet: its learner hears the patience for it first.
    if (P.acks && P.in_flight.empty() && !P.broadcast_time.seeded) send_beat(m, /*broadcast_next=*/true);
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
      if (P.in_flight.empty()) P.dl_busy_from = now();  // the link turns busy (codec fitting: acknowledge())
      P.in_flight.push_back({P.seq, bytes, now()});
      P.in_flight_bytes += bytes;
    }
  }
}

void SyncerNode::Impl::acknowledge(int64_t m, int64_t seq, double t) {
  Peer& P = peers[m];
  // Codec fitting: the downlink's rate is the bytes acknowledged over the time the link was busy with them (from
  // the later of the link's turning busy and the previous acknowledgement), summed over busy spells until 256 KiB:
  // acknowledgements arrive in bunches, so one alone says little. A push that arrived meanwhile voids the sum (an
  // acknowledgement may have waited behind it on the way up).
  const double busy_from = std::max(P.dl_busy_from, P.last_ack);
  double acked = 0;
  while (!P.in_flight.empty() && P.in_flight.front().seq <= static_cast<uint64_t>(seq)) {
    acked += static_cast<double>(P.in_flight.front().bytes);
    broadcast_time.add(t - P.in_flight.front().sent, cfg.sync.ema);
    P.broadcast_time.add(t - P.in_flight.front().sent, cfg.sync.ema);
    ++broadcasts_measured;
    ++broadcasts_acked;
    P.in_flight_bytes -= P.in_flight.front().bytes;
    P.in_flight.pop_front();
  }
  if (acked == 0) return;
  P.last_ack = t;
  if (fitter) {
    if (P.last_push_at > busy_from || !(P.dl_busy_from >= 0)) {
      P.dl_bytes = P.dl_seconds = 0;
    } else {
      P.dl_bytes += acked;
      P.dl_seconds += t - busy_from;
    }
    if (P.dl_bytes >= 256 * 1024) {  // (at idle too little may have gathered: the remainder of a bunch)
      fitter->observe_download(m, P.dl_bytes, P.dl_seconds);
      P.dl_bytes = P.dl_seconds = 0;
    }
  }
  if (P.in_flight.empty()) P.dl_busy_from = -1;
}

void SyncerNode::Impl::rebuild_latest() {
  for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) {
    const int64_t v = core->version(p);
    if (v == 0) continue;
    std::vector<at::Tensor> ts = core->fragment_tensors(p);
    at::Tensor flat = torch::empty({layouts[p].elements}, torch::kFloat);
    flatten_into(ts, flat.data_ptr<float>());
    MessageHeader bh;
    Bytes payload;
    if (encode_broadcast(p, v, flat, &bh, &payload)) {  // whole: which version a learner holds is not known
      latest[p] = syncer_detail::Latest();
      latest[p].version = v;
      latest[p].header = bh;
      latest[p].payload = payload;
    }
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
    emit(rec::rolled_back_record(r, global_id(p)));
    for (int64_t m : out.learners)
      reject(peers[m].alive ? peers[m].route : std::string(), m, global_id(p), RejectReason::kRefusedByCore,
             "the merge of this round was rolled back: " + out.detail, sync_reject_name(out.rejected));
    return;
  }
  if (!r.merged()) return;
  if (fitter) fitter->observe_merge(p, t);
  ++merges;
  last_merge_t = t;
  if (first_merge_pending) {  // the first merge of a standby that took over: the failover's end
    first_merge_pending = false;
    rec::FailoverMerge fm;
    fm.epoch = epoch();
    fm.fragment = global_id(p);
    fm.version = out.version;
    fm.seconds_after_takeover = t - took_over_at;
    emit(std::move(fm));
  }
  if (r.grace_wait > 1e-3) {
    ++grace_waits;
    grace_wait_total += r.grace_wait;
  }
  // Durable before anyone sees it: with checkpoint_every = 1 no merge a learner received can be lost. The
  // checkpoint is the group commit's (commit()): this merge's broadcast is staged until it is written.
  const bool staging =
      group.merged(now(), cfg.syncer.checkpoint_every > 0 && merges - merges_at_ckpt >= cfg.syncer.checkpoint_every);
  const auto merged_at = std::chrono::steady_clock::now();
  // Broadcast Θ_p: encode once, share the payload with every live learner.
  MessageHeader bh;
  Bytes payload;
  const bool encoded = encode_broadcast(p, out.version, r.flat, &bh, &payload);
  answer_marks.merged(p, out.learners);
  if (encoded) {
    syncer_detail::Latest b;
    b.version = out.version;
    b.header = bh;
    b.payload = payload;
    attach_delta(p, r.delta, &b);  // a staged one replaced before its commit: learners lack its base, get it whole
    if (staging) {
      group.stage(p, std::move(b));
    } else {
      latest[p] = std::move(b);
      broadcast_latest(p);
    }
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
  if (staging) group.stage_record(std::move(mr));  // recorded once durable, as every merge record is
  else emit(std::move(mr));
}

void SyncerNode::Impl::refit_codecs(int64_t m) {
  const CodecChoice before = fitter->choice(m);
  const auto now_choice = fitter->refit(m, peers[m].step_time);
  if (!now_choice) return;
  ++codec_changes;
  rec::CodecChanged r = rec::codec_record(*fitter, m, before, *now_choice, peers[m].step_time);
  emit(std::move(r));
  if (cfg.push_auto()) send_beat(m);  // the learner switches at its next step boundary
}

std::vector<bool> SyncerNode::Impl::live_learners() const {
  std::vector<bool> live(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) live[static_cast<size_t>(m)] = peers[m].alive && !retired[m];
  return live;
}

int64_t SyncerNode::Impl::next_link_period() const {
  return fitter ? fitter->longest_period(live_learners()) : -1;
}

int64_t SyncerNode::Impl::next_delta_encoding() {
  if (!fitter || !cfg.broadcast_auto()) return 0;
  const int j = fitter->broadcast(live_learners());
  if (j != delta_choice) {
    ++codec_changes;
    emit(rec::broadcast_codec_record(*fitter, delta_choice, j));
    delta_choice = j;
  }
  return static_cast<int64_t>(fitter->broadcast_ladder().codecs.at(static_cast<size_t>(j)).encoding);
}

}  // namespace deloco
