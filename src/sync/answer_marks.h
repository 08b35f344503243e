// sync/answer_marks.h — which push of a learner a broadcast of Θ_p answers: the mark the syncer puts on each
// broadcast it sends a learner (MessageHeader::c_tokens, proto::Welcome::marks_answers) and the simulator on each
// answer, read by LearnerCore::receive as `covers` (deloco/learner.h: the wait rule). Kept once here so the syncer
// node and the simulator mark alike.
//
// Per (learner, fragment): the base version of the latest push accepted, and 1 + that of the latest one merged
// (0: none merged). A version merged after merged() answers every push whose base is below its mark. The driver
// says when a push counts as accepted (after the core accepted it, from the learner process it came from) and
// forgets a learner when another process takes its place. No I/O, no clock; not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace deloco {

class AnswerMarks {
 public:
  // Learner m's push of fragment p, based on version `base`, was accepted.
  void accepted(int64_t m, int64_t p, int64_t base) { pushed_base_[{m, p}] = base; }
  // A merge of fragment p included the listed learners' latest accepted pushes.
  void merged(int64_t p, const std::vector<int64_t>& learners) {
    for (int64_t m : learners)
      if (auto b = pushed_base_.find({m, p}); b != pushed_base_.end()) merged_mark_[{m, p}] = b->second + 1;
  }
  // The mark of learner m's broadcast of fragment p as merged so far (0: none of its pushes merged).
  int64_t mark(int64_t m, int64_t p) const {
    const auto it = merged_mark_.find({m, p});
    return it == merged_mark_.end() ? 0 : it->second;
  }
  // Another process (or a restart) takes learner m's place: its pushes start afresh.
  void forget(int64_t m) {
    for (auto* map : {&pushed_base_, &merged_mark_})
      for (auto it = map->lower_bound({m, INT64_MIN}); it != map->end() && it->first.first == m;) it = map->erase(it);
  }

 private:
  std::map<std::pair<int64_t, int64_t>, int64_t> pushed_base_, merged_mark_;
};

}  // namespace deloco
