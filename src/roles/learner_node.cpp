// The learner process on the wall clock: a Trainer on the main thread, all networking on one comms thread.
//
// Main thread, per inner step: apply whatever the comms thread received (a downloaded global state, merged
// fragments) → one train_step() → for every fragment due, copy θ_p into a flat buffer and hand it to the comms
// thread. It never waits for the network (unless sync.wait_for_answer asks for synchronous DiLoCo).
// Comms thread: hello until welcomed (downloading the global parameters in verified chunks), heartbeats, pushes
// (quantized with error feedback), broadcasts into the inbox, and noticing a silent syncer (then hello again).
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/quantize.h"
#include "deloco/runtime.h"
#include "protocol.h"

namespace deloco {

using proto::unix_now;

struct LearnerNode::Impl {
  RuntimeConfig cfg;
  int64_t id = 0, M = 1;
  std::unique_ptr<ClientTransport> tx;
  std::shared_ptr<const Corpus> corpus;
  RecordSink record;
  std::unique_ptr<Trainer> trainer;
  std::vector<Fragment> frags;
  std::vector<proto::Layout> layouts;
  proto::Layout model_layout;
  std::map<std::string, size_t> param_index;
  uint64_t fingerprint = 0, instance = 0;
  WireLimits limits;
  Encoding push_enc = Encoding::kFp32;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  // ---- shared between the main and the comms thread (guarded by mu) ----
  struct Outgoing {
    int64_t fragment = 0;
    std::vector<float> data;
    int64_t c_steps = 0, c_tokens = 0, step = 0, version = 0;
  };
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
  std::deque<Outgoing> outbox;            // at most one entry per fragment (a newer push replaces an older)
  std::map<int64_t, Answer> inbox;         // newest merged fragment per fragment id
  std::optional<State> state_ready;        // a verified global-state download waiting to be installed
  std::optional<int64_t> resume_step;      // from the first welcome
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
  void comms_loop() {
    double last_hello = -1e9, last_beat = -1e9, last_heard = -1e9;
    const double start = now();
    // Download in progress.
    std::optional<proto::Welcome> dl;
    at::Tensor dl_flat;
    std::vector<bool> dl_have;
    int64_t dl_count = 0;
    std::vector<std::vector<float>> residual(layouts.size());
    bool first_join_recorded = false;
    double hello_sent_at = 0;

    for (;;) {
      const double t = now();
      Outgoing out;
      bool have_out = false, want_leave = false;
      proto::Beat b;
      bool is_joined;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (comms_stop) break;
        if (!outbox.empty()) {
          out = std::move(outbox.front());
          outbox.pop_front();
          have_out = true;
        }
        want_leave = !leave_reason.empty() && !left;
        b = beat;
        is_joined = joined;
      }
      if (want_leave && is_joined) {  // the final counters first, so the syncer's token and goodput totals are complete
        send(header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
        send(header(MessageKind::kLeave), Bytes::from_string(proto::encode_leave(leave_reason)));
        std::lock_guard<std::mutex> lock(mu);
        left = true;
        cv.notify_all();
        continue;
      }
      // Leaving while the syncer is away: keep saying hello (below) so the goodbye is delivered when it is back.
      if (!is_joined && t - last_hello >= cfg.net.heartbeat) {
        proto::Hello h;
        h.learner = id;
        h.instance = instance;
        h.step = b.step;
        h.want_state = !have_state;
        send(header(MessageKind::kHello), Bytes::from_string(proto::encode_hello(h)));
        last_hello = hello_sent_at = t;
      }
      if (is_joined && t - last_heard > cfg.net.dead_after) {
        std::lock_guard<std::mutex> lock(mu);
        joined = false;
        is_joined = false;
        dl.reset();
        emit({{"kind", "syncer_lost"}, {"step", b.step}, {"silent_seconds", t - last_heard}});
      }
      if (is_joined && t - last_beat >= cfg.net.heartbeat) {
        send(header(MessageKind::kHeartbeat), Bytes::from_string(proto::encode_beat(b)));
        last_beat = t;
      }
      if (have_out) {
        bool sent = false;
        if (is_joined) {
          const auto p = static_cast<size_t>(out.fragment);
          std::string payload;
          if (cfg.net.error_feedback && push_enc != Encoding::kFp32) {
            if (residual[p].size() != out.data.size()) residual[p].assign(out.data.size(), 0.0f);
            payload = quantize_with_error_feedback(out.data.data(), residual[p].data(), out.data.size(), push_enc);
          } else {
            payload = encode_floats(out.data.data(), out.data.size(), push_enc);
          }
          MessageHeader h = header(MessageKind::kFragmentPush);
          h.encoding = push_enc;
          h.fragment_id = static_cast<uint32_t>(out.fragment);
          h.round = static_cast<uint64_t>(out.version);
          h.c_steps = static_cast<uint64_t>(out.c_steps);
          h.c_tokens = static_cast<uint64_t>(out.c_tokens);
          h.element_count = out.data.size();
          const size_t bytes = payload.size() + kWireHeaderBytes;
          sent = send(h, Bytes::from_string(std::move(payload)));
          if (sent) emit({{"kind", "push"}, {"fragment", out.fragment}, {"step", out.step}, {"bytes", bytes}});
        }
        std::lock_guard<std::mutex> lock(mu);
        (sent ? pushes : pushes_dropped) += 1;
      }

      Envelope env;
      if (!tx->receive(&env, std::chrono::milliseconds(have_out ? 0 : 10))) continue;
      MessageHeader h;
      try {
        if (env.parts != 2 || env.header.size() != kWireHeaderBytes) throw WireError("frame layout");
        h = decode_header(env.header.data(), env.header.size(), limits);
        verify_payload(h, env.payload.data(), env.payload.size());
      } catch (const WireError& e) {
        emit({{"kind", "bad_frame"}, {"detail", e.what()}});
        continue;
      }
      if (h.fingerprint != fingerprint && h.kind != MessageKind::kReject) {  // a reject says why itself
        std::lock_guard<std::mutex> lock(mu);
        fatal = "the syncer serves another model: fingerprint " + fingerprint_hex(h.fingerprint) + ", ours " +
                fingerprint_hex(fingerprint) + " (fingerprint_mismatch; check the model section of both configs)";
        cv.notify_all();
        continue;
      }
      last_heard = now();
      try {
        switch (h.kind) {
          case MessageKind::kWelcome: {
            auto w = proto::parse_welcome(env.payload.data(), env.payload.size());
            if (w.versions.size() != layouts.size())
              throw WireError("welcome lists " + std::to_string(w.versions.size()) + " fragments, we have " +
                              std::to_string(layouts.size()) + " (sync.fragments differs)");
            std::lock_guard<std::mutex> lock(mu);
            joined = true;
            if (!welcomed_once) resume_step = w.resume_step;
            welcomed_once = true;
            if (w.chunks > 0) {
              if (w.elements != model_layout.elements) throw WireError("welcome describes another model size");
              dl = w;
              dl_flat = torch::empty({w.elements}, torch::kFloat);
              dl_have.assign(static_cast<size_t>(w.chunks), false);
              dl_count = 0;
            }
            if (!first_join_recorded || w.chunks == 0) {
              emit({{"kind", w.chunks > 0 ? "welcome" : "joined"}, {"step", beat.step}, {"syncer_round", w.round},
                    {"resume_step", w.resume_step}, {"hello_seconds", now() - hello_sent_at}});
            }
            first_join_recorded = true;
            cv.notify_all();
            break;
          }
          case MessageKind::kStateChunk: {
            if (!dl || h.round != dl->round) break;  // a chunk of an abandoned download
            const int64_t c = h.fragment_id;
            if (c >= dl->chunks) throw WireError("state chunk index out of range");
            const int64_t first = c * dl->chunk_elements, n = std::min(dl->chunk_elements, dl->elements - first);
            if (static_cast<int64_t>(h.element_count) != n) throw WireError("state chunk has the wrong size");
            decode_floats_into(env.payload.data(), env.payload.size(), h.encoding, static_cast<size_t>(n),
                               dl_flat.data_ptr<float>() + first);
            if (!dl_have[static_cast<size_t>(c)]) {
              dl_have[static_cast<size_t>(c)] = true;
              ++dl_count;
            }
            if (dl_count == dl->chunks) {
              const uint64_t hash = fnv1a64(dl_flat.data_ptr<float>(), static_cast<size_t>(dl->elements) * 4);
              std::lock_guard<std::mutex> lock(mu);
              if (hash != dl->state_hash) {
                emit({{"kind", "bad_frame"}, {"detail", "global state hash mismatch; downloading again"}});
                joined = false;  // hello again with want_state
              } else {
                state_ready = State{*dl, dl_flat};
                have_state = true;
                emit({{"kind", "joined"}, {"step", beat.step}, {"syncer_round", dl->round},
                      {"download_bytes", dl->elements * 4}, {"download_seconds", now() - hello_sent_at},
                      {"resume_step", dl->resume_step}});
                cv.notify_all();
              }
              dl.reset();
            }
            break;
          }
          case MessageKind::kFragmentBroadcast: {
            const int64_t p = h.fragment_id;
            if (p >= static_cast<int64_t>(layouts.size())) throw WireError("broadcast of an unknown fragment");
            const int64_t n = layouts[static_cast<size_t>(p)].elements;
            if (static_cast<int64_t>(h.element_count) != n) throw WireError("broadcast has the wrong size");
            at::Tensor flat = torch::empty({n}, torch::kFloat);
            decode_floats_into(env.payload.data(), env.payload.size(), h.encoding, static_cast<size_t>(n),
                               flat.data_ptr<float>());
            std::lock_guard<std::mutex> lock(mu);
            inbox[p] = Answer{static_cast<int64_t>(h.round), flat};
            ++broadcasts;
            cv.notify_all();
            break;
          }
          case MessageKind::kHeartbeat: break;
          case MessageKind::kReject: {
            const std::string why = env.payload.str();
            const std::string code = why.substr(0, why.find(':'));
            std::lock_guard<std::mutex> lock(mu);
            ++rejected;
            emit({{"kind", "rejected"}, {"reason", why}});
            if (code == "not_joined") joined = false;
            const bool permanent = code == "fingerprint_mismatch" || code == "key_id_mismatch" ||
                                   code == "unknown_learner" || code == "learner_id_mismatch";
            if (permanent || (code == "duplicate_id" && now() - start > cfg.net.join_timeout)) {
              fatal = "the syncer refused learner " + std::to_string(id) + ": " + why;
              cv.notify_all();
            }
            break;
          }
          default:
            throw WireError(std::string("unexpected ") + kind_name(h.kind) + " from the syncer");
        }
      } catch (const WireError& e) {
        emit({{"kind", "bad_frame"}, {"detail", e.what()}});
      }
    }
  }

  // ================================ main thread ================================
  // Installs a downloaded global state and/or merged fragments; returns true when something was applied.
  void apply_received(std::vector<int64_t>& c_steps, std::vector<int64_t>& c_tokens,
                      std::vector<int64_t>& versions) {
    std::optional<State> st;
    std::map<int64_t, Answer> answers;
    {
      std::lock_guard<std::mutex> lock(mu);
      st.swap(state_ready);
      answers.swap(inbox);
    }
    torch::NoGradGuard ng;
    auto& params = trainer->parameters();
    if (st) {
      auto views = proto::unflatten(st->flat, model_layout);
      for (size_t i = 0; i < views.size(); ++i) params[i].second.copy_(views[i]);
      for (size_t p = 0; p < layouts.size(); ++p) {
        c_steps[p] = c_tokens[p] = 0;
        versions[p] = st->welcome.versions[p];
      }
    }
    for (auto& [p, a] : answers) {
      auto views = proto::unflatten(a.flat, layouts[static_cast<size_t>(p)]);
      const auto& names = layouts[static_cast<size_t>(p)].names;
      for (size_t i = 0; i < names.size(); ++i) {
        at::Tensor& local = params[param_index.at(names[i])].second;
        apply_global(local, views[i].to(local.device()), cfg.sync.alpha);
      }
      c_steps[p] = c_tokens[p] = 0;
      versions[p] = a.version;
      emit({{"kind", "apply"}, {"fragment", p}, {"version", a.version}});
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

    // Join first: wait (bounded) for the global state so a (re)started learner trains from Θ, not from scratch.
    {
      std::unique_lock<std::mutex> lock(mu);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg.net.join_timeout);
      while (!state_ready && fatal.empty() && !stop.load() && std::chrono::steady_clock::now() < deadline)
        cv.wait_for(lock, std::chrono::milliseconds(50));
      if (!fatal.empty()) throw std::runtime_error(fatal);
      if (!state_ready && !stop.load())
        emit({{"kind", "alone"}, {"detail", "no welcome within net.join_timeout; training on, joining when the syncer appears"}});
      if (resume_step && *resume_step > trainer->step()) trainer->set_step(std::min(*resume_step, cfg.run.train.steps));
    }

    const int64_t P = static_cast<int64_t>(layouts.size());
    const int64_t H = cfg.sync.sync_every, steps = cfg.run.train.steps;
    const int64_t tokens_per_step = cfg.run.train.batch_size * cfg.run.model.block_size;
    std::vector<int64_t> c_steps(P, 0), c_tokens(P, 0), versions(P, 0), sent_at(P, -1);
    double busy = 0, comm_seconds = 0, wait_seconds = 0, recent_time = 0;
    int64_t recent_steps = 0;
    const int64_t first_step = trainer->step();
    const auto run_start = std::chrono::steady_clock::now();
    using clk = std::chrono::steady_clock;
    auto secs = [](clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); };

    while (trainer->step() < steps && !stop.load()) {
      auto c0 = clk::now();
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!fatal.empty()) throw std::runtime_error(fatal);
      }
      apply_received(c_steps, c_tokens, versions);
      auto c1 = clk::now();
      comm_seconds += secs(c0, c1);

      const double loss = trainer->train_step();
      auto c2 = clk::now();
      double dt = secs(c1, c2);
      if (cfg.learner.slowdown > 1) {
        std::this_thread::sleep_for(std::chrono::duration<double>(dt * (cfg.learner.slowdown - 1)));
        dt = secs(c1, clk::now());
      }
      busy += dt;
      recent_time += dt;
      ++recent_steps;
      const int64_t step = trainer->step();
      for (int64_t p = 0; p < P; ++p) {
        ++c_steps[p];
        c_tokens[p] += tokens_per_step;
      }
      if (step % cfg.run.train.log_every == 0 || step == steps)
        emit({{"kind", "learner"}, {"step", step}, {"loss", loss}, {"tokens", trainer->tokens_seen()},
              {"step_time", dt}});

      auto c3 = clk::now();
      for (int64_t p = 0; p < P; ++p) {
        if (!fragment_due(frags[static_cast<size_t>(p)], step, H)) continue;
        Outgoing o;
        o.fragment = p;
        o.data.resize(static_cast<size_t>(layouts[static_cast<size_t>(p)].elements));
        std::vector<at::Tensor> ts;
        for (const auto& n : layouts[static_cast<size_t>(p)].names) ts.push_back(trainer->parameters()[param_index.at(n)].second);
        proto::flatten_into(ts, o.data.data());
        o.c_steps = c_steps[p];
        o.c_tokens = c_tokens[p];
        o.step = step;
        o.version = versions[p];
        sent_at[p] = step;
        std::lock_guard<std::mutex> lock(mu);
        for (auto it = outbox.begin(); it != outbox.end();)
          it = it->fragment == p ? outbox.erase(it) : std::next(it);
        outbox.push_back(std::move(o));
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        beat.step = step;
        beat.tokens = trainer->tokens_seen();
        beat.busy_seconds = busy;
        beat.step_time = recent_steps > 0 ? recent_time / recent_steps : 0;
        if (recent_steps >= 20) recent_time = 0, recent_steps = 0;
      }
      auto c4 = clk::now();
      comm_seconds += secs(c3, c4);

      // Synchronous DiLoCo: block at send + τ until the answer for that fragment came (only while joined).
      if (cfg.sync.wait_for_answer) {
        for (int64_t p = 0; p < P; ++p) {
          if (sent_at[p] < 0 || step < sent_at[p] + cfg.sync.overlap) continue;
          std::unique_lock<std::mutex> lock(mu);
          while (!inbox.count(p) && joined && fatal.empty() && !stop.load())
            cv.wait_for(lock, std::chrono::milliseconds(20));
          sent_at[p] = -1;
        }
        wait_seconds += secs(c4, clk::now());
      }
    }

    const bool done = trainer->step() >= steps;
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
    const int64_t trained = trainer->step() - first_step;
    nlohmann::json s{{"learner", id},
                     {"step", trainer->step()},
                     {"steps_trained", trained},
                     {"tokens", trainer->tokens_seen()},
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
                     {"bytes_received", tx->stats().bytes_in}};
    nlohmann::json r = s;
    r["kind"] = "learner_done";
    emit(r);
    return s;
  }
};

LearnerNode::LearnerNode(const RuntimeConfig& cfg_in, int64_t learner_id, std::unique_ptr<ClientTransport> transport,
                         std::shared_ptr<const Corpus> corpus, RecordSink record)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.cfg = cfg_in;
  I.cfg.validate();
  I.M = I.cfg.resolved_learners();
  if (learner_id < 0 || learner_id >= I.M)
    throw ConfigError("learner id " + std::to_string(learner_id) + " is not in [0, sync.learners=" +
                      std::to_string(I.M) + ")");
  I.id = learner_id;
  I.corpus = std::move(corpus);
  I.record = std::move(record);
  RunConfig rc = I.cfg.run;
  rc.train.learner_id = learner_id;
  rc.train.num_learners = I.M;
  I.trainer = std::make_unique<Trainer>(rc, I.corpus);
  I.fingerprint = parse_fingerprint_hex(I.trainer->fingerprint());
  std::random_device rd;
  I.instance = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const auto& params = I.trainer->parameters();
  for (size_t i = 0; i < params.size(); ++i) I.param_index[params[i].first] = i;
  proto::ModelPlan plan = proto::plan_model(params, I.cfg.sync.fragments, I.cfg.sync.sync_every);
  I.frags = std::move(plan.fragments);
  I.layouts = std::move(plan.fragment_layouts);
  I.model_layout = std::move(plan.model);
  I.limits = plan.limits;
  I.push_enc = parse_encoding(I.cfg.net.encoding);
  I.tx = std::move(transport);
}

LearnerNode::~LearnerNode() = default;
Trainer& LearnerNode::trainer() { return *impl_->trainer; }
nlohmann::json LearnerNode::run(const std::atomic<bool>& stop) { return impl_->run(stop); }

}  // namespace deloco
