// records/record.h — the JSON-lines records every deloco process writes (syncer.jsonl, learner-N.jsonl,
// metrics.jsonl, events.jsonl): how a typed record becomes a line and a line becomes a typed record, the one writer
// and the one tailer. The record kinds themselves (their names and fields) are records/kinds.h: the schema.
//
// A record type R is a plain struct with
//   static constexpr const char* kKind = "merge";          // the "kind" field
//   template <class V> void fields(V& v) { v("fragment", fragment); v("version", version); ... }
// Every record may also carry the envelope fields of RecordBase, set by the driver that emits it: "t" (unix seconds
// for the nodes, virtual seconds for the simulator), "learner" (the learner it concerns: every record of a learner
// node, the simulator's per-learner records, the syncer's records about one learner) and "shard" (the syncer shard
// a learner's record about one link concerns).
// Field types: bool, int64_t, double, std::string, std::vector of int64_t / double / std::string, nlohmann::json
// (free-form: a config, a map of counts), and std::optional<T> of any of these (written only when set).
//
// Contract
//  * to_json(r) writes {"kind": R::kKind, every field}; an unset optional is left out, NaN and infinities are
//    written as null (JSON has no NaN).
//  * from_json<R>(j) reads untrusted input: nullopt unless j is an object whose "kind" is R::kKind. A field that is
//    missing, null or of another JSON type keeps its default (an optional stays unset), integers are read from
//    integral JSON numbers only, and texts are cut to kMaxRecordText bytes of valid UTF-8: a hostile record can
//    make a field absent, never make the reader throw or hold more than the line. record_kind(j) is the kind of a
//    line (empty when it has none).
//  * RecordWriter appends one line per record with one write(2) of the whole line, newline included (O_APPEND; no
//    user-space buffer), so a process killed mid-record leaves a line without its end, never a complete object
//    without its newline. A restarted process continues the same file and first ends such an unfinished last line,
//    so a crash loses at most the line being written, never the next process's first record. Bytes that are not
//    valid UTF-8 are written as U+FFFD, so no peer text quoted in a record can make a write fail. Thread-safe.
//    Throws IoError naming the path and the cause when the file cannot be opened and on every failed write (a full
//    disk): the caller counts what its sink failed to take, never a record silently dropped.
//  * RecordTailer reads the complete lines another process appends to a file (which may not exist yet), in 64 KiB
//    blocks. A line longer than max_line bytes is never held: it is skipped and counted. A file that shrank
//    (truncated) or was replaced (rotated: another inode at the path) is read again from its start, and said so by
//    restarts(). Memory: at most max_line bytes of an unfinished line plus one block. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace deloco::rec {

inline constexpr size_t kMaxRecordLine = size_t{1} << 20;  // 1 MiB: a record line (real ones are < 1 KiB)
inline constexpr size_t kMaxRecordText = 256;              // bytes of a text field read back (a reason, a detail)

// UTF-8-valid prefix of at most `max` bytes of `s` (never cuts a character; invalid bytes become U+FFFD first).
std::string clip_text(const std::string& s, size_t max = kMaxRecordText);

namespace detail {

template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};

inline nlohmann::json number_to_json(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

template <class T> nlohmann::json value_to_json(const T& v) {
  if constexpr (std::is_same_v<T, double>) return number_to_json(v);
  else if constexpr (std::is_same_v<T, std::vector<double>>) {
    nlohmann::json a = nlohmann::json::array();
    for (double x : v) a.push_back(number_to_json(x));
    return a;
  } else return nlohmann::json(v);
}

// Reads j into *out when j has T's JSON type; returns whether it did.
template <class T> bool value_from_json(const nlohmann::json& j, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!j.is_boolean()) return false;
    *out = j.get<bool>();
  } else if constexpr (std::is_same_v<T, int64_t>) {
    if (j.is_number_integer()) *out = j.get<int64_t>();
    else if (j.is_number_float() && std::isfinite(j.get<double>()) && std::floor(j.get<double>()) == j.get<double>() &&
             std::fabs(j.get<double>()) < 9.2e18)
      *out = static_cast<int64_t>(j.get<double>());
    else return false;
  } else if constexpr (std::is_same_v<T, double>) {
    if (!j.is_number()) return false;
    *out = j.get<double>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) return false;
    *out = clip_text(j.get_ref<const std::string&>());
  } else if constexpr (std::is_same_v<T, nlohmann::json>) {
    *out = j;
  } else {  // std::vector<E>
    if (!j.is_array()) return false;
    T v;
    for (const auto& e : j) {
      typename T::value_type x{};
      if (!value_from_json(e, &x)) return false;
      v.push_back(std::move(x));
    }
    *out = std::move(v);
  }
  return true;
}

struct Writer {
  nlohmann::json* j;
  template <class T> void operator()(const char* name, const T& v) {
    if constexpr (is_optional<T>::value) {
      if (v) (*j)[name] = value_to_json(*v);
    } else {
      (*j)[name] = value_to_json(v);
    }
  }
};

struct Reader {
  const nlohmann::json* j;
  std::vector<std::string>* wrong = nullptr;  // names of fields present but of another JSON type
  template <class T> void operator()(const char* name, T& v) {
    auto it = j->find(name);
    if (it == j->end() || it->is_null()) return;
    bool ok;
    if constexpr (is_optional<T>::value) {
      typename T::value_type x{};
      ok = value_from_json(*it, &x);
      if (ok) v = std::move(x);
    } else {
      ok = value_from_json(*it, &v);
    }
    if (!ok && wrong) wrong->push_back(name);
  }
};

}  // namespace detail

// The envelope fields every record may carry.
struct RecordBase {
  std::optional<double> t;         // unix seconds (nodes, `deloco run`), virtual seconds (`deloco sim`)
  std::optional<int64_t> learner;  // the learner the record concerns
  std::optional<int64_t> shard;    // the syncer shard (a learner's record about one link of a sharded syncer)
};

template <class R> nlohmann::json to_json(const R& r) {
  nlohmann::json j = nlohmann::json::object();
  j["kind"] = R::kKind;
  detail::Writer w{&j};
  w("t", r.t);
  w("learner", r.learner);
  w("shard", r.shard);
  const_cast<R&>(r).fields(w);
  return j;
}

// The kind of a line's record; "" when it is not an object with a string "kind".
std::string record_kind(const nlohmann::json& j);

// wrong_types: when given, receives the name of every field of R (or the envelope) that is present but of another
// JSON type (read as missing), for a reader that ignores such a record or notes it.
template <class R> std::optional<R> from_json(const nlohmann::json& j, std::vector<std::string>* wrong_types = nullptr) {
  if (!j.is_object()) return std::nullopt;
  auto k = j.find("kind");
  if (k == j.end() || !k->is_string() || k->get_ref<const std::string&>() != R::kKind) return std::nullopt;
  R r;
  detail::Reader rd{&j, wrong_types};
  rd("t", r.t);
  rd("learner", r.learner);
  rd("shard", r.shard);
  r.fields(rd);
  return r;
}

class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path);
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  template <class R> void write(const R& r) { write_json(to_json(r)); }
  // A record already in JSON form (the drivers' emit callbacks pass records on this way).
  void write_json(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::mutex mu_;
  int fd_ = -1;
};

class RecordTailer {
 public:
  explicit RecordTailer(std::string path, size_t max_line = kMaxRecordLine);
  // Calls on_line for every complete line appended since the last call (after a truncation or rotation: every
  // line of the new file); keeps an incomplete last line for the next call. A reader that numbers lines or keeps
  // state per file passes the optional on_skip (a line over max_line, with its length in bytes, in its place among
  // the lines) and on_restart (called before the first line of a file read again from its start).
  void poll(const std::function<void(const std::string&)>& on_line,
            const std::function<void(uint64_t bytes)>& on_skip = {}, const std::function<void()>& on_restart = {});
  const std::string& path() const { return path_; }
  int64_t skipped() const { return skipped_; }    // lines over max_line bytes so far
  int64_t restarts() const { return restarts_; }  // times the file shrank or was replaced and was read again
  uint64_t offset() const { return static_cast<uint64_t>(offset_); }
  // The incomplete last line as it is now: its bytes while at most max_line (else empty), and its length so far
  // once it passed max_line (else 0; its bytes are not kept).
  const std::string& partial() const { return partial_; }
  uint64_t partial_long_bytes() const { return long_bytes_; }

 private:
  std::string path_;
  size_t max_line_;
  off_t offset_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  bool seen_ = false;
  std::string partial_;      // an incomplete last line (at most max_line_ bytes)
  uint64_t long_bytes_ = 0;  // > 0: the incomplete line passed max_line_ (its bytes are dropped)
  int64_t skipped_ = 0, restarts_ = 0;
};

}  // namespace deloco::rec
