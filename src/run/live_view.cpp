// The live view of `deloco run` (contract in live_view.h).
#include "run/live_view.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "records/kinds.h"
#include "records/record.h"
#include "util/clock.h"

namespace deloco::run {
using nlohmann::json;

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

int64_t next_milestone(int64_t m) {
  for (int64_t base = 10;; base *= 10)
    for (int64_t k : {1, 2, 5})
      if (k * base > m) return k * base;
}

RunRecords::RunRecords(int64_t learners, RejoinLog* rejoins, std::function<void(const std::string&)> event,
                       int64_t shards)
    : rejoins_(rejoins),
      event_(std::move(event)),
      shards_(static_cast<size_t>(std::max<int64_t>(1, shards))),
      learners_(static_cast<size_t>(learners)) {}

SyncerView RunRecords::syncer() const {
  if (shards_.size() == 1) return shards_[0];
  SyncerView v;
  v.val_loss = shards_[0].val_loss;
  v.val_bpb = shards_[0].val_bpb;
  v.quorum = last_quorum_;
  for (const auto& s : shards_) {
    v.merges += s.merges;
    v.rejected += s.rejected;
    v.starts += s.starts;
    if (std::isfinite(s.uptime)) v.uptime = std::isfinite(v.uptime) ? std::min(v.uptime, s.uptime) : s.uptime;
    v.blocked = v.blocked || s.blocked;
    if (!s.leader.empty()) {  // a standby pair per shard: which syncer leads each, in shard order
      v.leader += (v.leader.empty() ? "" : "/") + s.leader;
      v.epoch = std::max(v.epoch, s.epoch);
    }
  }
  return v;
}

void RunRecords::set_pairs() {
  for (auto& s : shards_) {
    s.leader = "primary";
    s.epoch = 1;
  }
}

void RunRecords::on_line(const std::string& line, int64_t learner, int64_t shard, bool standby) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string()) return;
  try {
    if (learner < 0)
      on_syncer_record(j, std::clamp<int64_t>(shard, 0, static_cast<int64_t>(shards_.size()) - 1), standby);
    else on_learner_record(j, learner);
  } catch (const json::exception&) {
    // A record with an unexpected field type: the live view ignores it.
  }
}

namespace {

// The record of kind R in j, read through the schema (records/kinds.h), or nullopt when j is another kind or one of
// the fields the view uses (`used`) has an unexpected JSON type: the view ignores that record.
template <class R> std::optional<R> read(const json& j, std::initializer_list<const char*> used) {
  std::vector<std::string> wrong;
  std::optional<R> r = rec::from_json<R>(j, &wrong);
  for (const auto& w : wrong)
    for (const char* u : used)
      if (w == u) return std::nullopt;
  return r;
}

// Whether j has `key` (not null): a schema field the view tells apart from its default (it keeps its state then).
bool has(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && !it->is_null();
}

}  // namespace

void RunRecords::on_syncer_record(const json& j, int64_t shard, bool standby) {
  SyncerView& s = shards_[static_cast<size_t>(shard)];
  const std::string who = (shards_.size() > 1 ? "syncer shard " + std::to_string(shard) : std::string("syncer")) +
                          (standby ? " (standby)" : s.leader.empty() ? "" : " (primary)");
  const int side = standby ? 1 : 0;
  const auto when = [](const rec::RecordBase& r) { return r.t.value_or(unix_now()); };
  if (auto to = read<rec::TakeOver>(j, {"epoch", "silent_seconds", "rounds_checked", "mismatches", "merges", "detail"})) {
    if (to->epoch >= s.epoch) {  // the two files are read in turn: an older takeover read late changes nothing
      s.leader = standby ? "standby" : "primary";
      s.epoch = to->epoch;
    }
    s.lead_since = std::max(s.lead_since, when(*to));  // the other syncer follows it once it holds its image
    event_(who + " took over (epoch " + std::to_string(to->epoch) + ") after " + fixed(to->silent_seconds, 2) +
           " s without the leader, at " + std::to_string(to->merges) + " merges; " + std::to_string(to->rounds_checked) +
           " rounds checked, " + std::to_string(to->mismatches) + " differed" +
           (to->detail.empty() ? std::string() : " (" + to->detail + ")"));
    if (standby && shard == 0 && standby_port_ > 0 && standby_port_ != dashboard_port_) {  // the leader's dashboard
      dashboard_port_ = standby_port_;
      event_("dashboard: http://" + dashboard_host_ + ":" + std::to_string(standby_port_) + "/");
    }
    return;
  }
  if (auto fm = read<rec::FailoverMerge>(j, {"seconds_after_takeover"})) {
    event_(who + ": first merge " + fixed(fm->seconds_after_takeover, 2) + " s after the takeover");
    return;
  }
  if (auto sb = read<rec::Standby>(j, {"event"})) {
    const double at = when(*sb);
    if (sb->event == "image") s.image_at[side] = std::max(s.image_at[side], at);
    if (sb->event == "gap" || sb->event == "mismatch" || sb->event == "malformed" || sb->event == "image_refused")
      s.lost_at[side] = std::max(s.lost_at[side], at);
    if (sb->event == "dropped") s.lost_at[1 - side] = std::max(s.lost_at[1 - side], at);  // the leader dropped it
    return;
  }
  if (auto sd = read<rec::StepDown>(j, {"epoch", "newer_epoch"})) {
    event_(who + " stepped down: a leader of epoch " + std::to_string(sd->newer_epoch) + " exists; it follows it");
    return;
  }
  if (standby) {
    if (auto st = read<rec::Started>(j, {"metrics_port"})) {  // a standby's start is no syncer (re)start
      if (shard == 0) standby_port_ = st->metrics_port;
      return;
    }
  }
  if (auto st = read<rec::Started>(j, {"resumed", "merges", "metrics_port", "metrics_warning", "follows"})) {
    ++s.starts;
    if (st->resumed && !st->follows) event_(who + " resumed at " + std::to_string(st->merges) + " merges");
    // Its dashboard (the metrics endpoint's /), once per port: a restarted syncer listens on a new one.
    const int64_t port = st->metrics_port;
    if (port > 0 && shard == 0 && port != dashboard_port_) {
      dashboard_port_ = port;
      event_("dashboard: http://" + dashboard_host_ + ":" + std::to_string(port) + "/");
      // Bound beyond loopback (syncer.metrics = ":0"): the syncer's warning names the real address.
      if (!st->metrics_warning.empty()) event_("WARNING: " + st->metrics_warning);
    }
  } else if (auto m = read<rec::Merge>(j, {"merges", "quorum"})) {
    s.merges = m->merges.value_or(s.merges + 1);
    if (has(j, "quorum")) s.quorum = m->quorum;
    last_quorum_ = s.quorum;
    const int64_t total = syncer().merges;
    if (total >= next_milestone_) {
      event_(std::to_string(total) + " merges");
      next_milestone_ = next_milestone(total);
    }
  } else if (auto e = read<rec::Eval>(j, {"val_loss", "val_bpb", "loss_unit", "merges"})) {
    s.val_loss = has(j, "val_loss") ? e->val_loss : NAN;
    s.val_bpb = has(j, "val_bpb") ? e->val_bpb : NAN;
    event_("eval: val loss " + fixed(s.val_loss, 4) + " " + (has(j, "loss_unit") ? e->loss_unit : "nats/byte") + ", " +
           fixed(s.val_bpb, 3) + " bits/byte after " +
           std::to_string(shards_.size() > 1 ? syncer().merges : e->merges.value_or(s.merges)) + " merges");
  } else if (auto u = read<rec::Status>(j, {"uptime", "rejected", "blocked"})) {
    if (has(j, "uptime")) s.uptime = u->uptime;
    if (has(j, "rejected")) s.rejected = u->rejected;
    s.blocked = u->blocked;
  } else if (read<rec::LearnersBlocked>(j, {})) {
    s.blocked = true;
    event_(who + ": every connected learner stopped advancing (blocked); counted as stalled");
  } else if (read<rec::LearnersAdvancing>(j, {})) {
    s.blocked = false;
    event_(who + ": learners advancing again");
  } else if (auto d = read<rec::AuthDenied>(j, {"new"})) {
    event_(who + " refused " + std::to_string(has(j, "new") ? d->fresh : 1) +
           " CURVE handshake(s): a key not in net.allow");
  }
}

void RunRecords::process_ended(int64_t n) {
  LearnerView& v = learners_.at(static_cast<size_t>(n));
  if (v.open.due == 0) return;  // it wrote learner_done (or pushed nothing)
  v.open.processes = v.open.from_records = 1;
  v.pushes += v.open;
  v.open = PushTally{};
}

void RunRecords::on_learner_record(const json& j, int64_t n) {
  LearnerView& v = learners_[static_cast<size_t>(n)];
  const std::string name = "learner-" + std::to_string(n);
  const auto when = [](const rec::RecordBase& r) { return r.t.value_or(unix_now()); };
  if (auto l = read<rec::Learner>(j, {"t", "step", "loss"})) {
    if (has(j, "step")) v.step = l->step;
    v.loss = l->loss.value_or(v.loss);
  } else if (auto r = read<rec::Joined>(j, {"t", "shard", "step", "resume_step"})) {
    // A sharded syncer: a learner joins every shard; its joins are counted on shard 0's link, and a kill closes
    // with whichever shard it joins first.
    const bool counted = r->shard.value_or(0) == 0;
    if (counted) ++v.joins;
    const int64_t resumed_at = std::max(r->step, r->resume_step);
    const double rejoin = rejoins_->joined(n, when(*r));
    const bool announced = v.rejoin_announced;  // by another shard's join of the same restart
    v.rejoin_announced = rejoin >= 0 && !counted;
    if (counted) v.rejoin_announced = false;
    if (rejoin >= 0)
      event_(name + " rejoined " + fixed(rejoin, 1) + " s after its kill, resuming at step " + std::to_string(resumed_at));
    else if (counted && v.joins > 1 && !announced)
      event_(name + " rejoined at step " + std::to_string(resumed_at));
    v.step = std::max({v.step, has(j, "step") ? r->step : v.step, has(j, "resume_step") ? r->resume_step : v.step});
  } else if (auto p = read<rec::Push>(j, {"t"})) {
    rejoins_->pushed(n, when(*p));
    ++v.open.due, ++v.open.sent;
  } else if (auto u = read<rec::PushUnsent>(j, {"t", "fragment", "step", "replaced_by"})) {
    ++v.open.due;
    if (u->reason == "superseded") ++v.open.superseded;
    else if (u->reason == "at_end" || u->reason == "unanswered_at_end") ++v.open.unsent_at_end;
    else ++v.open.dropped;  // not_joined, send_failed
  } else if (auto d = read<rec::LearnerDone>(j, {"step", "finished", "error"})) {
    if (has(j, "step")) v.step = d->step;
    v.open = PushTally{};  // its own counts follow
    ++v.pushes.processes;
    v.pushes.due += d->pushes_due.value_or(0);
    v.pushes.sent += d->pushes.value_or(0);
    v.pushes.superseded += d->pushes_superseded.value_or(0);
    v.pushes.dropped += d->pushes_dropped.value_or(0);
    v.pushes.unsent_at_end += d->pushes_unsent_at_end.value_or(0);
    // A learner_done that says "finished": false (stopped early, or a syncer shard never let it in) is no finish.
    v.finished = d->finished.value_or(true);
    if (v.finished)
      event_(name + " finished " + std::to_string(v.step) + " steps");
    else
      event_(name + " ended at step " + std::to_string(v.step) + " without finishing" +
             (d->error ? ": " + *d->error : std::string()));
  } else if (auto a = read<rec::AuthRefused>(j, {"detail", "refusals"})) {
    event_(name + ": " + (has(j, "detail") ? a->detail : std::string("its CURVE key was refused")) + " (" +
           std::to_string(has(j, "refusals") ? a->refusals : 1) + " refusals)");
  } else if (auto dd = read<rec::DriftDropped>(j, {"fragment"})) {
    event_(name + " dropped its drift of fragment " + std::to_string(dd->fragment) +
           " (its push was over the syncer's norm bound)");
  } else if (auto sl = read<rec::SyncerLost>(j, {"shard", "step"})) {
    event_(name + " lost the syncer" + (sl->shard ? " shard " + std::to_string(*sl->shard) : std::string()) +
           " at step " + std::to_string(sl->step));
  } else if (auto rj = read<rec::Rejected>(j, {"reason"})) {
    event_(name + " was rejected: " + (has(j, "reason") ? rj->reason : std::string("?")));
  }
}

namespace {

std::string learner_cell(const StatusInput& in, size_t n) {
  const ProcessState& p = in.learner_states[n];
  const LearnerView& v = in.learners[n];
  std::string state;
  if (p.done) state = "done";
  else if (!p.running) state = in.stopping ? "stopped" : "DOWN";
  else if (p.sigstopped) state = "STOPPED";
  std::ostringstream o;
  o << "L" << n;
  if (v.step >= 0) o << " " << v.step << "/" << in.steps << " " << fixed(v.loss, 3);
  else if (state.empty()) o << " starting";
  if (!state.empty()) o << " " << state;
  if (static_cast<int64_t>(n) == in.slow_learner) o << " SLOW";
  return o.str();
}

}  // namespace

std::vector<std::string> status_lines(const StatusInput& in) {
  const SyncerView& s = in.syncer;
  const ProcessState& sp = in.syncer_state;
  std::ostringstream h;
  h << "[" << std::setw(6) << format_duration(in.elapsed) << "] syncer ";
  if (in.shards > 1 && !sp.done && in.shards_up > 0 && in.shards_up < in.shards)
    h << in.shards_up << "/" << in.shards << " shards up";
  else
    h << (sp.done ? "done" : !sp.running ? (in.stopping ? "stopped" : "DOWN") : s.blocked ? "up, LEARNERS BLOCKED" : "up")
      << (in.shards > 1 ? " (" + std::to_string(in.shards) + " shards)" : "");
  if (!s.leader.empty()) h << " (" << s.leader << " leads, epoch " << s.epoch << ")";
  h << " | merges " << s.merges;
  if (s.quorum >= 0) h << " (last quorum " << s.quorum << ")";
  h << " | val " << fixed(s.val_loss, 4) << " nats, " << fixed(s.val_bpb, 3) << " bpb | uptime "
    << (std::isfinite(s.uptime) ? fixed(100 * s.uptime, 0) + "%" : "-") << " | rejects " << s.rejected;
  std::vector<std::string> lines{h.str()};
  const size_t per_line = 4;
  const size_t m = in.learner_states.size();
  for (size_t n = 0; n < m; n += per_line) {
    std::string l = "  ";
    for (size_t i = n; i < std::min(m, n + per_line); ++i) l += (i > n ? " | " : "") + learner_cell(in, i);
    lines.push_back(l);
  }
  return lines;
}

LiveView::LiveView(std::ostream& out, bool tty, std::function<std::vector<std::string>()> status,
                   std::function<double()> elapsed)
    : out_(out), tty_(tty), status_(std::move(status)), elapsed_(std::move(elapsed)) {}

namespace {
size_t terminal_width() {
  winsize w{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 10) return w.ws_col;
  return 200;
}
}  // namespace

void LiveView::clear() {
  if (tty_ && drawn_lines_ > 0) out_ << "\033[" << drawn_lines_ << "A\r\033[J";
  drawn_lines_ = 0;
}

void LiveView::draw() {
  const auto lines = status_();
  if (!tty_) {  // one plain line per update
    std::string all = lines[0];
    for (size_t i = 1; i < lines.size(); ++i) all += " |" + lines[i].substr(1);
    out_ << all << "\n";
    return;
  }
  clear();
  const size_t width = terminal_width() - 1;
  for (const auto& l : lines) out_ << (l.size() > width ? l.substr(0, width) : l) << "\n";
  drawn_lines_ = lines.size();
  out_.flush();
}

void LiveView::event(const std::string& what) {
  const bool redraw = tty_ && drawn_lines_ > 0;
  clear();
  std::string line = what;
  for (char& c : line)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  out_ << "[" << std::setw(6) << format_duration(elapsed_()) << "] " << line << "\n";
  if (redraw) draw();
}

}  // namespace deloco::run
