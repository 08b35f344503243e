// The learner process on the wall clock: a Workload and the learner core (deloco/learner.h) on the main thread,
// all networking on one comms thread.
//
// Main thread, per inner step: hand the answers the comms thread received to the core → the core applies those
// whose time has come (and says whether to wait: synchronous and streaming DiLoCo) → one inner step → the core
// returns the pushes due, already encoded → hand them to the comms thread. The algorithm is the core's; this file
// only moves bytes, keeps time and writes records.
// Comms thread: hello until welcomed (downloading the global parameters in verified chunks), heartbeats, pushes,
// broadcasts into the inbox, noticing a silent syncer (then hello again). One handler per message kind.
#include "learner_node_impl.h"

namespace deloco {

void LearnerNode::Impl::publish_versions() {
  std::lock_guard<std::mutex> lock(mu);
  held_versions = core->versions();
}

void LearnerNode::Impl::save_state() {
  if (cfg.learner.state_dir.empty()) return;
  TensorFile opt;
  opt.tensors = work->optimizer_state();
  nlohmann::json manifest{{"kind", "learner"}, {"learner", id}, {"step", work->step()},
                          {"model_fingerprint", work->fingerprint()}};
  save_learner_state(state_path(), work->step(), manifest, opt);
}

void LearnerNode::Impl::remember_initial() {
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

void LearnerNode::Impl::load_state() {
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

void LearnerNode::Impl::stop_comms() {
  {
    std::lock_guard<std::mutex> lock(mu);
    comms_stop = true;
  }
  if (comms.joinable()) comms.join();
}

void LearnerNode::Impl::throw_if_fatal() {
  std::lock_guard<std::mutex> lock(mu);
  if (!fatal.empty()) throw_fatal();
}

void LearnerNode::Impl::begin(const std::atomic<bool>& stop) {
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

std::vector<Applied> LearnerNode::Impl::apply_answers(int64_t step, bool installed) {
  const std::vector<Applied> applied = core->apply_due(step);
  for (const auto& a : applied) {
    rec::Apply r;
    r.fragment = a.fragment;
    r.version = a.version;
    r.step = step;
    emit(r);
  }
  if (installed || !applied.empty()) publish_versions();  // the comms thread compares welcomes against them
  return applied;
}

bool LearnerNode::Impl::boundary(const std::atomic<bool>& stop) {
  if (phase != Phase::kTraining) throw std::logic_error("LearnerNode: not training (start() first, not after finish())");
  for (;;) {
    auto c0 = clk::now();
    throw_if_fatal();
    const std::vector<int64_t> installed = take_received();
    const int64_t step = work->step();
    const std::vector<Applied> applied = apply_answers(step, !installed.empty());
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

void LearnerNode::Impl::after(const StepResult& r, double dt) {
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
  std::vector<rec::PushUnsent> unsent;
  {
    std::lock_guard<std::mutex> lock(mu);
    pushes_due += static_cast<int64_t>(due.size());
    for (auto& p : due) {
      // A push of the same fragment still waiting (its link's window is full) is replaced: the new one's
      // Θ_p^v − θ_p and counters (kept since its base version) hold its progress too.
      for (auto it = outbox.begin(); it != outbox.end();) {
        if (it->fragment != p.fragment) {
          ++it;
          continue;
        }
        rec::PushUnsent u;
        u.fragment = it->fragment;
        u.step = it->step;
        u.reason = "superseded";
        u.replaced_by = p.step;
        unsent.push_back(u);
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
  for (auto& u : unsent) emit(link_of(u.fragment), std::move(u));
  if (now_step % state_every == 0) save_state();
  comm_seconds += secs(c3, clk::now());
}

void LearnerNode::Impl::send_final_states() {
  const int64_t step = work->step();
  const auto deadline = clk::now() + std::chrono::duration<double>(cfg.net.join_timeout);
  auto c0 = clk::now();
  std::vector<int64_t> unanswered;
  for (;;) {
    throw_if_fatal();
    apply_answers(step, !take_received().empty());
    unanswered = core->in_flight();
    if (unanswered.empty() || clk::now() >= deadline) break;
    std::unique_lock<std::mutex> lock(mu);
    // An answer from a shard that is not joined will not come.
    const bool any_joined = std::any_of(unanswered.begin(), unanswered.end(), [&](int64_t p) { return link_of(p).joined; });
    if (!any_joined || !fatal.empty()) break;
    cv.wait_for(lock, std::chrono::milliseconds(20),
                [&] { return !inbox.empty() || !refused_pushes.empty() || any_state_ready() || !fatal.empty(); });
  }
  wait_seconds += secs(c0, clk::now());
  std::vector<Push> finals = core->final_pushes(step);
  {
    std::lock_guard<std::mutex> lock(mu);
    pushes_due += static_cast<int64_t>(finals.size() + unanswered.size());
    pushes_unsent_at_end += static_cast<int64_t>(unanswered.size());
    for (auto& p : finals) outbox.push_back(std::move(p));
  }
  for (int64_t p : unanswered) {
    rec::PushUnsent u;
    u.fragment = p;
    u.step = step;
    u.reason = "unanswered_at_end";
    emit(link_of(p), u);
  }
}

nlohmann::json LearnerNode::Impl::end() {
  if (phase != Phase::kTraining) throw std::logic_error("LearnerNode: finish() without start(), or twice");
  phase = Phase::kFinished;
  const int64_t steps = cfg.run.train.steps;
  const bool done = work->step() >= steps;
  if (cfg.sync.final_round && done) send_final_states();
  // sync.apply = rebase: a fragment in flight at the last step did not push its rest (LearnerCore::held_back_at_end):
  // a push due and not made, accounted as unsent at the end.
  for (int64_t p : core->held_back_at_end(work->step())) {
    rec::PushUnsent u;
    u.fragment = p;
    u.step = work->step();
    u.reason = "unanswered_at_end";
    {
      std::lock_guard<std::mutex> lock(mu);
      ++pushes_due;
      ++pushes_unsent_at_end;
    }
    emit(link_of(p), u);
  }
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
  // Pushes still waiting for their link's window (the goodbye goes only after them, so the learner left without it).
  std::deque<Push> left;
  {
    std::lock_guard<std::mutex> lock(mu);
    left.swap(outbox);
    pushes_unsent_at_end += static_cast<int64_t>(left.size());
  }
  for (const Push& p : left) {
    rec::PushUnsent u;
    u.fragment = p.fragment;
    u.step = p.step;
    u.reason = "at_end";
    emit(link_of(p.fragment), u);
  }
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
  d.record_errors = record_errors.load();
  d.pushes_due = pushes_due;
  d.pushes_unsent_at_end = pushes_unsent_at_end;
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

std::vector<int64_t> LearnerNode::Impl::refused_links() const {
  std::vector<int64_t> out;
  for (const auto& L : links)
    if (!L.ever_joined && L.c.syncer.auth_refusals() > 0) out.push_back(L.plan.shard);
  return out;
}

nlohmann::json LearnerNode::Impl::run(const std::atomic<bool>& stop) {
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
  I.push_ladder = push_codecs(I.cfg);
  I.held_versions = I.core->versions();
  I.links.resize(shards.size());
  for (size_t s = 0; s < shards.size(); ++s) {
    I.links[s].plan = plan_shard(plan, static_cast<int64_t>(shards.size()), static_cast<int64_t>(s));
    I.links[s].tx = std::move(shards[s]);
    I.links[s].c.syncer = SyncerLink({I.cfg.net.heartbeat, I.cfg.net.dead_after, I.cfg.net.join_timeout});
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
