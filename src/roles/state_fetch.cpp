// Which chunk of a state download to ask of whom (state_fetch.h has the rules and the contract).
#include "state_fetch.h"

#include <algorithm>

namespace deloco {

StateFetch::StateFetch(int64_t chunks, double started, int64_t window) : window_(window), started_(started) {
  src_.emplace_back();  // the syncer
  for (int64_t k = 0; k < chunks; ++k) todo_.push_back(k);
}

size_t StateFetch::add_donor(int64_t learner) {
  Source s;
  s.donor = learner;
  src_.push_back(std::move(s));
  return src_.size() - 1;
}

void StateFetch::expire(double t) {
  for (size_t i = 1; i < src_.size(); ++i) {
    Source& s = src_[i];
    for (auto it = s.asked.begin(); it != s.asked.end();) {
      if (t - it->second < kTimeout) {
        ++it;
        continue;
      }
      syncer_todo_.push_back(it->first);
      it = s.asked.erase(it);
      if (++s.timeouts >= 2) s.banned = true;
    }
    if (s.banned) {
      for (const auto& [k, at] : s.asked) syncer_todo_.push_back(k);
      s.asked.clear();
    }
  }
}

bool StateFetch::asked(size_t i, int64_t k, double t, bool sent) {
  Source& s = src_[i];
  if (!sent) {  // not connected yet, or a full queue: the caller keeps the chunk, this source waits a moment
    s.retry_at = t + 0.02;
    if (s.unready_since < 0) s.unready_since = t;
    if (i > 0 && t - s.unready_since > kTimeout) s.banned = true;
    return false;
  }
  s.unready_since = -1;
  s.asked[k] = t;
  return true;
}

bool StateFetch::outstanding(size_t i, int64_t k) const { return src_[i].asked.count(k) > 0; }

void StateFetch::answered(size_t i, int64_t k, double t, bool count) {
  Source& s = src_[i];
  const auto it = s.asked.find(k);
  const double asked_at = it == s.asked.end() ? -1 : it->second;
  if (count) {
    ++s.got;
    if (s.first_at < 0) s.first_at = t;
    if (asked_at >= 0) {
      latency_sum_ += t - asked_at;
      ++latency_n_;
    }
  }
  for (auto& o : src_) o.asked.erase(k);  // asked of two sources (the endgame): the other's answer is dropped
}

void StateFetch::refused(size_t i, int64_t k, bool busy) {
  Source& s = src_[i];
  s.asked.erase(k);
  syncer_todo_.push_back(k);
  ++s.refused;
  if (!busy && s.refused >= 3) s.banned = true;
}

bool StateFetch::lied(size_t i, int64_t k) {
  Source& s = src_[i];
  if (k >= 0) {
    s.asked.erase(k);
    syncer_todo_.push_back(k);
  }
  for (const auto& [q, at] : s.asked) syncer_todo_.push_back(q);
  s.asked.clear();
  const bool fresh = !s.banned;
  if (fresh) ++lied_;
  s.banned = true;
  return fresh;
}

}  // namespace deloco
