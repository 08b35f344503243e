// Transport bounds sized to the model (deloco/runtime.h: legit_frame_bytes, node_transport_options).
#include <algorithm>
#include <limits>

#include "deloco/config.h"
#include "deloco/runtime.h"
#include "deloco/wire.h"
#include "protocol.h"

namespace deloco {
namespace {

constexpr uint64_t kSlackBytes = 4096;

// The bytes of n elements in the costliest float encoding (fp32 for large n; int8's block scales make it larger
// for a handful of elements).
uint64_t costliest_float_bytes(int64_t n) {
  uint64_t most = 0;
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4, Encoding::kInt2})
    most = std::max<uint64_t>(most, encoded_bytes(e, static_cast<uint64_t>(n)));
  // A top-k payload that keeps every element in one gap each (density 1): 4 + int8's bytes + one byte per index
  // (the first index up to 5). Honest pushes at lower densities are smaller.
  most = std::max<uint64_t>(most, 4 + encoded_bytes(Encoding::kInt8, static_cast<uint64_t>(n)) +
                                      static_cast<uint64_t>(n) + 4);
  return most;
}

}  // namespace

uint64_t legit_frame_bytes(NodeRole role, int64_t fragment_elements, int64_t model_elements) {
  if (fragment_elements < 0 || model_elements < fragment_elements)
    throw ConfigError("legit_frame_bytes: fragment of " + std::to_string(fragment_elements) +
                      " elements in a model of " + std::to_string(model_elements));
  try {
    const uint64_t floats = costliest_float_bytes(role == NodeRole::kSyncer ? fragment_elements : model_elements);
    const uint64_t largest =
        std::max<uint64_t>(floats, role == NodeRole::kSyncer ? proto::kMaxControlBytes : proto::kMaxWelcomeBytes);
    if (largest > std::numeric_limits<uint64_t>::max() - kSlackBytes) throw WireError("overflow");
    return largest + kSlackBytes;
  } catch (const WireError&) {
    throw ConfigError("a model of " + std::to_string(model_elements) + " elements is too large for the wire format");
  }
}

int syncer_receive_limit(int64_t fragments) { return static_cast<int>(4 * std::max<int64_t>(fragments, 1) + 16); }

TransportOptions node_transport_options(const RuntimeConfig& cfg_in, Workload& model, NodeRole role) {
  RuntimeConfig cfg = cfg_in;
  cfg.resolve();
  const ModelPlan plan = plan_model(model.parameters(), cfg.sync.fragments, cfg.sync.sync_every);
  int64_t largest = 0;
  for (const auto& l : plan.fragment_layouts) largest = std::max(largest, l.elements);
  TransportOptions t = cfg.net.transport();
  if (cfg.net.max_frame_bytes <= 0) t.max_frame_bytes = legit_frame_bytes(role, largest, plan.model.elements);
  if (role == NodeRole::kSyncer) {
    t.receive_limit = syncer_receive_limit(static_cast<int64_t>(plan.fragments.size()));
    t.linger = std::chrono::milliseconds(1000);  // the answers to the last goodbyes leave before the syncer exits
  }
  return t;
}

}  // namespace deloco

namespace deloco {

LearnerLinks dial_learner_links(const RuntimeConfig& cfg, const TransportOptions& options) {
  LearnerLinks links;
  for (const auto& e : shard_endpoints(cfg.net.address, cfg.syncer.shards))
    links.syncers.push_back(make_zmq_client(e, options));
  if (!cfg.net.standby.empty())
    for (const auto& e : shard_endpoints(cfg.net.standby, cfg.syncer.shards))
      links.standbys.push_back(make_zmq_client(e, options));
  links.donor_options = options;
  links.donor_options.lanes = 1;
  links.donor_options.server_public_key_file.clear();
  if (cfg.net.serve == "auto")
    throw ConfigError("net.serve=auto is for `deloco run` (it picks an endpoint per learner); a learner started by "
                      "hand serves at an endpoint named in net.serve, e.g. tcp://HOST:PORT");
  if (!cfg.net.serve.empty()) {
    TransportOptions so = options;
    so.lanes = 1;
    if (!options.plaintext) {
      if (cfg.net.allow.empty())
        throw ConfigError("net.serve under CURVE needs net.allow on this learner: the learners' keys that may fetch "
                          "state chunks from it (the syncer's allow-list folder will do)");
      so.allow = cfg.net.allow;
      links.serve_key = read_public_key_file(options.secret_key_file);
    }
    links.serve = make_zmq_server(cfg.net.serve, so);
  }
  return links;
}

TransportOptions standby_transport_options(const RuntimeConfig& cfg, Workload& model) {
  TransportOptions t = node_transport_options(cfg, model, NodeRole::kLearner);
  int64_t elements = 0;
  for (const auto& [n, p] : model.parameters()) elements += p.numel();
  const uint64_t image = static_cast<uint64_t>(elements) * 4 * 4 + (uint64_t{1} << 20);
  if (cfg.net.max_frame_bytes <= 0) t.max_frame_bytes = std::max<uint64_t>(t.max_frame_bytes, image);
  return t;
}

}  // namespace deloco
