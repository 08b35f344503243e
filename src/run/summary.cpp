// Results of `deloco run` (contract in summary.h).
#include "run/summary.h"
#include "util/shell.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "run/live_view.h"
#include "util/clock.h"
#include "util/fs.h"

namespace deloco::run {

nlohmann::json median_max(std::vector<double> v) {
  if (v.empty()) return nullptr;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return nlohmann::json{{"median", med}, {"max", v.back()}, {"count", n}};
}

RejoinLog::RejoinLog(int64_t learners)
    : open_join_(static_cast<size_t>(learners), -1), open_push_(static_cast<size_t>(learners), -1) {}

void RejoinLog::killed(int64_t learner, double t_unix) {
  const size_t n = static_cast<size_t>(learner);
  open_join_[n] = open_push_[n] = static_cast<int64_t>(kills_.size());
  kills_.push_back(Kill{learner, t_unix});
}

double RejoinLog::joined(int64_t learner, double t) {
  int64_t& k = open_join_[static_cast<size_t>(learner)];
  if (k < 0 || t < kills_[static_cast<size_t>(k)].t_unix) return -1;
  Kill& kill = kills_[static_cast<size_t>(k)];
  kill.rejoin = t - kill.t_unix;
  k = -1;
  return kill.rejoin;
}

void RejoinLog::pushed(int64_t learner, double t) {
  int64_t& k = open_push_[static_cast<size_t>(learner)];
  if (k < 0 || t < kills_[static_cast<size_t>(k)].t_unix) return;
  kills_[static_cast<size_t>(k)].recontribute = t - kills_[static_cast<size_t>(k)].t_unix;
  k = -1;
}

nlohmann::json RejoinLog::rejoin_seconds() const {
  std::vector<double> v;
  for (const Kill& k : kills_)
    if (k.rejoin >= 0) v.push_back(k.rejoin);
  return median_max(v);
}

nlohmann::json RejoinLog::recontribute_seconds() const {
  std::vector<double> v;
  for (const Kill& k : kills_)
    if (k.recontribute >= 0) v.push_back(k.recontribute);
  return median_max(v);
}

nlohmann::json read_syncer_summary(const std::string& path) {
  nlohmann::json s = nlohmann::json::object();
  if (!std::filesystem::exists(path)) {
    s["syncer_summary_missing"] = true;
    return s;
  }
  try {
    s = nlohmann::json::parse(read_file(path));
  } catch (const std::exception& e) {
    std::cerr << "deloco run: warning: cannot read " << path << ": " << e.what() << "\n";
  }
  if (!s.is_object()) s = nlohmann::json::object();
  return s;
}

nlohmann::json combine_shard_summaries(const std::vector<nlohmann::json>& shards) {
  using nlohmann::json;
  json s = !shards.empty() && shards[0].is_object() ? shards[0] : json::object();
  auto has = [](const json& one, const char* f) { return one.is_object() && one.contains(f); };
  // Counters: each shard counts its own fragments' rounds, transfers and its own connections; summed.
  for (const char* f : {"outer_steps", "contributions_merged", "contributions_rejected", "bytes_sent", "bytes_received",
                        "state_snapshots", "state_downloads", "states_held", "state_requests_dropped", "grace_waits",
                        "broadcasts_sent", "broadcasts_superseded", "broadcasts_acked", "uploads_measured",
                        "broadcasts_measured", "record_errors", "blocked_spells", "drift_resets", "auth_denied",
                        "handshake_failures", "connections", "disconnects", "contributions_replaced",
                        "contributions_pending_at_end", "joins_refused"}) {
    bool any = false;
    int64_t n = 0;
    for (const json& one : shards)
      if (has(one, f) && one[f].is_number_integer()) {
        any = true;
        n += one[f].get<int64_t>();
      }
    if (any) s[f] = n;
  }
  for (const char* f : {"rejects", "push_rejects", "joins_refused_by", "final_round"}) {  // by reason (by field): summed per reason
    json rejects = json::object();
    for (const json& one : shards)
      if (has(one, f) && one[f].is_object())
        for (auto& [reason, n] : one[f].items())
          if (n.is_number_integer()) rejects[reason] = rejects.value(reason, int64_t{0}) + n.get<int64_t>();
    if (!rejects.empty() || has(s, f)) s[f] = rejects;
  }
  // Times: uptime the lowest (training is down when any shard's fragments are); the transfer times the mean over
  // the shards that measured one (each is that shard's moving average; every shard's value is in its brief).
  for (const json& one : shards)
    if (has(one, "uptime") && one["uptime"].is_number())
      s["uptime"] = std::min(s["uptime"].is_number() ? s["uptime"].get<double>() : 1.0, one["uptime"].get<double>());
  for (const char* f : {"upload_seconds", "broadcast_seconds"}) {
    double total = 0;
    int64_t n = 0;
    bool seen = false;
    for (const json& one : shards) {
      seen = seen || has(one, f);
      if (has(one, f) && one[f].is_number()) {
        total += one[f].get<double>();
        ++n;
      }
    }
    if (seen) s[f] = n > 0 ? json(total / static_cast<double>(n)) : json();
  }
  // Every shard counts the same learners' tokens and joins: the highest.
  for (const json& one : shards)
    if (has(one, "tokens") && one["tokens"].is_number_integer())
      s["tokens"] = std::max(s["tokens"].is_number_integer() ? s["tokens"].get<int64_t>() : int64_t{0},
                             one["tokens"].get<int64_t>());
  json joins = json::array();
  for (const json& one : shards)
    if (has(one, "joins") && one["joins"].is_array())
      for (size_t m = 0; m < one["joins"].size(); ++m) {
        const json& j = one["joins"][m];
        if (m >= joins.size()) joins.push_back(int64_t{0});
        if (j.is_number_integer()) joins[m] = std::max(joins[m].get<int64_t>(), j.get<int64_t>());
      }
  if (!joins.empty()) s["joins"] = joins;
  bool resumed = false, missing = false;
  json per = json::array();
  for (const json& one : shards) {
    resumed = resumed || (has(one, "resumed") && one["resumed"].is_boolean() && one["resumed"].get<bool>());
    missing = missing || has(one, "syncer_summary_missing");
    json brief = json::object();
    for (const char* f : {"shard", "fragments", "outer_steps", "contributions_merged", "uptime", "bytes_sent",
                          "bytes_received", "resumed", "checkpoint", "wall_seconds", "peak_rss_bytes", "parameters",
                          "upload_seconds", "broadcast_seconds", "pair"})
      if (has(one, f)) brief[f] = one[f];
    per.push_back(brief);
  }
  if (has(s, "resumed") || resumed) s["resumed"] = resumed;
  for (const char* f :
       {"shard", "fragments", "checkpoint", "final_val_loss", "val_bpb", "peak_rss_bytes", "parameters", "pair"})
    s.erase(f);
  s["shards"] = per;
  if (missing) s["syncer_summary_missing"] = true;
  return s;
}

std::string final_report(const nlohmann::json& s, const std::string& summary_file) {
  auto num = [&](const char* k) { return s.contains(k) && s[k].is_number() ? s[k].get<double>() : NAN; };
  auto count = [&](const char* k) { return s.contains(k) && s[k].is_number() ? std::to_string(s[k].get<int64_t>()) : "-"; };
  auto med_max = [&](const char* k) {
    if (!s.contains(k) || !s[k].is_object()) return std::string("n/a");
    return "median " + fixed(s[k]["median"].get<double>(), 1) + " s, max " + fixed(s[k]["max"].get<double>(), 1) + " s";
  };
  std::ostringstream o;
  o << "deloco run: " << format_duration(num("wall_seconds")) << ", " << count("learners")
    << " learners: final val loss " << fixed(num("final_val_loss"), 4) << " "
    << (s.contains("loss_unit") && s["loss_unit"].is_string() ? s["loss_unit"].get<std::string>() : "nats/byte") << ", "
    << fixed(num("val_bpb"), 3) << " bits/byte; " << count("outer_steps") << " fragment merges, "
    << count("contributions_merged") << " contributions merged, " << count("contributions_rejected")
    << " rejected; uptime " << fixed(num("uptime"), 3) << ", goodput " << fixed(num("goodput"), 3) << "\n";
  o << "chaos: " << count("learner_kills") << " learner kills (rejoin " << med_max("rejoin_seconds")
    << "; contributing again " << med_max("recontribute_seconds") << "), " << count("learner_stops")
    << " stops, " << count("syncer_kills") << " syncer kills\n";
  // Every push accounted for: one line when some due push was not sent or some sent one not merged.
  if (s.contains("push_accounting") && s["push_accounting"].is_object()) {
    const auto& a = s["push_accounting"];
    const auto n = [](const nlohmann::json& o, const char* k) {
      return o.is_object() && o.contains(k) && o[k].is_number_integer() ? o[k].get<int64_t>() : int64_t{0};
    };
    const nlohmann::json un = a.value("unsent", nlohmann::json::object()), um = a.value("unmerged", nlohmann::json::object());
    const int64_t due = n(a, "due"), sent = n(a, "sent"), merged = n(a, "merged"), finals = n(a, "final_states_merged");
    if (due > 0 && (due != sent || sent != merged + finals)) {
      o << "pushes: " << due << " due, " << sent << " sent";
      std::string why;
      const auto part = [&](const nlohmann::json& o2, const char* k, const char* text) {
        if (n(o2, k) > 0) why += (why.empty() ? "" : ", ") + std::to_string(n(o2, k)) + " " + text;
      };
      part(un, "superseded", "superseded while the link was busy");
      part(un, "dropped", "dropped while not joined");
      part(un, "at_end", "unsent at the end");
      if (!why.empty()) o << " (" << why << ")";
      why.clear();
      o << ", " << merged << " merged";
      if (finals > 0) o << " and " << finals << " final states averaged";
      part(um, "refused", "refused");
      part(um, "replaced", "replaced by a newer push");
      part(um, "pending_at_end", "waiting at the end");
      part(a, "unaccounted", "not counted by the final syncer");
      if (!why.empty()) o << " (" << why << ")";
      const int64_t killed = n(a, "processes_from_records");
      if (killed > 0)
        o << "; " << killed << " killed learner process" << (killed == 1 ? "" : "es") << " counted from push records";
      // More merged than sent: a learner's records were cut short (a file lost, a line torn by the kill).
      if (merged + finals > sent) o << "; more merged than the learners' records say were sent";
      o << "\n";
    }
  }
  // Network faults on a testbed (chaos.net): one line, in the order written.
  if (s.contains("net_faults") && s["net_faults"].is_array() && !s["net_faults"].empty()) {
    o << "network faults:";
    bool first = true;
    for (const auto& f : s["net_faults"]) {
      if (!f.is_object()) continue;
      const auto text = [&](const char* k) { return f.contains(k) && f[k].is_string() ? f[k].get<std::string>() : "?"; };
      const auto number = [&](const char* k) { return f.contains(k) && f[k].is_number() ? f[k].get<double>() : NAN; };
      o << (first ? " " : "; ") << text("fault") << " of host "
        << (f.contains("host") && f["host"].is_number_integer() ? std::to_string(f["host"].get<int64_t>()) : "?")
        << " at " << fixed(number("at"), 0) << " s for " << fixed(number("for"), 0) << " s"
        << (f.contains("started") && f["started"].is_boolean() && !f["started"].get<bool>() ? " (never began)" : "");
      first = false;
    }
    o << "\n";
  }
  // The learners' compute precision (train.precision = auto: what each chose, and learner 0's measured rates).
  if (s.contains("learner_precision") && s["learner_precision"].is_array()) {
    std::map<std::string, int> chosen;
    std::string rates;
    for (const auto& p : s["learner_precision"]) {
      if (!p.is_object() || !p.contains("precision") || !p["precision"].is_string()) continue;
      ++chosen[p["precision"].get<std::string>()];
      if (rates.empty() && p.contains("fp32_gflops") && p["fp32_gflops"].is_number() && p.contains("bf16_gflops") &&
          p["bf16_gflops"].is_number())
        rates = " (auto: matmuls at the model's shapes, fp32 " + fixed(p["fp32_gflops"].get<double>(), 1) +
                " GFLOP/s, bf16 " + fixed(p["bf16_gflops"].get<double>(), 1) + ")";
    }
    if (!chosen.empty()) {
      o << "precision:";
      bool first = true;
      for (const auto& [name, n] : chosen) o << (first ? " " : ", ") << name << " on " << n << " learner" << (n == 1 ? "" : "s"), first = false;
      o << rates << "\n";
    }
  }
  o << "summary: " << summary_file << "\n";
  return o.str();
}


std::string use_the_model(const std::string& program, const std::string& run_dir) {
  const std::string exe = shell_word(program), dir = shell_word(run_dir);
  std::ostringstream o;
  o << "use the model (the final global model: " << run_dir << "/latest names its checkpoint):\n"
    << "  " << exe << " eval --checkpoint " << dir << "\n"
    << "  " << exe << " sample --checkpoint " << dir << " --prompt 'Fellow citizens'\n"
    << "  /usr/bin/python3 tests/python/checkpoint_loss.py " << dir << " 'Fellow citizens'   # in PyTorch\n"
    << "see the run (charts of loss, merges, learners and chaos in one page):\n"
    << "  " << exe << " report " << dir << " --out " << shell_word(run_dir + "/report.html") << "\n";
  return o.str();
}

nlohmann::json push_accounting(const std::vector<PushTally>& learners, const nlohmann::json& syncer) {
  using nlohmann::json;
  const auto num = [&](const char* f) {
    return syncer.is_object() && syncer.contains(f) && syncer[f].is_number_integer() ? syncer[f].get<int64_t>() : 0;
  };
  json per = json::array();
  int64_t due = 0, sent = 0, superseded = 0, dropped = 0, at_end = 0, from_records = 0;
  for (const PushTally& v : learners) {
    per.push_back({{"due", v.due}, {"sent", v.sent}, {"superseded", v.superseded}, {"dropped", v.dropped},
                   {"unsent_at_end", v.unsent_at_end}, {"processes", v.processes}, {"from_records", v.from_records}});
    due += v.due, sent += v.sent, superseded += v.superseded, dropped += v.dropped, at_end += v.unsent_at_end;
    from_records += v.from_records;
  }
  int64_t refused = 0;
  json by_reason = json::object();
  if (syncer.is_object() && syncer.contains("push_rejects") && syncer["push_rejects"].is_object())
    for (auto& [reason, n] : syncer["push_rejects"].items())
      if (n.is_number_integer()) refused += n.get<int64_t>(), by_reason[reason] = n;
  const int64_t merged = num("contributions_merged"), replaced = num("contributions_replaced"),
                pending = num("contributions_pending_at_end");
  // sync.final_round: the final states the final round merged (sent like pushes, never merged as one).
  const int64_t finals = syncer.is_object() && syncer.contains("final_round") && syncer["final_round"].is_object()
                             ? syncer["final_round"].value("states_merged", int64_t{0})
                             : 0;
  json a = {{"due", due},
            {"sent", sent},
            {"unsent", {{"superseded", superseded}, {"dropped", dropped}, {"at_end", at_end}}},
            {"merged", merged},
            {"final_states_merged", finals},
            {"unmerged", {{"refused", refused}, {"replaced", replaced}, {"pending_at_end", pending}}},
            {"refused_by_reason", by_reason},
            {"unaccounted", sent - merged - finals - refused - replaced - pending},
            {"processes_from_records", from_records},
            {"learners", per}};
  return a;
}

}  // namespace deloco::run
