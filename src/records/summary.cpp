#include "records/summary.h"

#include <cmath>

#include "records/record.h"
#include "util/fs.h"

namespace deloco::rec {
namespace {

// Visits the typed fields in one order, for writing and reading alike.
template <class S, class V> void typed_fields(S& s, V& v) {
  v("final_val_loss", s.final_val_loss);
  v("initial_val_loss", s.initial_val_loss);
  v("val_bpb", s.val_bpb);
  v("loss_unit", s.loss_unit);
  v("tokens", s.tokens);
  v("outer_steps", s.outer_steps);
  v("contributions_merged", s.contributions_merged);
  v("contributions_rejected", s.contributions_rejected);
  v("failures", s.failures);
  v("uptime", s.uptime);
  v("goodput", s.goodput);
  v("wall_seconds", s.wall_seconds);
  v("bytes_sent", s.bytes_sent);
}

// Reads a typed field; a present but mistyped one is named in *wrong. Either way it leaves `extra`.
struct SummaryReader {
  const nlohmann::json* j;
  nlohmann::json* extra;
  std::vector<std::string>* wrong;
  template <class T> void operator()(const char* name, std::optional<T>& v) {
    auto it = j->find(name);
    if (it == j->end()) return;
    T x{};
    if (!it->is_null()) {
      if (detail::value_from_json(*it, &x)) v = std::move(x);
      else if (wrong) wrong->push_back(name);
    }
    extra->erase(name);
  }
};

}  // namespace

nlohmann::json RunSummary::to_json() const {
  nlohmann::json j = extra.is_object() ? extra : nlohmann::json::object();
  if (!command.empty()) j["command"] = command;
  detail::Writer w{&j};
  typed_fields(*this, w);
  return j;
}

RunSummary RunSummary::from_json(const nlohmann::json& j, std::vector<std::string>* wrong_types) {
  RunSummary s;
  if (!j.is_object()) return s;
  s.extra = j;
  auto c = j.find("command");
  if (c != j.end()) {
    if (c->is_string()) s.command = clip_text(c->get_ref<const std::string&>());
    else if (wrong_types) wrong_types->push_back("command");
    s.extra.erase("command");
  }
  SummaryReader rd{&j, &s.extra, wrong_types};
  typed_fields(s, rd);
  return s;
}

void write_summary_file(const std::string& path, const RunSummary& summary) {
  write_file_atomic(path, summary.to_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace deloco::rec
