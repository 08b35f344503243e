// src/run/net_chaos.h — network faults that `deloco run` schedules on a testbed (chaos.net, docs/testbed.md): a
// host's link cut and healed, a flapping link, a link whose rate drops and is restored. What is due when is decided
// here; the runner (cluster.cpp) carries the actions out with scripts/testbed.sh and writes their records.
//
// chaos.net is one string: faults separated by ';' or line breaks, each a kind and key=value words (times in
// seconds since the run started, an optional trailing "s" allowed):
//
//   partition host=H at=T for=D                        host H's link down at T, up again at T + D
//   flap      host=H at=T for=D period=P               down for P/2, up for P/2, from T for D; up at T + D
//   slow      host=H at=T for=D [factor=F | rate=R]    the link shaped to its rate / F (default F = 100) or to R
//                                                      (tc syntax: 200kbit, 1mbit, 50kbps) at T, its own rate at T + D
//
// `learner=N` may replace `host=H`: every host learner N's ranks run on (testbed_hosts_of below; one rank per learner:
// host 1 + N mod (hosts − 1)). A learner whose ranks are on several hosts gets the fault on each of them, at once.
//
// Contract
//  * parse_net_faults() checks the syntax and the values alone and throws ConfigError saying which fault (its number
//    and text) is wrong and how; place_net_faults() resolves learner= to hosts (one fault per host) and checks the faults against the
//    testbed (hosts in range, no two link faults — partition, flap — on one host at once, nor two slow faults).
//  * NetChaosSchedule is pure bookkeeping, like ChaosSchedule: deterministic, sends nothing, not thread-safe. Every
//    action of every fault is planned at construction, in time order; at one instant an action that heals (link up,
//    rate restored) comes before one that breaks, so a fault may start the moment another on its host ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace deloco::run {

enum class NetFaultKind { kPartition, kFlap, kSlow };
const char* net_fault_name(NetFaultKind k);  // "partition" | "flap" | "slow"

struct NetFault {
  NetFaultKind kind = NetFaultKind::kPartition;
  int64_t host = -1;      // the testbed host (-1 until placed, when given as learner=)
  int64_t learner = -1;   // learner=N as written (-1: host= was given)
  double at = 0;          // seconds since the run started
  double duration = 0;    // for=
  double period = 0;      // flap: one down-and-up cycle
  double factor = 0;      // slow: the host's rate / factor (0 when rate= is given)
  std::string rate;       // slow: the rate as given (tc syntax), "" when by factor
  std::string text;       // the fault as written (trimmed), for messages
  size_t number = 0;      // its place in chaos.net (0: the first), shared by the copies of a learner= fault
};

// Where `deloco run` places a learner's processes on a testbed of `hosts` ≥ 2 hosts (host 0 the syncer's): rank r of
// learner n (`ranks` processes per learner) takes slot n·ranks + r, on host 1 + slot mod (hosts − 1). A testbed of
// at least 1 + learners·ranks hosts gives every rank a host of its own; a smaller one wraps round (ranks and
// learners share hosts). One rank per learner: learner n on host 1 + n mod (hosts − 1).
int64_t testbed_host_of(int64_t learner, int64_t rank, int64_t ranks, int64_t hosts);
// The hosts of learner n's ranks, ascending, each once.
std::vector<int64_t> testbed_hosts_of(int64_t learner, int64_t ranks, int64_t hosts);

// The faults of chaos.net in the order written ("" or only separators: none). Throws ConfigError.
std::vector<NetFault> parse_net_faults(const std::string& text);
// Resolves learner= (M learners of `ranks` processes each) to hosts of a testbed of `hosts` hosts — a learner on
// several hosts: the fault copied, one per host (in host order, where it was written) — and checks the faults
// against the testbed (see above). Throws ConfigError naming chaos.net and the fault.
void place_net_faults(std::vector<NetFault>& faults, int64_t hosts, int64_t learners, int64_t ranks = 1);

// A tc rate ("20mbit", "2.5kbps") in bits per second; -1 when it is not one (or "none").
double rate_bits(const std::string& rate);
// Bits per second as a tc rate: "200kbit", "1mbit", "12345bit" (rounded to whole bits, at least 8).
std::string format_rate(double bits);

// One thing to do to the testbed.
struct NetAction {
  enum Op { kLinkDown, kLinkUp, kShape };
  size_t fault = 0;        // index into the faults
  int64_t host = 0;
  Op op = kLinkDown;
  std::string rate;        // kShape: the rate to shape the host's link to
  double at = 0;           // when it is due (seconds since the run started)
  std::string phase;       // "start" | "down" | "up" (a flapping link between its start and end) | "end"
  bool heals = false;      // link up or the host's own rate back
};

class NetChaosSchedule {
 public:
  // `faults` placed; rates[h] is host h's own rate (the testbed's rate<h>=, "none": unshaped). Throws ConfigError
  // for a slow fault by factor on an unshaped host (it has no rate to divide).
  NetChaosSchedule(std::vector<NetFault> faults, std::vector<std::string> rates);
  NetChaosSchedule() = default;  // no faults

  // The actions due by `now` not returned before, in plan order.
  std::vector<NetAction> due(double now);
  // The actions that undo every fault started and not ended (link up, the host's own rate), each with phase "end";
  // afterwards nothing more is due. What the runner does when the run ends during a fault.
  std::vector<NetAction> heal();

  const std::vector<NetFault>& faults() const { return faults_; }
  const std::vector<NetAction>& plan() const { return plan_; }
  bool started(size_t fault) const { return started_[fault]; }
  bool ended(size_t fault) const { return ended_[fault]; }

 private:
  std::vector<NetFault> faults_;
  std::vector<std::string> rates_;
  std::vector<NetAction> plan_;
  std::vector<bool> started_, ended_;
  size_t next_ = 0;
};

}  // namespace deloco::run
