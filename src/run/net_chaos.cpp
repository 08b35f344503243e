// The network faults of `deloco run` on a testbed (contract in net_chaos.h).
#include "run/net_chaos.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>

#include "deloco/error.h"
#include "util/text.h"

namespace deloco::run {
namespace {

constexpr double kMaxFaultSeconds = 1e6;
constexpr double kMinPeriod = 0.5;  // `deloco run` looks at the schedule every 0.1 s

std::string which(size_t n, const std::string& text) {
  return "fault " + std::to_string(n + 1) + " ('" + clip_utf8(text, 120) + "')";
}

// A number of seconds: a decimal number, optionally followed by "s".
bool parse_seconds(std::string v, double* out) {
  if (!v.empty() && v.back() == 's') v.pop_back();
  if (v.empty()) return false;
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end != v.c_str() + v.size() || !std::isfinite(d)) return false;
  *out = d;
  return true;
}

std::string seconds_text(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

bool parse_index(const std::string& v, int64_t* out) {
  if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::atoll(v.c_str());
  return true;
}

bool parse_number(const std::string& v, double* out) {
  if (v.empty()) return false;
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end != v.c_str() + v.size() || !std::isfinite(d)) return false;
  *out = d;
  return true;
}

NetFault parse_one(const std::string& text, size_t n) {
  std::istringstream words(text);
  std::string kind;
  words >> kind;
  NetFault f;
  f.text = text;
  f.number = n;
  const std::string who = which(n, text);
  if (kind == "partition") f.kind = NetFaultKind::kPartition;
  else if (kind == "flap") f.kind = NetFaultKind::kFlap;
  else if (kind == "slow") f.kind = NetFaultKind::kSlow;
  else
    throw ConfigError(who + ": unknown kind '" + clip_utf8(kind, 40) + "' (partition, flap or slow)");
  std::map<std::string, std::string> kv;
  for (std::string w; words >> w;) {
    const size_t eq = w.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError(who + ": '" + clip_utf8(w, 40) + "' is not key=value");
    const std::string key = w.substr(0, eq);
    if (!kv.emplace(key, w.substr(eq + 1)).second) throw ConfigError(who + ": " + key + "= given twice");
  }
  std::vector<std::string> allowed = {"host", "learner", "at", "for"};
  if (f.kind == NetFaultKind::kFlap) allowed.push_back("period");
  if (f.kind == NetFaultKind::kSlow) allowed.insert(allowed.end(), {"factor", "rate"});
  for (const auto& [key, value] : kv)
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a + "=";
      throw ConfigError(who + ": unknown key '" + clip_utf8(key, 40) + "' (a " + kind + " takes " + list + ")");
    }
  // Where: host= or learner=, exactly one.
  const bool has_host = kv.count("host") > 0, has_learner = kv.count("learner") > 0;
  if (has_host == has_learner) throw ConfigError(who + ": give host=H (a testbed host) or learner=N (its host), one of them");
  if (has_host && !parse_index(kv["host"], &f.host))
    throw ConfigError(who + ": host= must be a host number (0 is the syncer's), got '" + clip_utf8(kv["host"], 40) + "'");
  if (has_learner && !parse_index(kv["learner"], &f.learner))
    throw ConfigError(who + ": learner= must be a learner id, got '" + clip_utf8(kv["learner"], 40) + "'");
  // When.
  for (const char* key : {"at", "for"}) {
    if (!kv.count(key)) throw ConfigError(who + ": needs " + key + "=SECONDS");
    double* field = std::string(key) == "at" ? &f.at : &f.duration;
    if (!parse_seconds(kv[key], field))
      throw ConfigError(who + ": " + key + "= must be a number of seconds, got '" + clip_utf8(kv[key], 40) + "'");
  }
  if (!(f.at >= 0 && f.at <= kMaxFaultSeconds)) throw ConfigError(who + ": at= must be in [0, 1e6] seconds");
  if (!(f.duration > 0 && f.duration <= kMaxFaultSeconds)) throw ConfigError(who + ": for= must be in (0, 1e6] seconds");
  if (f.kind == NetFaultKind::kFlap) {
    if (!kv.count("period"))
      throw ConfigError(who + ": needs period=SECONDS (one down-and-up cycle: down for half of it, up for the other)");
    if (!parse_seconds(kv["period"], &f.period))
      throw ConfigError(who + ": period= must be a number of seconds, got '" + clip_utf8(kv["period"], 40) + "'");
    if (!(f.period >= kMinPeriod && f.period <= f.duration))
      throw ConfigError(who + ": period= must be at least 0.5 s and at most for= (" + seconds_text(f.duration) + " s)");
  }
  if (f.kind == NetFaultKind::kSlow) {
    if (kv.count("factor") && kv.count("rate")) throw ConfigError(who + ": give factor= or rate=, not both");
    if (kv.count("rate")) {
      f.rate = kv["rate"];
      if (rate_bits(f.rate) <= 0)
        throw ConfigError(who + ": rate= must be a tc rate like 200kbit, 1mbit or 50kbps, got '" + clip_utf8(f.rate, 40) + "'");
    } else {
      f.factor = 100;
      if (kv.count("factor") && !parse_number(kv["factor"], &f.factor))
        throw ConfigError(who + ": factor= must be a number, got '" + clip_utf8(kv["factor"], 40) + "'");
      if (!(f.factor > 1 && f.factor <= 1e6)) throw ConfigError(who + ": factor= must be in (1, 1e6]");
    }
  }
  return f;
}

bool is_link_fault(const NetFault& f) { return f.kind != NetFaultKind::kSlow; }

}  // namespace

const char* net_fault_name(NetFaultKind k) {
  switch (k) {
    case NetFaultKind::kPartition: return "partition";
    case NetFaultKind::kFlap: return "flap";
    case NetFaultKind::kSlow: return "slow";
  }
  return "?";
}

std::vector<NetFault> parse_net_faults(const std::string& text) {
  std::vector<NetFault> out;
  std::string item;
  const auto flush = [&] {
    const std::string t = trim_space(item);
    item.clear();
    if (!t.empty()) out.push_back(parse_one(t, out.size()));
  };
  for (char c : text) {
    if (c == ';' || c == '\n') flush();
    else item += c;
  }
  flush();
  return out;
}

int64_t testbed_host_of(int64_t learner, int64_t rank, int64_t ranks, int64_t hosts) {
  const int64_t slot = learner * std::max<int64_t>(1, ranks) + rank;
  return 1 + slot % std::max<int64_t>(1, hosts - 1);
}

std::vector<int64_t> testbed_hosts_of(int64_t learner, int64_t ranks, int64_t hosts) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < std::max<int64_t>(1, ranks); ++r) out.push_back(testbed_host_of(learner, r, ranks, hosts));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void place_net_faults(std::vector<NetFault>& faults, int64_t hosts, int64_t learners, int64_t ranks) {
  const std::string key = "config key 'chaos.net': ";
  std::vector<NetFault> placed;
  for (const NetFault& f : faults) {
    if (f.learner < 0) {
      placed.push_back(f);
      continue;
    }
    if (f.learner >= learners)
      throw ConfigError(key + which(f.number, f.text) + ": learner " + std::to_string(f.learner) + " does not exist (" +
                        std::to_string(learners) + " learners)");
    for (int64_t h : testbed_hosts_of(f.learner, ranks, hosts)) {
      placed.push_back(f);
      placed.back().host = h;
    }
  }
  faults = std::move(placed);
  for (const NetFault& f : faults)
    if (f.host < 0 || f.host >= hosts)
      throw ConfigError(key + which(f.number, f.text) + ": the testbed has no host " + std::to_string(f.host) +
                        " (hosts 0 .. " + std::to_string(hosts - 1) + ")");
  for (size_t i = 0; i < faults.size(); ++i)
    for (size_t j = i + 1; j < faults.size(); ++j) {
      const NetFault &a = faults[i], &b = faults[j];
      if (a.host != b.host || is_link_fault(a) != is_link_fault(b)) continue;
      if (a.at < b.at + b.duration && b.at < a.at + a.duration)
        throw ConfigError(key + which(a.number, a.text) + " and " + which(b.number, b.text) + " both " +
                          (is_link_fault(a) ? "take host " : "shape host ") + std::to_string(a.host) +
                          "'s link at once: one fault per host at a time");
    }
}

double rate_bits(const std::string& rate) {
  size_t i = 0;
  while (i < rate.size() && (std::isdigit(static_cast<unsigned char>(rate[i])) || rate[i] == '.')) ++i;
  if (i == 0 || i > 20) return -1;
  double v = 0;
  if (!parse_number(rate.substr(0, i), &v) || rate[0] == '.' || rate[i - 1] == '.') return -1;
  std::string unit = rate.substr(i);
  double mult = 1;
  if (!unit.empty() && std::string("kmgt").find(unit[0]) != std::string::npos) {
    mult = unit[0] == 'k' ? 1e3 : unit[0] == 'm' ? 1e6 : unit[0] == 'g' ? 1e9 : 1e12;
    unit = unit.substr(1);
  }
  if (unit == "bit") return v * mult;
  if (unit == "bps") return v * mult * 8;  // tc: bytes per second
  return -1;
}

std::string format_rate(double bits) {
  const int64_t b = std::max<int64_t>(8, static_cast<int64_t>(std::llround(bits)));
  if (b % 1000000000 == 0) return std::to_string(b / 1000000000) + "gbit";
  if (b % 1000000 == 0) return std::to_string(b / 1000000) + "mbit";
  if (b % 1000 == 0) return std::to_string(b / 1000) + "kbit";
  return std::to_string(b) + "bit";
}

NetChaosSchedule::NetChaosSchedule(std::vector<NetFault> faults, std::vector<std::string> rates)
    : faults_(std::move(faults)), rates_(std::move(rates)) {
  started_.assign(faults_.size(), false);
  ended_.assign(faults_.size(), false);
  for (size_t i = 0; i < faults_.size(); ++i) {
    const NetFault& f = faults_[i];
    const double end = f.at + f.duration;
    const auto add = [&](NetAction::Op op, double at, const char* phase, std::string rate = "") {
      NetAction a;
      a.fault = i;
      a.host = f.host;
      a.op = op;
      a.rate = std::move(rate);
      a.at = at;
      a.phase = phase;
      a.heals = op == NetAction::kLinkUp || (op == NetAction::kShape && std::string(phase) == "end");
      plan_.push_back(std::move(a));
    };
    switch (f.kind) {
      case NetFaultKind::kPartition:
        add(NetAction::kLinkDown, f.at, "start");
        add(NetAction::kLinkUp, end, "end");
        break;
      case NetFaultKind::kFlap:
        for (int64_t k = 0;; ++k) {
          const double down = f.at + static_cast<double>(k) * f.period, up = down + f.period / 2;
          if (down >= end) break;
          add(NetAction::kLinkDown, down, k == 0 ? "start" : "down");
          if (up < end) add(NetAction::kLinkUp, up, "up");
        }
        add(NetAction::kLinkUp, end, "end");
        break;
      case NetFaultKind::kSlow: {
        const std::string own = f.host >= 0 && static_cast<size_t>(f.host) < rates_.size() ? rates_[f.host] : "none";
        std::string slow = f.rate;
        if (slow.empty()) {
          const double bits = rate_bits(own);
          if (bits <= 0)
            throw ConfigError("config key 'chaos.net': " + which(f.number, f.text) + ": host " + std::to_string(f.host) +
                              "'s link is unshaped (rate " + own + "): it has no rate to divide; give rate=RATE");
          slow = format_rate(bits / f.factor);
        }
        add(NetAction::kShape, f.at, "start", slow);
        add(NetAction::kShape, end, "end", own);
        break;
      }
    }
  }
  // In time order; at one instant what heals first; else as planned (fault order, then each fault's own order).
  std::stable_sort(plan_.begin(), plan_.end(), [](const NetAction& a, const NetAction& b) {
    if (a.at != b.at) return a.at < b.at;
    return a.heals && !b.heals;
  });
}

std::vector<NetAction> NetChaosSchedule::due(double now) {
  std::vector<NetAction> out;
  while (next_ < plan_.size() && plan_[next_].at <= now) {
    const NetAction& a = plan_[next_++];
    if (a.phase == "start") started_[a.fault] = true;
    if (a.phase == "end") ended_[a.fault] = true;
    out.push_back(a);
  }
  return out;
}

std::vector<NetAction> NetChaosSchedule::heal() {
  std::vector<NetAction> out;
  next_ = plan_.size();
  for (size_t i = 0; i < faults_.size(); ++i) {
    if (!started_[i] || ended_[i]) continue;
    ended_[i] = true;
    // The fault's own end action, done now.
    for (const NetAction& a : plan_)
      if (a.fault == i && a.phase == "end") out.push_back(a);
  }
  return out;
}

}  // namespace deloco::run
