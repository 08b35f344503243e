// The syncer process on the wall clock: the Syncer core of deloco/sync.h behind a ServerTransport.
//
// Read run() top to bottom: wait for one message (or the next timer) → handle it (hello / push / heartbeat / leave,
// each validated before anything is trusted) → housekeeping (peers gone silent, heartbeats, merge timers from the
// grace window, evaluation, status, checkpoints) → stop once every learner retired. A merge broadcasts the new Θ_p
// to every live learner with one shared payload (zero copy). Every rejection is counted by reason, logged as a
// "reject" record and answered with a reject frame so the learner knows.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <mutex>
#include <sstream>

#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/fs.h"
#include "deloco/quantize.h"
#include "deloco/runtime.h"
#include "protocol.h"

namespace deloco {
namespace fs = std::filesystem;

namespace {

using proto::RejectReason;
using proto::unix_now;

struct Peer {
  std::string route;        // transport peer id ("" : no live connection)
  std::string identity;     // CURVE allow-list name
  uint64_t instance = 0;
  bool alive = false;
  double last_heard = -1e9;
  double last_beat_sent = -1e9;
  int64_t step = 0, tokens = 0;
  double busy = 0;          // busy seconds of the current instance
  double busy_done = 0;     // busy seconds of earlier instances
  double step_time = 0;
  int64_t joins = 0;
};

}  // namespace

struct SyncerNode::Impl {
  RuntimeConfig cfg;
  std::unique_ptr<ServerTransport> tx;
  RecordSink record;
  int64_t M = 0;
  std::unique_ptr<Workload> evaluator;  // holds a model replica to evaluate Θ
  std::unique_ptr<Syncer> core;
  std::vector<proto::Layout> layouts;  // per fragment
  proto::Layout model_layout;
  uint64_t fingerprint = 0;
  WireLimits limits;
  Encoding broadcast_enc = Encoding::kFp32;
  std::vector<Peer> peers;
  std::map<std::string, int64_t> route_to_id;
  std::vector<double> timers;  // per fragment: call decide again at this time (< 0: none)
  std::unique_ptr<MetricsServer> metrics;

  // Clock and accounting.
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double prior_elapsed = 0, prior_stalled = 0;  // from earlier incarnations (resume)
  double first_join = -1;  // steady time of the first hello (or of the resume): the uptime clock's origin
  double stalled = 0, last_account = 0, last_status = -1e9, last_eval = 0, last_merge_t = -1;
  int64_t merges = 0, merges_at_ckpt = 0, evals = 0, grace_waits = 0;
  double grace_wait_total = 0;
  std::map<std::string, int64_t> rejects;  // reason → count (node-level, includes wire errors)
  std::map<std::string, std::pair<double, int64_t>> reject_log;  // reason → (window start, records logged)
  EvalResult last_eval_result;
  bool have_eval = false;
  bool resumed = false;
  std::string last_checkpoint;

  // Prometheus snapshot.
  mutable std::mutex prom_mu;
  std::string prom_text;

  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  void emit(nlohmann::json j) {
    j["t"] = unix_now();
    if (record) record(j);
  }
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
  bool all_retired() const {
    for (int64_t m = 0; m < M; ++m)
      if (!retired[m]) return false;
    return true;
  }
  std::vector<bool> retired;

  // ---- rejections -------------------------------------------------------------------------------------------
  // `counter`: the name counted and logged ("" : the code's name; the core's own reasons are finer).
  void reject(const std::string& route, int64_t learner, int64_t fragment, RejectReason code, const std::string& detail,
              const std::string& counter = "") {
    const std::string reason = counter.empty() ? proto::reject_reason_name(code) : counter;
    ++rejects[reason];
    // Log at most 20 records per reason and 10 s window, so a flood of garbage cannot fill the disk either; the
    // counters (summary, Prometheus) stay exact.
    auto& [window, logged] = reject_log[reason];
    const double t = now();
    if (t - window > 10.0) window = t, logged = 0;
    if (++logged <= 20)
      emit({{"kind", "reject"}, {"learner", learner}, {"fragment", fragment}, {"reason", reason}, {"detail", detail}});
    else if (logged == 21)
      emit({{"kind", "reject_suppressed"}, {"reason", reason}, {"detail", "more than 20 in 10 s; still counted"}});
    if (route.empty()) return;
    MessageHeader h;
    h.kind = MessageKind::kReject;
    h.round = static_cast<uint64_t>(code);
    h.learner_id = learner >= 0 ? static_cast<uint32_t>(learner) : 0;
    h.fingerprint = fingerprint;
    const std::string body = reason + ": " + detail.substr(0, 400);
    auto f = proto::make_frame(h, body, limits);
    tx->send(route, f.header, f.payload);
  }

  void send_to(int64_t m, const proto::Frame& f) {
    if (!peers[m].alive || peers[m].route.empty()) return;
    tx->send(peers[m].route, f.header, f.payload);
  }

  // A learner finished: it no longer counts towards the quorum. Checkpointed at once, so a resumed syncer does
  // not wait for a learner that will never come back.
  void retire(int64_t m, const char* how) {
    if (retired[m]) return;
    retired[m] = true;
    peers[m].alive = false;
    core->retire(now(), m);
    emit({{"kind", "retired"}, {"learner", m}, {"how", how}});
    for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) try_merge(p);
    if (cfg.syncer.checkpoint_every > 0) checkpoint();
  }

  // ---- messages -------------------------------------------------------------------------------------------
  void handle(const Envelope& env) {
    const double t = now();
    if (env.parts != 2) {
      reject(env.peer, -1, -1, RejectReason::kMalformedFrame, "message has " + std::to_string(env.parts) + " frames, not 2");
      return;
    }
    MessageHeader h;
    try {
      h = decode_header(env.header.data(), env.header.size(), limits);
      if (env.header.size() != kWireHeaderBytes)
        throw WireError("header frame has " + std::to_string(env.header.size()) + " bytes");
      verify_payload(h, env.payload.data(), env.payload.size());
    } catch (const WireError& e) {
      reject(env.peer, -1, -1, RejectReason::kMalformedFrame, e.what());
      return;
    }
    if (h.fingerprint != fingerprint) {
      reject(env.peer, h.learner_id, -1, RejectReason::kFingerprintMismatch,
             "peer model " + fingerprint_hex(h.fingerprint) + " differs from the syncer's " + fingerprint_hex(fingerprint));
      return;
    }
    if (h.kind == MessageKind::kHello) return on_hello(env, h, t);
    auto it = route_to_id.find(env.peer);
    if (it == route_to_id.end()) {
      reject(env.peer, h.learner_id, -1, RejectReason::kNotJoined, "say hello first");
      return;
    }
    const int64_t m = it->second;
    if (static_cast<int64_t>(h.learner_id) != m) {
      reject(env.peer, h.learner_id, -1, RejectReason::kLearnerIdMismatch,
             "connection joined as learner " + std::to_string(m) + " but sent id " + std::to_string(h.learner_id));
      return;
    }
    Peer& P = peers[m];
    P.last_heard = t;
    if (!P.alive && !retired[m]) {
      P.alive = true;
      core->set_connected(m, true);
    }
    try {
      switch (h.kind) {
        case MessageKind::kFragmentPush: return on_push(env, h, m, t);
        case MessageKind::kHeartbeat: {
          if (env.payload.empty()) return;
          auto b = proto::parse_beat(env.payload.data(), env.payload.size());
          P.step = std::max(P.step, b.step);  // a just-restarted process beats step 0 before it resumes
          P.tokens = std::max(P.tokens, b.tokens);
          P.busy = b.busy_seconds;
          P.step_time = b.step_time;
          return;
        }
        case MessageKind::kLeave: {
          const std::string why = proto::parse_leave(env.payload.data(), env.payload.size());
          P.alive = false;
          route_to_id.erase(P.route);
          P.route.clear();
          if (why == "done") {
            retire(m, "leave");
          } else {
            core->set_connected(m, false);
            emit({{"kind", "lost"}, {"learner", m}, {"reason", "leave"}});
          }
          return;
        }
        default:
          reject(env.peer, m, -1, RejectReason::kUnexpectedKind, std::string("a learner may not send ") + kind_name(h.kind));
          return;
      }
    } catch (const WireError& e) {
      reject(env.peer, m, -1, RejectReason::kMalformedFrame, e.what());
    }
  }

  void on_hello(const Envelope& env, const MessageHeader& h, double t) {
    proto::Hello hello;
    try {
      hello = proto::parse_hello(env.payload.data(), env.payload.size());
    } catch (const WireError& e) {
      return reject(env.peer, h.learner_id, -1, RejectReason::kMalformedFrame, e.what());
    }
    const int64_t m = hello.learner;
    if (m >= M || static_cast<int64_t>(h.learner_id) != m)
      return reject(env.peer, m, -1, RejectReason::kUnknownLearner,
                    "learner id " + std::to_string(m) + " is not in [0, " + std::to_string(M) + ")");
    // A key named "learner-N" in the allow-list may only speak for learner N.
    if (env.identity.rfind("learner-", 0) == 0 && env.identity != "learner-" + std::to_string(m))
      return reject(env.peer, m, -1, RejectReason::kKeyIdMismatch, "key '" + env.identity + "' may not join as learner " + std::to_string(m));
    Peer& P = peers[m];
    const bool other_live = P.alive && !P.route.empty() && P.route != env.peer &&
                            t - P.last_heard < 2 * cfg.net.heartbeat && P.instance != hello.instance;
    if (other_live)
      return reject(env.peer, m, -1, RejectReason::kDuplicateId,
                    "learner " + std::to_string(m) + " is held by a live connection (another process with this id?)");
    if (!P.route.empty() && P.route != env.peer) route_to_id.erase(P.route);
    const bool restart = P.joins > 0 && P.instance != hello.instance;
    if (P.instance != hello.instance) {
      P.busy_done += P.busy;
      P.busy = 0;
    }
    P.route = env.peer;
    P.identity = env.identity;
    P.instance = hello.instance;
    P.alive = !retired[m];
    P.last_heard = t;
    P.step = std::max(P.step, hello.step);
    ++P.joins;
    route_to_id[env.peer] = m;
    if (!retired[m]) core->set_connected(m, true);
    if (first_join < 0) first_join = t;

    proto::Welcome w;
    w.round = static_cast<uint64_t>(merges);
    w.versions = core->versions();
    w.resume_step = P.step;
    w.elements = model_layout.elements;
    Bytes state;
    if (hello.want_state) {
      auto flat = std::make_shared<std::vector<float>>(static_cast<size_t>(model_layout.elements));
      std::vector<at::Tensor> ts;
      for (const auto& [n, tensor] : core->global()) ts.push_back(tensor);
      flatten_into(ts, flat->data());
      w.state_hash = fnv1a64(flat->data(), flat->size() * sizeof(float));
      w.chunk_elements = std::max<int64_t>(1, cfg.net.chunk_bytes / 4);
      w.chunks = (w.elements + w.chunk_elements - 1) / w.chunk_elements;
      state = Bytes(flat, reinterpret_cast<const char*>(flat->data()), flat->size() * sizeof(float));
    }
    MessageHeader wh;
    wh.kind = MessageKind::kWelcome;
    wh.learner_id = static_cast<uint32_t>(m);
    wh.fingerprint = fingerprint;
    wh.round = w.round;
    auto wf = proto::make_frame(wh, proto::encode_welcome(w), limits);
    tx->send(env.peer, wf.header, wf.payload);
    for (int64_t c = 0; c < w.chunks; ++c) {
      const int64_t first = c * w.chunk_elements, n = std::min(w.chunk_elements, w.elements - first);
      Bytes chunk(owner_of(state), state.data() + first * 4, static_cast<size_t>(n) * 4);
      MessageHeader ch;
      ch.kind = MessageKind::kStateChunk;
      ch.encoding = Encoding::kFp32;
      ch.learner_id = static_cast<uint32_t>(m);
      ch.fragment_id = static_cast<uint32_t>(c);
      ch.fingerprint = fingerprint;
      ch.round = w.round;
      ch.element_count = static_cast<uint64_t>(n);
      auto cf = proto::make_frame(ch, chunk, limits);
      tx->send(env.peer, cf.header, cf.payload);
    }
    if (hello.want_state) core->note_joined(m);  // it will hold every fragment's current version
    emit({{"kind", "join"}, {"learner", m}, {"instance", fingerprint_hex(hello.instance)}, {"restart", restart},
          {"step", P.step}, {"state_bytes", hello.want_state ? model_layout.elements * 4 : 0},
          {"identity", env.identity}});
  }

  // Bytes does not expose its owner; keep the shared buffer alive through a copy of the Bytes itself.
  static std::shared_ptr<const void> owner_of(const Bytes& b) { return std::make_shared<Bytes>(b); }

  void on_push(const Envelope& env, const MessageHeader& h, int64_t m, double t) {
    const int64_t p = h.fragment_id;
    if (p >= static_cast<int64_t>(layouts.size()))
      return reject(env.peer, m, p, RejectReason::kUnknownFragment, "fragment " + std::to_string(p) + " of " + std::to_string(layouts.size()));
    const proto::Layout& L = layouts[p];
    if (static_cast<int64_t>(h.element_count) != L.elements)
      return reject(env.peer, m, p, RejectReason::kWrongShape,
                    "fragment " + std::to_string(p) + " has " + std::to_string(L.elements) + " elements, push has " +
                        std::to_string(h.element_count));
    if (h.encoding == Encoding::kRaw) return reject(env.peer, m, p, RejectReason::kMalformedFrame, "push must carry floats");
    at::Tensor flat = torch::empty({L.elements}, torch::kFloat);
    try {
      decode_floats_into(env.payload.data(), env.payload.size(), h.encoding, static_cast<size_t>(L.elements),
                         flat.data_ptr<float>());
    } catch (const WireError& e) {
      const std::string what = e.what();
      return reject(env.peer, m, p, what.find("finite") != std::string::npos ? RejectReason::kNonFinite : RejectReason::kMalformedFrame, what);
    }
    Contribution c;
    c.learner = m;
    c.fragment = p;
    c.deltas = unflatten(flat, L);
    c.base_version = static_cast<int64_t>(h.round);
    c.c_steps = static_cast<int64_t>(h.c_steps);
    c.c_tokens = static_cast<int64_t>(h.c_tokens);
    c.step_time = peers[m].step_time;
    const std::string why = core->receive(t, std::move(c));
    if (!why.empty()) return reject(env.peer, m, p, proto::reject_reason_from_core(why), "refused by the syncer core: " + why, why);
    try_merge(p);
  }

  // ---- merging --------------------------------------------------------------------------------------------
  // force: merge whatever waits regardless of the quorum (at the end, when nobody can send again).
  void try_merge(int64_t p, bool force = false) {
    const double t = now();
    RoundDecision d = core->decide(t, p);
    if (force) d.kind = RoundDecision::kMerge;
    if (d.kind == RoundDecision::kWaitUntil) {
      timers[p] = d.until;
      return;
    }
    timers[p] = -1;
    if (d.kind != RoundDecision::kMerge || core->pending(p) == 0) return;
    const double qt = core->quorum_time(p);
    const double grace = core->grace();
    const auto start = std::chrono::steady_clock::now();
    MergeOutcome out = core->merge(p);
    ++merges;
    last_merge_t = t;
    if (qt >= 0 && t - qt > 1e-3) {
      ++grace_waits;
      grace_wait_total += t - qt;
    }
    // Durable before anyone sees it: with checkpoint_every = 1 no merge a learner received can be lost.
    if (cfg.syncer.checkpoint_every > 0 && merges - merges_at_ckpt >= cfg.syncer.checkpoint_every) checkpoint();
    const auto merged_at = std::chrono::steady_clock::now();
    // Broadcast Θ_p: encode once, share the payload with every live learner.
    const proto::Layout& L = layouts[p];
    std::vector<float> flat(static_cast<size_t>(L.elements));
    flatten_into(core->fragment_tensors(p), flat.data());
    MessageHeader bh;
    bh.kind = MessageKind::kFragmentBroadcast;
    bh.encoding = broadcast_enc;
    bh.fragment_id = static_cast<uint32_t>(p);
    bh.fingerprint = fingerprint;
    bh.round = static_cast<uint64_t>(out.version);
    bh.element_count = static_cast<uint64_t>(L.elements);
    const Bytes payload = Bytes::from_string(encode_floats(flat.data(), flat.size(), broadcast_enc));
    for (int64_t m = 0; m < M; ++m) {
      if (!peers[m].alive || retired[m]) continue;
      bh.learner_id = static_cast<uint32_t>(m);
      auto f = proto::make_frame(bh, payload, limits);
      send_to(m, f);
    }
    // ξ_sync = upload + merge + broadcast. One side cannot observe a transfer's duration on the wire; the time to
    // encode and hand the broadcast to the transport stands for each direction (the simulator models both).
    const double broadcast_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - merged_at).count();
    core->observe_sync(broadcast_s, std::chrono::duration<double>(merged_at - start).count(), broadcast_s);
    emit({{"kind", "merge"}, {"fragment", p}, {"version", out.version}, {"quorum", out.learners.size()},
          {"learners", out.learners}, {"weights", out.weights}, {"grace", grace},
          {"grace_wait", qt >= 0 ? t - qt : 0.0}, {"delta_norm", out.delta_norm}, {"tokens", total_tokens()},
          {"merges", merges}});
  }

  // ---- evaluation, checkpoints, status -----------------------------------------------------------------------
  // Time the syncer spent not listening (an evaluation, a checkpoint) is not the learners' silence.
  void excuse_peers(double busy_seconds) {
    for (auto& p : peers) p.last_heard += busy_seconds;
  }

  void evaluate(const char* kind) {
    const double start = now();
    torch::NoGradGuard ng;
    auto& params = evaluator->parameters();
    const auto& g = core->global();
    for (size_t i = 0; i < g.size(); ++i) params[i].second.copy_(g[i].second);
    last_eval_result = evaluator->evaluate();
    have_eval = true;
    ++evals;
    last_eval = now();
    excuse_peers(last_eval - start);
    emit({{"kind", kind}, {"val_loss", last_eval_result.loss}, {"val_bpb", last_eval_result.bpb},
          {"tokens", total_tokens()}, {"merges", merges}});
  }

  nlohmann::json counters() const {
    nlohmann::json peers_j = nlohmann::json::array();
    for (const auto& p : peers)
      peers_j.push_back({{"step", p.step}, {"tokens", p.tokens}, {"busy", p.busy}, {"busy_done", p.busy_done},
                         {"instance", fingerprint_hex(p.instance)}, {"joins", p.joins}});
    std::vector<bool> ret(retired.begin(), retired.end());
    return {{"merges", merges},
            {"elapsed", elapsed()},
            {"stalled", prior_stalled + stalled},
            {"unix_time", unix_now()},
            {"rejects", rejects},
            {"peers", peers_j},
            {"retired", ret},
            {"grace_waits", grace_waits},
            {"grace_wait_total", grace_wait_total}};
  }

  void checkpoint() {
    const double start = now();
    int64_t n_retired = 0;
    for (bool r : retired) n_retired += r ? 1 : 0;
    std::ostringstream name;  // sorts by merges, then by retirements
    name << "merges_" << std::setw(8) << std::setfill('0') << merges << "-r" << std::setw(4) << n_retired;
    const fs::path dir = fs::path(cfg.syncer.out_dir) / "checkpoints" / name.str();
    if (fs::exists(dir)) return;  // already written at this merge count (e.g. final == periodic)
    nlohmann::json manifest;
    manifest["kind"] = "syncer";
    manifest["fingerprint"] = fingerprint_hex(fingerprint);
    manifest["versions"] = core->versions();
    manifest["contributions_merged"] = core->merged_contributions();
    manifest["counters"] = counters();
    manifest["step"] = merges;
    TensorFile model, opt;
    for (const auto& [n, t] : core->global()) model.tensors[n] = t.detach().to(torch::kCPU).clone();
    for (const auto& [n, t] : core->outer_state()) opt.tensors[n] = t.detach().to(torch::kCPU).clone();
    write_checkpoint(dir.string(), manifest, model, &opt);
    write_file_atomic((fs::path(cfg.syncer.out_dir) / "latest").string(), name.str() + "\n");
    // Keep the three newest.
    std::vector<fs::path> all;
    for (const auto& e : fs::directory_iterator(fs::path(cfg.syncer.out_dir) / "checkpoints"))
      if (e.is_directory() && e.path().filename().string().rfind("merges_", 0) == 0) all.push_back(e.path());
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i + 3 < all.size(); ++i) fs::remove_all(all[i]);
    merges_at_ckpt = merges;
    last_checkpoint = dir.string();
    excuse_peers(now() - start);
    emit({{"kind", "checkpoint"}, {"path", dir.string()}, {"merges", merges}});
  }

  void restore_from(const std::string& out_dir) {
    Checkpoint ck = read_checkpoint(out_dir, /*with_optimizer=*/true);
    const auto& man = ck.manifest;
    if (man.value("kind", std::string()) != "syncer")
      throw CheckpointError("'" + ck.dir + "' is not a syncer checkpoint (kind '" + man.value("kind", std::string()) + "')");
    if (man.value("fingerprint", std::string()) != fingerprint_hex(fingerprint))
      throw CheckpointError("'" + ck.dir + "' holds a model with fingerprint " + man.value("fingerprint", std::string()) +
                            ", this config builds " + fingerprint_hex(fingerprint));
    try {
      core->restore(ck.model.tensors, ck.optimizer.tensors, man.at("versions").get<std::vector<int64_t>>(),
                    man.at("contributions_merged").get<int64_t>());
      const auto& c = man.at("counters");
      merges = merges_at_ckpt = c.at("merges").get<int64_t>();
      prior_elapsed = c.at("elapsed").get<double>();
      // The syncer was down from (at the latest) the checkpoint until now: counted as stalled (conservative).
      const double down = std::max(0.0, unix_now() - c.at("unix_time").get<double>());
      prior_elapsed += down;
      prior_stalled = c.at("stalled").get<double>() + down;
      rejects = c.at("rejects").get<std::map<std::string, int64_t>>();
      grace_waits = c.value("grace_waits", int64_t{0});
      grace_wait_total = c.value("grace_wait_total", 0.0);
      const auto& pj = c.at("peers");
      const auto ret = c.at("retired").get<std::vector<bool>>();
      if (static_cast<int64_t>(pj.size()) != M || static_cast<int64_t>(ret.size()) != M)
        throw CheckpointError("'" + ck.dir + "' was written for " + std::to_string(pj.size()) + " learners, not " +
                              std::to_string(M));
      for (int64_t m = 0; m < M; ++m) {
        peers[m].step = pj[m].at("step").get<int64_t>();
        peers[m].tokens = pj[m].at("tokens").get<int64_t>();
        peers[m].busy = pj[m].at("busy").get<double>();
        peers[m].busy_done = pj[m].at("busy_done").get<double>();
        peers[m].instance = parse_fingerprint_hex(pj[m].at("instance").get<std::string>());
        peers[m].joins = pj[m].at("joins").get<int64_t>();
        if (ret[m]) {
          retired[m] = true;
          core->retire(now(), m);
        }
        // It had finished but the syncer died before its goodbye: it will not come back.
        if (!ret[m] && peers[m].step >= cfg.run.train.steps) {
          retired[m] = true;
          core->retire(now(), m);
        }
      }
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError("'" + ck.dir + "/manifest.json' is missing syncer fields: " + e.what());
    } catch (const SyncError& e) {
      throw CheckpointError("'" + ck.dir + "': " + e.what());
    }
    resumed = true;
    first_join = 0;  // a resumed cluster was already running: its clock continues at once
    last_checkpoint = ck.dir;
  }

  double elapsed() const { return prior_elapsed + (first_join >= 0 ? now() - first_join : 0.0); }
  double uptime() const {
    const double el = elapsed();
    return el > 0 ? 1.0 - (prior_stalled + stalled) / el : 1.0;
  }
  double goodput() const {
    double busy = 0;
    for (const auto& p : peers) busy += p.busy + p.busy_done;
    const double el = elapsed();
    return el > 0 ? busy / (static_cast<double>(M) * el) : 0.0;
  }

  void housekeeping() {
    const double t = now();
    // Uptime: global training is stalled while a fragment waits below its quorum or no learner is connected.
    // The clock starts with the first learner's hello (a syncer waiting for its cluster to boot is not down).
    const bool stall = !all_retired() && (core->stalled() || alive_count() == 0);
    if (stall && first_join >= 0) stalled += t - last_account;
    last_account = t;
    for (int64_t m = 0; m < M; ++m) {
      Peer& P = peers[m];
      if (P.alive && t - P.last_heard > cfg.net.dead_after) {
        P.alive = false;
        core->set_connected(m, false);
        emit({{"kind", "lost"}, {"learner", m}, {"reason", "silent"}, {"silent_seconds", t - P.last_heard}});
        // Its last heartbeat said it had finished: its goodbye was lost (e.g. sent while the syncer was down).
        if (P.step >= cfg.run.train.steps) retire(m, "finished_silently");
        for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) try_merge(p);
      }
      if (P.alive && t - P.last_beat_sent >= cfg.net.heartbeat) {
        MessageHeader h;
        h.kind = MessageKind::kHeartbeat;
        h.learner_id = static_cast<uint32_t>(m);
        h.fingerprint = fingerprint;
        h.round = static_cast<uint64_t>(merges);
        auto f = proto::make_frame(h, std::string(), limits);
        send_to(m, f);
        P.last_beat_sent = t;
      }
    }
    for (int64_t p = 0; p < static_cast<int64_t>(timers.size()); ++p)
      if (timers[p] >= 0 && t >= timers[p]) try_merge(p);
    if (cfg.syncer.eval_interval > 0 && t - last_eval >= cfg.syncer.eval_interval && merges > 0) evaluate("eval");
    if (t - last_status >= 1.0) {
      last_status = t;
      std::vector<int64_t> connected;
      for (int64_t m = 0; m < M; ++m)
        if (peers[m].alive) connected.push_back(m);
      const auto st = tx->stats();
      emit({{"kind", "status"}, {"alive", alive_count()}, {"connected", connected}, {"stalled", stall},
            {"uptime", uptime()}, {"merges", merges}, {"rejected", total_rejects()}, {"bytes_in", st.bytes_in},
            {"bytes_out", st.bytes_out}, {"tokens", total_tokens()}});
    }
    update_prometheus();
  }

  int64_t total_rejects() const {
    int64_t n = 0;
    for (const auto& [k, v] : rejects) n += v;
    return n;
  }

  double next_wakeup() const {
    double next = now() + 0.05;
    for (double u : timers)
      if (u >= 0) next = std::min(next, u);
    return next;
  }

  void update_prometheus() {
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
    metric("global_step", "gauge", "Largest inner step reported by a learner.", [&] {
      int64_t s = 0;
      for (const auto& p : peers) s = std::max(s, p.step);
      return static_cast<double>(s);
    }());
    metric("tokens_total", "counter", "Tokens trained by all learners.", static_cast<double>(total_tokens()));
    metric("uptime_ratio", "gauge", "Fraction of wall time in which global training was not stalled.", uptime());
    if (have_eval) metric("validation_loss", "gauge", "Validation loss of the global model (nats/byte).", last_eval_result.loss);
    o << "# HELP deloco_rejects_total Messages rejected, by reason.\n# TYPE deloco_rejects_total counter\n";
    for (const auto& [k, v] : rejects) o << "deloco_rejects_total{reason=\"" << k << "\"} " << v << "\n";
    std::lock_guard<std::mutex> lock(prom_mu);
    prom_text = o.str();
  }

  nlohmann::json summary(double wall) const {
    const auto st = tx->stats();
    int64_t tokens = total_tokens();
    nlohmann::json s{{"final_val_loss", have_eval ? last_eval_result.loss : std::nan("")},
                     {"val_bpb", have_eval ? last_eval_result.bpb : std::nan("")},
                     {"tokens", tokens},
                     {"wall_seconds", wall},
                     {"outer_steps", merges},
                     {"uptime", uptime()},
                     {"goodput", goodput()},
                     {"bytes_sent", st.bytes_out},
                     {"bytes_received", st.bytes_in},
                     {"contributions_merged", core->merged_contributions()},
                     {"contributions_rejected", total_rejects()},
                     {"rejects", rejects},
                     {"grace_waits", grace_waits},
                     {"auth_denied", st.auth_denied},
                     {"handshake_failures", st.handshake_failures},
                     {"resumed", resumed},
                     {"learners", M},
                     {"checkpoint", last_checkpoint}};
    nlohmann::json joins = nlohmann::json::array();
    for (const auto& p : peers) joins.push_back(p.joins);
    s["joins"] = joins;
    return s;
  }
};

SyncerNode::SyncerNode(const RuntimeConfig& cfg_in, std::unique_ptr<ServerTransport> transport,
                       std::shared_ptr<const Corpus> corpus, bool resume, RecordSink record)
    : SyncerNode(cfg_in, std::move(transport), gpt_workloads(cfg_in.run, std::move(corpus))(0, 1), resume,
                 std::move(record)) {}

SyncerNode::SyncerNode(const RuntimeConfig& cfg_in, std::unique_ptr<ServerTransport> transport,
                       std::unique_ptr<Workload> evaluator, bool resume, RecordSink record)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.cfg = cfg_in;
  I.cfg.resolve();
  I.cfg.validate();
  I.M = I.cfg.resolved_learners();
  I.cfg.sync.learners = I.M;
  I.cfg.sync.learners_auto_ok = false;
  I.record = std::move(record);
  I.evaluator = std::move(evaluator);
  I.fingerprint = parse_fingerprint_hex(I.evaluator->fingerprint());
  std::vector<std::pair<std::string, at::Tensor>> global;
  for (const auto& [n, t] : I.evaluator->parameters()) global.emplace_back(n, t.detach().to(torch::kCPU));
  proto::ModelPlan plan = proto::plan_model(global, I.cfg.sync.fragments, I.cfg.sync.sync_every);
  I.core = std::make_unique<Syncer>(I.cfg.sync, plan.fragments, global, I.cfg.merge_plan(), I.cfg.outer);
  I.layouts = std::move(plan.fragment_layouts);
  I.model_layout = std::move(plan.model);
  I.limits = plan.limits;
  I.broadcast_enc = I.cfg.answer_encoding();
  I.peers.resize(static_cast<size_t>(I.M));
  I.retired.assign(static_cast<size_t>(I.M), false);
  I.timers.assign(I.layouts.size(), -1.0);
  for (int64_t m = 0; m < I.M; ++m) I.core->set_connected(m, false);
  if (I.cfg.syncer.out_dir.empty()) throw ConfigError("syncer.out_dir must name the syncer's run folder");
  if (resume) I.restore_from(I.cfg.syncer.out_dir);
  I.tx = std::move(transport);
  if (!I.cfg.syncer.metrics.empty())
    I.metrics = std::make_unique<MetricsServer>(I.cfg.syncer.metrics, [this] { return prometheus(); });
  I.update_prometheus();
}

SyncerNode::~SyncerNode() = default;

std::string SyncerNode::prometheus() const {
  std::lock_guard<std::mutex> lock(impl_->prom_mu);
  return impl_->prom_text;
}

nlohmann::json SyncerNode::run(const std::atomic<bool>& stop) {
  Impl& I = *impl_;
  const auto start = std::chrono::steady_clock::now();
  I.emit({{"kind", "started"}, {"resumed", I.resumed}, {"merges", I.merges}, {"endpoint", I.tx->endpoint()},
          {"metrics_port", I.metrics ? I.metrics->port() : 0}, {"learners", I.M},
          {"fingerprint", fingerprint_hex(I.fingerprint)}});
  while (!stop.load() && !I.all_retired()) {
    const double wait = std::max(0.0, I.next_wakeup() - I.now());
    Envelope env;
    if (I.tx->receive(&env, std::chrono::milliseconds(static_cast<int64_t>(wait * 1000) + 1))) I.handle(env);
    I.housekeeping();
  }
  // Merge whatever still waits (the learners that finished cannot send again), then evaluate and checkpoint.
  if (I.all_retired())
    for (int64_t p = 0; p < static_cast<int64_t>(I.layouts.size()); ++p)
      if (I.core->pending(p) > 0) I.try_merge(p, /*force=*/true);
  I.evaluate("final_eval");
  I.checkpoint();
  I.update_prometheus();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  nlohmann::json s = I.summary(wall);
  nlohmann::json done = s;
  done["kind"] = "done";
  done["stopped"] = stop.load();
  I.emit(done);
  return s;
}

}  // namespace deloco
