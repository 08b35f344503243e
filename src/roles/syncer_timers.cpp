// The syncer's clock-driven work (src/roles/syncer_node_impl.h): housekeeping after every message or timer (peers
// gone silent, heartbeats, grace timers, evaluation, status, checkpoints), the next wake-up, evaluation and goodput.
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
#include "util/checkpoint_store.h"
#include "util/fs.h"
#include "util/text.h"
#include "wire/quantize.h"

namespace deloco {
namespace fs = std::filesystem;

using proto::RejectReason;
using proto::unix_now;
using syncer_detail::Peer;

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

void SyncerNode::Impl::housekeeping() {
  leader_housekeeping();
  // A leader holding after a pause (leader_tick) merges nothing, not even on a grace timer, and counts no learner
  // silent (their messages wait in the hold) until it knows it still leads.
  if (holding()) return;
  if (pair.leads()) retry_waiting_hellos(now());
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
    // Before any push of the link was measured, a push its heartbeat announced gets the patience cap (20 dead_after):
    // at 1 Mbit/s the larger model's first two int4 pushes took 4.4 s, both sides counted the other gone, and the
    // learners dropped 22 of 26 pushes while they joined again.
    const double allowance = P.push_announced > 0 && !P.upload_time.seeded ? patience_cap()
                                                                           : patience(P.upload_time);
    if (P.alive && t - P.last_heard > cfg.net.dead_after + allowance) {
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
    if (P.finish_by >= 0 && !P.alive && !retired[m] && t > P.finish_by) retire(m, "finished_silently");
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

}  // namespace deloco
