// src/roles/syncer_node_impl.h — the syncer process's state, shared by its files:
//   syncer_node.cpp        the loop (run()), message dispatch (push, heartbeat, leave), state snapshots and chunks
//   syncer_hello.cpp       a learner's admission: the hello's checks, a waiting hello, the welcome
//   syncer_broadcast.cpp   a round's result, broadcasts per learner (send window, the standby's acknowledgement)
//   syncer_timers.cpp      housekeeping, the next wake-up, evaluation, goodput
//   syncer_standby.cpp     the standby pair: journal, images, leases, takeover and fencing
//   syncer_checkpoint.cpp  atomic checkpoints of Θ, the outer state and the counters; --resume
//   syncer_metrics.cpp     the Prometheus text and the summary
// The state chunks a joining learner downloads go through chunk_server.h (also the donors' server).
// Private to src/roles; everything runs on the syncer's one thread (the Prometheus text is guarded by prom_mu).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chunk_server.h"
#include "group_commit.h"
#include "pair_role.h"
#include "sync/answer_marks.h"
#include "sync/codec_fit.h"
#include "deloco/runtime.h"
#include "protocol.h"
#include "records/kinds.h"
#include "replication.h"

namespace deloco {

namespace syncer_detail {

struct StateSnapshot;

struct Peer {
  std::string route;        // transport peer id ("" : no live connection)
  // A hello of another process (instance) on another connection while this id's connection still looks live: a
  // fast restart whose old connection has not gone quiet yet, or a real duplicate. It waits here (the newest one only)
  // and is judged again every 50 ms: accepted once the old connection has been quiet for net.dead_after, refused as
  // duplicate_id once the old connection spoke after it came and it waited a heartbeat.
  std::optional<Envelope> waiting_hello;
  double waiting_since = -1, waiting_tried = -1;
  // When the syncer first found its inbox empty after the waiting hello came (−1: not yet). A message of the old
  // connection handled after that was sent after the hello; one handled before may have waited in the queue.
  double waiting_drained = -1;
  std::string identity;     // CURVE allow-list name
  uint64_t instance = 0;
  bool alive = false;
  // Liveness: the steady time of its connection's last message, moved on by the time this syncer spent not
  // listening (excuse_peers: a checkpoint, an evaluation), so the syncer's own work never makes a learner look silent.
  double last_heard = -1e9;
  // The steady time of its connection's last message, never moved on: whether the old connection spoke after a
  // waiting hello came is a question of messages (excused time made a closed connection seem to speak on).
  double last_spoke = -1e9;
  // The longest single stretch the syncer spent not listening since this peer's last message (excuse_peers).
  double longest_busy = 0;
  void heard(double t) {
    last_heard = last_spoke = t;
    longest_busy = 0;
  }
  double last_beat_sent = -1e9;
  int64_t sync_every_told = 0;  // the sync period (sync.dynamic_local_updates) the latest beat to it carried
  int64_t step = 0, tokens = 0;
  double busy = 0;          // busy seconds of the current instance
  double busy_done = 0;     // busy seconds of earlier instances
  double step_time = 0;
  double advanced_at = -1e9;  // steady time its reported step last went up (or it joined)
  // sync.final_round: a learner past its last step when this syncer took over or resumed (it may still be waiting for
  // answers or sending its final states) is retired as finished silently if it has not said hello by then (−1: none).
  double finish_by = -1;
  int64_t joins = 0;
  // The global-state download outstanding to this learner (on_hello in syncer_node.cpp): queued whole on
  // connection `route` at steady time dl_sent (< 0: none) with welcome round dl_round.
  double dl_sent = -1;
  int64_t dl_round = -1;
  // ---- the send window for broadcasts (pump() in syncer_node.cpp) ----
  // A broadcast handed to the transport and not yet acknowledged (the learner's heartbeat reports the highest
  // broadcast sequence number it received, Beat::broadcasts).
  struct InFlight {
    uint64_t seq = 0;
    size_t bytes = 0;
    double sent = 0;  // steady time it was handed to the transport
  };
  std::deque<InFlight> in_flight;
  size_t in_flight_bytes = 0;
  uint64_t seq = 0;  // the last sequence number given (never reset: an acknowledgement from an old connection is moot)
  bool acks = false;  // the learner acknowledges broadcasts (a heartbeat carried Beat::broadcasts)
  bool missed = false;  // counted lost since its last hello: broadcasts were not sent to it (catch_up())
  // Per local fragment: the newest merged Θ_p not yet handed to the transport. A newer merge of the same fragment
  // replaces it (the older one is superseded: counted, never sent).
  struct Pending {
    int64_t version = 0;
    uint64_t order = 0;  // the node's merge count when it was queued: oldest first
    uint64_t journal = 0;  // the journal entry of its merge: sent only once the standby acknowledged it (pump())
    MessageHeader header;
    Bytes payload;
    // The delta broadcast: the fragment_delta from version − 1, sent instead when the learner holds version − 1.
    bool has_delta = false;
    MessageHeader delta_header;
    Bytes delta;
  };
  std::map<int64_t, Pending> pending;
  // Per local fragment: the older merge kept back when a newer one replaced it while both waited for the standby's
  // acknowledgement (pump()). Sent once acknowledged, unless the newer one is by then: when merges come faster than
  // the standby's acknowledgements return, the newest is always waiting, and replacing it would starve the learner.
  std::map<int64_t, Pending> awaiting_standby;
  size_t queued() const { return pending.size() + awaiting_standby.size(); }
  void drop_queued() {
    pending.clear();
    awaiting_standby.clear();
  }
  // The delta broadcast: per local fragment, the version the frames handed to the transport on the current
  // connection leave this learner holding (−1: unknown, so the next broadcast is the whole fragment). Reset by a
  // hello, a failed send and the learner's Beat::resend.
  std::vector<int64_t> delta_held;
  // Frame bytes read from and handed to the transport for this learner (pushes, hellos, heartbeats / broadcasts,
  // deltas, state chunks): the per-learner accounting of the summary.
  int64_t bytes_up = 0, bytes_down = 0;
  // ---- pushes on the current connection ----
  int64_t pushes_rx = 0;     // pushes read on `route` since its latest hello (told back: proto::SyncerBeat)
  // This link's measured transfer times (moving averages): a push (upload) and a broadcast (hand-off to
  // acknowledgement). A slow link makes silences of a few frames' time normal: liveness allows for them.
  Ema upload_time, broadcast_time;
  // When the link last finished delivering a broadcast (an acknowledgement).
  double last_ack = -1e9;
  // Codec fitting (acknowledge()): when the link last turned busy with broadcasts (−1: idle), and the bytes and
  // seconds acknowledged since the downlink's last sample.
  double dl_busy_from = -1, dl_bytes = 0, dl_seconds = 0;
  // When its latest push arrived: an acknowledgement sent while a push was on the way up queued behind it, so a
  // broadcast whose time on the wire overlaps a push's arrival does not measure the downlink (codec fitting).
  double last_push_at = -1e9;
  double last_beat = -1;     // steady time of its latest heartbeat: the one the learner sends right before a push
  // The step its latest heartbeat reported. The one right before a push reports the step the push was taken at
  // (a push can wait in the learner's outbox while later heartbeats report later steps): the push's own step.
  int64_t last_beat_step = 0;
  // The push its latest heartbeat announced (Beat::push_bytes) and that has not arrived yet (0: none).
  int64_t push_announced = 0;
  // ---- rejoin from peers (docs/reliability.md) ----
  // Where this learner serves state chunks to joining learners and its server's public key (its hello; "" : none).
  std::string serve, serve_key;
  Digest serve_secret{};  // its hello's key for the fetch tickets the welcomes of joining learners carry
  // A download this learner fetches chunk by chunk (Welcome::fetch): the snapshot its state requests are answered from.
  std::shared_ptr<const StateSnapshot> fetch_snap;
  int64_t fetch_chunks_sent = 0;
};

// The latest broadcast of a fragment (version 0: none yet), kept encoded for a learner that comes back without a
// download (on_hello: it missed the broadcasts made while it was away).
struct Latest {
  int64_t version = 0;
  MessageHeader header;
  Bytes payload;
  bool has_delta = false;  // the delta broadcast: the fragment_delta from version − 1
  MessageHeader delta_header;
  Bytes delta;
};

// The global state as joining learners download it: Θ flattened to fp32 once per set of fragment versions, kept as
// one immutable shared buffer that every download's chunks point into (the transport sends without copying).
struct StateSnapshot {
  std::vector<int64_t> versions;  // the core's fragment versions it holds
  int64_t round = 0;              // merges when it was taken: the welcome's round
  Bytes bytes;                    // fp32 elements of the whole model (model_layout order)
  Digest hash{};                  // BLAKE2b-256 of `bytes`
  // BLAKE2b-256 of each chunk of chunk_elements elements (Welcome::chunk_hashes), computed on first use.
  mutable std::vector<Digest> chunk_hashes;
  mutable int64_t hashed_chunk_elements = 0;
  const std::vector<Digest>& hashes(int64_t chunk_elements) const;
};

}  // namespace syncer_detail

struct SyncerNode::Impl {
  RuntimeConfig cfg;
  std::unique_ptr<ServerTransport> tx;
  RecordSink record;
  int64_t M = 0;
  std::unique_ptr<Workload> evaluator;  // holds a model replica to evaluate Θ (shards other than 0: freed after setup)
  std::string model_fingerprint;        // the evaluator's, for checkpoint manifests
  std::map<std::string, at::Tensor> initial;  // shard 0 of a sharded syncer: the other shards' tensors at version 0
  std::unique_ptr<Syncer> core;
  // A sharded syncer: this shard's fragments. The core, layouts, timers and versions are in the shard's local
  // order; the wire, the records and the checkpoints' "fragments" name global fragment ids (shard.fragments[p]).
  ShardPlan shard;
  int64_t global_id(int64_t local) const { return shard.fragments[static_cast<size_t>(local)]; }
  std::vector<proto::Layout> layouts;  // per fragment of this shard (local order)
  proto::Layout model_layout;          // this shard's part of the model (all of it when syncer.shards = 1)
  uint64_t fingerprint = 0;
  WireLimits limits;
  Encoding broadcast_enc = Encoding::kFp32;
  // The delta broadcast (net.broadcast_delta / topk, Syncer::set_delta_broadcast): merges go to a learner that holds
  // the previous version as fragment_delta frames in broadcast_enc, and otherwise whole, in fp32 (exact).
  bool delta_on = false;
  int64_t deltas_sent = 0, delta_resends = 0;
  // net.encoding / net.broadcast_encoding = auto (sync/codec_fit.h; null otherwise): every link's measured rates and
  // each learner's fitted codecs. delta_choice: the broadcast ladder index the delta broadcast uses now (the coarsest
  // of the live learners' fits). codec_changes: codec_changed records written.
  std::unique_ptr<CodecFitter> fitter;
  int delta_choice = 0;
  int64_t codec_changes = 0;
  // Refits learner m after a push (its step time as its heartbeat said); a change is recorded and told (send_beat).
  void refit_codecs(int64_t m);
  // net.broadcast_encoding = auto: the encoding the next merge's delta uses (recorded when it changes); 0 otherwise.
  // Carried by the kRound / kDrain journal entry, so leader and standby encode the same deltas.
  int64_t next_delta_encoding();
  // net.encoding or net.broadcast_encoding = auto: the longest live learner's fitted period (the kRound entry's
  // link_period: the grace window of rebasing learners spans it); -1 otherwise.
  int64_t next_link_period() const;
  std::vector<bool> live_learners() const;  // alive and not retired, by learner id
  std::vector<syncer_detail::Peer> peers;
  AnswerMarks answer_marks;  // by learner id and local fragment: the push each broadcast answers
  std::map<std::string, int64_t> route_to_id;
  std::vector<double> timers;  // per fragment: call decide again at this time (< 0: none)
  std::vector<syncer_detail::Latest> latest;  // per fragment (local order): its latest broadcast
  std::unique_ptr<MetricsServer> metrics;

  // Clock and accounting.
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double prior_elapsed = 0, prior_stalled = 0;  // from earlier incarnations (resume)
  double first_join = -1;  // steady time of the first hello (or of the resume): the uptime clock's origin
  double stalled = 0, last_account = 0, last_status = -1e9, last_eval = 0, last_merge_t = -1;
  int64_t merges = 0, merges_at_ckpt = 0, evals = 0, grace_waits = 0;
  // Learners connected but none advancing (blocked_learners()): counted as stalled; drift_resets: pushes refused by
  // a norm bound, each of which makes its learner drop its drift of the fragment (RejectReason::kDeltaTooLarge).
  bool blocked = false;
  uint64_t auth_denied_seen = 0;  // the transport's CURVE refusals already recorded (auth_denied records)
  int64_t blocked_spells = 0, drift_resets = 0;
  // Accepted contributions no merge took (contribution_unmerged records): replaced by a newer push of the same learner
  // and fragment before the round merged; still waiting when the syncer stopped.
  int64_t contributions_replaced = 0, contributions_pending_at_end = 0;
  // sync.final_round: final states received (accepted), refused, and the fragments the final round changed.
  int64_t finals_received = 0, finals_refused = 0, final_fragments = 0;
  std::map<std::string, int64_t> push_rejects;  // the refused pushes among `rejects`, by reason
  double grace_wait_total = 0;
  std::map<std::string, int64_t> rejects;  // reason → count (node-level, includes wire errors)
  // Of those, hellos refused (duplicate_id while the old connection still counts live, a key bound to another id,
  // ...) and messages other than pushes from connections that have not joined ("say hello first"): part of joining,
  // not refused contributions, so the summary reports them apart (joins_refused).
  int64_t joins_refused = 0;
  // Answers to goodbyes (ack_leave) the transport still holds: the end of the run waits for them (run()).
  std::shared_ptr<std::atomic<int64_t>> goodbyes_unsent = std::make_shared<std::atomic<int64_t>>(0);
  double last_leave_heard = -1e9;  // steady time of the latest leave read (a repeat included)
  double last_goodbye_repeat = -1e9;
  // A goodbye answered behind unacknowledged broadcasts: the end of the run keeps reading until then (run()).
  double goodbye_linger_until = -1e9;  // ... of the latest goodbye from a learner already answered (its answer is late)
  std::map<std::string, int64_t> joins_refused_by;  // reason -> count (summary, Prometheus)
  bool in_hello = false;  // on_hello is running: reject() counts into joins_refused too
  std::map<std::string, std::pair<double, int64_t>> reject_log;  // log key → (window start, records logged)
  // State downloads (on_hello): snapshots encoded, downloads queued, requests answered without a new copy because
  // one was outstanding. Records the sink failed to take (emit never throws).
  std::shared_ptr<const syncer_detail::StateSnapshot> snapshot;  // the newest; older ones live while queued chunks point into them
  int64_t state_snapshots = 0, state_downloads = 0, state_requests_dropped = 0, record_errors = 0;
  // Rejoin from peers: downloads fetched with donors, chunks the syncer sent of those, donor offers ignored (a key
  // that is not the hello's own), and the allow-list that checks them (CURVE).
  int64_t fetch_downloads = 0, fetch_chunks_sent = 0, serve_offers_refused = 0;
  std::optional<AllowList> allow_list;
  uint64_t donor_rotation = 0;
  void on_state_request(const Envelope& env, const MessageHeader& h, int64_t m);
  // State requests waiting for net.serve_rate, answered by serve_chunks() (ChunkServer: the queue, the rate bound,
  // the reply frames; set at construction).
  ChunkServer chunk_queue;
  void serve_chunks();
  int64_t states_held = 0;  // joins that asked for the state and held it already (hash matched): no chunks sent
  // Broadcasts: handed to the transport, superseded by a newer merge before they could be sent (the learner's send
  // window was full), acknowledged by the learner. The send window in bytes per learner (set at construction:
  // twice the largest broadcast frame of this shard).
  int64_t broadcasts_sent = 0, broadcasts_superseded = 0, broadcasts_acked = 0;
  size_t send_window = 0;
  // Measured transfer times (seconds, moving averages with the core's sync.ema): a push from the learner's
  // heartbeat right before it to its arrival (upload), and a broadcast from its hand-off to the transport to the
  // learner's acknowledgement (broadcast). They are ξ_sync's transfer terms (observe_sync in finish_round).
  Ema upload_time, broadcast_time;
  int64_t uploads_measured = 0, broadcasts_measured = 0;
  EvalResult last_eval_result;
  bool have_eval = false;
  bool resumed = false;
  std::string last_checkpoint;

  // ---- the standby pair (replication.h; docs/reliability.md, "A standby syncer") ----
  // Every change to the core goes through journal(): applied here, and sent to the standby while one follows.
  // The role (leader, a standby asking for an image, a standby following) and the fencing epoch: this leader's term
  // (a follower's: its leader's). Changed only by the table in pair_role.h (take_over, step_down, on_upstream).
  PairRole pair;
  int64_t epoch() const { return pair.epoch(); }
  std::function<std::unique_ptr<ClientTransport>()> dial_peer;  // a connection to the other syncer of the pair
  double lease = 1.0;       // syncer.lease
  WireLimits replica_limits;  // the limits replica frames are read with (an image holds Θ and the outer state)
  // Leader: its standby (route "" : none), the entries it acknowledged, when it was last heard, when the lease went.
  std::string standby_route, standby_identity;
  uint64_t standby_acked = 0, image_seq = 0;
  double image_sent = -1e9;
  double standby_heard = -1e9, lease_sent = -1e9;
  int64_t standby_follows = 0, standby_dropped = 0, resync_replayed = 0;
  // Every change to the core, numbered; the pushes its rounds wait on (received again after an image, so no learner's
  // push is lost to a standby joining); the frames for the standby (replication.h).
  repl::Journal jrnl;
  // Sends the journal's frames to the standby (after each message and housekeeping): a merge reaches the standby only
  // after its checkpoint is written, so the standby never holds a merge the leader's disk lacks.
  void flush_journal();
  // Follower: the connection to the leader, whether it holds an image, when the leader was last heard, the latest
  // counters it replicated, the learners that said hello here (told when this standby takes over), the checks.
  std::unique_ptr<ClientTransport> upstream;
  bool drained = false;  // the leader's final drain was applied: the run is over
  double upstream_heard = -1e9, follow_sent = -1e9;  // upstream_heard: any sign of a live leader (also its lease
                                                     // on the learners' endpoint, sent while no standby follows it)
  // A pair with no leader (repl::leads_leaderless): this syncer's slot, and the other's follow requests heard while
  // this one had no image and heard no leader: the first and latest (steady time) and the latest's state. Queued
  // requests arrive in a burst; requests spread over a lease show the other syncer is asking now, so not leading.
  int slot = -1;
  double peer_asks_first = -1, peer_asks_last = -1;
  repl::PairState peer_asks;
  nlohmann::json leader_counters;
  std::map<int64_t, std::string> standby_routes;  // learner → route of its latest hello here while following
  int64_t rounds_checked = 0, replica_mismatches = 0, images_applied = 0, takeovers = 0, step_downs = 0;
  int64_t epoch_hints = 0;  // hellos refused because their learner had joined a newer epoch (refuse_newer_epoch)
  double took_over_at = -1;  // steady time of the latest takeover (its first merge is timed from it)
  // Pauses (SIGSTOP, a frozen VM, a long stall): the loop's previous housekeeping. A gap of more than half a lease
  // means this process did not run, so silence it "saw" meanwhile proves nothing about the other syncer.
  double loop_tick = -1;
  int64_t pauses = 0;
  double pause_began(double t);  // the loop's previous tick when the gap to `t` is such a pause (recorded), else -1
  void excuse_pause(double began, double t, double& heard) const;
  // A leader no standby follows tells the other syncer of the pair its epoch every lease (a syncer that still
  // thinks it leads, say one paused past the lease, steps down on it: the only evidence a leader steps down on).
  std::unique_ptr<ClientTransport> peer_link;
  double epoch_told = -1e9;
  void tell_peer_epoch();
  // A leader of a pair that was paused holds every learner message (no push received, nothing merged, no grace
  // timer) for two leases, so a leader replaced meanwhile merges nothing beside its successor: its successor's epoch
  // (tell_peer_epoch, every lease) arrives within the hold and it steps down. Acknowledgements do not end the hold:
  // they may have waited in the queue since before its successor took over.
  // Held messages are bounded as the transport bounds what it queues: at most syncer_receive_limit(P) per connection
  // (more from one connection are dropped and counted, held_dropped); the transport's own queues stay bounded too.
  double hold_until = -1;
  std::deque<Envelope> held_messages;
  std::map<std::string, int64_t> held_per_peer;
  int64_t held_dropped = 0;
  void hold(Envelope env);
  void leader_tick();          // at the top of each loop: notices a pause, starts the hold
  void release_held();         // the hold ends: the held messages are handled in order
  bool holding() const { return hold_until >= 0; }
  bool first_merge_pending = false;
  // Applies `e` to the core (repl::apply) and, on a leader with a standby, sends it there. Sets e.seq.
  repl::Applied journal(repl::Entry e);
  // The core calls every driver of the node makes, each one journal entry.
  void core_connected(int64_t m, bool c) {
    repl::Entry e;
    e.kind = repl::EntryKind::kConnected;
    e.learner = m;
    e.flag = c;
    journal(std::move(e));
  }
  void core_joined(int64_t m) {
    repl::Entry e;
    e.kind = repl::EntryKind::kJoined;
    e.learner = m;
    journal(std::move(e));
  }
  // (and says so: a learner_finished record at `step`)
  void core_finished(double t, int64_t m, bool finished, int64_t step) {
    repl::Entry e;
    e.kind = repl::EntryKind::kFinished;
    e.t = t;
    e.learner = m;
    e.flag = finished;
    journal(std::move(e));
    rec::LearnerFinished r;
    r.learner = m;
    r.finished = finished;
    r.step = step;
    emit(r);
  }
  void core_retire(double t, int64_t m) {
    repl::Entry e;
    e.kind = repl::EntryKind::kRetire;
    e.t = t;
    e.learner = m;
    journal(std::move(e));
  }
  RoundResult core_round(double t, int64_t p) {
    repl::Entry e;
    e.kind = repl::EntryKind::kRound;
    e.t = t;
    e.fragment = p;
    e.delta_encoding = next_delta_encoding();
    e.link_period = next_link_period();
    return journal(std::move(e)).rounds.at(0);
  }
  void core_observe(double upload, double merge, double broadcast) {
    repl::Entry e;
    e.kind = repl::EntryKind::kObserveSync;
    e.upload = upload;
    e.merge = merge;
    e.broadcast = broadcast;
    journal(std::move(e));
  }
  // The broadcast frame of a merged round's Θ_p (shared with every learner): false when it could not be encoded.
  bool encode_broadcast(int64_t p, int64_t version, const at::Tensor& flat, MessageHeader* h, Bytes* payload);
  // `latest` from Θ as it is (every merged fragment whole): after a standby's image or a resume from a checkpoint,
  // the broadcasts a learner that comes back without a download catches up with (catch_up).
  void rebuild_latest();
  // The leader's side: the standby's messages (kFollow, kAck) on the learners' endpoint.
  void on_replica_message(const Envelope& env, const MessageHeader& h);
  // The follower's side: one message from the leader.
  void on_upstream(const Envelope& env);
  // Role changes: the lease lapsed (follower → leader), or a newer epoch was seen (leader → follower).
  // A leaderless pair's election passes the other syncer's epoch (the new one is above both) and why (`detail`).
  // `why`: kLeaseLapsed (following) or kElected (asking; other_epoch the other syncer's).
  void take_over(PairRole::Event why, double silent, int64_t other_epoch = 0, std::string detail = "");
  // The other syncer asked to follow this one (kFollow) while this one is a follower: kept for a leaderless pair.
  void note_peer_asks(const repl::Entry& e);
  // True when this follower, holding no image and hearing no leader, should lead a pair that has none.
  bool leads_leaderless_pair(double t) const;
  void step_down(int64_t newer_epoch, const std::string& why);
  void send_follow();
  // A control entry (kFollow, kAck) of `kind` at this replica's journal position and epoch, to the leader.
  void send_upstream(repl::EntryKind kind);
  // A control entry (kFollow, kAck, kLease) at this replica's journal position and epoch, framed.
  proto::Frame control_frame(repl::EntryKind kind) const;
  // Role changes: every learner counts as gone (routes, send windows, waiting pushes and timers dropped); they join
  // the syncer that leads afresh. Final states held for the final round stay (Syncer::drop_waiting).
  void forget_learners();
  void follower_housekeeping();
  void leader_housekeeping();  // leases and counters to the standby; drops a standby silent for the lease
  // A hello or other message from a learner while following: refused with not_leader (its route kept for the takeover).
  void refuse_not_leader(const Envelope& env, const MessageHeader& h);
  void retry_waiting_hellos(double t);
  // A checked hello from learner m that has joined a leader of `newer` > epoch: refused with not_leader and recorded
  // (a Standby record "epoch_hint", rate limited); nothing else changes. Only the other syncer's word makes a leader
  // step down (on_replica_message).
  void refuse_newer_epoch(const Envelope& env, int64_t m, int64_t newer);
  // A not_leader reject to learner m on `route` (not counted as a refusal: it is how a pair works).
  void send_not_leader(const std::string& route, int64_t m, const std::string& text);
  // The node counters (counters()) of a checkpoint or of the leader: what --resume and a takeover continue from.
  void load_counters(const nlohmann::json& c, double down);

  // Prometheus snapshot.
  mutable std::mutex prom_mu;
  std::string prom_text;

  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  // Never throws: a record the sink cannot take (a full disk, a sink's own error) is counted, not fatal. Peer text
  // in records is cut with clip_utf8 (util/text.h) before it gets here, and `deloco syncer`'s sink dumps with
  // invalid UTF-8 replaced, so a peer's bytes cannot make a record throw either.
  // A typed record (records/kinds.h), stamped with the unix time.
  template <class R> void emit(R r) noexcept {
    try {
      r.t = proto::unix_now();
      if (record) record(rec::to_json(r));
    } catch (...) {
      ++record_errors;
    }
  }
  // A record already in JSON form (the suppressed note, the summary's "done"), stamped with the unix time.
  void emit_json(nlohmann::json j) noexcept {
    try {
      j["t"] = proto::unix_now();
      if (record) record(j);
    } catch (...) {
      ++record_errors;
    }
  }
  // Emits `r` unless 20 records under `key` were already logged in the current 10 s window; the 21st becomes one
  // "<kind>_suppressed" note (rec::suppressed_record). Counting is the caller's (exact); this only keeps a flood
  // from filling the disk.
  template <class R> void log_limited(const std::string& key, R r) {
    const int64_t turn = log_turn(key);
    if (turn <= 20) emit(std::move(r));
    else if (turn == 21) emit_json(rec::suppressed_record(R::kKind, key));
  }
  // The count of records under `key` in its current 10 s window, this one included.
  int64_t log_turn(const std::string& key);
  int64_t alive_count() const {
    int64_t n = 0;
    for (const auto& p : peers) n += p.alive ? 1 : 0;
    return n;
  }
  int64_t total_tokens() const {
    int64_t n = 0;
    for (const auto& p : peers) n += p.tokens;
    return n;
  }
  // Every connected, unfinished learner's reported step has stood still longer than its patience,
  // max(4·net.dead_after, 20·its step time): training is not advancing although nothing waits at the syncer (a
  // deadlock, or learners all blocked). False when no such learner is connected.
  bool blocked_learners(double t) const;
  bool all_retired() const {
    for (int64_t m = 0; m < M; ++m)
      if (!retired[m]) return false;
    return true;
  }
  std::vector<bool> retired;

  // ---- rejections -------------------------------------------------------------------------------------------
  // `counter`: the name counted and logged ("" : the code's name; the core's own reasons are finer). `detail` may
  // quote the peer: it is cut to 400 bytes of valid UTF-8 for the record and the reject frame.
  void ack_leave(const std::string& route, const MessageHeader& leave, const std::string& reason);
  void reject(const std::string& route, int64_t learner, int64_t fragment, proto::RejectReason code, const std::string& detail,
              const std::string& counter = "");
  // An exception escaped a message's handler: counted and logged as handler_error, answered with a reject frame.
  void handler_error(const Envelope& env, const std::string& what) noexcept;


  void send_to(int64_t m, const proto::Frame& f) {
    if (!peers[m].alive || peers[m].route.empty()) return;
    tx->send(peers[m].route, f.header, f.payload);
  }
  // The send window (docs/runtime.md, "Flow control"): queues merged fragment p (local) of `version` for learner m,
  // replacing an older one of p not yet sent, then pump(m).
  void queue_broadcast(int64_t m, int64_t p, const syncer_detail::Latest& b);
  // The delta broadcast: adds the core's delta payload of fragment p's merge to `b` (a fragment_delta frame).
  void attach_delta(int64_t p, const std::shared_ptr<const std::string>& delta, syncer_detail::Latest* b) const;
  // Hands learner m's queued broadcasts to the transport, oldest merge first, while its window allows: nothing
  // unacknowledged, or the unacknowledged bytes plus the next one within send_window (a learner that never
  // acknowledges, an older build, gets every one at once). Nothing while a state download to it is outstanding: the
  // download carries the state, and what was merged since waits behind it anyway.
  void pump(int64_t m);
  // Learner m's connection was lost or replaced: what was queued for it goes (a rejoin's welcome or download brings
  // the state), and what was in flight on the old connection is no longer counted.
  void reset_window(syncer_detail::Peer& P) {
    P.missed = true;
    P.drop_queued();
    P.in_flight.clear();
    P.dl_busy_from = -1;
    P.dl_bytes = P.dl_seconds = 0;
    P.in_flight_bytes = 0;
  }
  // Learner m is back after being counted lost, without a download: queues the latest broadcast of every merged
  // fragment (it missed those made meanwhile; the send window sends each fragment's newest once).
  void catch_up(int64_t m);
  // The silence (seconds) beyond net.dead_after that a link's own traffic can cause, capped at 20 net.dead_after: a
  // heartbeat queued behind two frames (the send windows) at their measured time on that link.
  double patience(const Ema& e) const { return e.seeded ? std::min(2 * e.value, patience_cap()) : 0.0; }
  // The most patience a link gets (the learners bound what a syncer says by the same, SyncerLink::set_patience).
  double patience_cap() const { return 20 * cfg.net.dead_after; }
  // The acknowledgement of broadcasts up to sequence number `seq`: measures each one's time in flight.
  void acknowledge(int64_t m, int64_t seq, double t);
  // Before any broadcast on P's link was measured: its first estimate from a transfer of `bytes` that took `seconds`
  // on the same link (a state download, a push), scaled to one largest broadcast frame (half the send window).
  // Liveness allows for it (patience) until real broadcasts are measured. Nothing when seeded or seconds ≤ 0.
  void seed_broadcast_time(syncer_detail::Peer& P, double bytes, double seconds) const {
    if (P.broadcast_time.seeded || !(seconds > 0) || !(bytes > 0)) return;
    P.broadcast_time.add(static_cast<double>(send_window) / 2 / (bytes / seconds), cfg.sync.ema);
  }
  // The patience announced to P's learner (SyncerBeat::patience). Measured (or seeded) broadcast time: patience().
  // None measured yet while broadcasts are on their way or about to go (`broadcast_next`): the cap, 20
  // net.dead_after, as for a push announced on an unmeasured link. At 1 Mbit/s the larger model's first broadcast
  // went out before that learner's first push had arrived; the heartbeat queued behind it arrived 3 s late and
  // the learner counted the syncer gone, rejoining for 18 s. Nothing while the link carries none.
  double announced_patience(const syncer_detail::Peer& P, bool broadcast_next) const {
    if (P.broadcast_time.seeded) return patience(P.broadcast_time);
    return P.acks && (broadcast_next || !P.in_flight.empty()) ? patience_cap() : 0.0;
  }
  // A heartbeat frame to learner m carrying b (the header's round: this syncer's merge count).
  proto::Frame beat_frame(int64_t m, const proto::SyncerBeat& b) const;
  // proto::SyncerBeat to learner m: the pushes read on its connection (after each push, and periodically);
  // `broadcast_next`: a broadcast follows it on the link (see announced_patience).
  void send_beat(int64_t m, bool broadcast_next = false);

  // A learner finished: it no longer counts towards the quorum. Checkpointed at once, so a resumed syncer does
  // not wait for a learner that will never come back.
  void retire(int64_t m, const char* how);

  // ---- messages -------------------------------------------------------------------------------------------
  // Handles one message. Never throws: whatever a handler throws (ours, the core's, libtorch's, bad_alloc) is
  // contained here and counted as handler_error; the syncer carries on. Handlers keep the state consistent if that
  // happens: they parse and check everything, and build what they will send, before they change any state; records
  // and sends come after the change.
  void handle(const Envelope& env);
  void dispatch(const Envelope& env);

  // hello: checks (the header and body ids agree, the id is in range, a CURVE key joins only as the learner its
  // allow-list name learner-N says, a connection's id never changes, no second live process per id), then a
  // welcome and, when asked for, the global state from the shared snapshot. See syncer_node.cpp for when a state
  // download counts as outstanding (one per learner).
  void on_hello(const Envelope& env, const MessageHeader& h, double t);
  bool download_outstanding(const syncer_detail::Peer& P, double t) const;
  // The current global state as a shared snapshot: encoded on first use after the fragment versions changed.
  std::shared_ptr<const syncer_detail::StateSnapshot> state_snapshot();

  // Bytes does not expose its owner; keep the shared buffer alive through a copy of the Bytes itself.
  static std::shared_ptr<const void> owner_of(const Bytes& b) { return std::make_shared<Bytes>(b); }

  // A fragment_push, or (`final`) a final_state held for the final round (sync.final_round; Syncer::receive_final).
  void on_push(const Envelope& env, const MessageHeader& h, int64_t m, double t, bool final = false);
  // sync.final_round, once every learner retired: the final model from the final states (Syncer::final_round,
  // journaled), final_merge records.
  void final_round();

  // ---- merging --------------------------------------------------------------------------------------------
  // The core's round of fragment p now (Syncer::on_round): arms its timer, then finish_round().
  void try_merge(int64_t p);
  // What the node does with a round's result (on_round, or drain at the end): tells the contributors of a rolled-back
  // round, or counts the merge, checkpoints, encodes and broadcasts the flat Θ_p, reports ξ_sync (the merge timed
  // from `start`) and records it.
  void finish_round(int64_t p, double t, std::chrono::steady_clock::time_point start, const RoundResult& r);

  // ---- evaluation, checkpoints, status -----------------------------------------------------------------------
  // Time the syncer spent not listening (an evaluation, a checkpoint) is not the learners' silence.
  // The excuse is bounded: a live peer's next message waits in the queue behind at most one message of every other
  // sender (M learners, the standby) and one timer's work, each at most the longest stretch, so more is not owed.
  // Unbounded, a syncer busy nearly all the time (a checkpoint after every merge on a slow disk, merges back to back)
  // never found a dead peer silent: a restarted learner's hello waited for its old connection forever.
  void excuse_peers(double busy_seconds) {
    for (auto& p : peers) {
      p.longest_busy = std::max(p.longest_busy, busy_seconds);
      const double bound = p.last_spoke + static_cast<double>(M + 2) * p.longest_busy;
      p.last_heard = std::min(p.last_heard + busy_seconds, std::max(p.last_heard, bound));
      p.advanced_at += busy_seconds;
    }
  }

  // final: the "final_eval" record (the end of the run), else "eval".
  void evaluate(bool final);

  nlohmann::json counters() const;

  // final: the end of a finished run (every learner retired): the run's final global model. Every merge it covers
  // becomes visible (GroupCommit::committed).
  void checkpoint(bool final = false);

  // ---- group commit (checkpoint_every > 0; group_commit.h): durable before anyone sees it ----------------------
  GroupCommit<syncer_detail::Latest, rec::Merge> group;
  // Pushes and heartbeats may be handled before a due commit: they show nothing of Θ (a hello's download, a state
  // chunk, the standby's image would show a merge the disk lacks).
  bool may_gather(const Envelope& env) const;
  void commit() { checkpoint(); }
  // latest[p] queued to every live learner that has not retired.
  void broadcast_latest(int64_t p);

  void restore_from(const std::string& out_dir);

  double elapsed() const { return prior_elapsed + (first_join >= 0 ? now() - first_join : 0.0); }
  double uptime() const { return run_uptime(prior_stalled + stalled, elapsed()); }
  double goodput() const;

  void housekeeping();
  // The leader's receive found nothing to read at t: everything that was queued has been handled.
  void inbox_empty(double t) {
    for (auto& p : peers)
      if (p.waiting_hello && p.waiting_drained < 0) p.waiting_drained = t;
  }

  // Every refusal but refused joins: the summary's contributions_rejected.
  int64_t contribution_rejects() const { return total_rejects() - joins_refused; }
  int64_t total_rejects() const {
    int64_t n = 0;
    for (const auto& [k, v] : rejects) n += v;
    return n;
  }

  double next_wakeup() const;

  void update_prometheus();

  nlohmann::json summary(double wall) const;
};

}  // namespace deloco
