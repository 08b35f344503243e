// roles/hello_admission.h — the checks a learner's hello passes before the syncer trusts anything in it
// (docs/runtime.md, "Protocol"; SyncerNode::Impl::on_hello applies them first, then judges the learner's old
// connection and prepares the welcome): the header and the body name one learner, the id is in range, a CURVE key
// joins only as the learner its allow-list name "learner-N" binds it to, a learner that joined a newer leader is
// refused (its word is a hint: only the other syncer's makes a leader step down), and a connection's learner id never
// changes. The first check that fails decides. Pure: no I/O, no clock, no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "protocol.h"

namespace deloco {

struct HelloFacts {
  int64_t header_learner = 0;   // MessageHeader::learner_id
  int64_t body_learner = 0;     // proto::Hello::learner
  int64_t learners = 0;         // M
  std::string identity;         // the connection's CURVE allow-list name ("" : plaintext, anyone may claim any id)
  bool paired = false;          // this syncer is one of a standby pair (net.standby)
  int64_t hello_epoch = 0;      // the newest leader epoch the learner has joined (proto::Hello::epoch)
  int64_t epoch = 0;            // this syncer's
  std::optional<int64_t> connection_learner;  // the id this connection joined as before (none: a new connection)
};

struct HelloVerdict {
  enum Kind { kAdmit, kRefuse, kNewerEpoch } kind = kAdmit;
  proto::RejectReason reason = proto::RejectReason::kOther;  // kRefuse
  int64_t learner = 0;  // kRefuse: the learner the refusal names (the header's id when header and body disagree)
  std::string detail;                                        // kRefuse: the reject's text, naming the problem
};

HelloVerdict check_hello(const HelloFacts& f);

}  // namespace deloco
