// The learner process on the wall clock: a Workload and the learner core (deloco/learner.h) on the main thread,
// all networking on one comms thread.
//
// Main thread, per inner step: hand the answers the comms thread received to the core → the core applies those
// whose time has come (and says whether to wait: synchronous and streaming DiLoCo) → one inner step → the core
// returns the pushes due, already encoded → hand them to the comms thread. The algorithm is the core's; this file
// only moves bytes, keeps time and writes records.
// Comms thread: hello until welcomed (downloading the global parameters in verified chunks), heartbeats, pushes,
// broadcasts into the inbox, noticing a silent syncer (then hello again). One handler per message kind.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/group.h"
#include "deloco/learner.h"
#include "deloco/quantize.h"
#include "deloco/runtime.h"
#include "deloco/text.h"
#include "protocol.h"

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
  std::unique_ptr<ClientTransport> tx;
  RecordSink record;
  std::unique_ptr<Workload> work;
  std::unique_ptr<LearnerCore> core;
  std::shared_ptr<LearnerGroup> group;  // rank 0 of a learner group: the other ranks mirror this one
  std::vector<std::string> group_changed;  // parameters changed since the group's last step boundary
  std::vector<FlatLayout> layouts;
  FlatLayout model_layout;
  uint64_t fingerprint = 0, instance = 0;
  WireLimits limits;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  // ---- shared between the main and the comms thread (guarded by mu) ----
  struct Answer {
    int64_t version = 0;
    at::Tensor flat;
  };
  struct State {
    proto::Welcome welcome;
    at::Tensor flat;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Push> outbox;                 // at most one entry per fragment (a newer push replaces an older)
  std::map<int64_t, Answer> inbox;         // newest merged fragment per fragment id
  std::set<int64_t> refused_pushes;      // fragments whose outstanding push the syncer refused (reject naming it)
  std::optional<State> state_ready;        // a verified global-state download waiting to be installed
  std::optional<int64_t> resume_step;      // from the first welcome
  std::vector<int64_t> held_versions;      // the core's versions, as last published by the main thread
  bool joined = false, welcomed_once = false, have_state = false;
  std::string fatal;                        // set by comms: a refusal that retrying cannot fix
  proto::Beat beat;
  std::string leave_reason;                 // set by main at the end
  bool left = false;
  bool comms_stop = false;
  int64_t pushes = 0, pushes_dropped = 0, broadcasts = 0, rejected = 0;

  std::thread comms;
  std::mutex record_mu;  // both threads emit records

  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  void emit(nlohmann::json j) {
    j["t"] = unix_now();
    j["learner"] = id;
    std::lock_guard<std::mutex> lock(record_mu);
    if (record) record(j);
  }

  MessageHeader header(MessageKind k) const {
    MessageHeader h;
    h.kind = k;
    h.learner_id = static_cast<uint32_t>(id);
    h.fingerprint = fingerprint;
    return h;
  }
  bool send(const MessageHeader& h, Bytes payload) {
    auto f = proto::make_frame(h, std::move(payload), limits);
    return tx->send(f.header, f.payload);
  }

  // ================================ comms thread ================================
  struct Comms {
    double last_hello = -1e9, last_beat = -1e9, last_heard = -1e9, last_leave = -1e9, hello_sent_at = 0, start = 0;
    std::optional<proto::Welcome> dl;  // download in progress
    at::Tensor dl_flat;
    std::vector<bool> dl_have;
    int64_t dl_count = 0;
    bool first_join_recorded = false;
  };

  void comms_loop() {
    Comms c;
    c.start = now();
    for (;;) {
      const double t = now();
      std::optional<Push> out;
      bool want_leave = false, is_joined = false;
      std::string reason;
      proto::Beat b;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (comms_stop) break;
        if (!outbox.empty()) {
          out = std::move(outbox.front());
          outbox.pop_front();
        }
        // Goodbye only once every push before it went out, so the syncer merges them before retiring us.
        want_leave = !out && !leave_reason.empty() && !left;
        if (want_leave) reason = leave_reason;
        b = beat;
        is_joined = joined;
      }
      // The final counters first, so the syncer's token and goodput totals are complete. The goodbye counts as
      // delivered (left) only once the syncer answers it: a close discards what the socket has not sent yet, so
      // it is repeated every heartbeat until answered (the syncer answers repeats too).
      if (want_leave && is_joined && t - c.last_leave >= cfg.net.heartbeat) {
        send(header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
        send(header(MessageKind::kLeave), Bytes::from_string(proto::encode_leave(reason)));
        c.last_leave = t;
        c.last_beat = t;
      }
      // Leaving while the syncer is away: keep saying hello (below) so the goodbye is delivered when it is back.
      if (!is_joined && t - c.last_hello >= cfg.net.heartbeat) say_hello(c, b, t);
      if (is_joined && t - c.last_heard > cfg.net.dead_after) {
        std::lock_guard<std::mutex> lock(mu);
        joined = false;
        is_joined = false;
        c.last_leave = -1e9;  // a goodbye waiting for its answer goes again as soon as we are back
        // A download in progress is kept: its chunks may still be on the way, and the syncer sends no second copy
        // while one is outstanding on this connection. The next welcome that carries chunks replaces it.
        cv.notify_all();
        emit({{"kind", "syncer_lost"}, {"step", b.step}, {"silent_seconds", t - c.last_heard}});
      }
      if (is_joined && t - c.last_beat >= cfg.net.heartbeat) {
        send(header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
        c.last_beat = t;
      }
      if (out) send_push(*out, b, is_joined);

      Envelope env;
      if (!tx->receive(&env, std::chrono::milliseconds(out ? 0 : 10))) continue;
      handle(c, env);
    }
  }

  void say_hello(Comms& c, const proto::Beat& b, double t) {
    proto::Hello h;
    h.learner = id;
    h.instance = instance;
    h.step = b.step;
    {
      std::lock_guard<std::mutex> lock(mu);
      h.want_state = !have_state;
    }
    send(header(MessageKind::kHello), Bytes::from_string(proto::encode_hello(h)));
    c.last_hello = c.hello_sent_at = t;
  }

  // The step-time estimate travels in a heartbeat right before the push it belongs to (the push header has no
  // field for it), so the syncer sees the same ξ_step input as the simulator's syncer.
  void send_push(const Push& p, proto::Beat b, bool is_joined) {
    bool sent = false;
    if (is_joined) {
      b.step_time = p.step_time;
      send(header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
      MessageHeader h = header(MessageKind::kFragmentPush);
      h.encoding = p.encoding;
      h.fragment_id = static_cast<uint32_t>(p.fragment);
      h.round = static_cast<uint64_t>(p.base_version);
      h.c_steps = static_cast<uint64_t>(p.c_steps);
      h.c_tokens = static_cast<uint64_t>(p.c_tokens);
      h.element_count = static_cast<uint64_t>(p.elements);
      const size_t bytes = p.payload.size() + kWireHeaderBytes;
      sent = send(h, Bytes::from_string(p.payload));
      if (sent)
        emit({{"kind", "push"}, {"fragment", p.fragment}, {"step", p.step}, {"bytes", bytes},
              {"base_version", p.base_version}});
    }
    std::lock_guard<std::mutex> lock(mu);
    (sent ? pushes : pushes_dropped) += 1;
  }

  void handle(Comms& c, const Envelope& env) {
    MessageHeader h;
    try {
      if (env.parts != 2 || env.header.size() != kWireHeaderBytes) throw WireError("frame layout");
      h = decode_header(env.header.data(), env.header.size(), limits);
      verify_payload(h, env.payload.data(), env.payload.size());
    } catch (const WireError& e) {
      emit({{"kind", "bad_frame"}, {"detail", e.what()}});
      return;
    }
    if (h.fingerprint != fingerprint && h.kind != MessageKind::kReject) {  // a reject says why itself
      std::lock_guard<std::mutex> lock(mu);
      fatal = "the syncer serves another model: fingerprint " + fingerprint_hex(h.fingerprint) + ", ours " +
              fingerprint_hex(fingerprint) + " (fingerprint_mismatch; check the model section of both configs)";
      cv.notify_all();
      return;
    }
    c.last_heard = now();
    try {
      switch (h.kind) {
        case MessageKind::kWelcome: return on_welcome(c, env);
        case MessageKind::kStateChunk: return on_state_chunk(c, h, env);
        case MessageKind::kFragmentBroadcast: return on_broadcast(h, env);
        case MessageKind::kHeartbeat: return;
        case MessageKind::kLeave: {  // the syncer handled our goodbye
          proto::parse_leave(env.payload.data(), env.payload.size());
          std::lock_guard<std::mutex> lock(mu);
          if (!leave_reason.empty()) {
            left = true;
            cv.notify_all();
          }
          return;
        }
        case MessageKind::kReject: return on_reject(c, h, env);
        default: throw WireError(std::string("unexpected ") + kind_name(h.kind) + " from the syncer");
      }
    } catch (const WireError& e) {
      emit({{"kind", "bad_frame"}, {"detail", e.what()}});
    }
  }

  void on_welcome(Comms& c, const Envelope& env) {
    auto w = proto::parse_welcome(env.payload.data(), env.payload.size());
    if (w.versions.size() != layouts.size())
      throw WireError("welcome lists " + std::to_string(w.versions.size()) + " fragments, we have " +
                      std::to_string(layouts.size()) + " (sync.fragments differs)");
    std::lock_guard<std::mutex> lock(mu);
    // A syncer that went back in time (resumed from an older checkpoint) no longer has the versions we hold: our
    // pushes would be refused (future_base). Download its state instead.
    if (w.chunks == 0 && have_state) {
      for (size_t p = 0; p < w.versions.size() && p < held_versions.size(); ++p)
        if (w.versions[p] < held_versions[p]) {
          have_state = false;
          emit({{"kind", "syncer_behind"}, {"fragment", p}, {"syncer_version", w.versions[p]},
                {"held_version", held_versions[p]}});
          c.last_hello = -1e9;  // hello again at once, asking for the state
          return;
        }
    }
    joined = true;
    if (!welcomed_once) resume_step = w.resume_step;
    welcomed_once = true;
    if (w.chunks > 0) {
      if (w.elements != model_layout.elements) throw WireError("welcome describes another model size");
      c.dl = w;
      c.dl_flat = torch::empty({w.elements}, torch::kFloat);
      c.dl_have.assign(static_cast<size_t>(w.chunks), false);
      c.dl_count = 0;
    }
    if (!c.first_join_recorded || w.chunks == 0)
      emit({{"kind", w.chunks > 0 ? "welcome" : "joined"}, {"step", beat.step}, {"syncer_round", w.round},
            {"resume_step", w.resume_step}, {"hello_seconds", now() - c.hello_sent_at}});
    c.first_join_recorded = true;
    cv.notify_all();
  }

  void on_state_chunk(Comms& c, const MessageHeader& h, const Envelope& env) {
    if (!c.dl || h.round != c.dl->round) return;  // a chunk of an abandoned download
    const int64_t k = h.fragment_id;
    if (k >= c.dl->chunks) throw WireError("state chunk index out of range");
    const int64_t first = k * c.dl->chunk_elements, n = std::min(c.dl->chunk_elements, c.dl->elements - first);
    if (static_cast<int64_t>(h.element_count) != n) throw WireError("state chunk has the wrong size");
    decode_floats_into(env.payload.data(), env.payload.size(), h.encoding, static_cast<size_t>(n),
                       c.dl_flat.data_ptr<float>() + first);
    if (!c.dl_have[static_cast<size_t>(k)]) {
      c.dl_have[static_cast<size_t>(k)] = true;
      ++c.dl_count;
    }
    if (c.dl_count < c.dl->chunks) return;
    const uint64_t hash = fnv1a64(c.dl_flat.data_ptr<float>(), static_cast<size_t>(c.dl->elements) * 4);
    std::lock_guard<std::mutex> lock(mu);
    if (hash != c.dl->state_hash) {
      emit({{"kind", "bad_frame"}, {"detail", "global state hash mismatch; downloading again"}});
      joined = false;  // hello again with want_state
    } else {
      state_ready = State{*c.dl, c.dl_flat};
      have_state = true;
      beat.state_round = static_cast<int64_t>(c.dl->round);  // tells the syncer the download arrived
      emit({{"kind", "joined"}, {"step", beat.step}, {"syncer_round", c.dl->round},
            {"download_bytes", c.dl->elements * 4}, {"download_seconds", now() - c.hello_sent_at},
            {"resume_step", c.dl->resume_step}});
      cv.notify_all();
    }
    c.dl.reset();
  }

  void on_broadcast(const MessageHeader& h, const Envelope& env) {
    const int64_t p = h.fragment_id;
    if (p >= static_cast<int64_t>(layouts.size())) throw WireError("broadcast of an unknown fragment");
    const int64_t n = layouts[static_cast<size_t>(p)].elements;
    if (static_cast<int64_t>(h.element_count) != n) throw WireError("broadcast has the wrong size");
    at::Tensor flat = torch::empty({n}, torch::kFloat);
    decode_floats_into(env.payload.data(), env.payload.size(), h.encoding, static_cast<size_t>(n), flat.data_ptr<float>());
    std::lock_guard<std::mutex> lock(mu);
    auto it = inbox.find(p);
    if (it == inbox.end() || it->second.version < static_cast<int64_t>(h.round))
      inbox[p] = Answer{static_cast<int64_t>(h.round), flat};
    ++broadcasts;
    cv.notify_all();
  }

  void on_reject(Comms& c, const MessageHeader& h, const Envelope& env) {
    const std::string why = clip_utf8(std::string_view(env.payload.data(), env.payload.size()), 500);
    const RejectReason code = reject_reason_of(h);
    std::lock_guard<std::mutex> lock(mu);
    ++rejected;
    emit({{"kind", "rejected"}, {"reason", why}, {"code", reject_reason_name(code)}});
    if (code == RejectReason::kNotJoined) joined = false;
    // A refused push of fragment p: its answer will not come (the main thread tells the core, take_received).
    if (h.fragment_id != proto::kNoFragment && h.fragment_id < core->fragments().size()) {
      refused_pushes.insert(static_cast<int64_t>(h.fragment_id));
      cv.notify_all();
    }
    if (reject_is_permanent(code) || (code == RejectReason::kDuplicateId && now() - c.start > cfg.net.join_timeout)) {
      fatal = "the syncer refused learner " + std::to_string(id) + ": " + why;
      cv.notify_all();
    }
  }

  // ================================ main thread ================================
  // Hands a downloaded state and received answers to the core. Returns true when a state was installed.
  bool take_received() {
    std::optional<State> st;
    std::map<int64_t, Answer> answers;
    std::set<int64_t> refused;
    {
      std::lock_guard<std::mutex> lock(mu);
      st.swap(state_ready);
      answers.swap(inbox);
      refused.swap(refused_pushes);
    }
    if (st) core->install(st->flat, st->welcome.versions);
    for (int64_t p : refused) core->refused(p);
    for (auto& [p, a] : answers) core->receive(p, a.version, a.flat);
    return st.has_value();
  }

  void publish_versions() {
    std::lock_guard<std::mutex> lock(mu);
    held_versions = core->versions();
  }

  // Learner-local state (the inner optimizer's moments), so a restarted learner keeps them as in the simulator.
  fs::path state_path() const {
    return fs::path(cfg.learner.state_dir) / ("learner-" + std::to_string(id)) / "state";
  }
  void save_state() {
    if (cfg.learner.state_dir.empty()) return;
    const fs::path dir = state_path();
    const fs::path tmp = dir.string() + ".new";
    fs::remove_all(tmp);
    fs::create_directories(dir.parent_path());
    TensorFile model, opt;
    opt.tensors = work->optimizer_state();
    nlohmann::json manifest{{"kind", "learner"}, {"learner", id}, {"step", work->step()},
                            {"model_fingerprint", work->fingerprint()}};
    write_checkpoint(tmp.string(), manifest, model, &opt);
    fs::remove_all(dir);
    fs::rename(tmp, dir);
  }
  void load_state() {
    if (cfg.learner.state_dir.empty()) return;
    fs::path dir = state_path();
    if (!fs::exists(dir)) {
      if (!fs::exists(dir.string() + ".new")) return;
      dir = dir.string() + ".new";  // a crash between the two renames above
    }
    try {
      Checkpoint ck = read_checkpoint(dir.string(), /*with_optimizer=*/true);
      if (ck.manifest.value("model_fingerprint", std::string()) != work->fingerprint())
        throw CheckpointError("it was written for another model");
      work->load_optimizer_state(ck.optimizer.tensors);
      emit({{"kind", "state_restored"}, {"path", dir.string()}, {"step", ck.manifest.value("step", int64_t{0})}});
    } catch (const std::exception& e) {  // a damaged local state costs the moments, never the run
      emit({{"kind", "state_unusable"}, {"path", dir.string()}, {"detail", e.what()}});
    }
  }

  nlohmann::json run(const std::atomic<bool>& stop) {
    comms = std::thread([this] {
      try {
        comms_loop();
      } catch (const std::exception& e) {  // a bug or resource failure: surface it on the main thread
        std::lock_guard<std::mutex> lock(mu);
        fatal = std::string("comms thread failed: ") + e.what();
        cv.notify_all();
      }
    });
    struct Joiner {
      Impl* I;
      ~Joiner() {
        {
          std::lock_guard<std::mutex> lock(I->mu);
          I->comms_stop = true;
        }
        if (I->comms.joinable()) I->comms.join();
      }
    } joiner{this};

    load_state();
    // Join first: wait (bounded) for the global state so a (re)started learner trains from Θ, not from scratch.
    {
      std::unique_lock<std::mutex> lock(mu);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg.net.join_timeout);
      while (!state_ready && fatal.empty() && !stop.load() && std::chrono::steady_clock::now() < deadline)
        cv.wait_for(lock, std::chrono::milliseconds(50));
      if (!fatal.empty()) throw std::runtime_error(fatal);
      if (!state_ready && !stop.load())
        emit({{"kind", "alone"}, {"detail", "no welcome within net.join_timeout; training on, joining when the syncer appears"}});
      if (resume_step && *resume_step > work->step()) work->set_step(std::min(*resume_step, cfg.run.train.steps));
    }

    const int64_t steps = cfg.run.train.steps;
    const int64_t state_every =
        cfg.learner.state_every > 0 ? cfg.learner.state_every : std::max<int64_t>(100, cfg.sync.sync_every);
    double busy = 0, comm_seconds = 0, wait_seconds = 0;
    int64_t tokens = 0;
    const int64_t first_step = work->step();
    const auto run_start = std::chrono::steady_clock::now();
    using clk = std::chrono::steady_clock;
    auto secs = [](clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); };

    for (;;) {
      auto c0 = clk::now();
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!fatal.empty()) throw std::runtime_error(fatal);
      }
      const bool installed = take_received();
      const int64_t step = work->step();
      const std::vector<Applied> applied = core->apply_due(step);
      for (const auto& a : applied)
        emit({{"kind", "apply"}, {"fragment", a.fragment}, {"version", a.version}, {"step", step}});
      if (installed || !applied.empty()) publish_versions();  // the comms thread compares welcomes against them
      if (group) {
        if (installed)
          for (const auto& [name, p] : work->parameters()) group_changed.push_back(name);
        for (const auto& a : applied)
          for (const auto& name : core->layout(a.fragment).names) group_changed.push_back(name);
      }
      comm_seconds += secs(c0, clk::now());
      // Synchronous / streaming DiLoCo: the core says which answers must come first. Wait only while joined: the
      // answer of a syncer that went away will not come (the learner trains on and joins again).
      if (core->must_wait(step) && !stop.load()) {
        auto w0 = clk::now();
        std::unique_lock<std::mutex> lock(mu);
        if (!joined) {
          lock.unlock();
          core->forget_in_flight();
          emit({{"kind", "wait_abandoned"}, {"step", step}, {"detail", "not joined"}});
        } else {
          cv.wait_for(lock, std::chrono::milliseconds(20),
                      [this] { return !inbox.empty() || !refused_pushes.empty() || state_ready || !joined || !fatal.empty(); });
        }
        wait_seconds += secs(w0, clk::now());
        continue;
      }
      if (step >= steps || stop.load()) break;

      if (group) {
        group->lead(LearnerGroup::Command::kStep, *work, group_changed);
        group_changed.clear();
      }
      auto c1 = clk::now();
      const StepResult r = work->inner_step();
      auto c2 = clk::now();
      double dt = secs(c1, c2);
      if (cfg.learner.slowdown > 1) {
        std::this_thread::sleep_for(std::chrono::duration<double>(dt * (cfg.learner.slowdown - 1)));
        dt = secs(c1, clk::now());
      }
      busy += dt;
      tokens += r.tokens;
      const int64_t now_step = work->step();
      if (now_step % cfg.run.train.log_every == 0 || now_step == steps)
        emit({{"kind", "learner"}, {"step", now_step}, {"loss", r.loss}, {"tokens", tokens}, {"step_time", dt}});

      auto c3 = clk::now();
      std::vector<Push> due = core->after_step(now_step, r.tokens, dt);
      {
        std::lock_guard<std::mutex> lock(mu);
        for (auto& p : due) {
          for (auto it = outbox.begin(); it != outbox.end();)
            it = it->fragment == p.fragment ? outbox.erase(it) : std::next(it);
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

    const bool done = work->step() >= steps;
    if (group) {
      // A rank that already went (SIGTERM to the whole group, a crash) must not cost this learner its goodbye and
      // its local state: the stop is best effort.
      try {
        group->lead(LearnerGroup::Command::kStop, *work, {});
      } catch (const std::exception& e) {
        emit({{"kind", "group_stop_undelivered"}, {"detail", e.what()}});
      }
    }
    save_state();
    {
      // A finished learner must tell the syncer (it releases its quorum share), so it waits for a syncer that is
      // away — up to net.join_timeout; an interrupted one waits briefly.
      std::unique_lock<std::mutex> lock(mu);
      leave_reason = done ? "done" : "stop";
      const double patience = done ? cfg.net.join_timeout : 2.0;
      cv.wait_for(lock, std::chrono::duration<double>(patience), [this] { return left || !fatal.empty(); });
      if (!left) emit({{"kind", "leave_undelivered"}, {"reason", leave_reason}});
    }
    const double wall = secs(run_start, clk::now());
    const int64_t trained = work->step() - first_step;
    nlohmann::json s{{"learner", id},
                     {"step", work->step()},
                     {"steps_trained", trained},
                     {"tokens", tokens},
                     {"wall_seconds", wall},
                     {"busy_seconds", busy},
                     {"steps_per_second", wall > 0 ? trained / wall : 0.0},
                     {"train_steps_per_second", busy > 0 ? trained / busy : 0.0},
                     {"comm_seconds", comm_seconds},
                     {"comm_fraction", wall > 0 ? comm_seconds / wall : 0.0},
                     {"wait_seconds", wait_seconds},
                     {"pushes", pushes},
                     {"pushes_dropped", pushes_dropped},
                     {"broadcasts", broadcasts},
                     {"rejected", rejected},
                     {"finished", done},
                     {"bytes_sent", tx->stats().bytes_out},
                     {"bytes_received", tx->stats().bytes_in},
                     {"ranks", group ? group->size() : 1},
                     {"group_comm_seconds", group ? group->communication_seconds() : 0.0}};
    nlohmann::json r = s;
    r["kind"] = "learner_done";
    emit(r);
    return s;
  }
};

LearnerNode::LearnerNode(const RuntimeConfig& cfg_in, int64_t learner_id, std::unique_ptr<ClientTransport> transport,
                         std::shared_ptr<const Corpus> corpus, RecordSink record)
    : LearnerNode(cfg_in, learner_id, std::move(transport),
                  gpt_workloads(cfg_in.run, std::move(corpus))(learner_id, cfg_in.resolved_learners()),
                  std::move(record)) {}

LearnerNode::LearnerNode(const RuntimeConfig& cfg_in, int64_t learner_id, std::unique_ptr<ClientTransport> transport,
                         std::unique_ptr<Workload> workload, RecordSink record)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.cfg = cfg_in;
  I.cfg.resolve();
  I.cfg.validate();
  I.M = I.cfg.resolved_learners();
  if (learner_id < 0 || learner_id >= I.M)
    throw ConfigError("learner id " + std::to_string(learner_id) + " is not in [0, sync.learners=" +
                      std::to_string(I.M) + ")");
  I.id = learner_id;
  I.record = std::move(record);
  I.work = std::move(workload);
  I.fingerprint = parse_fingerprint_hex(I.work->fingerprint());
  std::random_device rd;
  I.instance = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  proto::ModelPlan plan = proto::plan_model(I.work->parameters(), I.cfg.sync.fragments, I.cfg.sync.sync_every);
  I.layouts = plan.fragment_layouts;
  I.model_layout = plan.model;
  I.limits = plan.limits;
  SyncOptions so = I.cfg.sync;
  so.learners = I.M;
  I.core = std::make_unique<LearnerCore>(so, plan.fragments, I.work->parameters(), I.cfg.run.train.steps,
                                         I.cfg.push_encoding(), I.cfg.error_feedback);
  I.held_versions = I.core->versions();
  I.tx = std::move(transport);
}

LearnerNode::~LearnerNode() = default;
void LearnerNode::lead_group(std::shared_ptr<LearnerGroup> group) { impl_->group = std::move(group); }
nlohmann::json LearnerNode::run(const std::atomic<bool>& stop) { return impl_->run(stop); }

}  // namespace deloco
