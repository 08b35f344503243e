// The hello's checks before anything in it is trusted (hello_admission.h has the contract).
#include "hello_admission.h"

namespace deloco {

namespace {

HelloVerdict refused_hello(int64_t learner, proto::RejectReason r, std::string detail) {
  HelloVerdict v;
  v.kind = HelloVerdict::kRefuse;
  v.learner = learner;
  v.reason = r;
  v.detail = std::move(detail);
  return v;
}

}  // namespace

HelloVerdict check_hello(const HelloFacts& f) {
  using proto::RejectReason;
  const int64_t m = f.body_learner;
  if (f.header_learner != m)
    return refused_hello(f.header_learner, RejectReason::kLearnerIdMismatch, "hello header says learner " + std::to_string(f.header_learner) +
                                                        " but its body says learner " + std::to_string(m));
  if (m < 0 || m >= f.learners)
    return refused_hello(m, RejectReason::kUnknownLearner,
                  "learner id " + std::to_string(m) + " is not in [0, " + std::to_string(f.learners) + ")");
  // CURVE: the key's allow-list name says which learner it is; a name that is not learner-N speaks for nobody.
  if (!f.identity.empty()) {
    const std::optional<int64_t> bound = proto::learner_of_key_name(f.identity);
    if (!bound)
      return refused_hello(m, RejectReason::kUnboundKey,
                    "key '" + f.identity + "' is in the allow-list but its name is not learner-N, so it may not "
                    "join as any learner (name its .pub file learner-" + std::to_string(m) + ".pub to bind it to learner " +
                        std::to_string(m) + ")");
    if (*bound != m)
      return refused_hello(m, RejectReason::kKeyIdMismatch, "key '" + f.identity + "' may only join as learner " +
                                                      std::to_string(*bound) + ", not as learner " + std::to_string(m));
  }
  // A learner that has joined a leader of a newer epoch: this syncer may have been replaced (cut off, or a restarted
  // old leader). The node refuses it with not_leader and records it; it does not step down on a learner's word.
  if (f.paired && f.hello_epoch > f.epoch) {
    HelloVerdict v;
    v.kind = HelloVerdict::kNewerEpoch;
    return v;
  }
  if (f.connection_learner && *f.connection_learner != m)
    return refused_hello(m, RejectReason::kLearnerIdMismatch, "this connection joined as learner " +
                                                        std::to_string(*f.connection_learner) +
                                                        "; a connection's learner id never changes");
  return {};
}

}  // namespace deloco
