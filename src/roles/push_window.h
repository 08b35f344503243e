// roles/push_window.h — a learner's pushes on one link to a syncer (docs/runtime.md, "Flow control"): the window
// that keeps a full link from queueing stale pushes behind each other, and which pushes are still unsettled (may yet
// be answered by a merge or refused).
//
// Since the latest welcome, the fragments pushed on the link in order; the syncer's heartbeat says how many of them
// it read (proto::SyncerBeat::pushes), and those leave the window. While kSize pushes are unacknowledged the next one
// waits in the learner's outbox (where a newer push of its fragment replaces it). A syncer that never acknowledges
// (an older one, or one not yet heard since a failover) gets no window. A welcome after a rejoin settles every push
// the syncer says it never read (Welcome::pushes; all unsettled ones when it cannot say) as refused: their progress
// stays in θ and goes in the next push, and waiting for an answer no syncer holds would block the learner for good.
// No I/O, no clock; not thread-safe (the learner guards it with its mutex).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <vector>

namespace deloco {

class PushWindow {
 public:
  static constexpr int64_t kSize = 2;

  // Whether the next push must wait: the syncer acknowledges pushes and kSize are unacknowledged.
  bool full() const { return acks_ && unacknowledged() >= kSize; }
  int64_t unacknowledged() const { return base_ + static_cast<int64_t>(sent_.size()) - acked_; }

  // A push of fragment p, based on version `base` of Θ_p, went out on the link.
  void sent(int64_t p, int64_t base = 0) {
    unsettled_[p] = base;
    sent_.push_back(p);
  }
  // The syncer's heartbeat: it read `read` of our pushes on this connection since our hello.
  void acknowledged(int64_t read) {
    acks_ = true;
    acked_ = read;
    while (!sent_.empty() && base_ < acked_) {
      sent_.pop_front();
      ++base_;
    }
  }
  // The syncer refused our push of p (or it was a final state, which gets no answer): settled.
  void settle(int64_t p) { unsettled_.erase(p); }
  // A broadcast of p arrived with the syncer's mark `covers` (sync/answer_marks.h: it holds this learner's pushes
  // based on versions below it; −1: unmarked, it answers any push). Settles our push of p only when it answers it:
  // a merge that overtook our push (another learner's) does not, and after a failover the new leader's welcome must
  // still count that push as refused, or the learner waits for good for an answer no syncer holds.
  void answered(int64_t p, int64_t covers) {
    const auto it = unsettled_.find(p);
    if (it != unsettled_.end() && (covers < 0 || it->second < covers)) unsettled_.erase(it);
  }
  // Another syncer leads the link now (a failover): it has not acknowledged anything yet.
  void new_leader() { acks_ = false; }

  // A welcome (the link joined, or joined again). `was_joined`: the link counted as joined before it (a repeated
  // welcome settles nothing). `read`: how many of our pushes since our previous hello the syncer read (−1: it cannot
  // say). Returns the fragments whose pushes now count as refused (in fragment order), and starts the window afresh.
  std::vector<int64_t> welcomed(bool was_joined, int64_t read) {
    std::vector<int64_t> settled;
    if (!was_joined && !unsettled_.empty()) {
      std::set<int64_t> lost;
      const std::set<int64_t> open = unsettled();
      const int64_t total = base_ + static_cast<int64_t>(sent_.size());
      if (read >= 0 && read <= total) {
        for (int64_t i = std::max(read, base_); i < total; ++i) lost.insert(sent_[static_cast<size_t>(i - base_)]);
      } else {
        lost = open;
      }
      for (int64_t p : open)
        if (lost.count(p)) settled.push_back(p);
      for (int64_t p : settled) unsettled_.erase(p);
    }
    sent_.clear();
    base_ = 0;
    acked_ = 0;
    return settled;
  }

  std::set<int64_t> unsettled() const {
    std::set<int64_t> out;
    for (const auto& [p, base] : unsettled_) out.insert(p);
    return out;
  }

 private:
  std::deque<int64_t> sent_;  // the pushes since the welcome from the base_-th on (the earlier ones were read)
  int64_t base_ = 0, acked_ = 0;
  bool acks_ = false;
  std::map<int64_t, int64_t> unsettled_;  // fragments pushed while joined and not yet answered or refused -> the
                                          // base version of the latest such push
};

}  // namespace deloco
