// The virtual-clock driver: learners, network, chaos schedule and the event loop around the Syncer.
//
// Data flow per learner, read top to bottom in on_step_done(): one inner step of the workload → the learner core
// (deloco/learner.h) bumps its counters and returns the pushes due, encoded exactly as on the wire → each arrives
// after latency + bytes/bandwidth and is decoded as the syncer node decodes it → at the step boundary the core
// applies the answers whose time has come and says whether to wait; else the next step starts. The syncer side is
// on_arrive() → Syncer::receive → try_merge() → Syncer::on_round (decide, merge, the flat new Θ_p) → broadcast
// (encoded and decoded in the broadcast codec). The simulator keeps no algorithm logic of its own: only events,
// time, bytes and accounting.
#include "deloco/gpt/train.h"
#include "deloco/sim.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <random>

#include <torch/torch.h>

#include "deloco/config.h"
#include "sync/answer_marks.h"
#include "deloco/learner.h"
#include "records/kinds.h"
#include "records/round_record.h"
#include "records/summary.h"
#include "wire/quantize.h"

namespace deloco {

void SimConfig::bind(ConfigSchema& s) {
  AlgorithmConfig::bind(s);
  auto nonneg = [](double* v, const char* key) {
    return [v, key] { return *v >= 0 ? std::string() : std::string(key) + " must be ≥ 0"; };
  };
  s.bind("sim.step_time", &sim.step_time, "seconds per inner step of a speed-1 learner",
         [this] { return sim.step_time > 0 ? "" : "sim.step_time must be > 0"; });
  s.bind("sim.speed_factors", &sim.speed_factors, "per-learner step-time multipliers", [this] {
    for (double f : sim.speed_factors)
      if (!(f > 0)) return std::string("sim.speed_factors must all be > 0");
    return std::string();
  });
  s.bind("sim.slow_fraction", &sim.slow_fraction, "fraction of learners that are slow",
         [this] { return sim.slow_fraction >= 0 && sim.slow_fraction <= 1 ? "" : "sim.slow_fraction must be in [0, 1]"; });
  s.bind("sim.slow_factor", &sim.slow_factor, "step-time factor of slow learners",
         [this] { return sim.slow_factor > 0 ? "" : "sim.slow_factor must be > 0"; });
  s.bind("sim.jitter", &sim.jitter, "relative std of step times", nonneg(&sim.jitter, "sim.jitter"));
  s.bind("sim.latency", &sim.latency, "seconds per message", nonneg(&sim.latency, "sim.latency"));
  s.bind("sim.bandwidth", &sim.bandwidth, "bytes/s per learner link (0: infinite)",
         nonneg(&sim.bandwidth, "sim.bandwidth"));
  s.bind("sim.queued_links", &sim.queued_links,
         "each link direction carries one transfer at a time (first come first served), the syncer's link shared");
  s.bind("sim.syncer_bandwidth", &sim.syncer_bandwidth,
         "bytes/s each way of the syncer's link, shared by all learners (0: not a bottleneck; with sim.queued_links)",
         [this] {
           if (!(sim.syncer_bandwidth >= 0)) return std::string("sim.syncer_bandwidth must be ≥ 0");
           if (sim.syncer_bandwidth > 0 && !sim.queued_links)
             return std::string("sim.syncer_bandwidth needs sim.queued_links = true (a shared link is a queue)");
           return std::string();
         });
  s.bind("sim.eval_learners", &sim.eval_learners,
         "at the end, also evaluate each learner's own parameters and their mean (summary: learners_val_loss)");
  s.bind("sim.merge_time", &sim.merge_time, "seconds per fragment merge", nonneg(&sim.merge_time, "sim.merge_time"));
  s.bind("sim.eval_interval", &sim.eval_interval, "virtual seconds between evaluations (0: end only)",
         nonneg(&sim.eval_interval, "sim.eval_interval"));
  s.bind("sim.max_time", &sim.max_time, "stop at this virtual time (0: none)", nonneg(&sim.max_time, "sim.max_time"));
  s.bind("sim.log_every", &sim.log_every, "learner-loss records every N steps",
         [this] { return sim.log_every >= 1 ? "" : "sim.log_every must be ≥ 1"; });
  s.bind("sim.seed", &sim.seed, "seed of jitter and chaos");
  s.bind("sim.out_dir", &sim.out_dir, "run folder");
  s.bind("sim.mtbf", &sim.mtbf, "mean virtual seconds between failures per learner (0: none)",
         nonneg(&sim.mtbf, "sim.mtbf"));
  s.bind("sim.fail_times", &sim.fail_times, "listed failure times");
  s.bind("sim.fail_learners", &sim.fail_learners, "learner of each listed failure");
  s.bind("sim.downtime", &sim.downtime, "seconds down before rejoining", nonneg(&sim.downtime, "sim.downtime"));
  s.bind("sim.straggler_times", &sim.straggler_times, "straggler start times");
  s.bind("sim.straggler_learners", &sim.straggler_learners, "learner of each straggler episode");
  s.bind("sim.straggler_duration", &sim.straggler_duration, "seconds of each straggler episode",
         nonneg(&sim.straggler_duration, "sim.straggler_duration"));
  s.bind("sim.straggler_factor", &sim.straggler_factor, "step-time factor while straggling",
         [this] { return sim.straggler_factor > 0 ? "" : "sim.straggler_factor must be > 0"; });
  s.bind("sim.pause_times", &sim.pause_times, "syncer pause start times");
  s.bind("sim.pause_duration", &sim.pause_duration, "seconds of each syncer pause",
         nonneg(&sim.pause_duration, "sim.pause_duration"));
}

void SimConfig::validate(const RunConfig& run) const {
  AlgorithmConfig algo = *this;
  algo.resolve();
  algo.validate();
  const auto M = sync.learners;
  if (sim.fail_times.size() != sim.fail_learners.size())
    throw ConfigError("sim.fail_times and sim.fail_learners must have the same length");
  if (sim.straggler_times.size() != sim.straggler_learners.size())
    throw ConfigError("sim.straggler_times and sim.straggler_learners must have the same length");
  for (auto m : sim.fail_learners)
    if (m < 0 || m >= M) throw ConfigError("sim.fail_learners names learner " + std::to_string(m) + " of " + std::to_string(M));
  for (auto m : sim.straggler_learners)
    if (m < 0 || m >= M)
      throw ConfigError("sim.straggler_learners names learner " + std::to_string(m) + " of " + std::to_string(M));
  for (const auto& [key, times] : {std::pair<const char*, const std::vector<double>*>{"sim.fail_times", &sim.fail_times},
                                   {"sim.pause_times", &sim.pause_times},
                                   {"sim.straggler_times", &sim.straggler_times}})
    for (double t : *times)
      if (!(t >= 0) || !std::isfinite(t))
        throw ConfigError(std::string(key) + " must be finite and ≥ 0 (seconds of virtual time), not " + std::to_string(t));
  if (static_cast<int64_t>(sim.speed_factors.size()) > M)
    throw ConfigError("sim.speed_factors has more entries than sync.learners");
  if (static_cast<int64_t>(run.train.learner_batch_sizes.size()) > M)
    throw ConfigError("train.learner_batch_sizes has more entries than sync.learners");
  if (run.train.steps < sync.sync_every)
    throw ConfigError("train.steps=" + std::to_string(run.train.steps) + " is less than sync.sync_every=" +
                      std::to_string(sync.sync_every) + ": no outer step would ever happen");
}

namespace {

enum EventKind { kStepDone, kArrive, kTimer, kAnswer, kRefused, kFail, kRejoin, kRestore, kStragglerOn, kStragglerOff,
                 kPauseOn, kPauseOff, kEval, kRetire, kFinished };

struct Snapshot {  // a merged fragment in flight, decoded once and shared by every receiver of one broadcast
  int64_t fragment = -1;
  int64_t version = 0;
  at::Tensor flat;
  at::Tensor delta;         // a delta broadcast: version − (version − 1), decoded from its payload (else undefined)
  int64_t delta_frame = 0;  // its frame bytes
};

struct Event {
  double t = 0;
  uint64_t seq = 0;
  EventKind kind = kStepDone;
  int64_t learner = -1, fragment = -1, epoch = 0;
  bool drop_drift = false;  // kRefused: a refusal that would repeat (refusal_drops_drift, deloco/sync.h)
  bool final = false;       // kArrive: a final state (sync.final_round), for Syncer::receive_final
  std::shared_ptr<Contribution> contribution;
  std::shared_ptr<const Snapshot> snapshot;
  int64_t covers = -1;  // kAnswer: the push it answers (LearnerCore::receive), as the syncer node marks it
  int64_t sync_every = 0;  // kAnswer: the learner's sync period (Syncer::local_updates), as the syncer node's beat says
  double took = 0;  // kArrive (not final), kAnswer: the transfer's own time (arrival()), heard when it lands
};
struct Later {
  bool operator()(const Event& a, const Event& b) const { return a.t != b.t ? a.t > b.t : a.seq > b.seq; }
};

struct Learner {
  std::unique_ptr<Workload> work;
  std::unique_ptr<LearnerCore> core;
  std::mt19937_64 rng, chaos_rng;
  double speed = 1.0, straggle = 1.0;
  int64_t straggling = 0;  // straggler episodes in progress (they may overlap: slow until the last one ends)
  bool up = true, done = false, waiting = false, stepping = false;
  bool retired = false;  // its goodbye reached the syncer (after its last pushes: on_retire)
  bool finishing = false;  // sync.final_round: past its last step, waiting for the answers to its pushes in flight
  bool finished_heard = false;  // sync.final_round: the beat of its last step is on its way (again after a failure)
  int64_t epoch = 0, tokens = 0;
  int64_t bytes_up = 0, bytes_down = 0;  // frames this learner sent and was sent
  double step_started = 0, step_duration = 0, wait_started = 0;
  double useful = 0, waited = 0, lost = 0;
  double last_arrival = 0;  // when the latest push this learner sent reaches the syncer
};

}  // namespace

// Impl is defined in this file only, so its fields may use this file's anonymous namespace; GCC warns about that
// when a unity build compiles the file as an included one.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsubobject-linkage"
struct Simulator::Impl {
  RunConfig run;
  SimConfig cfg;
  std::vector<Learner> learners;
  AnswerMarks answer_marks;  // the push each answer answers, marked as the syncer node marks its broadcasts
  std::unique_ptr<Workload> evaluator;
  std::unique_ptr<Syncer> syncer;
  std::vector<FlatLayout> layouts;
  FlatLayout model_layout;
  Encoding answer_enc = Encoding::kFp32;
  bool delta_on = false;       // net.broadcast_delta / topk: merges go out as deltas
  int64_t dense_fallbacks = 0;  // deltas a learner could not apply (it got the whole fragment instead)
  // The transfer times as the syncer node measures them (moving averages with sync.ema): a push's own time, heard on
  // its arrival, and a broadcast's, heard when it reaches its learner. Under sim.queued_links they are ξ_sync's
  // transfer terms, as on the node (a push that waited for the shared link took longer than bytes / bandwidth);
  // on independent links every transfer takes transfer(bytes) and ξ_sync uses that directly.
  Ema upload_seen, broadcast_seen;
  // net.encoding / net.broadcast_encoding = auto: the same fitter the syncer node runs, fed the modelled transfers.
  std::unique_ptr<CodecFitter> fitter;
  int delta_choice = 0;
  int64_t codec_changes = 0;
  std::priority_queue<Event, std::vector<Event>, Later> queue;
  uint64_t seq = 0;
  double now = 0, stalled_time = 0;
  double first_done_t = -1, stalled_at_first_done = 0;  // uptime while all M learners still train
  bool paused = false;
  int64_t pauses = 0;  // syncer pauses in progress (they may overlap: paused until the last one ends)
  // Arrivals during a syncer pause, with the sender's epoch and whether each is a final state.
  struct Deferred {
    std::shared_ptr<Contribution> c;
    int64_t epoch = 0;
    bool final = false;
  };
  std::vector<Deferred> deferred;
  int64_t finals_sent = 0, finals_rejected = 0;
  std::function<void(const nlohmann::json&)> record;
  Simulator* self = nullptr;
  int64_t inflight = 0;  // contributions on the network
  int64_t merges = 0, bytes_up = 0, bytes_down = 0, failures = 0;
  std::vector<int64_t> last_push_frame;  // per fragment: the frame bytes of its latest push (0: none yet)
  EvalResult last_eval;
  double initial_val_loss = 0;

  void push(Event e) {
    e.seq = seq++;
    queue.push(std::move(e));
  }
  // Stamps the record with the virtual time and hands it to the caller's sink.
  template <class R> void emit(R r) {
    r.t = now;
    if (record) record(rec::to_json(r));
  }
  double transfer(int64_t bytes) const {
    return cfg.sim.latency + (cfg.sim.bandwidth > 0 ? static_cast<double>(bytes) / cfg.sim.bandwidth : 0.0);
  }
  // sim.queued_links: when each link direction is free again (per learner; the syncer's, shared).
  std::vector<double> up_free, down_free;
  double syncer_in_free = 0, syncer_out_free = 0;
  // When `bytes` sent at time t from learner m to the syncer (up) or from the syncer to m arrive. `own_time`: the
  // transfer's time without its wait behind the same learner's earlier transfers (what the nodes measure: a push
  // from the heartbeat right before it, a broadcast over the time its link was busy with it), for the codec fitter.
  double arrival(int64_t m, int64_t bytes, bool up, double t, double* own_time = nullptr) {
    if (own_time) *own_time = transfer(bytes);
    if (!cfg.sim.queued_links) return t + transfer(bytes);
    const double bw = cfg.sim.bandwidth, sb = cfg.sim.syncer_bandwidth;
    const double rate = bw > 0 && sb > 0 ? std::min(bw, sb) : std::max(bw, sb);
    double& own = up ? up_free.at(static_cast<size_t>(m)) : down_free.at(static_cast<size_t>(m));
    double& shared = up ? syncer_in_free : syncer_out_free;
    const double start = std::max({t, own, sb > 0 ? shared : 0.0});
    const double end = start + (rate > 0 ? static_cast<double>(bytes) / rate : 0.0);
    // Its own time counts the wait for the shared link (on the testbed learners sharing it share its rate), not
    // the wait behind this learner's own earlier transfers.
    if (own_time) *own_time = end - std::max(t, own) + cfg.sim.latency;
    own = end;
    if (sb > 0) shared = end;
    return end + cfg.sim.latency;
  }
  static int64_t frame_bytes(int64_t payload) { return payload + static_cast<int64_t>(kWireHeaderBytes); }
  int64_t fragment_frame_bytes(int64_t p, Encoding e) const {
    return frame_bytes(static_cast<int64_t>(max_encoded_bytes(e, static_cast<uint64_t>(layouts[p].elements))));
  }
  int64_t total_tokens() const {
    int64_t n = 0;
    for (const auto& l : learners) n += l.tokens;
    return n;
  }

  void start_step(int64_t m) {
    Learner& L = learners[m];
    std::normal_distribution<double> n01(0.0, 1.0);
    double j = cfg.sim.jitter > 0 ? std::max(0.1, 1.0 + cfg.sim.jitter * n01(L.rng)) : 1.0;
    L.step_duration = cfg.sim.step_time * L.speed * L.straggle * j;
    L.step_started = now;
    L.stepping = true;
    Event e;
    e.t = now + L.step_duration;
    e.kind = kStepDone;
    e.learner = m;
    e.epoch = L.epoch;
    push(e);
  }

  // At a step boundary: the core applies what is due and says whether to wait; else finish or train on.
  void boundary(int64_t m) {
    Learner& L = learners[m];
    const int64_t step = L.work->step();
    for (const auto& a : L.core->apply_due(step)) {
      rec::Apply ap;
      ap.learner = m;
      ap.fragment = a.fragment;
      ap.version = a.version;
      ap.step = step;
      emit(ap);
    }
    // sync.final_round: its last step pushed nothing, and its beat of that step reaches the syncer behind its pushes
    // in flight, also while it waits here for their answers (as the node's heartbeat does).
    if (cfg.sync.final_round && step >= run.train.steps && !L.finished_heard) {
      L.finished_heard = true;
      heard_behind_pushes(m, kFinished);
    }
    if (L.core->must_wait(step)) {
      if (!L.waiting) L.wait_started = now;
      L.waiting = true;
      return;
    }
    if (L.waiting) L.waited += now - L.wait_started;
    L.waiting = false;
    if (step >= run.train.steps) {
      // sync.final_round: once the answers to its pushes in flight are in (on_answer / on_refused come back here),
      // its final state of every fragment goes to the syncer, ahead of its goodbye.
      if (cfg.sync.final_round && !L.done) {
        if (!L.core->in_flight().empty()) {
          L.finishing = true;
          return;
        }
        L.finishing = false;
        send_pushes(m, L.core->final_pushes(step), /*final=*/true);
      }
      if (!L.done) {
        L.done = true;
        if (first_done_t < 0) {
          first_done_t = now;
          stalled_at_first_done = stalled_time;
        }
        rec::LearnerDone d;
        d.learner = m;
        d.step = step;
        emit(d);
        // The syncer node retires a learner on its goodbye, which follows its last pushes on the same link: until
        // they are in, a finishing learner's final pushes may still merge with its peers' (the grace window).
        heard_behind_pushes(m, kRetire);
      }
      return;
    }
    start_step(m);
  }

  // What learner m sends now (a heartbeat, its goodbye) reaches the syncer behind its pushes in flight on the same
  // link: an event of `kind` then.
  void heard_behind_pushes(int64_t m, EventKind kind) {
    Event e;
    e.t = std::max(now, learners[m].last_arrival) + cfg.sim.latency;
    e.kind = kind;
    e.learner = m;
    e.epoch = learners[m].epoch;
    push(e);
  }

  // sync.final_round: learner m's beat of its last step reached the syncer (as SyncerNode's heartbeat handler): no
  // round waits for its push any more (Syncer::set_finished).
  void on_finished(const Event& e) {
    const Learner& L = learners[e.learner];
    if (e.epoch != L.epoch || !L.up || L.retired || syncer->finished(e.learner)) return;  // (heard before a failure)
    syncer->set_finished(now, e.learner, true);
    rec::LearnerFinished r;
    r.learner = e.learner;
    r.step = L.work->step();
    emit(r);
    for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) try_merge(p);
  }

  // A finished learner's goodbye: the syncer stops waiting for it and merges what waits.
  void on_retire(const Event& e) {
    learners[e.learner].retired = true;
    syncer->retire(now, e.learner);
    for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) try_merge(p);
  }

  void on_step_done(const Event& e) {
    Learner& L = learners[e.learner];
    if (e.epoch != L.epoch || !L.up) return;
    L.stepping = false;
    const StepResult r = L.work->inner_step();
    const int64_t step = L.work->step();
    L.tokens += r.tokens;
    L.useful += L.step_duration;
    if (step % cfg.sim.log_every == 0 || step == run.train.steps) {
      rec::Learner l;
      l.learner = e.learner;
      l.step = step;
      l.loss = r.loss;
      emit(l);
    }
    send_pushes(e.learner, L.core->after_step(step, r.tokens, L.step_duration), /*final=*/false);
    if (fitter) refit_codecs(e.learner);
    boundary(e.learner);
  }

  // Learner m's pushes on their way (each decoded exactly as the syncer node decodes a fragment_push).
  void send_pushes(int64_t m, std::vector<Push> pushes, bool final) {
    Learner& L = learners[m];
    for (Push& out : pushes) {
      auto c = std::make_shared<Contribution>(decode_push(m, out, layouts[out.fragment]));
      c->step = out.step;  // what the syncer node hears in the heartbeat that precedes a push
      const int64_t bytes = frame_bytes(static_cast<int64_t>(out.payload.size()));
      bytes_up += bytes;
      L.bytes_up += bytes;
      if (!final) last_push_frame[static_cast<size_t>(out.fragment)] = bytes;
      Event a;
      double took = 0;
      a.t = arrival(m, bytes, /*up=*/true, now, &took);
      a.took = took;
      if (fitter && !final) fitter->observe_upload(m, static_cast<double>(bytes), took);
      ++inflight;
      L.last_arrival = std::max(L.last_arrival, a.t);
      a.kind = kArrive;
      a.contribution = c;
      a.epoch = L.epoch;
      a.final = final;
      push(a);
      finals_sent += final ? 1 : 0;
    }
  }

  // Learner m's fit after its pushes (the syncer node refits on each push's arrival and tells it by heartbeat; here
  // the learner takes the new codec and period at once).
  void refit_codecs(int64_t m) {
    Learner& L = learners[m];
    const CodecChoice before = fitter->choice(m);
    const double xi = L.core->step_time();
    const auto c = fitter->refit(m, xi);
    if (!c) return;
    ++codec_changes;
    emit(rec::codec_record(*fitter, m, before, *c, xi));
    if (!cfg.push_auto()) return;
    const Codec& codec = fitter->push_ladder().codecs.at(static_cast<size_t>(c->push));
    for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) L.core->set_push_codec(p, codec);
    L.core->set_link_period(c->period > cfg.sync.sync_every ? c->period : 0);
  }

  // Before each merge: the grace window spans the longest live learner's fitted period, and (net.broadcast_encoding =
  // auto) the coarsest of the live learners' fits encodes the merge's delta.
  void fit_round() {
    if (!fitter) return;
    std::vector<bool> live(learners.size());
    for (size_t m = 0; m < learners.size(); ++m) live[m] = learners[m].up && !learners[m].retired;
    syncer->set_link_period(fitter->longest_period(live));
    if (!cfg.broadcast_auto()) return;
    const int j = fitter->broadcast(live);
    if (j == delta_choice) return;
    ++codec_changes;
    emit(rec::broadcast_codec_record(*fitter, delta_choice, j));
    delta_choice = j;
    syncer->use_delta_encoding(fitter->broadcast_ladder().codecs.at(static_cast<size_t>(j)).encoding);
  }

  void on_arrive(std::shared_ptr<Contribution> c, int64_t epoch, bool from_network = true, bool final = false) {
    if (from_network) --inflight;
    if (paused) {
      deferred.push_back({std::move(c), epoch, final});
      return;
    }
    const int64_t m = c->learner, p = c->fragment, base = c->base_version;
    if (final) {  // held for the final round (its learner is done: a refusal only counts)
      const SyncReject why = syncer->receive_final(std::move(*c));
      if (why != SyncReject::kNone) {
        ++finals_rejected;
        rec::Reject rj;
        rj.learner = m;
        rj.fragment = p;
        rj.reason = sync_reject_name(why);
        emit(rj);
      }
      return;
    }
    const SyncReject why = syncer->receive(now, std::move(*c));
    if (why == SyncReject::kNone && epoch == learners[m].epoch) answer_marks.accepted(m, p, base);
    if (why != SyncReject::kNone) {
      rec::Reject rj;
      rj.learner = m;
      rj.fragment = p;
      rj.reason = sync_reject_name(why);
      emit(rj);
      tell_refused(m, p, epoch, refusal_drops_drift(why));
    }
    try_merge(p);
  }

  // The reject frame the syncer node sends for a refused push, on its way to the learner.
  void tell_refused(int64_t m, int64_t p, int64_t epoch, bool drop) {
    Event r;
    r.t = arrival(m, frame_bytes(0), /*up=*/false, now);
    r.kind = kRefused;
    r.learner = m;
    r.fragment = p;
    r.epoch = epoch;
    r.drop_drift = drop;
    push(r);
  }

  void on_refused(const Event& e) {
    Learner& L = learners[e.learner];
    if (e.epoch != L.epoch || !L.up || L.done) return;
    if (e.drop_drift) {
      L.core->drop_drift(e.fragment);
      rec::DriftDropped d;
      d.learner = e.learner;
      d.fragment = e.fragment;
      d.version = L.core->version(e.fragment);
      d.step = L.work->step();
      emit(d);
    } else {
      L.core->refused(e.fragment);
    }
    if (L.waiting || L.finishing) boundary(e.learner);
  }

  void try_merge(int64_t p) {
    if (paused) return;
    fit_round();
    RoundResult r = syncer->on_round(now, p);
    if (r.decision.kind == RoundDecision::kWaitUntil) {
      Event e;
      e.t = r.decision.until;
      e.kind = kTimer;
      e.fragment = p;
      push(e);
      return;
    }
    const MergeOutcome& out = r.outcome;
    if (r.rolled_back()) {  // nothing changed, nothing to broadcast; its contributions were rejected
      for (int64_t m : out.learners) {
        rec::Reject rj;
        rj.learner = m;
        rj.fragment = p;
        rj.reason = sync_reject_name(out.rejected);
        rj.detail = out.detail;
        emit(rj);
        tell_refused(m, p, learners[m].epoch, false);
      }
      return;
    }
    if (!r.merged()) return;
    ++merges;
    if (fitter) fitter->observe_merge(p, now);
    // The broadcast payload, encoded and decoded as the learner node receives it.
    auto snap = std::make_shared<Snapshot>();
    snap->fragment = p;
    snap->version = out.version;
    snap->flat = r.flat;
    if (r.delta) {  // the delta as the learner node decodes it; flat (Θ_p, exact) only for a learner that lacks the base
      snap->delta = torch::empty({layouts[p].elements}, torch::kFloat);
      decode_floats_into(r.delta->data(), r.delta->size(), syncer->delta_encoding(), static_cast<size_t>(layouts[p].elements),
                         snap->delta.data_ptr<float>());
      snap->delta_frame = frame_bytes(static_cast<int64_t>(r.delta->size()));
    } else if (answer_enc != Encoding::kFp32 && !delta_on) {
      const std::string wire = encode_floats(snap->flat.data_ptr<float>(), static_cast<size_t>(layouts[p].elements), answer_enc);
      decode_floats_into(wire.data(), wire.size(), answer_enc, static_cast<size_t>(layouts[p].elements),
                         snap->flat.data_ptr<float>());
    }
    answer_marks.merged(p, out.learners);
    const int64_t down = r.delta ? snap->delta_frame : fragment_frame_bytes(p, delta_on ? Encoding::kFp32 : answer_enc);
    const double leave = now + cfg.sim.merge_time;
    for (int64_t m = 0; m < static_cast<int64_t>(learners.size()); ++m) {
      Learner& L = learners[m];
      if (!L.up || L.done) continue;
      Event a;
      double took = 0;
      a.t = arrival(m, down, /*up=*/false, leave, &took);
      a.took = took;
      a.kind = kAnswer;
      a.learner = m;
      a.fragment = p;
      a.epoch = L.epoch;
      a.snapshot = snap;
      a.covers = answer_marks.mark(m, p);
      a.sync_every = syncer->local_updates(m);
      push(a);
      if (fitter) fitter->observe_download(m, static_cast<double>(down), took);
      bytes_down += down;
      L.bytes_down += down;
    }
    // The upload: the latest push of this fragment (a sparse push's size depends on what it holds).
    const int64_t up = last_push_frame[static_cast<size_t>(p)] > 0 ? last_push_frame[static_cast<size_t>(p)]
                                                                   : fragment_frame_bytes(p, cfg.push_encoding());
    const bool measured = cfg.sim.queued_links;
    syncer->observe_sync(measured && upload_seen.seeded ? upload_seen.value : transfer(up), cfg.sim.merge_time,
                         measured && broadcast_seen.seeded ? broadcast_seen.value : transfer(down));
    emit(rec::merge_record(r, p, total_tokens()));
  }

  void on_answer(const Event& e) {
    Learner& L = learners[e.learner];
    if (e.epoch != L.epoch || !L.up) return;
    broadcast_seen.add(e.took, cfg.sync.ema);
    if (!e.snapshot->delta.defined() ||
        !L.core->receive_delta(e.snapshot->fragment, e.snapshot->version, e.snapshot->delta, e.covers)) {
      if (e.snapshot->delta.defined()) {  // it lacks the delta's base: the whole fragment follows, in fp32
        ++dense_fallbacks;
        bytes_down += fragment_frame_bytes(e.snapshot->fragment, Encoding::kFp32);
        L.bytes_down += fragment_frame_bytes(e.snapshot->fragment, Encoding::kFp32);
      }
      L.core->receive(e.snapshot->fragment, e.snapshot->version, e.snapshot->flat, e.covers);
    }
    L.core->set_sync_every(e.sync_every);
    if (L.waiting || L.finishing) boundary(e.learner);
  }

  void schedule_failure(int64_t m) {
    if (cfg.sim.mtbf <= 0) return;
    Learner& L = learners[m];
    std::exponential_distribution<double> ex(1.0 / cfg.sim.mtbf);
    Event f;
    f.t = now + ex(L.chaos_rng);
    f.kind = kFail;
    f.learner = m;
    f.epoch = L.epoch;
    f.fragment = 1;  // marks a Poisson failure (reschedules itself after rejoin)
    push(f);
  }

  void on_fail(const Event& e) {
    Learner& L = learners[e.learner];
    if (e.fragment == 1 && e.epoch != L.epoch) return;  // a Poisson failure from before the last failure
    if (!L.up || L.done) return;
    ++failures;
    if (L.stepping) L.lost += now - L.step_started;
    if (L.waiting) L.waited += now - L.wait_started;
    L.up = false;
    L.stepping = L.waiting = L.finishing = L.finished_heard = false;  // (a beat on its way is lost with the epoch)
    ++L.epoch;
    answer_marks.forget(e.learner);
    L.core->forget_in_flight();
    syncer->set_connected(e.learner, false);
    rec::Fail f;
    f.learner = e.learner;
    f.step = L.work->step();
    emit(f);
    // No round waits for a learner that is gone: as the syncer node does when it counts one gone (on_round's
    // contract: run it again when the learners' connections change).
    for (int64_t p = 0; p < static_cast<int64_t>(layouts.size()); ++p) try_merge(p);
    Event r;
    r.t = now + cfg.sim.downtime;
    r.kind = kRejoin;
    r.learner = e.learner;
    push(r);
  }

  void on_rejoin(const Event& e) {
    // The learner is back and asks for the global model; it arrives after one full-model transfer (fp32 chunks,
    // as the syncer node sends them) and holds the newest Θ at that moment (merges during the transfer included).
    const int64_t bytes = frame_bytes(model_layout.elements * 4);
    bytes_down += bytes;
    learners[e.learner].bytes_down += bytes;
    Event r;
    r.t = arrival(e.learner, bytes, /*up=*/false, now);
    r.kind = kRestore;
    r.learner = e.learner;
    push(r);
  }

  at::Tensor global_flat() const {
    at::Tensor flat = torch::empty({model_layout.elements}, torch::kFloat);
    std::vector<at::Tensor> ts;
    for (const auto& [n, t] : syncer->global()) ts.push_back(t);
    flatten_into(ts, flat.data_ptr<float>());
    return flat;
  }

  void on_restore(const Event& e) {
    Learner& L = learners[e.learner];
    L.core->install(global_flat(), syncer->versions());
    syncer->note_joined(e.learner);
    L.up = true;
    syncer->set_connected(e.learner, true);
    rec::Rejoin rj;
    rj.learner = e.learner;
    rj.step = L.work->step();
    emit(rj);
    if (self->on_rejoin) self->on_rejoin(e.learner, L.work->parameters(), syncer->global());
    schedule_failure(e.learner);
    boundary(e.learner);
  }

  // final: the "final_eval" record, else "eval" (the same fields).
  void evaluate_global(bool final) {
    torch::NoGradGuard ng;
    auto& params = evaluator->parameters();
    const auto& g = syncer->global();
    for (size_t i = 0; i < g.size(); ++i) params[i].second.copy_(g[i].second);
    last_eval = evaluator->evaluate();
    rec::Eval ev;
    ev.val_loss = last_eval.loss;
    ev.val_bpb = last_eval.bpb;
    ev.loss_unit = last_eval.loss_unit;
    ev.tokens = total_tokens();
    ev.outer_steps = merges;
    if (final) {
      rec::FinalEval fe;
      static_cast<rec::Eval&>(fe) = ev;
      emit(fe);
    } else {
      emit(ev);
    }
  }

  // sim.eval_learners: each learner's own parameters, then their plain mean, on the evaluator's tokens.
  nlohmann::json evaluate_learners() {
    torch::NoGradGuard ng;
    auto& params = evaluator->parameters();
    nlohmann::json own = nlohmann::json::array();
    std::vector<at::Tensor> sum;
    for (auto& L : learners) {
      const auto& lp = L.work->parameters();
      for (size_t i = 0; i < lp.size(); ++i) {
        params[i].second.copy_(lp[i].second);
        if (sum.size() <= i) sum.push_back(lp[i].second.detach().to(torch::kFloat).clone());
        else sum[i].add_(lp[i].second.detach().to(torch::kFloat));
      }
      own.push_back(evaluator->evaluate().loss);
    }
    for (size_t i = 0; i < sum.size(); ++i) params[i].second.copy_(sum[i] / static_cast<double>(learners.size()));
    const double mean = evaluator->evaluate().loss;
    return {{"learners_val_loss", own}, {"learners_mean_val_loss", mean}};
  }

  bool all_done() const {
    for (const auto& l : learners)
      if (!l.done) return false;
    return true;
  }
  bool finished() const { return all_done() && inflight == 0 && deferred.empty(); }
  bool is_stalled() const {
    if (all_done()) return false;
    bool any_up = false;
    for (const auto& l : learners) any_up = any_up || (l.up && !l.done);
    if (!any_up) return true;
    if (paused) {
      if (!deferred.empty()) return true;
      for (size_t p = 0; p < layouts.size(); ++p)
        if (syncer->pending(static_cast<int64_t>(p)) > 0) return true;
    }
    return syncer->stalled();
  }
};
#pragma GCC diagnostic pop

RunConfig simulated_run(const RunConfig& run, const AlgorithmConfig& algo) {
  RunConfig r = run;
  if (r.train.precision == "auto") r.train.precision = "fp32";
  resolve_inner_optimizer(r.train, algo.merge.preset);
  return r;
}

Simulator::Simulator(const RunConfig& run, const SimConfig& cfg, std::shared_ptr<const Corpus> corpus)
    : Simulator(run, cfg, gpt_workloads(simulated_run(run, cfg), std::move(corpus))) {}

Simulator::Simulator(const RunConfig& run, const SimConfig& cfg_in, WorkloadFactory workloads)
    : impl_(std::make_unique<Impl>()) {
  SimConfig cfg = cfg_in;
  cfg.resolve();
  cfg.validate(run);
  Impl& I = *impl_;
  I.run = simulated_run(run, cfg);
  I.cfg = cfg;
  I.self = this;
  I.answer_enc = cfg.answer_encoding();
  const int64_t M = cfg.sync.learners;
  for (int64_t m = 0; m < M; ++m) {
    Learner L;
    L.work = workloads(m, M);
    L.rng.seed(static_cast<uint64_t>(cfg.sim.seed) * 1000003u + static_cast<uint64_t>(m) * 2u);
    L.chaos_rng.seed(static_cast<uint64_t>(cfg.sim.seed) * 1000003u + static_cast<uint64_t>(m) * 2u + 1u);
    L.speed = m < static_cast<int64_t>(cfg.sim.speed_factors.size()) ? cfg.sim.speed_factors[m] : 1.0;
    const int64_t n_slow = static_cast<int64_t>(std::floor(cfg.sim.slow_fraction * static_cast<double>(M) + 1e-9));
    if (m >= M - n_slow) L.speed *= cfg.sim.slow_factor;
    I.learners.push_back(std::move(L));
  }
  I.evaluator = workloads(0, 1);
  // Every learner starts from learner 0's initial parameters (identical anyway: same seed).
  auto& p0 = I.learners[0].work->parameters();
  {
    torch::NoGradGuard ng;
    for (int64_t m = 1; m < M; ++m) {
      auto& pm = I.learners[m].work->parameters();
      for (size_t i = 0; i < p0.size(); ++i) pm[i].second.copy_(p0[i].second);
    }
  }
  ModelPlan plan;
  try {
    plan = plan_model(p0, cfg.sync.fragments, cfg.sync.sync_every);
  } catch (const SyncError& e) {
    throw ConfigError(e.what());
  }
  I.syncer = std::make_unique<Syncer>(cfg.sync, plan.fragments, p0, cfg.merge_plan(), cfg.outer);
  I.delta_on = cfg.delta_broadcast();
  if (I.delta_on) I.syncer->set_delta_broadcast(cfg.answer_codec());
  for (int64_t m = 0; m < M; ++m) I.syncer->set_budget(m, learner_budget(*I.learners[m].work, m, M, run.train.steps));
  for (int64_t m = 0; m < M; ++m) {
    Learner& L = I.learners[m];
    L.core = std::make_unique<LearnerCore>(cfg.sync, plan, L.work->parameters(), run.train.steps, cfg.push_codec(),
                                           cfg.error_feedback, cfg.error_feedback_decay);
    I.syncer->note_joined(m);
  }
  I.layouts = plan.fragment_layouts;
  I.last_push_frame.assign(I.layouts.size(), 0);
  I.up_free.assign(I.learners.size(), 0.0);  // sim.queued_links: every link free at the start
  I.down_free.assign(I.learners.size(), 0.0);
  {
    std::vector<int64_t> elements;
    for (const auto& L : I.layouts) elements.push_back(L.elements);
    I.fitter = make_codec_fitter(cfg, elements, M);
    if (cfg.broadcast_auto()) {  // int4 first (answer_codec), as the fitter's broadcast() before any fit
      I.syncer->set_delta_codecs(broadcast_codecs(cfg));
      I.delta_choice = start_index(I.fitter->broadcast_ladder());
    }
  }
  I.model_layout = plan.model;
}

Simulator::~Simulator() = default;

const std::vector<std::pair<std::string, at::Tensor>>& Simulator::global() const { return impl_->syncer->global(); }
Workload& Simulator::learner(int64_t m) { return *impl_->learners.at(static_cast<size_t>(m)).work; }
const Syncer& Simulator::syncer() const { return *impl_->syncer; }
const std::string& Simulator::precision() const { return impl_->run.train.precision; }

SimResult Simulator::run(const std::function<void(const nlohmann::json&)>& record) {
  Impl& I = *impl_;
  I.record = record;
  const auto& S = I.cfg.sim;
  const int64_t M = static_cast<int64_t>(I.learners.size());
  I.evaluate_global(/*final=*/false);
  I.initial_val_loss = I.last_eval.loss;
  for (size_t i = 0; i < S.fail_times.size(); ++i) {
    Event f;
    f.t = S.fail_times[i];
    f.kind = kFail;
    f.learner = S.fail_learners[i];
    I.push(f);
  }
  for (size_t i = 0; i < S.straggler_times.size(); ++i) {
    Event on;
    on.t = S.straggler_times[i];
    on.kind = kStragglerOn;
    on.learner = S.straggler_learners[i];
    I.push(on);
    on.t += S.straggler_duration;
    on.kind = kStragglerOff;
    I.push(on);
  }
  for (double t : S.pause_times) {
    Event p;
    p.t = t;
    p.kind = kPauseOn;
    I.push(p);
    p.t = t + S.pause_duration;
    p.kind = kPauseOff;
    I.push(p);
  }
  if (S.eval_interval > 0) {
    Event ev;
    ev.t = S.eval_interval;
    ev.kind = kEval;
    I.push(ev);
  }
  for (int64_t m = 0; m < M; ++m) {
    I.schedule_failure(m);
    I.start_step(m);
  }
  bool hit_max = false;
  while (!I.queue.empty() && !I.finished()) {
    Event e = I.queue.top();
    if (S.max_time > 0 && e.t > S.max_time) {
      if (I.is_stalled()) I.stalled_time += S.max_time - I.now;
      I.now = S.max_time;
      hit_max = true;
      break;
    }
    I.queue.pop();
    if (I.is_stalled()) I.stalled_time += e.t - I.now;
    I.now = e.t;
    switch (e.kind) {
      case kStepDone: I.on_step_done(e); break;
      case kArrive:
        if (!e.final) I.upload_seen.add(e.took, I.cfg.sync.ema);
        I.on_arrive(e.contribution, e.epoch, true, e.final);
        break;
      case kRefused: I.on_refused(e); break;
      case kTimer: I.try_merge(e.fragment); break;
      case kRetire: I.on_retire(e); break;
      case kFinished: I.on_finished(e); break;
      case kAnswer: I.on_answer(e); break;
      case kFail: I.on_fail(e); break;
      case kRejoin: I.on_rejoin(e); break;
      case kRestore: I.on_restore(e); break;
      case kStragglerOn:
        ++I.learners[e.learner].straggling;
        I.learners[e.learner].straggle = S.straggler_factor;
        break;
      case kStragglerOff:
        if (--I.learners[e.learner].straggling == 0) I.learners[e.learner].straggle = 1.0;
        break;
      case kPauseOn:
        if (I.pauses++ == 0) {
          I.paused = true;
          I.emit(rec::SyncerPause{});
        }
        break;
      case kPauseOff: {
        if (--I.pauses > 0) break;  // another pause still lasts
        I.paused = false;
        I.emit(rec::SyncerResume{});
        auto pending = std::move(I.deferred);
        I.deferred.clear();
        for (auto& d : pending) I.on_arrive(d.c, d.epoch, false, d.final);
        for (int64_t p = 0; p < static_cast<int64_t>(I.syncer->fragments().size()); ++p) I.try_merge(p);
        break;
      }
      case kEval: {
        I.evaluate_global(/*final=*/false);
        Event ev;
        ev.t = I.now + S.eval_interval;
        ev.kind = kEval;
        I.push(ev);
        break;
      }
    }
  }
  // Contributions still waiting (sent with the last steps) are merged before the final evaluation.
  if (!hit_max)
    for (const RoundResult& r : I.syncer->drain(I.now)) I.merges += r.merged() ? 1 : 0;
  // sync.final_round: the final model is the learners' final states' weighted mean (what arrived of them).
  nlohmann::json final_round;
  if (I.cfg.sync.final_round) {
    int64_t fragments = 0;
    for (const RoundResult& r : I.syncer->final_round()) {
      if (r.merged()) {
        ++fragments;
        I.emit(rec::final_merge_record(r));
      } else {
        I.emit(rec::rolled_back_record(r, r.outcome.fragment));
      }
    }
    int64_t unsent = 0;  // fragments of learners still waiting for an answer when the run ended
    for (const auto& L : I.learners) unsent += L.finishing ? static_cast<int64_t>(L.core->in_flight().size()) : 0;
    final_round = {{"states_sent", I.finals_sent}, {"states_merged", I.syncer->finals_merged()},
                   {"states_rejected", I.finals_rejected}, {"fragments", fragments}, {"states_unsent", unsent}};
  }
  I.evaluate_global(/*final=*/true);
  const nlohmann::json own = S.eval_learners ? I.evaluate_learners() : nlohmann::json();
  const double T = I.now;
  double useful = 0, waited = 0, lost = 0;
  int64_t steps = 0;
  nlohmann::json per_learner = nlohmann::json::array();
  for (const auto& L : I.learners) {
    useful += L.useful;
    waited += L.waited;
    lost += L.lost;
    steps += L.work->step();
    per_learner.push_back({{"steps", L.work->step()}, {"tokens", L.tokens}, {"useful_s", L.useful},
                           {"waited_s", L.waited}, {"lost_s", L.lost}, {"speed", L.speed},
                           {"bytes_up", L.bytes_up}, {"bytes_down", L.bytes_down}});
  }
  rec::RunSummary s;
  s.command = "sim";
  s.final_val_loss = I.last_eval.loss;
  s.val_bpb = I.last_eval.bpb;
  s.loss_unit = I.last_eval.loss_unit;
  s.initial_val_loss = I.initial_val_loss;
  s.tokens = I.total_tokens();
  s.outer_steps = I.merges;
  s.uptime = run_uptime(I.stalled_time, T);
  s.goodput = run_goodput(useful, M, T);
  s.failures = I.failures;
  s.bytes_sent = I.bytes_up + I.bytes_down;
  s.contributions_merged = I.syncer->merged_contributions();
  s.contributions_rejected = I.syncer->rejected_contributions();
  // The simulator's own fields.
  s.extra = {
      {"inner_steps", steps},
      {"virtual_seconds", T},
      {"uptime_until_first_done", I.first_done_t > 0 ? run_uptime(I.stalled_at_first_done, I.first_done_t)
                                                     : run_uptime(I.stalled_time, T)},
      {"stalled_seconds", I.stalled_time},
      {"waited_seconds", waited},
      {"lost_seconds", lost},
      {"bytes_up", I.bytes_up},
      {"bytes_down", I.bytes_down},
      {"delta_fallbacks", I.dense_fallbacks},
      // As the syncer node's summary: the measured transfer times, and ξ_sync (upload + merge + broadcast).
      {"upload_seconds", I.upload_seen.seeded ? nlohmann::json(I.upload_seen.value) : nlohmann::json()},
      {"broadcast_seconds", I.broadcast_seen.seeded ? nlohmann::json(I.broadcast_seen.value) : nlohmann::json()},
      {"sync_seconds", I.syncer->stats().sync.seeded ? nlohmann::json(I.syncer->stats().sync.value) : nlohmann::json()},
      {"parameters", I.model_layout.elements},
      {"precision", I.run.train.precision},
      {"rejected_by_reason", I.syncer->rejected()},
      {"stale_bases", I.syncer->stale_bases()},
      {"reached_max_time", hit_max},
      {"learners", per_learner},
  };
  if (S.eval_learners) s.extra.update(own);
  if (!final_round.is_null()) s.extra["final_round"] = final_round;
  if (I.fitter) {  // net.encoding / net.broadcast_encoding = auto (as the syncer node's summary)
    s.extra["codecs"] = rec::codec_summary(*I.fitter, M);
    s.extra["codec_changes"] = I.codec_changes;
  }
  SimResult r;
  r.summary = s.to_json();
  return r;
}

}  // namespace deloco
