// deloco/runtime.h — the distributed runtime: a syncer node and learner nodes on the wall clock, talking over a
// transport (deloco/transport.h) in the wire format (deloco/wire.h), driving the same algorithm core as the
// simulator (deloco/sync.h, deloco/learner.h). Used by `deloco syncer`, `deloco learner` and `deloco run`.
//
// Protocol (every message one wire frame; see docs/runtime.md for the sequence diagrams)
//   learner → syncer  hello        JSON {learner, instance, step, want_state[, state_hash][, epoch]}; the fingerprint is
//                                  in the header; state_hash: BLAKE2b-256 of the parameters the process started from;
//                                  epoch: the highest leader epoch it joined (a hint: refused not_leader by an older
//                                  leader, which steps down only on the other syncer's lease)
//   syncer → learner  welcome      JSON {round, versions[P], resume_step, chunks, chunk_elements, elements,
//                                  state_hash[, state_held]}   (state_hash: BLAKE2b-256 hex of the fp32 bytes;
//                                  state_held: the hello's state_hash matched, no chunks follow)
//   syncer → learner  state_chunk  fp32, fragment_id = chunk index, round = welcome.round   (only if want_state)
//   Rejoin from peers (docs/reliability.md): hello[, serve, serve_key, serve_secret] offers this learner's state to
//   joiners; welcome[, fetch, donors[{learner, endpoint, key, ticket}], chunk_hashes (BLAKE2b-256)] sends no chunks:
//   the learner asks for each one
//   learner → syncer or donor  state_request  fragment_id = chunk, round = welcome.round, JSON {shard, elements,
//                                  chunk_elements, versions[, learner, ticket]} (to a donor: its ticket from the
//                                  welcome, proto::fetch_ticket); answered by a state_chunk or a reject not_held/busy
//   learner → syncer  fragment_push    the outer gradient Δ_p = Θ_p^v − θ_p in net.encoding (with error feedback),
//                                      c_steps/c_tokens in the header, round = v, the version of Θ_p the learner
//                                      holds (last applied or downloaded); JSON-free. A heartbeat carrying the
//                                      push's step-time estimate goes right before it.
//   syncer → learner  fragment_broadcast Θ_p in net.broadcast_encoding, round = new version of fragment p,
//                                      c_steps = its sequence number for this learner (acknowledged in heartbeats)
//   either way        heartbeat    JSON {step, tokens, busy_seconds, step_time[, state_round][, broadcasts]} from
//                                  learners (state_round: the welcome round of the last state download it verified;
//                                  broadcasts: the highest broadcast sequence number received, sent at once on each);
//                                  JSON {pushes} from the syncer (pushes read on this connection since its hello)
// Flow control (docs/runtime.md): the syncer hands a learner's link broadcasts only within a send window of
// unacknowledged bytes (a newer merge of a fragment replaces one waiting); a learner hands its link a push only while
// fewer than two are unacknowledged (a newer push of a fragment replaces one waiting). The measured transfer times
// (push: heartbeat to arrival; broadcast: hand-off to acknowledgement) are ξ_sync's transfer terms.
//   learner → syncer  leave        JSON {reason: "done" | "stop"}; "done" retires the learner (its quorum share)
//   syncer → learner  leave        the answer (same reason). The learner repeats its leave every net.heartbeat until
//                                  answered and closes only then; the syncer answers every leave, repeats included
//   syncer → learner  reject       header round = the reason code (src/roles/protocol.h RejectReason), text
//                                  "name: detail" (fingerprint mismatch, duplicate id, not joined, key/id mismatch …);
//                                  fragment_id = the fragment of the push it refuses (0xffffffff: not about a push).
//                                  delta_too_large (a norm bound) tells the learner to drop its drift of that
//                                  fragment (LearnerCore::drop_drift): the same drift would be refused again.
// Settling pushes: a learner waits (sync.wait_for_answer) only for pushes some syncer may still answer. A reject naming
// a push's fragment settles it; so does the learner's (re)join: every push sent on that link before it counts as
// refused (its progress stays in θ and goes in the next push), as does a push that could not be sent.
// Identity (CURVE): a key is bound to the one learner id its allow-list name "learner-N" says; a key with another
// name joins as no learner (reject unbound_key); a connection's learner id never changes. Plaintext has no identity.
// State downloads come from one shared snapshot per set of fragment versions, at most one outstanding per learner
// (syncer_node.cpp, on_hello, says exactly when one is outstanding).
// A learner that hears nothing from the syncer for net.dead_after seconds counts it as gone, keeps training, and
// sends hello every net.heartbeat seconds until a welcome comes back (then it trains on without downloading).
// The syncer counts a learner gone after net.dead_after seconds of silence (Syncer::set_connected(false)).
//
// Sharded syncer (syncer.shards = S > 1): S syncer processes (`deloco syncer --shard s`), each serving the fragments
// assign_shards() gives it (deloco/sync.h, plan_shard: every node computes the same split from the one model plan). A
// learner speaks the protocol above with every shard on its own connection: hello, welcome and state download
// cover that shard's part only (welcome.versions and elements over its fragments, in its local order); pushes go to
// the fragment's shard; fragment ids on the wire are the model's (global) ids, and a push to the wrong shard is
// refused as unknown_fragment. A shard that is away stalls only its fragments: the learner notices it (syncer_lost
// with "shard"), trains on, and rejoins it alone. Each shard checkpoints its fragments and outer state (manifest:
// shard, shards, fragments); the global model is their union (assemble_shards).
//
// Metrics records: JSON lines, one object per line, each with "kind" and "t" (Unix seconds), written through the
// RecordSink given to each node (`deloco syncer` and `deloco learner` write syncer.jsonl and learner-N.jsonl). Every
// kind and its fields are defined once, in the record schema (src/records/kinds.h), which the writers and every
// reader (`deloco report`, the dashboard, scripts/jsonl_records.py) share; docs/runtime.md ("Observability") says
// what to look at.
//
// Contract
//  * Nodes own their transport and run on the calling thread until done or until `stop` becomes true. The learner
//    additionally runs one comms thread; inner steps never wait for the network (unless sync.wait_for_answer).
//  * Bad input from peers never throws out of run(): it is rejected, logged (a "reject" record) and counted by
//    reason in the summary and on the Prometheus endpoint; nothing it carries is ever merged. Any exception while
//    the syncer handles one message is contained the same way (reason handler_error). Records never throw either:
//    peer text in them is valid UTF-8 (clip_utf8), and a sink that throws costs that record only (record_errors).
//  * Errors in the node's own setup (config, corpus, key files, a corrupt checkpoint on --resume) throw before
//    any network activity with a message naming the key or file.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deloco/algorithm.h"
#include "deloco/gpt/config.h"
#include "deloco/transport.h"
#include "deloco/workload.h"

namespace deloco {

class ConfigSchema;
class Corpus;  // deloco/gpt/data.h
class LearnerGroup;

struct NetOptions {
  std::string address = "tcp://127.0.0.1:5555";  // syncer binds here, learners dial it (env DELOCO_SYNCER overrides)
  std::string standby;               // the standby syncer's endpoint(s), as address ("" : no standby pair)
  bool plaintext = false;            // run without CURVE (must be explicit)
  std::string secret_key;            // own .key file (env DELOCO_SECRET_KEY)
  std::string server_key;            // learners: the syncer's .pub file (env DELOCO_SERVER_KEY)
  std::string allow;                 // syncer: allow-list file or directory of .pub files (env DELOCO_ALLOW)
  // net.encoding, net.broadcast_encoding and net.error_feedback are algorithm keys (deloco/algorithm.h).
  double heartbeat = 0.5;            // seconds between heartbeats
  double dead_after = 3.0;           // seconds of silence before a peer counts as gone
  int64_t chunk_bytes = 1 << 20;     // global-state download chunk size
  double join_timeout = 60.0;        // learner: seconds to wait for the first welcome before training alone;
                                     // also how long a refused learner (duplicate id) keeps retrying
  int64_t max_frame_bytes = 0;       // largest frame a node accepts (0: sized to the model, node_transport_options)
  double tcp_timeout = 10.0;         // TCP: seconds of unacknowledged data before a connection is dropped and dialled
                                     // afresh (TransportOptions::tcp_timeout; 0: the OS's, minutes): the floor, a
                                     // slow link's connections get longer (8 base retransmission timeouts)
  std::string tcp_congestion;        // TCP congestion control of every connection ("": the system's; e.g. "bbr")
  int64_t lanes = 1;                 // learners: connections to each syncer shard, a large payload split over them
                                     // (TransportOptions::lanes; docs/transport.md)
  int64_t io_threads = 1;            // ZeroMQ I/O threads per transport (TransportOptions::io_threads)
  // Rejoin from peers (docs/reliability.md). Learners: where this learner serves chunks of the state it holds to
  // joining learners ("" : it serves none; a concrete address others can dial, not 0.0.0.0), and at most how many
  // Mbit/s it sends them (default 200, so serving never takes a donor's whole link; 0: unbounded, by choice).
  // Syncer: at most how many donors a joining learner's welcome names (0: the syncer sends the whole state itself).
  std::string serve;
  double serve_rate = 200.0;
  int64_t donors = 4;
  void bind(ConfigSchema& schema);
  // net.* as TransportOptions, without the model-sized bounds (node_transport_options adds them).
  TransportOptions transport() const;
};

struct SyncerNodeOptions {
  std::string out_dir;               // run folder: syncer.jsonl, checkpoints/, summary
  int64_t shards = 1;                // S: syncer processes, each serving the fragments assign_shards gives it
  int64_t shard = 0;                 // not a key: which shard this process is (`deloco syncer --shard`, DELOCO_SHARD)
  // Shard 0 of a sharded syncer evaluates the global model: its own fragments, and the other shards' from the
  // latest committed checkpoint in these run folders (index = shard; "" or unreadable: that shard's fragments
  // at version 0, as every node initialises them, or its latest readable checkpoint). Not a key: `deloco syncer`
  // fills it with the sibling folders shard-k of a run folder named shard-s.
  std::vector<std::string> shard_dirs;
  int64_t checkpoint_every = 1;      // merges between checkpoints, written before the broadcast (0: only at the
                                     // end); 1 means no merge a learner has seen is ever lost to a syncer crash
  double eval_interval = 30.0;       // seconds between validation evaluations of Θ (0: only at the end)
  std::string metrics = "127.0.0.1:0";  // Prometheus endpoint host:port ("" : off)
  bool standby = false;              // `deloco run`: a standby syncer per shard (net.standby, else derived endpoints)
  double lease = 1.0;                // seconds without a word from the leader before its standby takes over
  void bind(ConfigSchema& schema);   // syncer.*
};

struct LearnerNodeOptions {
  double slowdown = 1.0;             // chaos: stretch every inner step to this multiple of its time (sleep)
  std::string state_dir;             // learner-local state (inner-optimizer moments): <state_dir>/learner-N/
                                     // ("" : none). A restarted learner resumes its AdamW moments from it.
  int64_t state_every = 0;           // inner steps between learner-local state writes (0: max(100, sync.sync_every));
                                     // it is also written when the learner stops
  int64_t ranks = 1;                 // processes per learner: a data-parallel group (deloco/group.h)
  double bucket_mb = 25.0;           // gradient all-reduce bucket size of a group (the first bucket: ≤ 1 MB)
  double group_timeout = 600.0;      // seconds a group collective may take before the group fails
  bool serve_corrupt = false;        // fault drill: corrupt every chunk served to joining peers (they must catch it)
  void bind(ConfigSchema& schema);   // learner.*
};

struct ChaosOptions {                // used by `deloco run` only
  bool enabled = false;
  double kill_interval = 0.0;        // mean seconds between SIGKILLs of a random learner (0: none)
  double stop_interval = 0.0;        // mean seconds between SIGSTOPs of a random learner (0: none)
  double stop_seconds = 5.0;         // SIGCONT after this long
  double restart_delay = 2.0;        // seconds before a killed process is started again
  std::vector<double> syncer_kill_at;  // seconds after start at which the syncer is killed (then --resume)
  // The same by the run's progress (src/run/chaos.h: the furthest learner's inner step over train.steps), so chaos
  // hits the same point of a run on any machine: the mean fraction of train.steps between learner SIGKILLs
  // (0: none; not with kill_interval), and the fractions in (0, 1) at which the syncer is killed (not with
  // syncer_kill_at).
  double kill_interval_progress = 0.0;
  std::vector<double> syncer_kill_at_progress;
  int64_t slow_learner = -1;         // this learner runs learner.slowdown = slow_factor (-1: none)
  double slow_factor = 2.0;
  int64_t seed = 1;
  // Network faults on the testbed (testbed.name), docs/testbed.md: "partition host=1 at=20 for=30; flap host=2
  // at=10 for=20 period=4; slow learner=0 at=15 for=60 factor=100" (src/run/net_chaos.h; "" : none).
  std::string net;
  void bind(ConfigSchema& schema);   // chaos.*
};

struct TestbedOptions {              // used by `deloco run` only (docs/testbed.md)
  // "" : every process on this machine's own network. A name: the testbed of that name, made by
  // `scripts/testbed.sh up` (TESTBED_NAME): the syncer (every shard) on host 0, learner n (with its ranks) on host
  // 1 + n mod (hosts − 1), over TCP between the hosts' addresses; its dashboard on host 0's address.
  std::string name;
  int64_t port = 6000;               // the syncer's TCP port on host 0 (shard s: port + s)
  void bind(ConfigSchema& schema);   // testbed.*
};

// The algorithm (sync.*, merge.*, outer.*, codecs: deloco/algorithm.h, bound once there) plus the runtime's own keys.
struct RuntimeConfig : AlgorithmConfig {
  RunConfig run;                     // model.*, data.*, train.*
  NetOptions net;
  SyncerNodeOptions syncer;
  LearnerNodeOptions learner;
  ChaosOptions chaos;
  TestbedOptions testbed;
  void bind(ConfigSchema& schema);   // every section above
  // sync.learners, or one per core when it is 0 (allowed in runtime configs only).
  int64_t resolved_learners() const;
  // `deloco syncer`, `deloco learner` and the embedded learner: ConfigError naming `who` when sync.learners is 0
  // (auto), which only `deloco run` resolves once for all its processes.
  void require_explicit_learners(const std::string& who) const;
  void validate() const;             // cross-checks (resolving the preset first); throws ConfigError naming the key
};

// ---- Sharded syncer endpoints ----------------------------------------------------------------------------------
// net.address split at commas (spaces around each endpoint trimmed).
std::vector<std::string> split_endpoints(const std::string& address);
// The endpoint of every shard: the listed ones when net.address lists S; else derived from the one given — shard s
// on tcp port + s, or at ipc path "-s" (before a ".sock" extension). Throws ConfigError when neither works.
std::vector<std::string> shard_endpoints(const std::string& address, int64_t shards);

// ---- The global model of a sharded syncer -----------------------------------------------------------------------
// Each shard checkpoints only its fragments (manifest "shard", "shards", "fragments"). assemble_shards reads the
// latest committed checkpoint of every shard's run folder (given in any order, each shard exactly once), checks
// they are one run's (same model fingerprint, disjoint fragments, all S present) and commits their union as a
// syncer checkpoint of run folder `out_dir` (manifest: global versions, summed merges, "assembled_from"), which
// `deloco eval`, `sample` and `merge` read like any other. Throws CheckpointError naming the folder at fault.
struct AssembledModel {
  std::string dir;      // the committed checkpoint folder
  int64_t merges = 0;   // summed over the shards
  bool final = false;   // every shard's checkpoint was its final one
};
AssembledModel assemble_shards(const std::vector<std::string>& shard_dirs, const std::string& out_dir);

// ---- What a node reads from its environment (docs/cluster.md) --------------------------------------------------
enum class NodeRole;
// DELOCO_SECRET_KEY, and for the syncer DELOCO_BIND and DELOCO_ALLOW, for a learner DELOCO_SYNCER and
// DELOCO_SERVER_KEY: each replaces its key (net.secret_key, net.address, net.allow, net.server_key) when set and
// not empty. Nodes apply it after the config file and before --set overrides.
void apply_node_environment(RuntimeConfig& cfg, NodeRole role);
// An integer environment variable: `fallback` when unset or empty; ConfigError naming it when not an integer.
int64_t environment_integer(const char* name, int64_t fallback);

// ---- Transport bounds sized to the model ---------------------------------------------------------------------
// What a peer can make a node hold is a few frames (deloco/transport.h, Bounds), so frames are bounded by what the
// node legitimately receives for its model, not by the transport's generic 1 GiB.
enum class NodeRole { kSyncer, kLearner };
// The largest frame `role` legitimately receives, for a model of `model_elements` parameters whose largest
// fragment has `fragment_elements`, plus 4 KiB of slack (the 72-byte header is a frame of its own):
//   syncer:  a fragment push, the largest fragment in the costliest float encoding; or a control message
//            (hello, heartbeat, leave: at most 64 KiB).
//   learner: a state chunk or a fragment broadcast, never more than the whole model in the costliest float
//            encoding (whatever net.chunk_bytes the syncer uses); or a control message (a welcome: 256 KiB).
// Throws ConfigError when the size overflows.
uint64_t legit_frame_bytes(NodeRole role, int64_t fragment_elements, int64_t model_elements);
// TransportOptions of a node of `role` serving `model` under `cfg` (cut into fragments as the node will cut it):
// net.* (NetOptions::transport), max_frame_bytes = legit_frame_bytes unless net.max_frame_bytes > 0 overrides it,
// and on the syncer receive_limit = 4·P + 16 complete messages queued per learner (a learner has at most a hello,
// a few heartbeats, and a push plus its heartbeat per fragment in flight; a full queue only slows that learner's
// sending down, TCP back-pressure, it loses nothing).
TransportOptions node_transport_options(const RuntimeConfig& cfg, Workload& model, NodeRole role);
// That per-learner bound, 4·fragments + 16: also the most messages a paused leader holds from one connection.
int syncer_receive_limit(int64_t fragments);
// A learner's connections over ZeroMQ with `options`: one per syncer shard (net.address, in shard order) and, with
// net.standby, one per shard to the other syncer of that shard's pair (for LearnerNode::standbys; empty without).
struct LearnerLinks {
  std::vector<std::unique_ptr<ClientTransport>> syncers, standbys;
  // Rejoin from peers (net.serve): the server where this learner serves state chunks to joining learners (null:
  // net.serve is ""), its public key (z85; "" in plaintext), and the options a joining learner dials donors with
  // (each donor's key goes in server_public_key).
  std::unique_ptr<ServerTransport> serve;
  std::string serve_key;
  TransportOptions donor_options;
};
LearnerLinks dial_learner_links(const RuntimeConfig& cfg, const TransportOptions& options);
// A standby syncer's connection to its leader: a learner's options with frames up to an image (Θ and up to three
// outer-state tensors per parameter, in fp32) plus 1 MiB.
TransportOptions standby_transport_options(const RuntimeConfig& cfg, Workload& model);

using RecordSink = std::function<void(const nlohmann::json&)>;

class SyncerNode {
 public:
  // resume: continue from out_dir's latest syncer checkpoint (throws CheckpointError when none or corrupt).
  SyncerNode(const RuntimeConfig& cfg, std::unique_ptr<ServerTransport> transport,
             std::shared_ptr<const Corpus> corpus, bool resume, RecordSink record);
  // Any workload (deloco/workload.h): `evaluator` scores Θ and fixes the model every learner must match.
  SyncerNode(const RuntimeConfig& cfg, std::unique_ptr<ServerTransport> transport,
             std::unique_ptr<Workload> evaluator, bool resume, RecordSink record);
  ~SyncerNode();
  // Serves until every learner retired (then a final merge of what waits, a final evaluation and checkpoint) or
  // until `stop`. Returns the summary (the fields every run summary shares, plus runtime specifics).
  nlohmann::json run(const std::atomic<bool>& stop);
  // A standby pair (docs/reliability.md): `dial` opens a connection to the other syncer of the pair. follow: start
  // as its standby (it sends an image, then every change to the core; this node checks each merge against the
  // leader's and takes over when the leader is silent for syncer.lease). Else lead, with the standby following
  // this one; a leader that hears the other syncer at a newer epoch (its lease, or its request to follow) steps
  // down and follows (a learner's hello with a newer epoch is only a hint: refused, recorded, nothing changes).
  // `slot` is this syncer's place in the pair (0: the primary, at net.address; 1: the standby, at net.standby): when
  // neither syncer leads (the leader died before its standby held an image, then came back as a
  // standby), the one with the newer state takes over, the primary on a tie (repl::leads_leaderless). Call before run().
  void pair(std::function<std::unique_ptr<ClientTransport>()> dial, bool follow, int slot);
  std::string prometheus() const;    // the metrics text (thread-safe)
  // The live dashboard on the metrics endpoint (when syncer.metrics is on): `page_html` at "/", and at
  // "/api/data" the charts' data of the run folder (its records and summary: the learners' too when they write
  // beside it, as under `deloco run`), read on each request. Nothing of the config is served, so no key or key
  // path. Call before run().
  void serve_dashboard(std::string page_html);
  int metrics_port() const;          // the metrics endpoint's port (0 when off)
  // MetricsServer::exposure_warning(): "" when off or bound to loopback; else a sentence naming the real address.
  std::string metrics_warning() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class LearnerNode {
 public:
  LearnerNode(const RuntimeConfig& cfg, int64_t learner_id, std::unique_ptr<ClientTransport> transport,
              std::shared_ptr<const Corpus> corpus, RecordSink record);
  // Any workload (deloco/workload.h) as this learner's replica.
  LearnerNode(const RuntimeConfig& cfg, int64_t learner_id, std::unique_ptr<ClientTransport> transport,
              std::unique_ptr<Workload> workload, RecordSink record);
  // A sharded syncer (syncer.shards = S): one transport per shard, dialled to shard_endpoints() in shard order.
  // The learner joins every shard, downloads each shard's part of the global state from it, pushes each fragment
  // to the shard that serves it and takes its merges from there. A shard that is away stalls only its fragments:
  // the learner trains on, and its other fragments keep syncing.
  LearnerNode(const RuntimeConfig& cfg, int64_t learner_id, std::vector<std::unique_ptr<ClientTransport>> shards,
              std::unique_ptr<Workload> workload, RecordSink record);
  ~LearnerNode();
  // As rank 0 of a learner group (deloco/group.h), whose workload has joined `group`: at every step boundary the
  // node tells the other ranks to train a step or to stop, and sends them the parameters that changed (merged
  // fragments applied, a global state installed). Call before run().
  void lead_group(std::shared_ptr<LearnerGroup> group);
  // A standby pair (net.standby; docs/reliability.md): one connection per shard to that shard's other syncer. The
  // learner follows whichever syncer of each pair leads (the newest epoch). Call before run().
  void standbys(std::vector<std::unique_ptr<ClientTransport>> alts);
  // Rejoin from peers (docs/reliability.md): serve chunks of the state this learner holds on `server` (null: serve
  // none; its endpoint and `public_key` go in every hello), and fetch a download from the donors a welcome names,
  // dialled with `donor_options`. Call before start()/run(), after the links are given.
  void peers(std::unique_ptr<ServerTransport> server, const std::string& public_key, const TransportOptions& donor_options);
  // Joins, trains train.steps inner steps (resuming at the step the syncer remembers for this id), leaves.
  nlohmann::json run(const std::atomic<bool>& stop);

  // Step-driven use: the same node, but the caller's own loop trains the workload's parameters (the Python module,
  // deloco/embed.h), so the workload's inner_step() is never called. run() is exactly start(); while (next())
  // { inner_step; stepped(); } finish(). Not for a learner group (throws std::logic_error).
  //   start(): the comms thread and the join (as run() does); returns the step to train next: the step the syncer
  //            remembers for this learner id, so a restarted learner resumes there (0 for a new one).
  //   next():  the step boundary: installs a downloaded state, applies the merged fragments whose time has come to
  //            the parameters in place, waits when the algorithm says (sync.wait_for_answer). Returns whether to
  //            train another step: false once train.steps are done or `stop` is set. Throws RefusedError
  //            with the reason when the syncer refused this learner for good (another model, a wrong key …),
  //            TransportError when its comms thread failed.
  //   stepped(): one step was trained in `seconds` (the caller's clock) on result.tokens tokens: counts it, and
  //            hands the pushes due to the comms thread (encoded on this thread). Calls out of order throw
  //            std::logic_error.
  //   finish(): the goodbye ("done" when train.steps were trained, else "stop"), stops the comms thread, and
  //            returns the summary run() returns.
  int64_t start(const std::atomic<bool>& stop);
  bool next(const std::atomic<bool>& stop);
  void stepped(const StepResult& result, double seconds);
  nlohmann::json finish();
  int64_t step() const;                    // inner steps trained (the workload's count)
  const RuntimeConfig& config() const;     // as resolved and validated

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deloco
