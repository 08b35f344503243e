// The syncer's Prometheus text and summary (src/roles/syncer_node_impl.h).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "records/summary.h"
#include "records/round_record.h"
#include "syncer_node_impl.h"
#include "util/fs.h"

namespace deloco {
namespace fs = std::filesystem;
using proto::unix_now;

void SyncerNode::Impl::update_prometheus() {
  const auto st = tx->stats();
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    o << "# HELP deloco_" << name << " " << help << "\n# TYPE deloco_" << name << " " << type << "\ndeloco_"
      << name << " " << v << "\n";
  };
  metric("learners_alive", "gauge", "Learners currently connected.", static_cast<double>(alive_count()));
  metric("learners", "gauge", "Configured learners (M).", static_cast<double>(M));
  metric("quorum", "gauge", "Configured minimum quorum (K).", static_cast<double>(cfg.sync.quorum));
  metric("merges_total", "counter", "Fragment merges (outer steps).", static_cast<double>(merges));
  metric("contributions_merged_total", "counter", "Contributions merged.",
         static_cast<double>(core->merged_contributions()));
  metric("grace_waits_total", "counter", "Merges that waited in the grace window.", static_cast<double>(grace_waits));
  metric("grace_wait_seconds_total", "counter", "Seconds spent in grace windows.", grace_wait_total);
  metric("bytes_in_total", "counter", "Bytes received.", static_cast<double>(st.bytes_in));
  metric("bytes_out_total", "counter", "Bytes sent.", static_cast<double>(st.bytes_out));
  metric("auth_denied_total", "counter", "Connections refused by the CURVE allow-list.", static_cast<double>(st.auth_denied));
  metric("handshake_failures_total", "counter", "Failed handshakes (allow-list refusals, wrong keys, timeouts).",
         static_cast<double>(st.handshake_failures));
  metric("connections_total", "counter", "Connections accepted by the transport.", static_cast<double>(st.connections));
  metric("disconnects_total", "counter",
         "Connections closed for any reason (left, failed handshake, a frame over the bound).",
         static_cast<double>(st.disconnects));
  metric("tcp_timeout_seconds", "gauge",
         "The longest TCP user timeout fitted to a learner's link (net.tcp_timeout is the floor; 0: none above it).",
         static_cast<double>(st.tcp_timeout_ms) / 1000.0);
  metric("global_step", "gauge", "Largest inner step reported by a learner.", [&] {
    int64_t s = 0;
    for (const auto& p : peers) s = std::max(s, p.step);
    return static_cast<double>(s);
  }());
  metric("tokens_total", "counter", "Tokens trained by all learners.", static_cast<double>(total_tokens()));
  // A standby pair: which syncer leads, its term, and what replication checked (docs/reliability.md).
  metric("leader", "gauge", "1 while this syncer leads (always, without a standby pair), 0 while it is the standby.",
         pair.leads() ? 1.0 : 0.0);
  metric("epoch", "gauge", "The leader's term (fencing token) this syncer leads or follows.", static_cast<double>(epoch()));
  metric("replica_rounds_checked_total", "counter", "Rounds a standby replayed and checked against the leader's.",
         static_cast<double>(rounds_checked));
  metric("replica_mismatches_total", "counter", "Replayed rounds that differed from the leader's (then resynced).",
         static_cast<double>(replica_mismatches));
  metric("takeovers_total", "counter", "Times this syncer took over as leader.", static_cast<double>(takeovers));
  metric("uptime_ratio", "gauge", "Fraction of wall time in which global training was not stalled.", uptime());
  metric("state_snapshots_total", "counter", "Global-state snapshots encoded for downloads (one per set of versions).",
         static_cast<double>(state_snapshots));
  metric("state_downloads_total", "counter", "Global-state downloads queued to learners.", static_cast<double>(state_downloads));
  metric("peer_fetch_downloads_total", "counter", "Downloads a joining learner fetched from donor learners and the syncer.",
         static_cast<double>(fetch_downloads));
  metric("peer_fetch_chunks_from_syncer_total", "counter", "Chunks of such downloads the syncer sent itself.",
         static_cast<double>(fetch_chunks_sent));
  metric("states_held_total", "counter",
         "Joins asking for the state whose learner held it already (its parameters' hash matched): no download.",
         static_cast<double>(states_held));
  metric("state_requests_dropped_total", "counter",
         "Hellos asking for the state while a download to the learner was outstanding (no new copy).",
         static_cast<double>(state_requests_dropped));
  metric("broadcasts_sent_total", "counter", "Merged fragments handed to the transport for a learner.",
         static_cast<double>(broadcasts_sent));
  metric("broadcasts_superseded_total", "counter",
         "Merged fragments never sent to a learner: a newer merge of the fragment replaced them while its send "
         "window was full, or a state download carried them.",
         static_cast<double>(broadcasts_superseded));
  if (upload_time.seeded)
    metric("upload_seconds", "gauge", "Measured time of a push on the wire (moving average).", upload_time.value);
  if (broadcast_time.seeded)
    metric("broadcast_seconds", "gauge", "Measured time from a broadcast's hand-off to its acknowledgement (moving average).",
           broadcast_time.value);
  metric("learners_blocked", "gauge",
         "1 while every connected learner has stopped advancing although nothing waits at the syncer.",
         blocked ? 1.0 : 0.0);
  metric("drift_resets_total", "counter",
         "Pushes refused by a norm bound; each makes its learner drop its drift of the fragment.",
         static_cast<double>(drift_resets));
  metric("record_errors_total", "counter", "Records the record sink failed to take.", static_cast<double>(record_errors));
  if (have_eval) metric("validation_loss", "gauge", ("Validation loss of the global model (" + last_eval_result.loss_unit + ").").c_str(),
                        last_eval_result.loss);
  o << "# HELP deloco_rejects_total Messages rejected, by reason (refused joins included).\n# TYPE deloco_rejects_total counter\n";
  for (const auto& [k, v] : rejects) o << "deloco_rejects_total{reason=\"" << k << "\"} " << v << "\n";
  metric("contributions_rejected_total", "counter",
         "Messages rejected other than refused joins: refused contributions (pushes) and malformed or unexpected messages.",
         static_cast<double>(contribution_rejects()));
  o << "# HELP deloco_joins_refused_total Refused joins (hellos, and messages from connections that have not joined), "
       "by reason.\n# TYPE deloco_joins_refused_total counter\n";
  for (const auto& [k, v] : joins_refused_by) o << "deloco_joins_refused_total{reason=\"" << k << "\"} " << v << "\n";
  std::lock_guard<std::mutex> lock(prom_mu);
  prom_text = o.str();
}

namespace {
// The process's peak resident set (Linux VmHWM), 0 when unknown: what a syncer (shard) host must have.
int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return 0;
}
}  // namespace

nlohmann::json SyncerNode::Impl::summary(double wall) const {
  const auto st = tx->stats();
  rec::RunSummary sum;
  // No evaluation yet: written as null (unknown).
  sum.final_val_loss = have_eval ? last_eval_result.loss : std::nan("");
  sum.val_bpb = have_eval ? last_eval_result.bpb : std::nan("");
  sum.loss_unit = last_eval_result.loss_unit;
  sum.tokens = total_tokens();
  sum.wall_seconds = wall;
  sum.outer_steps = merges;
  sum.uptime = uptime();
  sum.goodput = goodput();
  sum.bytes_sent = static_cast<int64_t>(st.bytes_out);
  sum.contributions_merged = core->merged_contributions();
  sum.contributions_rejected = contribution_rejects();
  // The syncer node's own fields.
  nlohmann::json s{{"bytes_received", st.bytes_in},
                   {"rejects", rejects},
                   {"joins_refused", joins_refused},
                   {"joins_refused_by", joins_refused_by},
                   {"grace_waits", grace_waits},
                   {"state_snapshots", state_snapshots},
                   {"state_downloads", state_downloads},
                   {"states_held", states_held},
                   {"peer_fetch_downloads", fetch_downloads},
                   {"peer_fetch_chunks_from_syncer", fetch_chunks_sent},
                   {"serve_offers_refused", serve_offers_refused},
                   {"state_requests_dropped", state_requests_dropped},
                   {"broadcasts_sent", broadcasts_sent},
                   {"broadcasts_superseded", broadcasts_superseded},
                   {"broadcasts_acked", broadcasts_acked},
                   {"send_window_bytes", send_window},
                   {"uploads_measured", uploads_measured},
                   {"broadcasts_measured", broadcasts_measured},
                   {"record_errors", record_errors},
                   {"blocked_spells", blocked_spells},
                   {"drift_resets", drift_resets},
                   {"contributions_replaced", contributions_replaced},
                   {"contributions_pending_at_end", contributions_pending_at_end},
                   {"push_rejects", push_rejects},
                   {"auth_denied", st.auth_denied},
                   {"handshake_failures", st.handshake_failures},
                   {"connections", st.connections},
                   {"disconnects", st.disconnects},
                   {"tcp_timeout_ms", st.tcp_timeout_ms},
                   {"resumed", resumed},
                   {"learners", M},
                   {"checkpoint", last_checkpoint}};
  nlohmann::json joins = nlohmann::json::array(), bytes = nlohmann::json::array();
  for (const auto& p : peers) joins.push_back(p.joins);
  s["joins"] = joins;
  // Per learner: frame bytes read from it (pushes, heartbeats, hellos) and broadcast to it (whole fragments and
  // deltas; state downloads are counted in state_downloads).
  for (const auto& p : peers) bytes.push_back({{"up", p.bytes_up}, {"down", p.bytes_down}});
  s["learner_bytes"] = bytes;
  if (cfg.sync.final_round)  // the final round (sync.final_round): states held, refused, fragments it changed
    s["final_round"] = {{"states_received", finals_received}, {"states_refused", finals_refused},
                        {"states_merged", core->finals_merged()}, {"fragments", final_fragments}};
  s["deltas_sent"] = deltas_sent;
  s["delta_resends"] = delta_resends;
  if (fitter) {  // net.encoding / net.broadcast_encoding = auto: each learner's fit as the run ended
    s["codecs"] = rec::codec_summary(*fitter, M);
    s["codec_changes"] = codec_changes;
    s["delta_encoding"] = delta_on ? encoding_name(core->delta_encoding()) : "";
  }
  s["group_commit_merges"] = group.gathered();  // merges a checkpoint covered beside the one that made it due
  // Measured transfer times (moving averages; null until one was measured).
  s["upload_seconds"] = upload_time.seeded ? nlohmann::json(upload_time.value) : nlohmann::json();
  s["broadcast_seconds"] = broadcast_time.seeded ? nlohmann::json(broadcast_time.value) : nlohmann::json();
  s["peak_rss_bytes"] = peak_rss_bytes();
  s["parameters"] = model_layout.elements;  // what this syncer (shard) serves
  if (shard.shards > 1) {
    s["shard"] = shard.shard;
    s["shards"] = shard.shards;
    s["fragments"] = shard.fragments;
  }
  if (dial_peer) {  // a standby pair (docs/reliability.md)
    s["pair"] = {{"role", pair.leads() ? "leader" : "standby"},
                 {"epoch", epoch()},
                 {"journal", jrnl.seq()},
                 {"takeovers", takeovers},
                 {"step_downs", step_downs},
                 {"epoch_hints", epoch_hints},
                 {"rounds_checked", rounds_checked},
                 {"mismatches", replica_mismatches},
                 {"images_applied", images_applied},
                 {"standby_follows", standby_follows},
                 {"standby_dropped", standby_dropped},
                 {"resync_replayed", resync_replayed}};
  }
  sum.extra = std::move(s);
  return sum.to_json();
}

}  // namespace deloco
