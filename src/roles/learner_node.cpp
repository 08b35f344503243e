// The learner process on the wall clock: a Workload and the learner core (deloco/learner.h) on the main thread,
// all networking on one comms thread.
//
// Main thread, per inner step: hand the answers the comms thread received to the core → the core applies those
// whose time has come (and says whether to wait: synchronous and streaming DiLoCo) → one inner step → the core
// returns the pushes due, already encoded → hand them to the comms thread. The algorithm is the core's; this file
// only moves bytes, keeps time and writes records.
// Comms thread: hello until welcomed (downloading the global parameters in verified chunks), heartbeats, pushes,
// broadcasts into the inbox, noticing a silent syncer (then hello again). One handler per message kind.
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
#include "deloco/gpt/train.h"
#include "deloco/group.h"
#include "deloco/learner.h"
#include "deloco/runtime.h"
#include "donor_server.h"
#include "learner_state.h"
#include "protocol.h"
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
  // Rejoin from peers (docs/reliability.md): a download the learner asks for chunk by chunk, from the donors its
  // welcome named (source 1..) and from the syncer (source 0), each chunk checked against the syncer's hash of it.
  struct Fetch {
    struct Source {
      int64_t donor = -1;  // learner id (-1: the syncer)
      std::unique_ptr<ClientTransport> tx;  // null: the syncer's link
      Digest ticket{};                      // a donor's: the welcome's ticket for it (proto::fetch_ticket)
      std::map<int64_t, double> asked;      // chunk -> when it was asked
      bool banned = false;
      int64_t got = 0, refused = 0, timeouts = 0;
      // A donor still connecting refuses sends: asked again a little later, and given up after kFetchTimeout.
      double retry_at = -1, unready_since = -1;
      double first_at = -1;  // when its first chunk came
    };
    std::vector<Source> src;
    std::deque<int64_t> todo;         // chunks anyone may serve, not yet asked
    std::deque<int64_t> syncer_todo;  // chunks a donor could not serve (or served wrong): the syncer's
    int64_t peer_bytes = 0, lied = 0, duplicates = 0;
    double started = 0;  // the welcome
    double latency_sum = 0;  // seconds from ask to answer, over the chunks answered (the endgame's yardstick)
    int64_t latency_n = 0;
  };
  static constexpr int64_t kFetchWindow = proto::kFetchWindow;  // chunks asked of one source at a time
  static constexpr double kFetchTimeout = 10.0;  // seconds a donor may take for a chunk before the syncer is asked
  // Serving (net.serve): this learner's copy of the syncer's state and the server joining learners fetch it from.
  std::optional<TransportOptions> donor_options;  // how this learner connects to donors when it fetches
  std::unique_ptr<DonorServer> donor;
  // What the comms thread alone touches, per link.
  struct Comms {
    double last_hello = -1e9, last_beat = -1e9, last_heard = -1e9, last_leave = -1e9, hello_sent_at = 0, start = 0;
    std::optional<proto::Welcome> dl;  // download in progress
    at::Tensor dl_flat;
    std::vector<bool> dl_have;
    int64_t dl_count = 0;
    std::unique_ptr<struct Fetch> fetch;  // a download fetched from donors and the syncer (Welcome::fetch)
    bool first_join_recorded = false;
    // CURVE refusals by this syncer (shard): our key is not in its allow-list. libzmq keeps reconnecting with its
    // backoff; each refusal is counted, and recorded at the 1st, 2nd, 4th, 8th, ... (auth_refused).
    uint64_t auth_refusals = 0, auth_logged_at = 0;
    // The highest broadcast sequence number received since the latest welcome (the broadcast header's c_steps):
    // every heartbeat carries it (Beat::broadcasts), and one goes as soon as a broadcast arrives.
    int64_t rx_seq = 0;
    // Hellos handed to the transport since the latest welcome: a hello repeats every net.heartbeat, doubling
    // while unanswered up to net.dead_after, so a cut link does not queue one per heartbeat behind it.
    int64_t hellos_unanswered = 0;
    // The syncer's allowance for silences its own traffic causes on this link (proto::SyncerBeat::patience): the
    // learner counts the syncer gone after net.dead_after + patience.
    double patience = 0;
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
    // Fragments pushed on this link while joined, since it last (re)joined. A (re)join settles each of them as
    // refused: the syncer that answers now may not hold them (a restarted syncer never got them, or lost them
    // with its memory), and waiting for an answer that no syncer holds would block the learner for good.
    std::set<int64_t> unsettled;
    // The push window: the fragments pushed on this link since the latest welcome, in order, from the
    // (sent_base)-th on (the ones before it the syncer acknowledged), and the syncer's count of pushes it read
    // (proto::SyncerBeat). A push waits in the outbox while kPushWindow pushes are unacknowledged (a newer push of
    // its fragment replaces it there), so a full link does not queue stale pushes behind each other.
    std::deque<int64_t> sent;
    int64_t sent_base = 0, pushes_acked = 0;
    bool syncer_acks = false;  // this syncer acknowledges pushes (a heartbeat with a body came): the window applies
    // A standby pair (net.standby; docs/reliability.md): the other syncer of this shard's pair. The learner says
    // hello there too, every second: while it follows it answers not_leader and keeps the route, so that when it
    // takes over it tells this learner at once (a syncer beat with leader_epoch). Then tx and alt swap and the link
    // joins the new leader. Comms thread only, like tx.
    std::unique_ptr<ClientTransport> alt;
    double alt_hello = -1e9;
    int64_t epoch = 0;  // the highest leader epoch seen on this link (0: none, or no pair); guarded by mu
    // The delta broadcast (comms thread only): per fragment id, the newest whole version this process holds or will
    // hold (a whole fp32 broadcast, or the last delta applied to one): what the next fragment_delta is added to. The
    // fragments whose delta found another version, told to the syncer with the next heartbeat (Beat::resend).
    std::map<int64_t, std::pair<int64_t, at::Tensor>> exact;
    std::set<int64_t> resend;
    int64_t unacknowledged() const { return sent_base + static_cast<int64_t>(sent.size()) - pushes_acked; }
    Comms c;
  };
  static constexpr int64_t kPushWindow = 2;
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
  int64_t pushes = 0, pushes_dropped = 0, pushes_superseded = 0, broadcasts = 0, rejected = 0;
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
  template <class R> void emit(R r) {
    r.t = unix_now();
    r.learner = id;
    const nlohmann::json j = rec::to_json(r);
    std::lock_guard<std::mutex> lock(record_mu);
    if (record) record(j);
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
  void handle_alt(Link& L, const Envelope& env) {
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

  void fail_over(Link& L, int64_t new_epoch) {
    std::swap(L.tx, L.alt);
    Comms& c = L.c;
    int64_t step;
    {
      std::lock_guard<std::mutex> lock(mu);
      L.epoch = new_epoch;
      L.joined = false;  // join the new leader now: its welcome settles what was pushed to the old one
      L.syncer_acks = false;
      step = beat.step;
      cv.notify_all();
    }
    c.last_hello = -1e9;
    c.last_heard = now();
    c.hellos_unanswered = 0;
    c.patience = 0;
    c.last_leave = -1e9;
    L.alt_hello = now();  // the old leader hears from us again in a second (it may come back as the standby)
    rec::SyncerFailover r;
    r.step = step;
    r.epoch = new_epoch;
    emit(L, r);
  }

  // ================================ comms thread ================================
  void comms_loop() {
    for (auto& L : links) L.c.start = now();
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
          if (L.joined && L.syncer_acks && L.unacknowledged() >= kPushWindow) continue;
          out = std::move(*it);
          outbox.erase(it);
          break;
        }
        // Goodbye only once every push before it went out, so the syncer merges them before retiring us.
        if (!out && outbox.empty()) reason = leave_reason;
        b = beat;
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

  // One link's housekeeping: goodbye, hello, noticing a silent shard, heartbeats, a refused key.
  void tend(Link& L, proto::Beat b, const std::string& reason) {
    Comms& c = L.c;
    const double t = now();
    if (const uint64_t refused = L.tx->stats().auth_denied; refused > c.auth_refusals) {
      c.auth_refusals = refused;
      if (refused >= 2 * c.auth_logged_at || c.auth_logged_at == 0) {
        c.auth_logged_at = refused;
        rec::AuthRefused r;
        r.refusals = static_cast<int64_t>(refused);
        r.step = b.step;
        r.detail = std::string("the syncer") + (sharded() ? " shard " + std::to_string(L.plan.shard) : "") +
                   " refused this learner's CURVE key (its public key is not in that syncer's net.allow folder); "
                   "retrying with backoff" +
                   (sharded() ? "; the fragments it serves are not merged meanwhile" : "");
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
    if (want_leave && is_joined && t - c.last_leave >= cfg.net.heartbeat) {
      send(L, header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
      send(L, header(MessageKind::kLeave), Bytes::from_string(proto::encode_leave(reason)));
      c.last_leave = t;
      c.last_beat = t;
    }
    // Leaving while the syncer is away: keep saying hello (below) so the goodbye is delivered when it is back.
    if (!is_joined && t - c.last_hello >= hello_interval(c)) say_hello(L, b, t);
    // The same hello as to the active link: if the other syncer leads (this learner started, or restarted, while its
    // active link pointed at the standby), its welcome — with the state download this learner needs — moves the link.
    if (L.alt && t - L.alt_hello >= std::max(1.0, 2 * cfg.net.heartbeat)) {
      send_on(*L.alt, header(MessageKind::kHello), Bytes::from_string(proto::encode_hello(make_hello(L, b))));
      L.alt_hello = t;
    }
    // A download in progress is the syncer talking (its chunks may each take seconds on a slow link): the join's
    // own bound, net.join_timeout, applies to it instead.
    const double allowed = c.dl ? std::max(cfg.net.join_timeout, cfg.net.dead_after) : cfg.net.dead_after + c.patience;
    if (is_joined && t - c.last_heard > allowed) {
      std::lock_guard<std::mutex> lock(mu);
      L.joined = false;
      is_joined = false;
      c.last_leave = -1e9;  // a goodbye waiting for its answer goes again as soon as we are back
      // A download in progress is kept: its chunks may still be on the way, and the syncer sends no second copy
      // while one is outstanding on this connection. The next welcome that carries chunks replaces it.
      cv.notify_all();
      rec::SyncerLost r;
      r.step = b.step;
      r.silent_seconds = t - c.last_heard;
      emit(L, r);
    }
    if (is_joined && t - c.last_beat >= cfg.net.heartbeat) {
      send(L, header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
      c.last_beat = t;
    }
  }

  proto::Hello make_hello(Link& L, const proto::Beat& b) {
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
  void say_hello(Link& L, const proto::Beat& b, double t) {
    const proto::Hello h = make_hello(L, b);
    if (send(L, header(MessageKind::kHello), Bytes::from_string(proto::encode_hello(h)))) ++L.c.hellos_unanswered;
    L.c.last_hello = L.c.hello_sent_at = t;
  }
  // net.heartbeat, doubling with each hello the transport took and no welcome answered, up to net.dead_after.
  double hello_interval(const Comms& c) const {
    const double cap = std::max(cfg.net.heartbeat, cfg.net.dead_after);
    return std::min(cap, cfg.net.heartbeat * static_cast<double>(int64_t{1} << std::min<int64_t>(c.hellos_unanswered, 6)));
  }

  // The step-time estimate travels in a heartbeat right before the push it belongs to (the push header has no
  // field for it), so the syncer sees the same ξ_step input as the simulator's syncer.
  void send_push(Link& L, const Push& p, proto::Beat b, bool is_joined) {
    bool sent = false;
    if (is_joined) {
      b.step_time = p.step_time;
      {
        std::lock_guard<std::mutex> lock(mu);
        b.state_round = L.state_round;
      }
      b.broadcasts = L.c.rx_seq;
      send(L, header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
      L.c.last_beat = now();
      MessageHeader h = header(MessageKind::kFragmentPush);
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
        emit(L, r);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    (sent ? pushes : pushes_dropped) += 1;
    if (sent) {
      L.unsettled.insert(p.fragment);
      L.sent.push_back(p.fragment);
    } else {  // not sent (not joined, or the transport refused it): no answer will come for it
      refused_pushes.insert(p.fragment);
      cv.notify_all();
    }
  }

  void handle(Link& L, const Envelope& env) {
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
    L.c.last_heard = now();
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

  void on_welcome(Link& L, const Envelope& env) {
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
          c.last_hello = -1e9;  // hello again at once, asking for the state
          return;
        }
      }
    }
    if (!L.joined && !L.unsettled.empty()) {
      // The syncer says how many of our pushes on this connection it read before this hello (w.pushes): those
      // will be answered. The others never arrived: they count as refused (their progress goes in the next push).
      // Unknown (another connection, an older syncer): every unanswered push counts as refused.
      std::set<int64_t> lost;
      const int64_t total = L.sent_base + static_cast<int64_t>(L.sent.size());
      if (w.pushes >= 0 && w.pushes <= total) {
        for (int64_t i = std::max(w.pushes, L.sent_base); i < total; ++i)
          lost.insert(L.sent[static_cast<size_t>(i - L.sent_base)]);
      } else {
        lost = L.unsettled;
      }
      std::vector<int64_t> settled;
      for (int64_t p : L.unsettled)
        if (lost.count(p)) settled.push_back(p);
      if (!settled.empty()) {
        refused_pushes.insert(settled.begin(), settled.end());
        for (int64_t p : settled) L.unsettled.erase(p);
        rec::PushesSettled r;
        r.fragments = settled;
        r.detail = w.pushes >= 0 ? "joined again: pushes sent before the join that the syncer never read count as "
                                   "refused (their progress goes in the next push)"
                                 : "joined again: pushes sent before the join count as refused (their progress goes "
                                   "in the next push)";
        emit(L, r);
      }
    }
    L.marks_answers = w.marks_answers;
    L.sent.clear();
    L.sent_base = 0;
    L.pushes_acked = 0;
    c.rx_seq = 0;
    c.hellos_unanswered = 0;
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
      c.fetch.reset();
      if (donor) donor->set_served(L.plan.shard, L.initial, w.versions);
      L.state_ready = State{w, L.initial};
      L.have_state = true;
      L.state_round = static_cast<int64_t>(w.round);
      L.initial = at::Tensor();  // one copy of the part, kept only until the first state
      rec::Joined r;
      r.step = beat.step;
      r.syncer_round = static_cast<int64_t>(w.round);
      r.resume_step = w.resume_step;
      r.hello_seconds = now() - c.hello_sent_at;
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
      c.dl_flat = torch::empty({w.elements}, torch::kFloat);
      c.dl_have.assign(static_cast<size_t>(w.chunks), false);
      c.dl_count = 0;
      c.fetch.reset();
      if (w.fetch) start_fetch(L, w);
    }
    if (!c.first_join_recorded || w.chunks == 0) {
      rec::Joined r;  // a download follows: "welcome" now, "joined" when it is verified
      r.step = beat.step;
      r.syncer_round = static_cast<int64_t>(w.round);
      r.resume_step = w.resume_step;
      r.hello_seconds = now() - c.hello_sent_at;
      if (w.chunks > 0) emit(L, rec::Welcome{r});
      else emit(L, r);
    }
    c.first_join_recorded = true;
    cv.notify_all();
  }

  void on_state_chunk(Link& L, const MessageHeader& h, const Envelope& env) {
    Comms& c = L.c;
    if (!c.dl || h.round != c.dl->round) return;  // a chunk of an abandoned download
    const int64_t k = h.fragment_id;
    if (k >= c.dl->chunks) throw WireError("state chunk index out of range");
    if (c.fetch) {
      Fetch::Source& sy = c.fetch->src[0];
      const auto asked = sy.asked.find(k);
      const double asked_at = asked == sy.asked.end() ? -1 : asked->second;
      if (!chunk_matches(L, k, h, env)) {  // the syncer's own chunk is not what its welcome said: start again
        emit(L, bad_frame("state chunk " + std::to_string(k) + " from the syncer does not match its hash; joining again"));
        std::lock_guard<std::mutex> lock(mu);
        L.joined = false;
        c.dl.reset();
        c.fetch.reset();
        return;
      }
      if (!c.dl_have[static_cast<size_t>(k)]) answered(*c.fetch, sy, asked_at);
    }
    accept_chunk(L, k, h, env);
  }

  static bool little_endian() {
    const uint32_t one = 1;
    unsigned char b;
    std::memcpy(&b, &one, 1);
    return b == 1;
  }
  // Whether chunk k as received has the size and hash the welcome gave for it (Welcome::chunk_hashes).
  bool chunk_matches(const Link& L, int64_t k, const MessageHeader& h, const Envelope& env) const {
    const proto::Welcome& w = *L.c.dl;
    const int64_t first = k * w.chunk_elements, n = std::min(w.chunk_elements, w.elements - first);
    if (h.encoding != Encoding::kFp32 || static_cast<int64_t>(h.element_count) != n ||
        env.payload.size() != static_cast<size_t>(n) * 4 || !little_endian())
      return false;
    return digests_equal(blake2b256(env.payload.data(), env.payload.size()), w.chunk_hashes[static_cast<size_t>(k)]);
  }

  void accept_chunk(Link& L, int64_t k, const MessageHeader& h, const Envelope& env) {
    Comms& c = L.c;
    const int64_t first = k * c.dl->chunk_elements, n = std::min(c.dl->chunk_elements, c.dl->elements - first);
    if (static_cast<int64_t>(h.element_count) != n) throw WireError("state chunk has the wrong size");
    decode_floats_into(env.payload.data(), env.payload.size(), h.encoding, static_cast<size_t>(n),
                       c.dl_flat.data_ptr<float>() + first);
    if (!c.dl_have[static_cast<size_t>(k)]) {
      c.dl_have[static_cast<size_t>(k)] = true;
      ++c.dl_count;
    }
    if (c.fetch)  // asked of two sources (the endgame): the other's answer, when it comes, is dropped
      for (auto& s : c.fetch->src) s.asked.erase(k);
    if (c.dl_count < c.dl->chunks) return;
    const Digest hash = blake2b256(c.dl_flat.data_ptr<float>(), static_cast<size_t>(c.dl->elements) * 4);
    std::lock_guard<std::mutex> lock(mu);
    if (!digests_equal(hash, c.dl->state_hash)) {
      emit(L, bad_frame("global state hash mismatch; downloading again"));
      L.joined = false;  // hello again with want_state
    } else {
      if (donor) donor->set_served(L.plan.shard, c.dl_flat, c.dl->versions);
      L.state_ready = State{*c.dl, c.dl_flat};
      L.have_state = true;
      L.initial = at::Tensor();
      L.state_round = static_cast<int64_t>(c.dl->round);  // tells the syncer the download arrived
      rec::Joined r;
      r.step = beat.step;
      r.syncer_round = static_cast<int64_t>(c.dl->round);
      r.download_bytes = c.dl->elements * 4;
      r.download_seconds = now() - c.hello_sent_at;
      r.resume_step = c.dl->resume_step;
      if (c.fetch) {
        r.peer_bytes = c.fetch->peer_bytes;
        r.donors = static_cast<int64_t>(c.fetch->src.size()) - 1;
        r.donors_lied = c.fetch->lied;
        r.welcome_seconds = c.fetch->started - c.hello_sent_at;
        std::vector<int64_t> got;
        std::vector<double> first;
        int64_t refused = 0, timeouts = 0;
        for (const auto& s : c.fetch->src) {
          got.push_back(s.got);
          first.push_back(s.first_at < 0 ? -1.0 : s.first_at - c.fetch->started);
          refused += s.refused;
          timeouts += s.timeouts;
        }
        r.source_chunks = std::move(got);
        r.source_first_seconds = std::move(first);
        r.donor_refused = refused;
        r.donor_timeouts = timeouts;
        r.endgame_asks = c.fetch->duplicates;
      }
      emit(L, r);
      cv.notify_all();
    }
    c.dl.reset();
    c.fetch.reset();
  }

  // ---- rejoin from peers: fetching ----
  void start_fetch(Link& L, const proto::Welcome& w) {
    auto f = std::make_unique<Fetch>();
    f->started = now();
    f->src.emplace_back();  // the syncer
    if (donor_options)
      for (const auto& d : w.donors) {
        if (d.learner == id) continue;
        TransportOptions o = *donor_options;
        o.server_public_key = d.key;
        if (!o.plaintext && d.key.empty()) continue;
        Fetch::Source s;
        s.donor = d.learner;
        s.ticket = d.ticket;
        try {
          s.tx = make_zmq_client(d.endpoint, o);
        } catch (const std::exception& e) {
          emit(L, bad_frame("cannot dial donor learner " + std::to_string(d.learner) + " at " + d.endpoint + ": " + e.what()));
          continue;
        }
        f->src.push_back(std::move(s));
      }
    for (int64_t k = 0; k < w.chunks; ++k) f->todo.push_back(k);
    L.c.fetch = std::move(f);
  }

  bool request_chunk(Link& L, size_t i, int64_t k) {
    Comms& c = L.c;
    Fetch::Source& s = c.fetch->src[i];
    MessageHeader h = header(MessageKind::kStateRequest);
    h.fragment_id = static_cast<uint32_t>(k);
    h.round = c.dl->round;
    proto::StateRequest r;
    r.shard = L.plan.shard;
    r.elements = c.dl->elements;
    r.chunk_elements = c.dl->chunk_elements;
    r.versions = c.dl->versions;
    if (s.tx) {  // a donor serves only with the ticket the welcome gave for it
      r.learner = id;
      r.ticket = s.ticket;
    }
    Bytes body = Bytes::from_string(proto::encode_state_request(r));
    const bool sent = s.tx ? send_on(*s.tx, h, std::move(body)) : send(L, h, std::move(body));
    const double t = now();
    if (!sent) {  // not connected yet, or a full queue: the caller keeps the chunk, this source waits a moment
      s.retry_at = t + 0.02;
      if (s.unready_since < 0) s.unready_since = t;
      if (s.tx && t - s.unready_since > kFetchTimeout) s.banned = true;
      return false;
    }
    s.unready_since = -1;
    s.asked[k] = t;
    return true;
  }

  // One round of a fetch: donors' answers, donors too slow, and every source's window refilled.
  void tend_fetch(Link& L) {
    Comms& c = L.c;
    if (!c.fetch || !c.dl) return;
    for (size_t i = 1; c.fetch && i < c.fetch->src.size(); ++i) {
      Envelope env;
      for (int n = 0; n < 16 && c.fetch && c.fetch->src[i].tx->receive(&env, std::chrono::milliseconds(0)); ++n)
        on_donor_message(L, i, env);
    }
    if (!c.fetch || !c.dl) return;
    Fetch& f = *c.fetch;
    const double t = now();
    for (size_t i = 1; i < f.src.size(); ++i) {
      Fetch::Source& s = f.src[i];
      for (auto it = s.asked.begin(); it != s.asked.end();) {
        if (t - it->second < kFetchTimeout) {
          ++it;
          continue;
        }
        f.syncer_todo.push_back(it->first);
        it = s.asked.erase(it);
        if (++s.timeouts >= 2) s.banned = true;
      }
      if (s.banned) {
        for (const auto& [k, at] : s.asked) f.syncer_todo.push_back(k);
        s.asked.clear();
      }
    }
    // The syncer: chunks no donor can serve first, then any; donors: any.
    Fetch::Source& sy = f.src[0];
    while (t >= sy.retry_at && static_cast<int64_t>(sy.asked.size()) < kFetchWindow &&
           (!f.syncer_todo.empty() || !f.todo.empty())) {
      int64_t k;
      if (!f.syncer_todo.empty()) {
        k = f.syncer_todo.front();
        f.syncer_todo.pop_front();
      } else {  // from the end: the donors work from the front, so the two meet in the middle
        k = f.todo.back();
        f.todo.pop_back();
      }
      if (!c.dl_have[static_cast<size_t>(k)] && !request_chunk(L, 0, k)) {
        f.syncer_todo.push_front(k);  // the syncer's own queue keeps it
        break;
      }
    }
    for (size_t i = 1; i < f.src.size(); ++i) {
      Fetch::Source& s = f.src[i];
      while (!s.banned && t >= s.retry_at && static_cast<int64_t>(s.asked.size()) < kFetchWindow && !f.todo.empty()) {
        const int64_t k = f.todo.front();
        f.todo.pop_front();
        if (!c.dl_have[static_cast<size_t>(k)] && !request_chunk(L, i, k)) {
          f.todo.push_front(k);
          break;
        }
      }
    }
    if (f.todo.empty() && f.syncer_todo.empty()) endgame(L, t);
  }

  // The end of a fetch: every chunk is asked of someone, and the download waits for the slowest source's last ones.
  // A source with room in its window is asked too for a chunk another source has had longest, once that chunk has
  // waited twice the fetch's mean time from ask to answer so far (each chunk of at most two donors, and the syncer,
  // which always holds the versions asked for, may be the third); the first answer counts, the others are dropped.
  void endgame(Link& L, double t) {
    Fetch& f = *L.c.fetch;
    if (f.latency_n == 0) return;
    const double overdue = t - 2 * f.latency_sum / static_cast<double>(f.latency_n);
    std::map<int64_t, std::pair<int, double>> out;  // chunk -> sources asked, earliest ask
    for (const auto& s : f.src)
      for (const auto& [k, at] : s.asked) {
        auto [it, fresh] = out.try_emplace(k, 0, at);
        ++it->second.first;
        it->second.second = std::min(it->second.second, at);
      }
    for (size_t i = 0; i < f.src.size(); ++i) {
      Fetch::Source& s = f.src[i];
      while (!s.banned && t >= s.retry_at && static_cast<int64_t>(s.asked.size()) < kFetchWindow) {
        int64_t pick = -1;
        double oldest = 0;
        for (const auto& [k, na] : out)
          if ((i == 0 || na.first == 1) && na.second < overdue && !s.asked.count(k) && !L.c.dl_have[static_cast<size_t>(k)] &&
              (pick < 0 || na.second < oldest)) {
            pick = k;
            oldest = na.second;
          }
        if (pick < 0 || !request_chunk(L, i, pick)) break;
        ++out[pick].first;
        ++f.duplicates;
      }
    }
  }

  void on_donor_message(Link& L, size_t i, const Envelope& env) {
    Comms& c = L.c;
    Fetch& f = *c.fetch;
    Fetch::Source& s = f.src[i];
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
    if ((h.kind != MessageKind::kReject && h.round != c.dl->round) || !s.asked.count(k)) return;
    const double asked_at = s.asked[k];
    s.asked.erase(k);
    if (h.kind == MessageKind::kReject) {  // it holds other versions now, or is busy: the syncer serves the chunk
      f.syncer_todo.push_back(k);
      ++s.refused;
      if (proto::reject_reason_of(h) != RejectReason::kBusy && s.refused >= 3) s.banned = true;
      return;
    }
    if (h.kind != MessageKind::kStateChunk) return caught_lying(L, i, k, std::string("answered with ") + kind_name(h.kind));
    if (!chunk_matches(L, k, h, env))
      return caught_lying(L, i, k, "chunk " + std::to_string(k) + " does not match the syncer's hash of it");
    answered(f, s, asked_at);
    f.peer_bytes += static_cast<int64_t>(env.payload.size());
    accept_chunk(L, k, h, env);
  }

  // A source's answer to a chunk it was asked for (at asked_at; -1: not asked of it) counted: the per-source figures
  // of the joined record and the endgame's mean answer time.
  void answered(Fetch& f, Fetch::Source& s, double asked_at) const {
    const double t = now();
    ++s.got;
    if (s.first_at < 0) s.first_at = t;
    if (asked_at >= 0) {
      f.latency_sum += t - asked_at;
      ++f.latency_n;
    }
  }

  void caught_lying(Link& L, size_t i, int64_t k, const std::string& what) {
    Fetch& f = *L.c.fetch;
    Fetch::Source& s = f.src[i];
    if (k >= 0) f.syncer_todo.push_back(k);
    for (const auto& [q, at] : s.asked) f.syncer_todo.push_back(q);
    s.asked.clear();
    if (!s.banned) ++f.lied;
    s.banned = true;
    rec::PeerLied r;
    r.donor = s.donor;
    r.chunk = k;
    r.detail = clip_utf8(what, 300) + "; this donor is used no more, the syncer serves what it was asked";
    emit(L, r);
  }

  // A broadcast's fragment and its element count, checked against this link's plan.
  int64_t broadcast_fragment(const Link& L, const MessageHeader& h, const char* what) const {
    const int64_t p = h.fragment_id;
    if (p >= static_cast<int64_t>(layouts.size())) throw WireError(std::string(what) + " of an unknown fragment");
    if (L.plan.local[static_cast<size_t>(p)] < 0)
      throw WireError(std::string(what) + " of fragment " + std::to_string(p) + ", which shard " +
                      std::to_string(L.plan.shard) + " does not serve");
    if (static_cast<int64_t>(h.element_count) != layouts[static_cast<size_t>(p)].elements)
      throw WireError(std::string(what) + " has the wrong size");
    return p;
  }

  void on_broadcast(Link& L, const MessageHeader& h, const Envelope& env) {
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

  // A fragment_delta (the delta broadcast): version round − (round − 1), added to the whole version this process
  // holds of the fragment when that is round − 1 (as the syncer computed it, add_delta); otherwise the syncer is
  // asked for the whole fragment (Beat::resend) and the delta is dropped.
  void on_delta(Link& L, const MessageHeader& h, const Envelope& env) {
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

  // The rest of a broadcast or delta: the answer to the main thread (undefined `flat`: none), the acknowledgement.
  void accept_answer(Link& L, const MessageHeader& h, int64_t p, const at::Tensor& flat) {
    std::unique_lock<std::mutex> lock(mu);
    if (flat.defined()) {
      auto it = inbox.find(p);
      if (it == inbox.end() || it->second.version < static_cast<int64_t>(h.round))
        inbox[p] = Answer{static_cast<int64_t>(h.round), flat, L.marks_answers ? static_cast<int64_t>(h.c_tokens) : -1};
      L.unsettled.erase(p);  // an answer for p answers our push of p too (the core clears it when it applies)
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
    lock.unlock();
    send(L, header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
    L.c.last_beat = now();
  }

  // The syncer's heartbeat: liveness, and (a body) the pushes it read on this connection since our hello.
  void on_syncer_beat(Link& L, const Envelope& env) {
    if (env.payload.empty()) return;  // an older syncer
    const proto::SyncerBeat sb = proto::parse_syncer_beat(env.payload.data(), env.payload.size());
    L.c.patience = std::min(sb.patience, 20 * cfg.net.dead_after);  // the syncer caps it too; a peer's value is bounded here
    std::lock_guard<std::mutex> lock(mu);
    L.syncer_acks = true;
    L.pushes_acked = sb.pushes;
    if (sb.sync_every > 0) sync_every_told = sb.sync_every;  // dynamic local updates: applied at the next boundary
    while (!L.sent.empty() && L.sent_base < L.pushes_acked) {
      L.sent.pop_front();
      ++L.sent_base;
    }
  }

  void on_reject(Link& L, const MessageHeader& h, const Envelope& env) {
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
      L.unsettled.erase(static_cast<int64_t>(h.fragment_id));
      if (code == RejectReason::kDeltaTooLarge) drop_drifts.insert(static_cast<int64_t>(h.fragment_id));
      cv.notify_all();
    }
    if (reject_is_permanent(code) || (code == RejectReason::kDuplicateId && now() - L.c.start > cfg.net.join_timeout)) {
      fatal_refused = true;
      fatal = "the syncer" + (sharded() ? " shard " + std::to_string(L.plan.shard) : std::string()) +
              " refused learner " + std::to_string(id) + ": " + why;
      cv.notify_all();
    }
  }

  // ================================ main thread ================================
  // Hands downloaded states, refusals and received answers to the core. Returns the fragments whose parameters it
  // overwrote (a state installed, a drift dropped).
  std::vector<int64_t> take_received() {
    std::vector<std::pair<size_t, State>> states;
    std::map<int64_t, Answer> answers;
    std::set<int64_t> refused, drops;
    int64_t told = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
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

  void publish_versions() {
    std::lock_guard<std::mutex> lock(mu);
    held_versions = core->versions();
  }

  // Learner-local state (the inner optimizer's moments), so a restarted learner keeps them as in the simulator:
  // committed like a checkpoint, so a crash leaves the previous state or the new one (learner_state.h).
  std::string state_path() const { return learner_state_dir(cfg.learner.state_dir, id); }
  void save_state() {
    if (cfg.learner.state_dir.empty()) return;
    TensorFile opt;
    opt.tensors = work->optimizer_state();
    nlohmann::json manifest{{"kind", "learner"}, {"learner", id}, {"step", work->step()},
                            {"model_fingerprint", work->fingerprint()}};
    save_learner_state(state_path(), work->step(), manifest, opt);
  }
  // Each link's part of the parameters as they are now (before any training or install), and its hash.
  void remember_initial() {
    std::map<std::string, at::Tensor> by_name;
    for (const auto& [name, t] : work->parameters()) by_name.emplace(name, t);
    for (Link& L : links) {
      std::vector<at::Tensor> ts;
      ts.reserve(L.plan.model.names.size());
      for (const auto& name : L.plan.model.names) ts.push_back(by_name.at(name));
      at::Tensor flat = torch::empty({L.plan.model.elements}, torch::kFloat);
      flatten_into(ts, flat.data_ptr<float>());
      L.initial_hash = blake2b256(flat.data_ptr<float>(), static_cast<size_t>(L.plan.model.elements) * 4);
      L.initial = flat;
    }
  }

  void load_state() {
    if (cfg.learner.state_dir.empty()) return;
    const std::string dir = state_path();
    try {
      std::optional<Checkpoint> ck = load_learner_state(dir);
      if (!ck) return;
      if (ck->manifest.value("model_fingerprint", std::string()) != work->fingerprint())
        throw CheckpointError("it was written for another model");
      work->load_optimizer_state(ck->optimizer.tensors);
      rec::StateRestored r;
      r.path = ck->dir;
      r.step = ck->manifest.value("step", int64_t{0});
      emit(r);
    } catch (const std::exception& e) {  // a damaged local state costs the moments, never the run
      // Kept aside (never deleted: a state_dir pointed at the wrong folder loses nothing), so the next save commits
      // into an empty folder, not beside what cannot be read. An older aside copy is replaced.
      const std::string aside = dir + ".unusable";
      std::error_code ec;
      fs::remove_all(aside, ec);
      fs::rename(dir, aside, ec);
      rec::StateUnusable r;
      r.path = dir;
      r.detail = e.what();
      r.kept_at = ec ? std::string() : aside;
      emit(r);
    }
  }

  // ---- the training loop, in the pieces a step-driven caller calls one by one (LearnerNode::start etc.) ----
  using clk = std::chrono::steady_clock;
  static double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }
  enum class Phase { kNew, kTraining, kFinished };
  Phase phase = Phase::kNew;
  double busy = 0, comm_seconds = 0, wait_seconds = 0;
  int64_t tokens = 0, first_step = 0, state_every = 0;
  clk::time_point run_start;

  void stop_comms() {
    {
      std::lock_guard<std::mutex> lock(mu);
      comms_stop = true;
    }
    if (comms.joinable()) comms.join();
  }
  ~Impl() { stop_comms(); }

  void throw_if_fatal() {
    std::lock_guard<std::mutex> lock(mu);
    if (!fatal.empty()) throw_fatal();
  }

  // fatal as its error: RefusedError when the syncer refused us for good, TransportError when comms failed.
  [[noreturn]] void throw_fatal() const {
    if (fatal_refused) throw RefusedError(fatal);
    throw TransportError(fatal);
  }

  // Starts the comms thread and joins: waits (bounded) for the global state so a (re)started learner trains from Θ,
  // not from scratch. Positions the workload at the step the syncer remembers for this learner.
  void begin(const std::atomic<bool>& stop) {
    if (phase != Phase::kNew) throw std::logic_error("LearnerNode: started twice");
    phase = Phase::kTraining;
    remember_initial();
    comms = std::thread([this] {
      try {
        comms_loop();
      } catch (const std::exception& e) {  // a bug or resource failure: surface it on the main thread
        std::lock_guard<std::mutex> lock(mu);
        fatal_refused = false;
        fatal = std::string("comms thread failed: ") + e.what();
        cv.notify_all();
      }
    });
    load_state();
    {
      std::unique_lock<std::mutex> lock(mu);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg.net.join_timeout);
      // A sharded syncer: once one shard's part arrived, a shard still silent after net.dead_after is counted as
      // down, like a shard lost later — its fragments do not hold the others back; its part installs when it is back.
      const auto start = std::chrono::steady_clock::now();
      auto some_down = [&] {
        return sharded() && std::chrono::steady_clock::now() - start > std::chrono::duration<double>(cfg.net.dead_after) &&
               std::any_of(links.begin(), links.end(), [](const Link& L) { return L.have_state; });
      };
      while (!all_have_state() && !some_down() && fatal.empty() && !stop.load() &&
             std::chrono::steady_clock::now() < deadline)
        cv.wait_for(lock, std::chrono::milliseconds(50));
      if (!fatal.empty()) throw_fatal();
      if (!all_have_state() && some_down()) {
        for (const auto& L : links)
          if (!L.have_state)
            emit(L, rec::ShardMissing{{}, "no state from this shard within net.dead_after; training on, its part "
                                          "installs when it answers"});
      } else if (!all_have_state() && !stop.load())
        emit(rec::Alone{{}, std::string("no welcome") + (sharded() ? " from every syncer shard" : "") +
                                " within net.join_timeout; training on, joining when the syncer appears"});
      if (resume_step && *resume_step > work->step()) work->set_step(std::min(*resume_step, cfg.run.train.steps));
    }
    state_every = cfg.learner.state_every > 0 ? cfg.learner.state_every : std::max<int64_t>(100, cfg.sync.sync_every);
    first_step = work->step();
    run_start = clk::now();
  }

  // The step boundary before the next inner step: installs downloaded states, applies the answers whose time has
  // come, and waits as long as the core says (synchronous and streaming DiLoCo). Returns whether to train a step
  // (false: train.steps reached, or `stop`).
  bool boundary(const std::atomic<bool>& stop) {
    if (phase != Phase::kTraining) throw std::logic_error("LearnerNode: not training (start() first, not after finish())");
    for (;;) {
      auto c0 = clk::now();
      throw_if_fatal();
      const std::vector<int64_t> installed = take_received();
      const int64_t step = work->step();
      const std::vector<Applied> applied = core->apply_due(step);
      for (const auto& a : applied) {
        rec::Apply r;
        r.fragment = a.fragment;
        r.version = a.version;
        r.step = step;
        emit(r);
      }
      if (!installed.empty() || !applied.empty()) publish_versions();  // the comms thread compares welcomes against them
      if (group) {
        for (int64_t p : installed)
          for (const auto& name : core->layout(p).names) group_changed.push_back(name);
        for (const auto& a : applied)
          for (const auto& name : core->layout(a.fragment).names) group_changed.push_back(name);
      }
      comm_seconds += secs(c0, clk::now());
      // Synchronous / streaming DiLoCo: the core says which answers must come first. Wait only while joined: the
      // answer of a syncer that went away will not come (the learner trains on and joins again).
      if (const std::vector<int64_t> waiting = core->waiting_for(step); !waiting.empty() && !stop.load()) {
        auto w0 = clk::now();
        // The shards whose answers it waits for.
        std::vector<Link*> from;
        for (int64_t p : waiting)
          if (std::find(from.begin(), from.end(), &link_of(p)) == from.end()) from.push_back(&link_of(p));
        std::unique_lock<std::mutex> lock(mu);
        auto gone = [&] {
          for (Link* L : from)
            if (!L->joined) return L;
          return static_cast<Link*>(nullptr);
        };
        if (Link* L = gone()) {
          lock.unlock();
          core->forget_in_flight(L->plan.fragments);
          rec::WaitAbandoned r;
          r.step = step;
          r.detail = "not joined";
          emit(*L, r);
        } else {
          cv.wait_for(lock, std::chrono::milliseconds(20), [&] {
            return !inbox.empty() || !refused_pushes.empty() || any_state_ready() || gone() || !fatal.empty();
          });
        }
        wait_seconds += secs(w0, clk::now());
        continue;
      }
      return step < cfg.run.train.steps && !stop.load();
    }
  }

  // One inner step was trained (work->step() is the new count) in `dt` seconds: counters, the pushes due, the
  // heartbeat's figures, the progress record, learner-local state.
  void after(const StepResult& r, double dt) {
    const int64_t steps = cfg.run.train.steps;
    busy += dt;
    tokens += r.tokens;
    const int64_t now_step = work->step();
    if (now_step % cfg.run.train.log_every == 0 || now_step == steps) {
      rec::Learner l;
      l.step = now_step;
      l.tokens = tokens;
      l.step_time = dt;
      if (std::isfinite(r.loss)) l.loss = r.loss;  // a caller-trained learner may not say
      emit(l);
    }
    auto c3 = clk::now();
    std::vector<Push> due = core->after_step(now_step, r.tokens, dt);
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& p : due) {
        // A push of the same fragment still waiting (its link's window is full) is replaced: the new one's
        // Θ_p^v − θ_p and counters (kept since its base version) hold its progress too.
        for (auto it = outbox.begin(); it != outbox.end();) {
          if (it->fragment != p.fragment) {
            ++it;
            continue;
          }
          it = outbox.erase(it);
          ++pushes_superseded;
        }
        outbox.push_back(std::move(p));
      }
      beat.step = now_step;
      beat.tokens = std::max(beat.tokens, tokens);
      beat.busy_seconds = busy;
      beat.step_time = core->step_time();
    }
    if (now_step % state_every == 0) save_state();
    comm_seconds += secs(c3, clk::now());
  }

  // Training is over (steps reached or stopped): stops the group, saves local state, says goodbye (a finished
  // learner waits up to net.join_timeout for a syncer that is away, an interrupted one 2 s), stops the comms
  // thread, returns the summary.
  nlohmann::json end() {
    if (phase != Phase::kTraining) throw std::logic_error("LearnerNode: finish() without start(), or twice");
    phase = Phase::kFinished;
    const int64_t steps = cfg.run.train.steps;
    const bool done = work->step() >= steps;
    if (group) {
      // A rank that already went (SIGTERM to the whole group, a crash) must not cost this learner its goodbye and
      // its local state: the stop is best effort.
      try {
        group->lead(LearnerGroup::Command::kStop, *work, {});
      } catch (const std::exception& e) {
        emit(rec::GroupStopUndelivered{{}, e.what()});
      }
    }
    save_state();
    {
      std::unique_lock<std::mutex> lock(mu);
      leave_reason = done ? "done" : "stop";
      const double patience = done ? cfg.net.join_timeout : 2.0;
      cv.wait_for(lock, std::chrono::duration<double>(patience), [this] { return all_left() || !fatal.empty(); });
      for (const auto& L : links)
        if (!L.left) emit(L, rec::LeaveUndelivered{{}, leave_reason});
    }
    stop_comms();
    uint64_t bytes_out = 0, bytes_in = 0;
    for (const auto& L : links) bytes_out += L.tx->stats().bytes_out, bytes_in += L.tx->stats().bytes_in;
    const double wall = secs(run_start, clk::now());
    const int64_t trained = work->step() - first_step;
    // The summary is the learner_done record (without its kind and time).
    rec::LearnerDone d;
    d.learner = id;
    d.step = work->step();
    d.steps_trained = trained;
    d.tokens = tokens;
    d.wall_seconds = wall;
    d.busy_seconds = busy;
    d.steps_per_second = wall > 0 ? trained / wall : 0.0;
    d.train_steps_per_second = busy > 0 ? trained / busy : 0.0;
    d.comm_seconds = comm_seconds;
    d.comm_fraction = wall > 0 ? comm_seconds / wall : 0.0;
    d.wait_seconds = wait_seconds;
    d.pushes = pushes;
    d.pushes_dropped = pushes_dropped;
    d.pushes_superseded = pushes_superseded;
    d.broadcasts = broadcasts;
    d.rejected = rejected;
    d.joins_refused = joins_refused;
    if (cfg.delta_broadcast()) {
      d.deltas_applied = deltas_applied;
      d.deltas_unapplied = deltas_unapplied;
    }
    if (donor) donor->report(d);
    d.finished = done && refused_links().empty();
    d.bytes_sent = static_cast<int64_t>(bytes_out);
    d.bytes_received = static_cast<int64_t>(bytes_in);
    d.ranks = group ? static_cast<int64_t>(group->size()) : 1;
    if (const ComputePrecision cp = work->compute_precision(); !cp.chosen.empty()) {
      d.precision = cp.chosen;
      d.precision_setting = cp.setting;
      if (cp.fp32_gflops > 0) d.fp32_gflops = cp.fp32_gflops, d.bf16_gflops = cp.bf16_gflops;
    }
    d.group_comm_seconds = group ? group->communication_seconds() : 0.0;
    if (const auto refused = refused_links(); !refused.empty()) {
      // Trained every step, but a syncer (shard) it needs never let it in: its part was never merged. Not finished.
      d.unreached_shards = refused;
      d.error = "syncer shard(s) " + nlohmann::json(refused).dump() +
                " refused this learner's CURVE key for the whole run (not in net.allow): their fragments were "
                "never merged";
    }
    nlohmann::json s = rec::to_json(d);
    s.erase("kind");
    emit(d);
    return s;
  }

  // The shards that refused our key and never let us join (comms stopped: read after stop_comms()).
  std::vector<int64_t> refused_links() const {
    std::vector<int64_t> out;
    for (const auto& L : links)
      if (!L.ever_joined && L.c.auth_refusals > 0) out.push_back(L.plan.shard);
    return out;
  }

  nlohmann::json run(const std::atomic<bool>& stop) {
    begin(stop);
    while (boundary(stop)) {
      if (group) {
        group->lead(LearnerGroup::Command::kStep, *work, group_changed);
        group_changed.clear();
      }
      auto c1 = clk::now();
      const StepResult r = work->inner_step();
      double dt = secs(c1, clk::now());
      if (cfg.learner.slowdown > 1) {
        std::this_thread::sleep_for(std::chrono::duration<double>(dt * (cfg.learner.slowdown - 1)));
        dt = secs(c1, clk::now());
      }
      after(r, dt);
    }
    return end();
  }
};

namespace {
RunConfig inner_resolved(const RuntimeConfig& cfg) {
  RunConfig r = cfg.run;
  resolve_inner_optimizer(r.train, cfg.merge.preset);
  return r;
}
}  // namespace

LearnerNode::LearnerNode(const RuntimeConfig& cfg_in, int64_t learner_id, std::unique_ptr<ClientTransport> transport,
                         std::shared_ptr<const Corpus> corpus, RecordSink record)
    : LearnerNode(cfg_in, learner_id, std::move(transport),
                  gpt_workloads(inner_resolved(cfg_in), std::move(corpus))(learner_id, cfg_in.resolved_learners()),
                  std::move(record)) {}

LearnerNode::LearnerNode(const RuntimeConfig& cfg_in, int64_t learner_id, std::unique_ptr<ClientTransport> transport,
                         std::unique_ptr<Workload> workload, RecordSink record)
    : LearnerNode(cfg_in, learner_id,
                  [&] {
                    std::vector<std::unique_ptr<ClientTransport>> v;
                    v.push_back(std::move(transport));
                    return v;
                  }(),
                  std::move(workload), std::move(record)) {}

LearnerNode::LearnerNode(const RuntimeConfig& cfg_in, int64_t learner_id,
                         std::vector<std::unique_ptr<ClientTransport>> shards, std::unique_ptr<Workload> workload,
                         RecordSink record)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.cfg = cfg_in;
  I.cfg.resolve();
  I.cfg.validate();
  I.M = I.cfg.resolved_learners();
  if (learner_id < 0 || learner_id >= I.M)
    throw ConfigError("learner id " + std::to_string(learner_id) + " is not in [0, sync.learners=" +
                      std::to_string(I.M) + ")");
  if (static_cast<int64_t>(shards.size()) != I.cfg.syncer.shards)
    throw ConfigError("a learner needs one connection per syncer shard: " + std::to_string(shards.size()) +
                      " given, syncer.shards=" + std::to_string(I.cfg.syncer.shards));
  I.id = learner_id;
  I.record = std::move(record);
  I.work = std::move(workload);
  I.fingerprint = parse_fingerprint_hex(I.work->fingerprint());
  std::random_device rd;
  I.instance = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const ModelPlan plan = plan_model(I.work->parameters(), I.cfg.sync.fragments, I.cfg.sync.sync_every);
  I.layouts = plan.fragment_layouts;
  I.limits = proto::wire_limits(plan);
  SyncOptions so = I.cfg.sync;
  so.learners = I.M;
  I.core = std::make_unique<LearnerCore>(so, plan, I.work->parameters(), I.cfg.run.train.steps,
                                         I.cfg.push_codec(), I.cfg.error_feedback, I.cfg.error_feedback_decay);
  I.held_versions = I.core->versions();
  I.links.resize(shards.size());
  for (size_t s = 0; s < shards.size(); ++s) {
    I.links[s].plan = plan_shard(plan, static_cast<int64_t>(shards.size()), static_cast<int64_t>(s));
    I.links[s].tx = std::move(shards[s]);
  }
}

void LearnerNode::standbys(std::vector<std::unique_ptr<ClientTransport>> alts) {
  Impl& I = *impl_;
  if (alts.size() != I.links.size())
    throw ConfigError("a learner needs one standby connection per syncer shard: " + std::to_string(alts.size()) +
                      " given, syncer.shards=" + std::to_string(I.links.size()));
  for (size_t s = 0; s < alts.size(); ++s) I.links[s].alt = std::move(alts[s]);
}

void LearnerNode::peers(std::unique_ptr<ServerTransport> server, const std::string& public_key,
                        const TransportOptions& donor_options) {
  Impl& I = *impl_;
  I.donor_options = donor_options;
  if (!server) return;
  DonorServer::Context ctx;
  ctx.id = I.id;
  ctx.fingerprint = I.fingerprint;
  ctx.limits = I.limits;
  ctx.serve_rate = I.cfg.net.serve_rate;
  ctx.serve_corrupt = I.cfg.learner.serve_corrupt;
  ctx.endpoint = I.cfg.net.serve;
  ctx.key = public_key;
  for (const Impl::Link& L : I.links) ctx.shards.push_back(L.plan);
  ctx.now = [&I] { return I.now(); };
  ctx.record = [&I](rec::ServeRefused r) { I.emit(std::move(r)); };
  I.donor = std::make_unique<DonorServer>(std::move(ctx), std::move(server));
}

LearnerNode::~LearnerNode() = default;
void LearnerNode::lead_group(std::shared_ptr<LearnerGroup> group) { impl_->group = std::move(group); }
nlohmann::json LearnerNode::run(const std::atomic<bool>& stop) { return impl_->run(stop); }

int64_t LearnerNode::start(const std::atomic<bool>& stop) {
  if (impl_->group) throw std::logic_error("LearnerNode: a learner group trains through run(), not step by step");
  impl_->begin(stop);
  return impl_->work->step();
}
bool LearnerNode::next(const std::atomic<bool>& stop) { return impl_->boundary(stop); }
void LearnerNode::stepped(const StepResult& result, double seconds) {
  if (impl_->phase != Impl::Phase::kTraining) throw std::logic_error("LearnerNode: stepped() outside start()..finish()");
  if (impl_->work->step() >= impl_->cfg.run.train.steps)
    throw std::logic_error("LearnerNode: stepped() after train.steps=" + std::to_string(impl_->cfg.run.train.steps) +
                           " steps (next() said to stop)");
  impl_->work->set_step(impl_->work->step() + 1);
  impl_->after(result, seconds);
}
nlohmann::json LearnerNode::finish() { return impl_->end(); }
int64_t LearnerNode::step() const { return impl_->work->step(); }
const RuntimeConfig& LearnerNode::config() const { return impl_->cfg; }

}  // namespace deloco
