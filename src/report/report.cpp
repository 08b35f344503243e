// `deloco report`: run folders' records -> chart series -> one self-contained HTML page / PNGs (src/report/report.h).
#include "report/report.h"


#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "records/kinds.h"
#include "records/record.h"
#include "records/summary.h"
#include "util/fs.h"
#include "util/shell.h"
#include "util/text.h"

namespace deloco {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Text from a file for a name, a label or a note: valid UTF-8, control characters written as '?'.
std::string printable(const std::string& s, size_t max_bytes) {
  std::string o = clip_utf8(s, max_bytes);
  for (char& c : o)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return o;
}

std::string number_text(double v) {
  std::ostringstream o;
  o << std::setprecision(6) << v;
  return o.str();
}

// What the charts use of a record, taken out of its JSON once, when its line is read: a poll then goes over these
// small structs, not over the parsed JSON of the run's whole history (which would also be kept in memory).
enum class Kind { kOther, kEval, kMerge, kLearner, kReject, kEvent, kStatus, kLearnerDone, kRejoining, kPushOrApply };

struct Status {  // a syncer's status record: the live summary while summary.json is not written yet
  int64_t shard = 0;
  bool has_connected = false;
  std::vector<int64_t> connected;
  bool has_goodput = false;
  double uptime = 1, goodput = 1, merges = 0, rejected = 0, bytes_out = 0, tokens = 0;
};

struct Rec {
  Kind kind = Kind::kOther;
  int64_t learner = -1;       // kLearner, kLearnerDone: whose record it is
  double t = std::numeric_limits<double>::quiet_NaN();  // the record's time ("t", else "elapsed_s"); NaN: none
  std::array<double, 3> v{};  // kEval: tokens, val_loss, val_bpb; kMerge: quorum, grace wait; kLearner: step, loss,
                              // tokens
  std::string text;           // kReject: the reason; kEvent: what happened (at most kMaxRecordText bytes)
  std::shared_ptr<const Status> status;  // kStatus
};

// How a line read.
enum class Parsed { kRecord, kNotARecord, kBadTime };

// Whether j has `key` as a number: a schema field the reader must tell apart from its default (a record's time, an
// evaluation's loss, a status's uptime: a non-finite number is written as null, and so is not charted as 0).
bool has_number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number();
}

// The record of a JSON object with a string "kind", read through the schema (records/kinds.h: rec::from_json, which
// reads a field of an unexpected type as missing and cuts texts to kMaxRecordText bytes of valid UTF-8);
// file_learner: N of learner-N.jsonl, -1 for the syncer's files. *bad_time: the time found when it is a number but
// not a finite time in [0, kMaxRecordTime] (then only that is read).
Parsed interpret(const json& j, int64_t file_learner, Rec* out, double* bad_time) {
  Rec& x = *out;
  x = Rec{};
  // The record's time: "t" (the envelope) when it is a number, else "elapsed_s" (`deloco train`) when that is one.
  std::optional<double> t, elapsed_s;
  rec::detail::Reader fields{&j};
  fields("t", t);
  fields("elapsed_s", elapsed_s);
  if (!t) t = elapsed_s;
  if (t) {
    if (!(*t >= 0 && *t <= kMaxRecordTime)) {  // NaN and infinities fail too
      *bad_time = *t;
      return Parsed::kBadTime;
    }
    x.t = *t;
  }
  const std::string kind = rec::record_kind(j);
  const auto whose = [&](const rec::RecordBase& r) { return r.learner.value_or(std::max<int64_t>(file_learner, 0)); };
  const auto eval = [&](const rec::Eval& e) {
    if (!has_number(j, "val_loss") || !std::isfinite(e.val_loss)) return;
    x.kind = Kind::kEval;
    x.v = {static_cast<double>(e.tokens), e.val_loss, e.val_bpb};
  };
  if (auto e = rec::from_json<rec::Eval>(j)) {
    eval(*e);
  } else if (auto fe = rec::from_json<rec::FinalEval>(j)) {
    eval(*fe);
  } else if (auto m = rec::from_json<rec::Merge>(j)) {
    // Every writer writes the quorum; a merge without one counts its learners.
    const double quorum = has_number(j, "quorum") ? static_cast<double>(m->quorum) : static_cast<double>(m->learners.size());
    x.kind = Kind::kMerge;
    x.v = {quorum, m->grace_wait, 0};
  } else if (auto l = rec::from_json<rec::Learner>(j)) {
    if (!j.contains("loss")) return Parsed::kRecord;  // "loss": null is a non-finite loss, charted as a gap
    x.kind = Kind::kLearner;
    x.learner = whose(*l);
    x.v = {static_cast<double>(l->step), l->loss.value_or(std::numeric_limits<double>::quiet_NaN()),
           static_cast<double>(l->tokens.value_or(0))};
  } else if (auto tr = rec::from_json<rec::Train>(j)) {
    if (!j.contains("loss")) return Parsed::kRecord;
    x.kind = Kind::kLearner;
    x.learner = whose(*tr);
    x.v = {static_cast<double>(tr->step),
           has_number(j, "loss") ? tr->loss : std::numeric_limits<double>::quiet_NaN(), static_cast<double>(tr->tokens)};
  } else if (auto rj = rec::from_json<rec::Reject>(j)) {
    if (j.contains("reason") && j["reason"].is_string() && !rj->join.value_or(false)) {  // a refused join: no contribution
      x.kind = Kind::kReject;
      x.text = rj->reason;
    }
  } else if (auto c = rec::from_json<rec::Chaos>(j)) {
    if (j.contains("what") && j["what"].is_string()) {
      x.kind = Kind::kEvent;
      x.text = c->what;
    }
  } else if (auto f = rec::from_json<rec::Fail>(j)) {
    x.kind = Kind::kEvent;
    x.text = "fail learner " + std::to_string(f->learner.value_or(-1));
  } else if (auto rj2 = rec::from_json<rec::Rejoin>(j)) {
    x.kind = Kind::kEvent;
    x.text = "rejoin learner " + std::to_string(rj2->learner.value_or(-1));
  } else if (auto st = rec::from_json<rec::Started>(j)) {
    if (st->resumed) {
      x.kind = Kind::kEvent;
      x.text = "syncer" + (st->shard && st->shards > 1 ? " shard " + std::to_string(*st->shard) : std::string()) +
               " resumed";
    }
  } else if (auto to = rec::from_json<rec::TakeOver>(j)) {
    // A standby pair (docs/reliability.md): which syncer leads from here on.
    x.kind = Kind::kEvent;
    x.text = "standby syncer took over: epoch " + std::to_string(to->epoch) + " (" +
             std::to_string(to->rounds_checked) + " rounds checked, " + std::to_string(to->mismatches) + " differed)";
  } else if (auto sd = rec::from_json<rec::StepDown>(j)) {
    x.kind = Kind::kEvent;
    x.text = "a syncer of epoch " + std::to_string(sd->epoch) + " stepped down (fenced by epoch " +
             std::to_string(sd->newer_epoch) + ")";
  } else if (auto cc = rec::from_json<rec::CodecChanged>(j)) {
    // net.encoding / net.broadcast_encoding = auto (docs/runtime.md, "Codecs fitted to the link").
    x.kind = Kind::kEvent;
    if (cc->scope == "broadcast") {
      x.text = "broadcast codec " + cc->previous.value_or("") + " -> " + cc->broadcast;
    } else {
      x.text = "learner " + std::to_string(cc->learner.value_or(-1)) + " codecs " + cc->push + "/" + cc->broadcast;
      if (cc->period && cc->fits && !*cc->fits) x.text += ", period stretched to " + std::to_string(*cc->period);
    }
  } else if (rec::from_json<rec::SyncerPause>(j) || rec::from_json<rec::SyncerResume>(j)) {
    x.kind = Kind::kEvent;
    x.text = kind == rec::SyncerPause::kKind ? "syncer down" : "syncer back";
  } else if (auto sr = rec::from_json<rec::Status>(j)) {
    auto s = std::make_shared<Status>();
    s->shard = sr->shard.value_or(0);
    // The connected list: its presence says the syncer names its learners; an element that is not an id is
    // dropped (the others stand).
    auto it = j.find("connected");
    if (it != j.end() && it->is_array()) {
      s->has_connected = true;
      for (const auto& c : *it)
        if (c.is_number_integer()) s->connected.push_back(c.get<int64_t>());
    }
    s->uptime = has_number(j, "uptime") ? sr->uptime : 1;
    s->has_goodput = j.contains("goodput");
    s->goodput = has_number(j, "goodput") ? sr->goodput : 1;
    s->merges = static_cast<double>(sr->merges);
    s->rejected = static_cast<double>(sr->rejected);
    s->bytes_out = static_cast<double>(sr->bytes_out);
    s->tokens = static_cast<double>(sr->tokens);
    x.kind = Kind::kStatus;
    x.status = std::move(s);
  } else if (auto d = rec::from_json<rec::LearnerDone>(j)) {
    x.kind = Kind::kLearnerDone;
    x.learner = whose(*d);
  } else if (rec::from_json<rec::Welcome>(j) || rec::from_json<rec::Joined>(j) || rec::from_json<rec::Alone>(j)) {
    // The learner node was welcomed (its state download follows), (re)joined (it holds the global state and trains
    // on from it) or gave up waiting and trains alone: "rejoining" until its next progress record.
    x.kind = Kind::kRejoining;
  } else if (rec::from_json<rec::Push>(j) || rec::from_json<rec::Apply>(j)) {
    x.kind = Kind::kPushOrApply;
  }
  return Parsed::kRecord;
}

// What the records of one file add up to beyond the charted ones (kept in `recs`): how many there were, the
// earliest time (the charts' origin is the run's first record, of any kind) and whether the last record that was not
// a push or an apply was a rejoining learner's (welcome, joined, alone).
struct Seen {
  int64_t records = 0;
  double min_t = std::numeric_limits<double>::infinity();
  int rejoining = -1;  // -1: no timed record yet; else 0 or 1

  void add(const Rec& x) {
    ++records;
    if (!std::isfinite(x.t)) return;  // a record without a time counts for nothing else
    min_t = std::min(min_t, x.t);
    if (x.kind != Kind::kPushOrApply) rejoining = x.kind == Kind::kRejoining ? 1 : 0;
  }
};

// Whether a record feeds a chart or a table (and so is kept in `recs`; status records are reduced apart).
bool charted(const Rec& x) {
  return std::isfinite(x.t) && x.kind != Kind::kOther && x.kind != Kind::kRejoining &&
         x.kind != Kind::kPushOrApply && x.kind != Kind::kStatus;
}

// The status records of a file that the live summary can use: per shard the one with the latest time, and the
// latest with a connected list (the later of equal times, as the records come).
struct Statuses {
  std::map<int64_t, Rec> per_shard;
  std::optional<Rec> connected;

  void add(const Rec& x) {
    if (x.kind != Kind::kStatus || !std::isfinite(x.t)) return;
    auto it = per_shard.find(x.status->shard);
    if (it == per_shard.end() || it->second.t <= x.t) per_shard[x.status->shard] = x;
    if (x.status->has_connected && (!connected || connected->t <= x.t)) connected = x;
  }
};

void add_note(std::vector<std::string>* notes, std::string note) {
  if (notes->size() < kMaxNotes) notes->push_back(std::move(note));
}

// What the complete lines of one records file held so far (read again from nothing when the file is).
struct FileRecords {
  int64_t lines = 0;               // complete lines
  std::vector<Rec> recs;           // the charted records of the complete lines, in their order
  Statuses statuses;               // their status records, reduced
  Seen seen;                       // all records of the complete lines
  int64_t bad = 0, long_lines = 0, bad_times = 0;
  std::vector<std::string> notes;  // the first kMaxNotes skips
};

// One records file, read as it grows by the records' tailer (records/record.h: a line over kMaxRecordLine bytes is
// never held; a file truncated or rotated is read again from its start).
struct RecordFile {
  explicit RecordFile(const std::string& path) : tail(path, kMaxRecordLine) {}
  rec::RecordTailer tail;  // also holds the unfinished last line (tail.partial(), tail.partial_long_bytes())
  FileRecords got;
};

std::string long_line_note(const std::string& label, int64_t line, std::uintmax_t bytes, bool finished) {
  return label + " line " + std::to_string(line) + ": " + (finished ? "" : "unfinished, already ") +
         std::to_string(bytes) + " bytes, over the " + std::to_string(kMaxRecordLine >> 20) +
         " MiB bound of a record line; skipped";
}

// Parses one line (at most kMaxRecordLine bytes). Counts and notes a skip; returns whether *out is a record.
bool read_line(const std::string& line, const std::string& label, int64_t line_no, int64_t file_learner, Rec* out,
               int64_t* bad, int64_t* bad_times, std::vector<std::string>* notes) {
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  double t = 0;
  if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string()) {
    ++*bad;
    add_note(notes, label + " line " + std::to_string(line_no) + ": not a JSON object with a string \"kind\"; skipped");
    return false;
  }
  if (interpret(j, file_learner, out, &t) == Parsed::kBadTime) {
    ++*bad_times;
    add_note(notes, label + " line " + std::to_string(line_no) + ": time " + number_text(t) +
                        " is not a finite time in [0, " + number_text(kMaxRecordTime) + "] s; record skipped");
    return false;
  }
  return true;
}

// Reads the lines `f` gained since the last call: each complete line a record, or a skip counted and noted.
void poll_records(const std::string& label, int64_t learner, RecordFile* f) {
  FileRecords& g = f->got;
  f->tail.poll(
      [&](const std::string& line) {
        ++g.lines;
        if (line.empty()) return;
        Rec x;
        if (read_line(line, label, g.lines, learner, &x, &g.bad, &g.bad_times, &g.notes)) {
          g.seen.add(x);
          g.statuses.add(x);
          if (charted(x)) g.recs.push_back(std::move(x));
        }
      },
      [&](uint64_t bytes) {
        ++g.lines;
        ++g.long_lines;
        add_note(&g.notes, long_line_note(label, g.lines, bytes, true));
      },
      [&] { g = FileRecords{}; });
}

std::string kind_of(const fs::path& dir, const json& summary) {
  const rec::RunSummary sum = rec::RunSummary::from_json(summary);  // (null: an empty summary)
  if (sum.command == "sim" || sum.command == "train" || sum.command == "run") return sum.command;
  if (fs::exists(dir / "syncer.jsonl") || fs::exists(dir / "shard-0" / "syncer.jsonl") ||
      fs::exists(dir / "learner-0.jsonl"))
    return "run";
  if (sum.outer_steps) return "sim";
  return "train";
}

// The summary fields the page and the data show, and whether each is text (else a number). "learners" and
// "steps" are passed on whatever they hold (a count, or sim's per-learner list); the page does not show them.
struct ShownField {
  const char* key;
  enum { kNumber, kText, kAny } type;
};
constexpr ShownField kShownSummary[] = {
    {"wall_seconds", ShownField::kNumber}, {"final_val_loss", ShownField::kNumber}, {"val_bpb", ShownField::kNumber},
    {"loss_unit", ShownField::kText}, {"tokens", ShownField::kNumber}, {"outer_steps", ShownField::kNumber},
    {"contributions_merged", ShownField::kNumber}, {"contributions_rejected", ShownField::kNumber},
    {"uptime", ShownField::kNumber}, {"goodput", ShownField::kNumber}, {"bytes_sent", ShownField::kNumber},
    {"learner_kills", ShownField::kNumber}, {"syncer_kills", ShownField::kNumber}, {"learners", ShownField::kAny},
    {"steps", ShownField::kAny}, {"command", ShownField::kText}};

bool shown_type_ok(const json& v, const ShownField& f) {
  return f.type == ShownField::kAny || (f.type == ShownField::kText ? v.is_string() : v.is_number());
}

}  // namespace

// Impl is defined in this file only, so its fields may use this file's anonymous namespace; GCC warns about that
// when a unity build compiles the file as an included one.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsubobject-linkage"
struct ReportRunReader::Impl {
  std::string dir;
  std::map<std::string, RecordFile> files;  // by path
};
#pragma GCC diagnostic pop

ReportRunReader::ReportRunReader(std::string dir) : impl_(std::make_unique<Impl>()) { impl_->dir = std::move(dir); }
ReportRunReader::~ReportRunReader() = default;
ReportRunReader::ReportRunReader(ReportRunReader&&) noexcept = default;
ReportRunReader& ReportRunReader::operator=(ReportRunReader&&) noexcept = default;

ReportRun load_report_run(const std::string& dir) { return ReportRunReader(dir).load(); }

ReportRun ReportRunReader::load() {
  const std::string& dir_in = impl_->dir;
  const fs::path dir(dir_in);
  if (!fs::is_directory(dir)) throw IoError("report: '" + dir_in + "' is not a folder");
  ReportRun r;
  r.dir = dir_in;
  r.name = fs::path(dir_in).lexically_normal().filename().string();
  if (r.name.empty() || r.name == ".") r.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  r.name = printable(r.name, 1024);
  const fs::path sj = dir / "summary.json";
  if (fs::exists(sj)) {
    std::error_code ec;
    const std::uintmax_t bytes = fs::file_size(sj, ec);
    if (!ec && bytes > kMaxSummaryBytes)
      throw IoError("report: '" + sj.string() + "' is " + std::to_string(bytes) + " bytes, over the " +
                    std::to_string(kMaxSummaryBytes >> 20) + " MiB bound of a summary (a damaged summary)");
    r.summary = json::parse(read_file(sj.string()), nullptr, false);
    if (r.summary.is_discarded() || !r.summary.is_object())
      throw IoError("report: '" + sj.string() + "' is not a JSON object (a damaged summary)");
    for (const ShownField& f : kShownSummary) {
      auto it = r.summary.find(f.key);
      if (it == r.summary.end() || shown_type_ok(*it, f)) continue;
      add_note(&r.notes, std::string("summary.json: \"") + f.key + "\" is a " + it->type_name() + ", not a " +
                             (f.type == ShownField::kText ? "string" : "number") + "; not shown");
      r.summary.erase(it);
    }
  }
  // The files in a fixed order (so the records are in the order a whole read would give), each read from where
  // the last load() stopped. An unfinished last line counts as it is now: a record if it parses, else a skip.
  std::vector<std::pair<fs::path, int64_t>> sources = {
      {dir / "metrics.jsonl", -1}, {dir / "syncer.jsonl", -1}, {dir / "events.jsonl", -1}};
  std::vector<fs::path> listing;
  for (const auto& e : fs::directory_iterator(dir)) listing.push_back(e.path());
  std::sort(listing.begin(), listing.end());
  for (const auto& p : listing) {
    const std::string f = p.filename().string();
    if (f.rfind("shard-", 0) == 0 && fs::is_directory(p)) {
      sources.emplace_back(p / "syncer.jsonl", -1);
      sources.emplace_back(p / "standby" / "syncer.jsonl", -1);  // its standby syncer (syncer.standby)
    }
    if (f == "standby" && fs::is_directory(p)) sources.emplace_back(p / "syncer.jsonl", -1);
    if (f.rfind("learner-", 0) == 0 && p.extension() == ".jsonl") {
      const std::string id = f.substr(8, f.size() - 8 - 6);
      char* end = nullptr;
      const long v = std::strtol(id.c_str(), &end, 10);
      sources.emplace_back(p, end && *end == '\0' && !id.empty() ? v : -1);
    }
  }
  std::vector<Rec> tails;  // records of unfinished last lines, this load only
  tails.reserve(sources.size());
  std::vector<const Rec*> recs;
  std::vector<const Statuses*> statuses;
  std::vector<Statuses> tail_statuses;
  tail_statuses.reserve(sources.size());
  int64_t records = 0;
  double t0 = std::numeric_limits<double>::infinity();
  std::map<int64_t, bool> rejoining;  // per learner file: its last record (but pushes and applies) was joined/alone
  const auto count = [&](const Seen& seen, int64_t learner) {
    records += seen.records;
    t0 = std::min(t0, seen.min_t);
    if (learner >= 0 && seen.rejoining >= 0) rejoining[learner] = seen.rejoining == 1;
  };
  for (const auto& [path, learner] : sources) {
    RecordFile& f = impl_->files.try_emplace(path.string(), path.string()).first->second;
    const std::string label = printable(path.lexically_relative(dir).string(), 1024);
    poll_records(label, learner, &f);
    const FileRecords& g = f.got;
    for (const Rec& x : g.recs) recs.push_back(&x);
    statuses.push_back(&g.statuses);
    count(g.seen, learner);
    r.bad_lines += g.bad;
    r.long_lines += g.long_lines;
    r.bad_times += g.bad_times;
    for (const auto& n : g.notes) add_note(&r.notes, n);
    if (f.tail.partial_long_bytes() > 0) {
      ++r.long_lines;
      add_note(&r.notes, long_line_note(label, g.lines + 1, f.tail.partial_long_bytes(), false));
    } else if (!f.tail.partial().empty()) {
      Rec x;
      if (read_line(f.tail.partial(), label, g.lines + 1, learner, &x, &r.bad_lines, &r.bad_times, &r.notes)) {
        Seen tail;
        tail.add(x);
        count(tail, learner);
        if (x.kind == Kind::kStatus) {
          tail_statuses.emplace_back();
          tail_statuses.back().add(x);
          statuses.push_back(&tail_statuses.back());
        }
        if (charted(x)) {
          tails.push_back(std::move(x));
          recs.push_back(&tails.back());
        }
      }
    }
  }
  if (records == 0 && r.summary.is_null())
    throw IoError("report: '" + dir_in + "' holds no summary.json and no records (metrics.jsonl, syncer.jsonl, "
                  "learner-N.jsonl): not a run folder of deloco run, sim or train");
  r.kind = kind_of(dir, r.summary);

  if (!std::isfinite(t0)) t0 = 0;
  std::set<int64_t> connected, done;
  // Per shard: the latest status record and its time, the live summary while summary.json is not written yet.
  std::map<int64_t, std::pair<const Status*, double>> last_status;
  bool have_status = false;
  double status_t = -1;
  for (const Statuses* s : statuses) {
    for (const auto& [shard, x] : s->per_shard) {
      const double t = x.t - t0;
      auto it = last_status.find(shard);
      if (it == last_status.end() || it->second.second <= t) last_status[shard] = {x.status.get(), t};
    }
    if (s->connected && s->connected->t - t0 >= status_t) {
      have_status = true;
      status_t = s->connected->t - t0;
      connected = std::set<int64_t>(s->connected->status->connected.begin(), s->connected->status->connected.end());
    }
  }
  int64_t uncharted = 0;  // records of learners past the first kMaxLearnerSeries
  for (const Rec* x : recs) {
    const double t = x->t - t0;
    if (!std::isfinite(t)) continue;
    switch (x->kind) {
      case Kind::kLearnerDone: done.insert(x->learner); break;
      case Kind::kEval: r.evals.push_back({t, x->v[0], x->v[1], x->v[2]}); break;
      case Kind::kMerge: r.merges.push_back({t, x->v[0], x->v[1]}); break;
      case Kind::kLearner:
        if (r.learners.size() < kMaxLearnerSeries || r.learners.count(x->learner))
          r.learners[x->learner].push_back({t, x->v[0], x->v[1], x->v[2]});
        else
          ++uncharted;
        break;
      case Kind::kReject:
        if (r.rejects.size() < kMaxRejectReasons || r.rejects.count(x->text)) ++r.rejects[x->text];
        else ++r.rejects["(other reasons)"];
        break;
      case Kind::kEvent: r.events.push_back({t, x->text}); break;
      default: break;
    }
  }
  if (uncharted > 0)
    add_note(&r.notes, std::to_string(uncharted) + " records of learners past the first " +
                           std::to_string(kMaxLearnerSeries) + " learner ids not charted");
  // A run still going: the syncer's latest status (every shard's, summed) stands in for the summary.
  if (!r.summary.is_object() && !last_status.empty()) {
    json s = json::object();
    double uptime = 1, goodput = 1, wall = 0, merges = 0, rejected = 0, bytes = 0, tokens = 0;
    bool have_goodput = false;
    for (const auto& [shard, latest] : last_status) {
      const Status& st = *latest.first;
      uptime = std::min(uptime, st.uptime);
      if (st.has_goodput) {
        goodput = std::min(goodput, st.goodput);
        have_goodput = true;
      }
      wall = std::max(wall, latest.second);
      merges += st.merges;
      rejected += st.rejected;
      bytes += st.bytes_out;
      tokens = std::max(tokens, st.tokens);
    }
    s["wall_seconds"] = wall;
    s["uptime"] = uptime;
    if (have_goodput) s["goodput"] = goodput;
    s["outer_steps"] = static_cast<int64_t>(merges);
    s["contributions_rejected"] = static_cast<int64_t>(rejected);
    double merged = 0;
    for (const auto& m : r.merges) merged += m[1];
    s["contributions_merged"] = static_cast<int64_t>(merged);
    s["bytes_sent"] = static_cast<int64_t>(bytes);
    s["tokens"] = static_cast<int64_t>(tokens);
    if (!r.evals.empty()) {
      s["final_val_loss"] = r.evals.back()[2];
      s["val_bpb"] = r.evals.back()[3];
    }
    int64_t kills = 0, syncer_kills = 0;
    for (const auto& [t, what] : r.events) {
      if (what.rfind("chaos: SIGKILL learner", 0) == 0) ++kills;
      if (what.rfind("chaos: SIGKILL syncer", 0) == 0 || what.rfind("chaos: SIGKILL the syncer", 0) == 0) ++syncer_kills;
    }
    s["learner_kills"] = kills;
    s["syncer_kills"] = syncer_kills;
    s["live"] = true;
    r.summary = s;
  }
  // The syncer's final reject counts, when it wrote them, are the whole truth (records are rate-limited): every
  // refusal by reason less the refused joins by reason, as contributions_rejected is counted.
  if (r.summary.is_object() && r.summary.contains("rejects") && r.summary["rejects"].is_object()) {
    r.rejects.clear();
    const json& joins = r.summary.contains("joins_refused_by") ? r.summary["joins_refused_by"] : json();
    for (const auto& [k, v] : r.summary["rejects"].items()) {
      if (!v.is_number_integer()) continue;
      int64_t n = v.get<int64_t>();
      if (joins.is_object() && joins.contains(k) && joins[k].is_number_integer()) n -= joins[k].get<int64_t>();
      if (n <= 0) continue;
      const std::string reason = clip_utf8(k, kMaxRecordText);
      if (r.rejects.size() < kMaxRejectReasons || r.rejects.count(reason)) r.rejects[reason] += n;
      else r.rejects["(other reasons)"] += n;
    }
  }
  auto by_time = [](const auto& a, const auto& b) { return a[0] < b[0]; };
  std::stable_sort(r.evals.begin(), r.evals.end(), by_time);
  std::stable_sort(r.merges.begin(), r.merges.end(), by_time);
  for (auto& [id, v] : r.learners) std::stable_sort(v.begin(), v.end(), by_time);
  for (const auto& [id, v] : r.learners) {
    ReportRun::LearnerNow n;
    const auto& last = v.back();
    n.t = last[0];
    n.step = last[1];
    n.loss = last[2];
    if (v.size() >= 2) {
      const auto& prev = v[v.size() - 2];
      if (last[0] > prev[0] && last[3] >= prev[3]) n.tokens_per_s = (last[3] - prev[3]) / (last[0] - prev[0]);
    }
    if (done.count(id)) n.state = "done";
    else if (rejoining.count(id) && rejoining[id]) n.state = "rejoining";
    else if (have_status) n.state = connected.count(id) ? "training" : "down";
    r.learner_now[id] = n;
  }
  std::stable_sort(r.events.begin(), r.events.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return r;
}

namespace {

json num_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// Merges per minute: counts in buckets of about 60 s (or 1/20 of the run when it is shorter than 20 minutes), made
// wider where that would be more than max_points buckets (0: more than max(20, merges)), so their number never
// depends on the span of the times. The buckets tile [0, last merge] exactly (the last one closed), so none is a
// sliver whose rate reads as a drop at the end. Merges at a time that is not finite or negative (only a ReportRun
// built by hand has them) are not counted.
std::vector<std::array<double, 2>> merge_rate(const ReportRun& r, size_t max_points) {
  std::vector<std::array<double, 2>> out;
  const size_t cap = max_points > 0 ? max_points : std::max<size_t>(20, r.merges.size());
  double end = 0;
  bool any = false;
  for (const auto& m : r.merges)
    if (std::isfinite(m[0]) && m[0] >= 0) {
      end = std::max(end, m[0]);
      any = true;
    }
  if (!any) return out;
  const double target = std::max({1e-3, std::min(60.0, std::max(end, 1.0) / 20.0), end / static_cast<double>(cap)});
  const double buckets = std::ceil(end / target);  // end / target <= cap, so this is at most cap
  const size_t n = end > 0 ? static_cast<size_t>(std::clamp(buckets, 1.0, static_cast<double>(cap))) : 1;
  const double width = end > 0 ? end / static_cast<double>(n) : 1.0;  // every merge at t = 0: one 1 s bucket
  std::vector<double> count(n, 0);
  for (const auto& m : r.merges)
    if (std::isfinite(m[0]) && m[0] >= 0) {
      const double k = std::floor(m[0] / width);
      count[k >= static_cast<double>(n - 1) ? n - 1 : static_cast<size_t>(k)] += 1;
    }
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back({(static_cast<double>(i) + 0.5) * width, count[i] * 60.0 / width});
  return out;
}

}  // namespace

size_t longest_series(const ReportRun& run) {
  size_t longest = std::max({run.evals.size(), run.merges.size(), run.events.size()});
  for (const auto& [id, v] : run.learners) longest = std::max(longest, v.size());
  return longest;
}

json report_data(const std::vector<ReportRun>& runs, size_t max_points) {
  json all = json::array();
  for (const auto& r : runs) {
    json o{{"name", clip_utf8(r.name, 1024)}, {"dir", clip_utf8(r.dir, 4096)},
           {"kind", r.kind},           {"bad_lines", r.bad_lines},
           {"long_lines", r.long_lines}, {"bad_times", r.bad_times},
           {"notes", json::array()}};
    for (size_t i = 0; i < r.notes.size() && i < kMaxNotes; ++i) o["notes"].push_back(clip_utf8(r.notes[i], 1024));
    json ev = json::array(), mg = json::array(), rate = json::array(), lr = json::object(), evs = json::array();
    // Each learner's share of kLearnerPointBudget (thinning only: max_points = 0 keeps every record).
    const size_t per_learner =
        max_points == 0 || r.learners.empty()
            ? max_points
            : std::min(max_points, std::max<size_t>(2, kLearnerPointBudget / r.learners.size()));
    bool thinned = max_points > 0 && longest_series(r) > max_points;
    for (const auto& [id, v] : r.learners) thinned = thinned || (max_points > 0 && v.size() > per_learner);
    // Calls add(i) for the records of a series of n to serve: all, or `cap` evenly spaced, first and last kept.
    auto each_kept_of = [](size_t cap, size_t n, const auto& add) {
      if (cap == 0 || n <= cap) {
        for (size_t i = 0; i < n; ++i) add(i);
        return;
      }
      if (cap == 1) {
        add(n - 1);
        return;
      }
      for (size_t k = 0; k < cap; ++k) add(k * (n - 1) / (cap - 1));
    };
    auto each_kept = [&](size_t n, const auto& add) { each_kept_of(max_points, n, add); };
    each_kept(r.evals.size(), [&](size_t i) {
      const auto& e = r.evals[i];
      ev.push_back({e[0], e[1], num_or_null(e[2]), num_or_null(e[3])});
    });
    each_kept(r.merges.size(), [&](size_t i) { mg.push_back({r.merges[i][0], r.merges[i][1], r.merges[i][2]}); });
    for (const auto& m : merge_rate(r, max_points)) rate.push_back({m[0], m[1]});
    for (const auto& learner : r.learners) {
      const auto& v = learner.second;  // (a structured binding cannot be captured by a lambda before C++20)
      json pts = json::array();
      each_kept_of(per_learner, v.size(),
                   [&](size_t i) { pts.push_back({v[i][0], v[i][1], num_or_null(v[i][2]), v[i][3]}); });
      lr[std::to_string(learner.first)] = std::move(pts);
    }
    if (thinned) o["thinned_to"] = max_points;
    each_kept(r.events.size(), [&](size_t i) {
      evs.push_back({num_or_null(r.events[i].first), clip_utf8(r.events[i].second, kMaxRecordText)});
    });
    o["evals"] = std::move(ev);
    o["merges"] = std::move(mg);
    o["merge_rate"] = std::move(rate);
    o["learners"] = std::move(lr);
    o["events"] = std::move(evs);
    json rejects = json::object();
    for (const auto& [reason, n] : r.rejects) {
      const std::string key = clip_utf8(reason, kMaxRecordText);
      rejects[key] = rejects.value(key, int64_t{0}) + n;
    }
    o["rejects"] = std::move(rejects);
    json now = json::object();
    for (const auto& [id, n] : r.learner_now)
      now[std::to_string(id)] = {{"state", n.state}, {"t", n.t}, {"step", n.step}, {"loss", num_or_null(n.loss)},
                                 {"tokens_per_s", n.tokens_per_s}};
    o["learner_now"] = std::move(now);
    json s = json::object();
    if (r.summary.is_object())
      for (const ShownField& f : kShownSummary) {
        auto it = r.summary.find(f.key);
        if (it == r.summary.end() || !shown_type_ok(*it, f)) continue;
        s[f.key] = it->is_string() ? json(clip_utf8(it->get_ref<const std::string&>(), kMaxRecordText)) : *it;
      }
    o["summary"] = std::move(s);
    all.push_back(std::move(o));
  }
  return all;
}

namespace {

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

// The uPlot library inside <script>: "</" could close the element early (it holds no "<!--").
std::string script_safe(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/') {
      o += "<\\/";
      ++i;
    } else {
      o += s[i];
    }
  }
  return o;
}

// JSON text inside <script type="application/json">: every <, > and & (which only occur inside JSON strings) and
// U+2028/U+2029 as \uXXXX escapes, which JSON.parse reads back as the same characters. No "</script>", "<!--" or
// "<script" can then appear, so the block ends where the page ends it and the parser never changes state in it.
std::string json_in_script(const std::string& s) {
  std::string o;
  o.reserve(s.size() + s.size() / 16);
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') o += "\\u003c";
    else if (c == '>') o += "\\u003e";
    else if (c == '&') o += "\\u0026";
    else if (c == '\xe2' && i + 2 < s.size() && s[i + 1] == '\x80' && (s[i + 2] == '\xa8' || s[i + 2] == '\xa9')) {
      o += s[i + 2] == '\xa8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      o += c;
    }
  }
  return o;
}

// The page (src/report/web/, compiled in by cmake/page_assets.cmake): the template with its @@NAME@@ fields, the
// page's own script (a summary table and the charts, each run one series; in a live page, updated in place from
// api/data) and its style.
constexpr const char* kPageTemplate =
#include "page_report_html.inc"
    ;
constexpr const char* kPageScript =
#include "page_report_js.inc"
    ;
constexpr const char* kPageStyle =
#include "page_report_css.inc"
    ;

// The template filled in: each @@NAME@@ becomes fields' NAME, and a line starting with "@@!" (a comment of the
// template) is dropped. What is put in is never scanned again, so no title or record can add a field.
std::string fill_page(const std::string& tpl, const std::map<std::string, std::string>& fields) {
  std::string out;
  size_t i = 0;
  for (size_t at; (at = tpl.find("@@", i)) != std::string::npos;) {
    out.append(tpl, i, at - i);
    if (at + 2 < tpl.size() && tpl[at + 2] == '!') {
      const size_t eol = tpl.find('\n', at);
      i = eol == std::string::npos ? tpl.size() : eol + 1;
      continue;
    }
    const size_t end = tpl.find("@@", at + 2);
    const auto it = end == std::string::npos ? fields.end() : fields.find(tpl.substr(at + 2, end - at - 2));
    if (it == fields.end()) throw std::logic_error("report page template: an unknown or unclosed field at byte " +
                                                   std::to_string(at));
    out += it->second;
    i = end + 2;
  }
  out.append(tpl, i, std::string::npos);
  return out;
}

}  // namespace

std::string report_html(const std::vector<ReportRun>& runs, const std::string& title, const std::string& uplot_js,
                        const std::string& uplot_css, bool live, size_t max_points) {
  const std::string intro =
      live ? std::string("The live dashboard of <code>deloco syncer</code>: <span id=\"live\">connecting</span>.")
           : "Written by <code>deloco report</code> from " + std::to_string(runs.size()) +
                 (runs.size() == 1 ? " run folder" : " run folders") + "; self-contained.";
  return fill_page(kPageTemplate,
                   {{"TITLE", html_escape(title)},
                    {"INTRO", intro},
                    {"UPLOT_CSS", uplot_css},
                    {"PAGE_CSS", kPageStyle},
                    {"DATA", live ? std::string("[]")
                                  : json_in_script(report_data(runs, max_points)
                                                       .dump(-1, ' ', false, json::error_handler_t::replace))},
                    {"LIVE", live ? "<script>const LIVE = true;</script>\n" : ""},
                    {"UPLOT_JS", script_safe(uplot_js)},
                    {"PAGE_JS", kPageScript}});
}

namespace {

// The inside of a single-quoted gnuplot string: gnuplot substitutes nothing there (no `command`, no @macro, no
// escapes) and ends it only at a lone ' or the end of the line, so every ' is doubled and every control character
// (a newline would end the command, and a next line starting with ! would run a shell) is written as '?'.
std::string gp_text(const std::string& s) {
  std::string o;
  for (char c : printable(s, 1024)) o += c == '\'' ? std::string("''") : std::string(1, c);
  return o;
}

}  // namespace

std::vector<std::string> write_report_pngs(const std::vector<ReportRun>& runs, const std::string& dir,
                                           size_t max_points) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError("report: cannot create '" + dir + "': " + ec.message());
  struct Chart {
    std::string stem, title, xlabel, ylabel;
    std::vector<std::pair<std::string, std::vector<std::array<double, 2>>>> series;
  };
  std::vector<Chart> charts{{"val_loss_time", "Validation loss of the global model", "seconds", "val loss", {}},
                            {"val_loss_tokens", "Validation loss against tokens", "tokens", "val loss", {}},
                            {"merges_per_minute", "Merges per minute", "seconds", "merges / min", {}}};
  for (const auto& r : runs) {
    std::vector<std::array<double, 2>> a, b, c;
    for (const auto& e : r.evals) {
      a.push_back({e[0], e[2]});
      b.push_back({e[1], e[2]});
    }
    c = merge_rate(r, max_points);
    charts[0].series.push_back({r.name, a});
    charts[1].series.push_back({r.name, b});
    charts[2].series.push_back({r.name, c});
  }
  const bool gnuplot = have_program("gnuplot");
  std::vector<std::string> pngs;
  for (const auto& ch : charts) {
    std::ostringstream d, g;
    d << std::setprecision(8);
    bool any = false;
    for (const auto& [name, pts] : ch.series) {
      d << "# " << printable(name, 1024) << "\n";  // one comment line, whatever the name holds
      for (const auto& p : pts) d << p[0] << " " << p[1] << "\n";
      if (pts.empty()) d << "nan nan\n";  // keeps the index of every run
      any = any || !pts.empty();
      d << "\n\n";
    }
    if (!any) continue;
    const fs::path dat = fs::path(dir) / (ch.stem + ".dat"), gp = fs::path(dir) / (ch.stem + ".gp");
    write_file_atomic(dat.string(), d.str());
    g << "# written by `deloco report`; run `gnuplot " << ch.stem << ".gp` in this folder\n"
      << "set terminal pngcairo size 900,520 enhanced font 'Sans,11'\nset output '" << ch.stem << ".png'\n"
      << "set title '" << gp_text(ch.title) << "' noenhanced\nset xlabel '" << gp_text(ch.xlabel)
      << "'\nset ylabel '" << gp_text(ch.ylabel) << "'\nset grid\nset key outside right noenhanced\nplot \\\n";
    for (size_t i = 0; i < ch.series.size(); ++i)
      g << "  '" << ch.stem << ".dat' index " << i << " using 1:2 with "
        << (ch.stem == "merges_per_minute" ? "steps" : "linespoints pt 7 ps 0.5") << " lw 2 title '"
        << gp_text(ch.series[i].first) << "'" << (i + 1 < ch.series.size() ? ", \\\n" : "\n");
    write_file_atomic(gp.string(), g.str());
    if (!gnuplot) continue;
    // gnuplot's warnings (an x range of one point) are noise here; a failure names the script to run by hand.
    if (!run_gnuplot(dir, ch.stem + ".gp", /*quiet=*/true))
      throw IoError("report: gnuplot failed on " + gp.string() + " (run it in that folder to see why)");
    pngs.push_back((fs::path(dir) / (ch.stem + ".png")).string());
  }
  if (!gnuplot)
    std::cerr << "report: gnuplot is not installed, so no PNG was drawn; the .dat and .gp files are in " << dir
              << " (apt-get install gnuplot-nox)\n";
  return pngs;
}

}  // namespace deloco
