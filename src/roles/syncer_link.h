// roles/syncer_link.h — the clocks of a learner's link to one syncer (docs/runtime.md, "Protocol" and "Faults"):
// when to say hello, when a heartbeat or a goodbye is due, when the syncer counts as gone, and what a failover to
// the standby starts afresh. The learner's comms thread asks it and does the sending (learner_link.cpp).
//
// The rules:
//  * a hello goes every net.heartbeat while the link is not joined, the interval doubling with each hello the
//    transport took and no welcome answered, up to max(net.heartbeat, net.dead_after), so a cut link does not queue
//    one hello per heartbeat behind it; a welcome resets the doubling;
//  * the other syncer of a standby pair hears the same hello every max(1 s, 2 net.heartbeat);
//  * a joined link sends a heartbeat every net.heartbeat, and a goodbye (repeated until answered) at most as often;
//  * the syncer counts as gone after net.dead_after + its patience of silence (the allowance it gives for silences
//    its own traffic causes, SyncerBeat::patience, capped here at 20 net.dead_after whatever a peer says), or after
//    max(net.join_timeout, net.dead_after) while a download is in progress (its chunks may each take seconds);
//  * a download that has made no progress (no welcome, no new chunk) for max(net.join_timeout, net.dead_after) has
//    stalled: a chunk was lost on the way, and the syncer's heartbeats keep the link alive, so silence never ends
//    it; the learner drops it and says hello again for a new one (the syncer sends a second copy once its first
//    is net.join_timeout old, which it then is);
//  * a failover (the standby leads now) starts the hello pacing, the silence and the patience afresh, and the old
//    leader hears a hello again a second later (it may come back as the standby);
//  * refusals of our CURVE key are recorded at the 1st, 2nd, 4th, 8th, ... (libzmq retries with its own backoff).
// Times are the caller's (seconds, one monotonic clock). No I/O; not thread-safe (the comms thread owns it).
#pragma once

#include <algorithm>
#include <cstdint>

namespace deloco {

class SyncerLink {
 public:
  struct Timing {
    double heartbeat = 1.0, dead_after = 10.0, join_timeout = 60.0;  // net.heartbeat, net.dead_after, net.join_timeout
  };

  SyncerLink() = default;
  explicit SyncerLink(Timing t) : timing_(t) {}

  void start(double t) { started_ = t; }
  double started() const { return started_; }

  // ---- hellos ----
  double hello_interval() const {
    const double cap = std::max(timing_.heartbeat, timing_.dead_after);
    return std::min(cap, timing_.heartbeat * static_cast<double>(int64_t{1} << std::min<int64_t>(unanswered_, 6)));
  }
  bool hello_due(double t) const { return t - last_hello_ >= hello_interval(); }
  // A hello was handed to the transport at t (`taken`: it accepted it).
  void hello_sent(double t, bool taken) {
    if (taken) ++unanswered_;
    last_hello_ = hello_sent_at_ = t;
  }
  double hello_sent_at() const { return hello_sent_at_; }
  void hello_now() { last_hello_ = -1e9; }  // the next tend says hello (asking for the state, say)
  void welcomed() { unanswered_ = 0; }
  int64_t hellos_unanswered() const { return unanswered_; }
  bool standby_hello_due(double t) const { return t - standby_hello_ >= std::max(1.0, 2 * timing_.heartbeat); }
  void standby_hello_sent(double t) { standby_hello_ = t; }

  // ---- liveness ----
  void heard(double t) { last_heard_ = t; }
  void set_patience(double syncer_patience) { patience_ = std::min(syncer_patience, 20 * timing_.dead_after); }
  double silent_for(double t) const { return t - last_heard_; }
  // Whether a joined link's syncer counts as gone at t.
  bool lost(double t, bool downloading) const {
    const double allowed =
        downloading ? std::max(timing_.join_timeout, timing_.dead_after) : timing_.dead_after + patience_;
    return silent_for(t) > allowed;
  }

  // ---- a download's progress ----
  void download_progress(double t) { dl_progress_ = t; }  // its welcome, or a chunk it did not hold
  bool download_stalled(double t) const {
    return t - dl_progress_ > std::max(timing_.join_timeout, timing_.dead_after);
  }
  double download_idle(double t) const { return t - dl_progress_; }

  // ---- heartbeats and the goodbye ----
  bool beat_due(double t) const { return t - last_beat_ >= timing_.heartbeat; }
  void beat_sent(double t) { last_beat_ = t; }
  bool leave_due(double t) const { return t - last_leave_ >= timing_.heartbeat; }
  void leave_sent(double t) { last_leave_ = last_beat_ = t; }  // the goodbye goes with its heartbeat
  void leave_again() { last_leave_ = -1e9; }                    // the syncer was lost: say it again once back

  // ---- failover: the other syncer of the pair leads now ----
  void failed_over(double t) {
    last_hello_ = -1e9;
    last_heard_ = t;
    unanswered_ = 0;
    patience_ = 0;
    last_leave_ = -1e9;
    standby_hello_ = t;
  }

  // The transport's count of CURVE refusals so far; true when this one is to be recorded (1st, 2nd, 4th, ...).
  bool auth_refused(uint64_t total) {
    if (total <= auth_refusals_) return false;
    auth_refusals_ = total;
    if (auth_logged_at_ != 0 && total < 2 * auth_logged_at_) return false;
    auth_logged_at_ = total;
    return true;
  }
  uint64_t auth_refusals() const { return auth_refusals_; }

 private:
  Timing timing_;
  double started_ = 0;
  double last_hello_ = -1e9, hello_sent_at_ = 0, standby_hello_ = -1e9;
  int64_t unanswered_ = 0;
  double last_heard_ = -1e9, patience_ = 0;
  double last_beat_ = -1e9, last_leave_ = -1e9;
  double dl_progress_ = 0;
  uint64_t auth_refusals_ = 0, auth_logged_at_ = 0;
};

}  // namespace deloco
