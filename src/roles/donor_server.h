// src/roles/donor_server.h — a learner's peer serving (net.serve; rejoin from peers, docs/reliability.md): the
// learner's copy of the syncer's state, per shard, and the server that answers joining learners' state requests
// from it. Owned by the learner node (learner_node.cpp), used on its comms thread only.
//
// Contract
//  * The copy. set_served() installs a shard's verified state (a download, or the initial state the syncer said it
//    holds) with its per-local-fragment versions; broadcast() writes a newer fp32 version of one fragment into it;
//    drop() forgets it (lossy broadcasts: the copy is no longer the syncer's state). The version before each
//    fragment's latest broadcast is kept, so a joiner whose welcome predates a merge still finds its versions here.
//    While a fetch reads the copy it stays at the versions asked for (kServeFreeze after its latest request, at most
//    kServeFreezeMax from that fetch's first request here): newer broadcasts wait and go in when it thaws. Replies
//    point into the copy without copying it; a broadcast while replies hold it writes a new copy (at most
//    kMaxPinned old ones kept alive, past that the broadcast waits too).
//  * Admission (tend): only learners a syncer introduced — a request carrying the ticket (proto::fetch_ticket) of
//    this server's secret for its own learner, shard, round and chunk size, from a connection whose CURVE key is
//    that learner's. Each requester has at most proto::kFetchWindow chunks queued or on their way; more are refused
//    busy. Strangers, bad tickets and malformed requests get no answer (a joiner treats silence as a slow donor).
//  * Answering (ChunkServer, chunk_server.h): at most 64 requests queued; a request for versions newer than held
//    waits up to kServeWait for their broadcast (64 at most), then is refused not_held; one for versions neither held
//    nor kept is refused not_held; the rest are served at net.serve_rate. Replies carry this learner's id; a reject
//    names the chunk. learner.serve_corrupt flips one bit of every chunk (the fault drill).
//  * Counting: every refusal by reason (stranger, bad_ticket, busy, not_held, malformed), recorded (serve_refused)
//    at the 1st, 2nd, 4th, 8th, ... of each reason; chunks and bytes served. report() writes them into learner_done.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "chunk_server.h"
#include "deloco/sync.h"
#include "deloco/transport.h"
#include "protocol.h"
#include "records/kinds.h"
#include "util/hash.h"

namespace deloco {

class DonorServer {
 public:
  static constexpr double kServeFreeze = 5.0;      // seconds a donor's copy stays at the versions a fetch asked for
  static constexpr double kServeFreezeMax = 15.0;  // ... at most, counted from that fetch's first request here
  static constexpr double kServeWait = 5.0;        // seconds a request for newer versions waits for their broadcast
  static constexpr size_t kMaxPinned = 2;          // old copies replies may keep alive at once

  // What the server needs of its learner, no more.
  struct Context {
    int64_t id = 0;  // this learner: its replies carry it
    uint64_t fingerprint = 0;
    WireLimits limits;
    double serve_rate = 0;       // net.serve_rate (Mbit/s)
    bool serve_corrupt = false;  // learner.serve_corrupt
    std::string endpoint, key;   // net.serve and the server's public key (the hello's serve, serve_key)
    std::vector<ShardPlan> shards;  // one per syncer shard, in shard order (the learner's links)
    std::function<double()> now;    // the learner's steady clock (seconds)
    std::function<void(rec::ServeRefused)> record;  // emits a record (its time and learner filled in)
  };
  DonorServer(Context ctx, std::unique_ptr<ServerTransport> server);
  ~DonorServer();

  // The hello's offer to serve.
  const std::string& endpoint() const { return ctx_.endpoint; }
  const std::string& key() const { return ctx_.key; }
  const Digest& secret() const { return secret_; }

  // The copy of shard `shard`'s part.
  void set_served(int64_t shard, const at::Tensor& flat, const std::vector<int64_t>& versions);
  void broadcast(int64_t shard, int64_t fragment, int64_t version, const at::Tensor& flat);  // global fragment id
  void drop(int64_t shard);

  // Takes new requests and answers what it can; call often (the comms loop).
  void tend();
  bool busy() const { return chunks_.queued() > 0; }  // requests wait for the rate bound: call again soon
  void report(rec::LearnerDone& d) const;

 private:
  struct Copy;
  struct Holding;
  struct Requester {
    int64_t queued = 0;
    std::shared_ptr<std::atomic<int64_t>> in_flight = std::make_shared<std::atomic<int64_t>>(0);
    double last = 0;
  };
  // Why a state request was refused (serve_refused records, learner_done's serve_refused): stranger (no ticket, or a
  // key that is not the ticket's learner's), bad_ticket (not one the syncer gave for this server and these fields),
  // busy (the requester has kFetchWindow chunks queued or on their way), not_held (other versions held), malformed
  // (not a state request for this model).
  enum Refusal { kStranger, kBadTicket, kBusy, kNotHeldHere, kMalformed, kRefusals };
  static constexpr const char* kRefusalNames[kRefusals] = {"stranger", "bad_ticket", "busy", "not_held", "malformed"};

  Copy* copy_of(int64_t shard);
  bool writable(Copy& C);
  void refused(Refusal why, const std::string& detail);
  void admit();
  Holding holding(const ChunkServer::Request& q);
  Bytes chunk_bytes(const std::shared_ptr<std::atomic<int64_t>>& count, const Holding& held);

  Context ctx_;
  std::unique_ptr<ServerTransport> tx_;
  Digest secret_;  // checks fetch tickets: random per process, told to the syncers in the hello
  ChunkServer chunks_;
  std::vector<Copy> copies_;
  std::vector<at::Tensor> pinned_;
  // Per requesting learner (its ticket's id, bound to its key under CURVE): requests queued here and replies the
  // transport still holds (each reply's payload owns a count that its release, once sent or dropped, takes back).
  std::map<int64_t, Requester> requesters_;
  double requesters_swept_ = 0;
  // The first request of each fetch (learner, welcome round) here: a fetch keeps the copy frozen kServeFreezeMax at
  // most, so a trickle of requests cannot keep it at old versions (and honest joiners refused) for good.
  std::map<std::pair<int64_t, uint64_t>, double> fetch_first_;
  std::atomic<int64_t> served_chunks_{0}, served_bytes_{0};
  std::array<std::atomic<int64_t>, kRefusals> refused_by_{};
};

}  // namespace deloco
