// roles/group_commit.h — the syncer's group commit (syncer.checkpoint_every > 0; docs/reliability.md, "Group
// commit"): a merge is durable before anyone sees it, and one checkpoint covers every merge made while pushes kept
// arriving. From the merge that makes a checkpoint due, the node gathers: it goes on handling pushes, heartbeats and
// the standby's acknowledgements (SyncerNode::Impl::may_gather), each merge's broadcast staged here (the newest per
// fragment) with its record, the journal to the standby held. It commits (writes one checkpoint, then release())
// when its inbox is empty, a message of another kind arrives, or it has gathered as long as its latest checkpoint
// took (gathered_enough). A checkpoint per merge fell behind without bound once a checkpoint took longer than the
// pushes took to arrive (a slow disk: learners saw merges 15 s after they were made, and later every minute).
//
// `Broadcast` is what a learner is sent of a merged fragment, `Record` its merge record; this class holds them and
// keeps the accounts, the node does the I/O. No clock (times are passed in), no I/O; not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace deloco {

template <class Broadcast, class Record>
class GroupCommit {
 public:
  // A merge was made at time t; `checkpoint_due`: the node's checkpoint rule asks for one after it. Returns whether
  // its broadcast and record must be staged (a commit is due: this merge's or an earlier one's).
  bool merged(double t, bool checkpoint_due) {
    if (due_) {
      ++gathered_;
      return true;
    }
    if (!checkpoint_due) return false;
    due_ = true;
    since_ = t;
    return true;
  }
  bool due() const { return due_; }
  // Whether the gathering has lasted as long as the latest checkpoint took (then the node commits even while more
  // pushes wait: a flood of pushes cannot put the commit off).
  bool gathered_enough(double t) const { return due_ && t - since_ >= last_seconds_; }

  // Fragment p's newest merge, in place of an older one staged (learners lack that one's base: the newer goes whole).
  void stage(int64_t p, Broadcast b) { staged_[p] = std::move(b); }
  void stage_record(Record r) { records_.push_back(std::move(r)); }

  // A checkpoint was written (any checkpoint: every merge so far is durable); it took `seconds`. Hands each staged
  // broadcast to send(p, Broadcast&&) in fragment order, then each record to record(Record&&) in merge order.
  template <class Send, class Emit> void committed(double seconds, Send&& send, Emit&& record) {
    last_seconds_ = seconds;
    due_ = false;
    since_ = -1;
    std::map<int64_t, Broadcast> staged;
    staged.swap(staged_);
    std::vector<Record> records;
    records.swap(records_);
    for (auto& [p, b] : staged) send(p, std::move(b));
    for (Record& r : records) record(std::move(r));
  }
  // Stepping down: the staged merges are on no disk and nobody saw them; the newer leader's learners join it afresh.
  void abandon() {
    staged_.clear();
    records_.clear();
    due_ = false;
    since_ = -1;
  }

  int64_t gathered() const { return gathered_; }  // merges made while a commit was due (group_commit_merges)
  size_t staged() const { return staged_.size(); }
  double last_seconds() const { return last_seconds_; }

 private:
  bool due_ = false;
  double since_ = -1;         // when the first merge the next commit covers was made
  double last_seconds_ = 0;   // how long the latest checkpoint took
  int64_t gathered_ = 0;
  std::map<int64_t, Broadcast> staged_;  // local fragment → its newest merge not yet committed
  std::vector<Record> records_;          // their merge records, written once they are durable
};

}  // namespace deloco
