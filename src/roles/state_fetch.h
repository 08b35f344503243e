// roles/state_fetch.h — which chunk of a joining learner's state download to ask of whom (rejoin from peers;
// docs/reliability.md, "Rejoin from peers"): the syncer (source 0) and the donors its welcome named (sources 1..),
// each asked at most `window` chunks at a time, every chunk checked by the learner against the syncer's hash of it.
//
// The rules: the syncer takes the chunks no donor could serve first, then works from the end of the download while
// the donors work from its front; a donor that leaves a chunk unanswered for kTimeout seconds loses it to the syncer,
// and after two such timeouts, three refusals other than "busy", one lie (a chunk that does not match its hash) or
// kTimeout seconds of not taking requests, it is asked nothing more (banned) and what it held goes to the syncer.
// The endgame: once every chunk is asked of someone, a source with room is asked too for a chunk another has had
// longest, once that chunk has waited twice the mean answer time so far (a chunk of at most two donors; the syncer,
// which holds every version asked for, may be the third); the first answer counts. The learner does the I/O
// (learner_fetch.cpp): it sends what schedule() asks and reports what came. No I/O, no clock; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

namespace deloco {

class StateFetch {
 public:
  static constexpr double kTimeout = 10.0;  // seconds a donor may take for a chunk before the syncer is asked

  struct Source {
    int64_t donor = -1;                   // learner id (-1: the syncer)
    std::map<int64_t, double> asked;      // chunk -> when it was asked
    bool banned = false;
    int64_t got = 0, refused = 0, timeouts = 0;
    double retry_at = -1, unready_since = -1;  // a source that could not take a request: asked again a little later
    double first_at = -1;                      // when its first chunk came
  };

  // A download of `chunks` chunks, started (the welcome) at `started`; at most `window` chunks asked of a source.
  StateFetch(int64_t chunks, double started, int64_t window);
  // Adds a donor (learner id); returns its source index.
  size_t add_donor(int64_t learner);

  // Asks what can be asked at time t: each source's window refilled by the rules above, chunks already held
  // (`have`) skipped. ask(source, chunk) sends the request and returns false when the source cannot take it now.
  template <class Ask> void schedule(double t, const std::vector<bool>& have, Ask&& ask) {
    expire(t);
    refill(t, have, [&](size_t i, int64_t k) { return asked(i, k, t, ask(i, k)); });
  }

  // Whether chunk k is outstanding at source i (an answer to a request abandoned since is dropped).
  bool outstanding(size_t i, int64_t k) const;
  // Chunk k came from source i at t and matched its hash; `count`: it is new to the download (counted for the source
  // and the mean answer time). Every other source's request for k is abandoned.
  void answered(size_t i, int64_t k, double t, bool count);
  // Source i refused chunk k (`busy`: it serves this learner its window already): the syncer serves it.
  void refused(size_t i, int64_t k, bool busy);
  // Source i answered wrong (chunk k, or −1 for a malformed answer): banned, everything it held goes to the syncer.
  // Returns whether it was newly banned (a lie counted once per donor).
  bool lied(size_t i, int64_t k);
  void add_peer_bytes(int64_t n) { peer_bytes_ += n; }

  const std::vector<Source>& sources() const { return src_; }
  double started() const { return started_; }
  int64_t peer_bytes() const { return peer_bytes_; }
  int64_t liars() const { return lied_; }
  int64_t endgame_asks() const { return duplicates_; }

 private:
  void expire(double t);
  // Records a request's outcome; returns `sent`.
  bool asked(size_t i, int64_t k, double t, bool sent);
  template <class Ask> void refill(double t, const std::vector<bool>& have, Ask&& ask);
  template <class Ask> void endgame(double t, const std::vector<bool>& have, Ask&& ask);

  std::vector<Source> src_;
  std::deque<int64_t> todo_;         // chunks anyone may serve, not yet asked
  std::deque<int64_t> syncer_todo_;  // chunks a donor could not serve (or served wrong): the syncer's
  int64_t window_;
  int64_t peer_bytes_ = 0, lied_ = 0, duplicates_ = 0;
  double started_;
  double latency_sum_ = 0;  // seconds from ask to answer, over the chunks answered (the endgame's yardstick)
  int64_t latency_n_ = 0;
};

template <class Ask> void StateFetch::refill(double t, const std::vector<bool>& have, Ask&& ask) {
  const auto held = [&](int64_t k) { return have[static_cast<size_t>(k)]; };
  // The syncer: chunks no donor can serve first, then any, from the end; donors: any, from the front.
  Source& sy = src_[0];
  while (t >= sy.retry_at && static_cast<int64_t>(sy.asked.size()) < window_ &&
         (!syncer_todo_.empty() || !todo_.empty())) {
    int64_t k;
    if (!syncer_todo_.empty()) {
      k = syncer_todo_.front();
      syncer_todo_.pop_front();
    } else {  // from the end: the donors work from the front, so the two meet in the middle
      k = todo_.back();
      todo_.pop_back();
    }
    if (!held(k) && !ask(size_t{0}, k)) {
      syncer_todo_.push_front(k);  // the syncer's own queue keeps it
      break;
    }
  }
  for (size_t i = 1; i < src_.size(); ++i) {
    Source& s = src_[i];
    while (!s.banned && t >= s.retry_at && static_cast<int64_t>(s.asked.size()) < window_ && !todo_.empty()) {
      const int64_t k = todo_.front();
      todo_.pop_front();
      if (!held(k) && !ask(i, k)) {
        todo_.push_front(k);
        break;
      }
    }
  }
  if (todo_.empty() && syncer_todo_.empty()) endgame(t, have, ask);
}

template <class Ask> void StateFetch::endgame(double t, const std::vector<bool>& have, Ask&& ask) {
  if (latency_n_ == 0) return;
  const double overdue = t - 2 * latency_sum_ / static_cast<double>(latency_n_);
  std::map<int64_t, std::pair<int, double>> out;  // chunk -> sources asked, earliest ask
  for (const auto& s : src_)
    for (const auto& [k, at] : s.asked) {
      auto [it, fresh] = out.try_emplace(k, 0, at);
      ++it->second.first;
      it->second.second = std::min(it->second.second, at);
    }
  for (size_t i = 0; i < src_.size(); ++i) {
    Source& s = src_[i];
    while (!s.banned && t >= s.retry_at && static_cast<int64_t>(s.asked.size()) < window_) {
      int64_t pick = -1;
      double oldest = 0;
      for (const auto& [k, na] : out)
        if ((i == 0 || na.first == 1) && na.second < overdue && !s.asked.count(k) && !have[static_cast<size_t>(k)] &&
            (pick < 0 || na.second < oldest)) {
          pick = k;
          oldest = na.second;
        }
      if (pick < 0 || !ask(i, pick)) break;
      ++out[pick].first;
      ++duplicates_;
    }
  }
}

}  // namespace deloco
