// LearnerNode::Impl, the learner process (src/roles/learner_node.cpp has the file comment): its state and its
// methods, defined in learner_node.cpp (the main thread: state, the training loop, the public API),
// learner_link.cpp (the comms thread: links to the syncers, hellos, heartbeats, pushes, broadcasts, rejects,
// failover) and learner_fetch.cpp (the join download: chunks from the syncer or from donors, the endgame).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/error.h"
#include "sync/codec_fit.h"
#include "deloco/gpt/train.h"
#include "deloco/group.h"
#include "deloco/learner.h"
#include "deloco/runtime.h"
#include "donor_server.h"
#include "learner_state.h"
#include "protocol.h"
#include "push_window.h"
#include "syncer_link.h"
#include "state_fetch.h"
#include "records/kinds.h"
#include "util/text.h"
#include "wire/quantize.h"

namespace deloco {
namespace fs = std::filesystem;

using proto::RejectReason;
using proto::reject_is_permanent;
using proto::reject_reason_name;
using proto::reject_reason_of;
using proto::unix_now;

struct LearnerNode::Impl {
  RuntimeConfig cfg;
  int64_t id = 0, M = 1;
  RecordSink record;
  std::unique_ptr<Workload> work;
  std::unique_ptr<LearnerCore> core;
  std::vector<Codec> push_ladder;  // net.encoding = auto: the codecs a syncer may tell this learner to push in
  std::shared_ptr<LearnerGroup> group;  // rank 0 of a learner group: the other ranks mirror this one
  std::vector<std::string> group_changed;  // parameters changed since the group's last step boundary
  std::vector<FlatLayout> layouts;         // per (global) fragment
  uint64_t fingerprint = 0, instance = 0;
  WireLimits limits;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  // ---- shared between the main and the comms thread (guarded by mu) ----
  struct Answer {
    int64_t version = 0;
    at::Tensor flat;
    int64_t covers = -1;  // LearnerCore::receive
  };
  struct State {
    proto::Welcome welcome;
    at::Tensor flat;
  };
  // Serving (net.serve): this learner's copy of the syncer's state and the server joining learners fetch it from.
  std::optional<TransportOptions> donor_options;  // how this learner connects to donors when it fetches
  std::unique_ptr<DonorServer> donor;
  // What the comms thread alone touches, per link.
  struct Comms {
    // The link's clocks: hellos, heartbeats, the goodbye, when the syncer counts as gone, failover (syncer_link.h).
    SyncerLink syncer;
    std::optional<proto::Welcome> dl;  // download in progress
    at::Tensor dl_flat;
    std::vector<bool> dl_have;
    int64_t dl_count = 0;
    // Rejoin from peers (docs/reliability.md): a download fetched chunk by chunk from the donors its welcome named
    // and from the syncer (Welcome::fetch): which chunk to ask of whom (state_fetch.h), and per source the donor's
    // connection and the welcome's ticket for it (source 0, the syncer: the link itself).
    std::unique_ptr<StateFetch> fetch;
    struct Donor {
      std::unique_ptr<ClientTransport> tx;  // null: the syncer's link
      Digest ticket{};                      // proto::fetch_ticket
    };
    std::vector<Donor> donors;
    bool first_join_recorded = false;
    uint64_t connections_seen = 0;  // the active transport's connections count (TransportStats) last looked at
    // The highest broadcast sequence number received since the latest welcome (the broadcast header's c_steps):
    // every heartbeat carries it (Beat::broadcasts), and one goes as soon as a broadcast arrives.
    int64_t rx_seq = 0;
  };
  // The connection to one syncer shard (the only one when syncer.shards = 1): the fragments it serves, and whether
  // the learner is joined to it, holds its part of the state and was answered its goodbye. Guarded by mu except
  // `tx` and `c` (comms thread only).
  struct Link {
    std::unique_ptr<ClientTransport> tx;
    ShardPlan plan;
    bool joined = false, have_state = false, left = false, ever_joined = false;
    bool marks_answers = false;  // its broadcasts say which push they answer (proto::Welcome::marks_answers)
    std::optional<State> state_ready;  // a verified download of this shard's part, waiting to be installed
    // The parameters of this shard's part as the process started (its seeded initialisation, model_layout order)
    // and their BLAKE2b-256: offered in the hello (proto::Hello::state_hash) until the link first holds a state, so a
    // syncer still at the same state sends no download (Welcome::state_held). Set before the comms thread starts.
    at::Tensor initial;
    Digest initial_hash{};
    int64_t state_round = -1;          // the welcome round of the last verified download (heartbeats carry it)
    // The pushes on this link: the window, and which are unsettled (push_window.h). Guarded by mu.
    PushWindow window;
    // net.encoding = auto: the push encoding and stretched period this link's syncer told (proto::SyncerBeat; 0:
    // none yet), applied to its fragments at the next step boundary (take_received). Guarded by mu.
    int64_t push_encoding_told = 0, period_told = 0;
    // A standby pair (net.standby; docs/reliability.md): the other syncer of this shard's pair. The learner says
    // hello there too, every second: while it follows it answers not_leader and keeps the route, so that when it
    // takes over it tells this learner at once (a syncer beat with leader_epoch). Then tx and alt swap and the link
    // joins the new leader. Comms thread only, like tx.
    std::unique_ptr<ClientTransport> alt;
    int64_t epoch = 0;  // the highest leader epoch seen on this link (0: none, or no pair); guarded by mu
    // The delta broadcast (comms thread only): per fragment id, the newest whole version this process holds or will
    // hold (a whole fp32 broadcast, or the last delta applied to one): what the next fragment_delta is added to. The
    // fragments whose delta found another version, told to the syncer with the next heartbeat (Beat::resend).
    std::map<int64_t, std::pair<int64_t, at::Tensor>> exact;
    std::set<int64_t> resend;
    Comms c;
  };
  std::vector<Link> links;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Push> outbox;                 // at most one entry per fragment (a newer push replaces an older)
  std::map<int64_t, Answer> inbox;         // newest merged fragment per fragment id
  std::set<int64_t> refused_pushes;      // fragments whose outstanding push the syncer refused (reject naming it)
  int64_t sync_every_told = 0;           // the latest sync period a syncer beat gave this learner (0: none)
  std::set<int64_t> drop_drifts;         // of those, refused by a norm bound: the learner drops its drift of them
  std::optional<int64_t> resume_step;      // the highest of the shards' first welcomes
  std::vector<int64_t> held_versions;      // the core's versions, as last published by the main thread
  bool welcomed_once = false;
  std::string fatal;                        // set by comms: a refusal that retrying cannot fix
  bool fatal_refused = false;               // fatal is the syncer refusing us (RefusedError), not a comms failure
  proto::Beat beat;
  std::string leave_reason;                 // set by main at the end
  bool comms_stop = false;
  // Pushes: made due by the schedule (main thread), sent, dropped (not joined or refused by the transport),
  // superseded in the outbox, left in it at the end; guarded by mu.
  int64_t pushes_due = 0, pushes = 0, pushes_dropped = 0, pushes_superseded = 0, pushes_unsent_at_end = 0;
  int64_t broadcasts = 0, rejected = 0;
  std::atomic<int64_t> record_errors{0};  // records the sink failed to take (both threads emit)
  int64_t joins_refused = 0;  // refusals of a hello (or of a message before joining): not refused contributions
  int64_t deltas_applied = 0, deltas_unapplied = 0;  // comms thread; read at the end

  std::thread comms;
  std::mutex record_mu;  // both threads emit records

  bool sharded() const { return links.size() > 1; }
  Link& link_of(int64_t fragment) { return links[static_cast<size_t>(links[0].plan.owner[static_cast<size_t>(fragment)])]; }
  bool all_left() const {
    for (const auto& L : links)
      if (!L.left) return false;
    return true;
  }
  bool all_have_state() const {
    for (const auto& L : links)
      if (!L.have_state) return false;
    return true;
  }
  bool any_state_ready() const {
    for (const auto& L : links)
      if (L.state_ready) return true;
    return false;
  }

  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  // Every record of this learner (records/kinds.h) carries the time and the learner id.
  // Never throws: a record the sink cannot take (a full disk) is counted in learner_done's record_errors, and
  // training goes on (the syncer's emit does the same).
  template <class R> void emit(R r) noexcept {
    try {
      r.t = unix_now();
      r.learner = id;
      const nlohmann::json j = rec::to_json(r);
      std::lock_guard<std::mutex> lock(record_mu);
      if (record) record(j);
    } catch (...) {
      record_errors.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // A record about one link: names the shard when the syncer is sharded.
  template <class R> void emit(const Link& L, R r) {
    if (sharded()) r.shard = L.plan.shard;
    emit(std::move(r));
  }

  static rec::BadFrame bad_frame(std::string detail) {
    rec::BadFrame r;
    r.detail = std::move(detail);
    return r;
  }

  MessageHeader header(MessageKind k) const {
    MessageHeader h;
    h.kind = k;
    h.learner_id = static_cast<uint32_t>(id);
    h.fingerprint = fingerprint;
    return h;
  }
  bool send(Link& L, const MessageHeader& h, Bytes payload) { return send_on(*L.tx, h, std::move(payload)); }
  bool send_on(ClientTransport& tx, const MessageHeader& h, Bytes payload) {
    auto f = proto::make_frame(h, std::move(payload), limits);
    return tx.send(f.header, f.payload);
  }

  // A message from the other syncer of this link's pair: a takeover announcement (or a welcome of a newer epoch)
  // moves the link there; everything else from a syncer that does not lead (its not_leader answers) is ignored.
  void handle_alt(Link& L, const Envelope& env);

  void fail_over(Link& L, int64_t new_epoch);

  // ================================ comms thread ================================
  void comms_loop();

  // One link's housekeeping: goodbye, hello, noticing a silent shard, heartbeats, a refused key.
  void tend(Link& L, proto::Beat b, const std::string& reason);

  proto::Hello make_hello(Link& L, const proto::Beat& b);
  void say_hello(Link& L, const proto::Beat& b, double t);

  // The step-time estimate travels in a heartbeat right before the push it belongs to (the push header has no
  // field for it), so the syncer sees the same ξ_step input as the simulator's syncer.
  void send_push(Link& L, const Push& p, proto::Beat b, bool is_joined);

  void handle(Link& L, const Envelope& env);

  void on_welcome(Link& L, const Envelope& env);

  void on_state_chunk(Link& L, const MessageHeader& h, const Envelope& env);

  static bool little_endian();
  // Whether chunk k as received has the size and hash the welcome gave for it (Welcome::chunk_hashes).
  bool chunk_matches(const Link& L, int64_t k, const MessageHeader& h, const Envelope& env) const;

  void accept_chunk(Link& L, int64_t k, const MessageHeader& h, const Envelope& env);

  // ---- rejoin from peers: fetching (the rules: state_fetch.h) ----
  void start_fetch(Link& L, const proto::Welcome& w);
  void end_fetch(Comms& c);

  // Sends the request for chunk k to source i of the fetch; false when it cannot take it now.
  bool request_chunk(Link& L, size_t i, int64_t k);

  // One round of a fetch: donors' answers read, and every source's window refilled (StateFetch::schedule).
  void tend_fetch(Link& L);

  void on_donor_message(Link& L, size_t i, const Envelope& env);

  void caught_lying(Link& L, size_t i, int64_t k, const std::string& what);

  // A broadcast's fragment and its element count, checked against this link's plan.
  int64_t broadcast_fragment(const Link& L, const MessageHeader& h, const char* what) const;

  void on_broadcast(Link& L, const MessageHeader& h, const Envelope& env);

  // A fragment_delta (the delta broadcast): version round − (round − 1), added to the whole version this process
  // holds of the fragment when that is round − 1 (as the syncer computed it, add_delta); otherwise the syncer is
  // asked for the whole fragment (Beat::resend) and the delta is dropped.
  void on_delta(Link& L, const MessageHeader& h, const Envelope& env);
  // The delta broadcast: the state this link just got (a download, or the welcome's "you hold it") is exactly the
  // syncer's Θ at `versions` (per local fragment): kept per fragment (Link::exact), so the first merge after a join
  // can come as a delta instead of the whole fragment in fp32. `flat` is over L.plan.model.
  void seed_exact(Link& L, const at::Tensor& flat, const std::vector<int64_t>& versions);

  // The rest of a broadcast or delta: the answer to the main thread (undefined `flat`: none), the acknowledgement.
  void accept_answer(Link& L, const MessageHeader& h, int64_t p, const at::Tensor& flat);

  // The syncer's heartbeat: liveness, and (a body) the pushes it read on this connection since our hello.
  void on_syncer_beat(Link& L, const Envelope& env);

  void on_reject(Link& L, const MessageHeader& h, const Envelope& env);

  // ================================ main thread ================================
  // Hands downloaded states, refusals and received answers to the core. Returns the fragments whose parameters it
  // overwrote (a state installed, a drift dropped).
  std::vector<int64_t> take_received();

  void publish_versions();

  // Learner-local state (the inner optimizer's moments), so a restarted learner keeps them as in the simulator:
  // committed like a checkpoint, so a crash leaves the previous state or the new one (learner_state.h).
  std::string state_path() const { return learner_state_dir(cfg.learner.state_dir, id); }
  void save_state();
  // Each link's part of the parameters as they are now (before any training or install), and its hash.
  void remember_initial();

  void load_state();

  // ---- the training loop, in the pieces a step-driven caller calls one by one (LearnerNode::start etc.) ----
  using clk = std::chrono::steady_clock;
  static double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }
  enum class Phase { kNew, kTraining, kFinished };
  Phase phase = Phase::kNew;
  double busy = 0, comm_seconds = 0, wait_seconds = 0;
  int64_t tokens = 0, first_step = 0, state_every = 0;
  clk::time_point run_start;

  void stop_comms();
  ~Impl() { stop_comms(); }

  void throw_if_fatal();

  // fatal as its error: RefusedError when the syncer refused us for good, TransportError when comms failed.
  [[noreturn]] void throw_fatal() const {
    if (fatal_refused) throw RefusedError(fatal);
    throw TransportError(fatal);
  }

  // Starts the comms thread and joins: waits (bounded) for the global state so a (re)started learner trains from Θ,
  // not from scratch. Positions the workload at the step the syncer remembers for this learner.
  void begin(const std::atomic<bool>& stop);

  // The step boundary before the next inner step: installs downloaded states, applies the answers whose time has
  // come, and waits as long as the core says (synchronous and streaming DiLoCo). Returns whether to train a step
  // (false: train.steps reached, or `stop`).
  bool boundary(const std::atomic<bool>& stop);
  // The answers due at the boundary after `step` applied (LearnerCore::apply_due), each an `apply` record; the
  // versions published when any was applied or (`installed`) a state was installed.
  std::vector<Applied> apply_answers(int64_t step, bool installed);

  // One inner step was trained (work->step() is the new count) in `dt` seconds: counters, the pushes due, the
  // heartbeat's figures, the progress record, learner-local state.
  void after(const StepResult& r, double dt);

  // Training is over (steps reached or stopped): stops the group, saves local state, says goodbye (a finished
  // learner waits up to net.join_timeout for a syncer that is away, an interrupted one 2 s), stops the comms
  // thread, returns the summary.
  nlohmann::json end();
  // sync.final_round, after the last step: applies the answers as they come (up to net.join_timeout, while their
  // shard is joined), then queues the final state of every fragment they leave unanswered-free ahead of the
  // goodbye; a fragment still unanswered is a push_unsent record (unanswered_at_end).
  void send_final_states();

  // The shards that refused our key and never let us join (comms stopped: read after stop_comms()).
  std::vector<int64_t> refused_links() const;

  nlohmann::json run(const std::atomic<bool>& stop);
};

}  // namespace deloco
