// The live view of `deloco run` (contract in live_view.h).
#include "run/live_view.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "util/clock.h"

namespace deloco::run {
using nlohmann::json;

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

void Tailer::poll(const std::function<void(const std::string&)>& on_line) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  std::vector<char> buf(size_t{1} << 16);
  for (;;) {
    const ssize_t got = ::pread(fd, buf.data(), buf.size(), offset_);
    if (got <= 0) break;
    offset_ += got;
    const size_t n = static_cast<size_t>(got);
    for (size_t begin = 0; begin < n;) {
      const char* nl = static_cast<const char*>(std::memchr(buf.data() + begin, '\n', n - begin));
      const size_t end = nl ? static_cast<size_t>(nl - buf.data()) : n;
      const size_t len = end - begin;
      if (long_bytes_ > 0) {
        long_bytes_ += len;
      } else if (partial_.size() + len > max_line_) {
        long_bytes_ = partial_.size() + len;
        std::string().swap(partial_);
      } else {
        partial_.append(buf.data() + begin, len);
      }
      if (!nl) break;
      if (long_bytes_ > 0) {
        ++skipped_;
        long_bytes_ = 0;
      } else {
        on_line(partial_);
      }
      partial_.clear();
      begin = end + 1;
    }
  }
  ::close(fd);
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
  }
  return v;
}

void RunRecords::on_line(const std::string& line, int64_t learner, int64_t shard) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string()) return;
  try {
    if (learner < 0) on_syncer_record(j, std::clamp<int64_t>(shard, 0, static_cast<int64_t>(shards_.size()) - 1));
    else on_learner_record(j, learner);
  } catch (const json::exception&) {
    // A record with an unexpected field type: the live view ignores it.
  }
}

void RunRecords::on_syncer_record(const json& j, int64_t shard) {
  const std::string kind = j["kind"];
  SyncerView& s = shards_[static_cast<size_t>(shard)];
  const std::string who = shards_.size() > 1 ? "syncer shard " + std::to_string(shard) : "syncer";
  if (kind == "started") {
    ++s.starts;
    if (j.value("resumed", false))
      event_(who + " resumed at " + std::to_string(j.value("merges", int64_t{0})) + " merges");
    // Its dashboard (the metrics endpoint's /), once per port: a restarted syncer listens on a new one.
    const int64_t port = j.value("metrics_port", int64_t{0});
    if (port > 0 && shard == 0 && port != dashboard_port_) {
      dashboard_port_ = port;
      event_("dashboard: http://127.0.0.1:" + std::to_string(port) + "/");
      // Bound beyond loopback (syncer.metrics = ":0"): the syncer's warning names the real address.
      if (j.contains("metrics_warning") && j["metrics_warning"].is_string()) {
        const std::string& w = j["metrics_warning"].get_ref<const std::string&>();
        if (!w.empty()) event_("WARNING: " + w);
      }
    }
  } else if (kind == "merge") {
    s.merges = j.value("merges", s.merges + 1);
    s.quorum = j.value("quorum", s.quorum);
    last_quorum_ = s.quorum;
    const int64_t total = syncer().merges;
    if (total >= next_milestone_) {
      event_(std::to_string(total) + " merges");
      next_milestone_ = next_milestone(total);
    }
  } else if (kind == "eval") {
    s.val_loss = j.value("val_loss", NAN);
    s.val_bpb = j.value("val_bpb", NAN);
    event_("eval: val loss " + fixed(s.val_loss, 4) + " " + j.value("loss_unit", std::string("nats/byte")) + ", " + fixed(s.val_bpb, 3) + " bits/byte after " +
           std::to_string(shards_.size() > 1 ? syncer().merges : j.value("merges", s.merges)) + " merges");
  } else if (kind == "status") {
    s.uptime = j.value("uptime", s.uptime);
    s.rejected = j.value("rejected", s.rejected);
    s.blocked = j.value("blocked", false);
  } else if (kind == "learners_blocked") {
    s.blocked = true;
    event_(who + ": every connected learner stopped advancing (blocked); counted as stalled");
  } else if (kind == "learners_advancing") {
    s.blocked = false;
    event_(who + ": learners advancing again");
  } else if (kind == "auth_denied") {
    event_(who + " refused " + std::to_string(j.value("new", int64_t{1})) +
           " CURVE handshake(s): a key not in net.allow");
  }
}

void RunRecords::on_learner_record(const json& j, int64_t n) {
  const std::string kind = j["kind"];
  LearnerView& v = learners_[static_cast<size_t>(n)];
  const double t = j.value("t", unix_now());
  const std::string name = "learner-" + std::to_string(n);
  if (kind == "learner") {
    v.step = j.value("step", v.step);
    v.loss = j.value("loss", v.loss);
  } else if (kind == "joined") {
    // A sharded syncer: a learner joins every shard; its joins are counted on shard 0's link, and a kill closes
    // with whichever shard it joins first.
    const bool counted = j.value("shard", int64_t{0}) == 0;
    if (counted) ++v.joins;
    const int64_t resumed_at = std::max(j.value("step", int64_t{0}), j.value("resume_step", int64_t{0}));
    const double rejoin = rejoins_->joined(n, t);
    const bool announced = v.rejoin_announced;  // by another shard's join of the same restart
    v.rejoin_announced = rejoin >= 0 && !counted;
    if (counted) v.rejoin_announced = false;
    if (rejoin >= 0)
      event_(name + " rejoined " + fixed(rejoin, 1) + " s after its kill, resuming at step " + std::to_string(resumed_at));
    else if (counted && v.joins > 1 && !announced)
      event_(name + " rejoined at step " + std::to_string(resumed_at));
    v.step = std::max({v.step, j.value("step", v.step), j.value("resume_step", v.step)});
  } else if (kind == "push") {
    rejoins_->pushed(n, t);
  } else if (kind == "learner_done") {
    v.step = j.value("step", v.step);
    // A learner_done that says "finished": false (stopped early, or a syncer shard never let it in) is no finish.
    v.finished = !(j.contains("finished") && j["finished"].is_boolean() && !j["finished"].get<bool>());
    if (v.finished)
      event_(name + " finished " + std::to_string(v.step) + " steps");
    else
      event_(name + " ended at step " + std::to_string(v.step) + " without finishing" +
             (j.contains("error") && j["error"].is_string() ? ": " + j["error"].get<std::string>() : std::string()));
  } else if (kind == "auth_refused") {
    event_(name + ": " + j.value("detail", std::string("its CURVE key was refused")) + " (" +
           std::to_string(j.value("refusals", int64_t{1})) + " refusals)");
  } else if (kind == "drift_dropped") {
    event_(name + " dropped its drift of fragment " + std::to_string(j.value("fragment", int64_t{-1})) +
           " (its push was over the syncer's norm bound)");
  } else if (kind == "syncer_lost") {
    event_(name + " lost the syncer" + (j.contains("shard") ? " shard " + std::to_string(j.value("shard", int64_t{0})) : std::string()) +
           " at step " + std::to_string(j.value("step", int64_t{0})));
  } else if (kind == "rejected") {
    event_(name + " was rejected: " + j.value("reason", std::string("?")));
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
