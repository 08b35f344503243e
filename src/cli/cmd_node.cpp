// `deloco syncer` and `deloco learner`: one process each, for a cluster of many machines (deloco/runtime.h).
//
// Addresses and keys come from the config, then the environment (DELOCO_SYNCER, DELOCO_BIND, DELOCO_SECRET_KEY,
// DELOCO_SERVER_KEY, DELOCO_ALLOW, DELOCO_LEARNER_ID), then the command line, later winning. Both write JSON-lines
// records into their run folder (appending, so a restarted process continues the same file) and stop cleanly on
// SIGINT/SIGTERM.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "deloco/config.h"
#include "deloco/gpt/data.h"
#include "deloco/gpt/train.h"
#include "deloco/group.h"
#include "deloco/runtime.h"
#include "records/record.h"
#include "records/summary.h"
#include "report/report.h"
#include "util/blas.h"
#include "util/checkpoint_store.h"
#include "util/fs.h"
#include "util/malloc_tuning.h"
#include "util/stop_signals.h"
#include "web_assets.h"

namespace deloco::cli {
namespace fs = std::filesystem;

namespace {
// The last component of a folder path ("runs/demo-1/" → "demo-1"): what the dashboard's title shows (no absolute
// path of the syncer's machine reaches a page).
std::string folder_name(const std::string& dir) {
  fs::path p = fs::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}


// The host part of syncer.metrics for a URL: an address bound to every interface is reached locally at 127.0.0.1.
std::string dashboard_host(const std::string& host_port) {
  std::string host = host_port.substr(0, host_port.rfind(':'));
  if (host.empty() || host == "*" || host == "0.0.0.0" || host == "[::]") return "127.0.0.1";
  return host;
}

struct NodeArgs {
  CommonOptions common;
  std::string address;  // --bind / --connect
  std::string out;
  bool resume = false;
  bool standby = false;  // syncer: the pair's second syncer (binds net.standby, follows net.address)
  bool follow = false;   // syncer: binds net.address, follows net.standby (a restarted leader whose standby took over)
  int64_t id = -1;
  std::optional<int64_t> shard;  // syncer: which shard of syncer.shards (default DELOCO_SHARD, else 0)
  // A learner group's rank (torchrun's names; unset: the environment, else rank 0 of learner.ranks).
  std::optional<int64_t> rank, world_size, local_rank, master_port;
  std::optional<std::string> master_addr;
};

// Loads the config in the one load order: file, environment (addresses, keys, DELOCO_SET), --set, --bind/--connect.
RuntimeConfig load(const NodeArgs& a, ConfigSchema& schema, bool syncer) {
  RuntimeConfig cfg;
  cfg.bind(schema);
  apply_config(
      schema, a.common, NoConfig::kDemo,
      [&] { apply_node_environment(cfg, syncer ? NodeRole::kSyncer : NodeRole::kLearner); },
      [&] {
        if (!a.address.empty()) cfg.net.address = a.address;
      });
  cfg.validate();
  cfg.require_explicit_learners(syncer ? "deloco syncer" : "deloco learner");
  resolve_inner_optimizer(cfg.run.train, cfg.merge.preset);  // merge.preset = muloco: learners train with Muon
  return cfg;
}

void run_syncer(const NodeArgs& a) {
  ConfigSchema schema;
  RuntimeConfig cfg = load(a, schema, /*syncer=*/true);
  const int64_t shard = a.shard ? *a.shard : environment_integer("DELOCO_SHARD", 0);
  cfg.syncer.shard = shard;
  cfg.validate();  // the shard against syncer.shards
  // A standby pair: this shard's two endpoints (net.address and net.standby, each one per shard or derived).
  if ((a.standby || a.follow) && cfg.net.standby.empty())
    throw ConfigError(std::string(a.standby ? "--standby" : "--follow") +
                      " needs net.standby: the endpoint of the pair's second syncer");
  if (a.standby && a.follow) throw ConfigError("--standby and --follow name the same thing twice: give one");
  std::string peer;
  if (!cfg.net.standby.empty()) {
    const std::string primary = shard_endpoints(cfg.net.address, cfg.syncer.shards)[static_cast<size_t>(shard)];
    const std::string second = shard_endpoints(cfg.net.standby, cfg.syncer.shards)[static_cast<size_t>(shard)];
    peer = a.standby ? primary : second;
    if (a.standby && a.address.empty()) cfg.net.address = second;
  }
  // Where this shard serves: --bind, else its endpoint of net.address (one per shard, or derived).
  if (a.address.empty() && !a.standby)
    cfg.net.address = shard_endpoints(cfg.net.address, cfg.syncer.shards)[static_cast<size_t>(shard)];
  std::string dir = !a.out.empty() ? a.out : cfg.syncer.out_dir;
  // A sharded syncer in a run folder named shard-s: the siblings shard-k are the other shards' (shard 0 assembles
  // the global model from their checkpoints for its evaluations).
  // A standby syncer's folder is shard-s/standby (`deloco run`): the shards are its parent's siblings.
  const fs::path shard_dir = !dir.empty() && fs::path(dir).filename() == "standby" ? fs::path(dir).parent_path() : fs::path(dir);
  if (cfg.syncer.shards > 1 && !dir.empty() && shard_dir.filename() == "shard-" + std::to_string(shard))
    for (int64_t k = 0; k < cfg.syncer.shards; ++k)
      cfg.syncer.shard_dirs.push_back((shard_dir.parent_path() / ("shard-" + std::to_string(k))).string());
  if (a.resume) {
    if (dir.empty()) throw ConfigError("--resume needs the run folder: --out DIR or syncer.out_dir");
  } else if (dir.empty()) {
    dir = new_run_dir("", a.common, "syncer", "choose another with --out DIR");
  } else if (!a.standby && !a.follow && (fs::exists(fs::path(dir) / "latest") || has_committed_checkpoint(dir))) {
    throw ConfigError("run folder '" + dir + "' already holds syncer checkpoints; continue it with --resume or choose another --out");
  }
  cfg.syncer.out_dir = dir;
  fs::create_directories(dir);
  configure_threads(cfg.run.train.threads);
  auto corpus = std::make_shared<const Corpus>(Corpus::load(cfg.run.data));
  rec::RecordWriter log((fs::path(dir) / "syncer.jsonl").string());
  // The evaluator's model fixes the transport's frame bound (node_transport_options), so it is built first.
  std::unique_ptr<Workload> evaluator = gpt_workloads(cfg.run, corpus)(0, 1);
  // A TorchScript module fixes V and T: checkpoint manifests and syncer-config.json must say the module's values,
  // as `deloco train` does, or whoever rebuilds the model from them (eval, PyTorch) gets the config's instead.
  if (const auto* t = dynamic_cast<const Trainer*>(evaluator.get())) cfg.run.model = t->config().model;
  const TransportOptions topts = node_transport_options(cfg, *evaluator, NodeRole::kSyncer);
  auto transport = make_zmq_server(cfg.net.address, topts);
  const std::string endpoint = transport->endpoint();
  // The pair's connection to the other syncer: frames up to an image; CURVE with this syncer's own key, the other's
  // public key being net.server_key, else the same key pair's (both syncers of a pair serve the same learners).
  TransportOptions popts = standby_transport_options(cfg, *evaluator);
  if (popts.server_public_key_file.empty()) popts.server_public_key_file = popts.secret_key_file;
  SyncerNode node(cfg, std::move(transport), std::move(evaluator), a.resume,
                  [&](const nlohmann::json& j) { log.write_json(j); });
  if (!peer.empty()) node.pair([peer, popts] { return make_zmq_client(peer, popts); }, a.standby || a.follow,
                                /*slot=*/a.standby ? 1 : 0);
  if (!a.resume) write_file_atomic((fs::path(dir) / "syncer-config.json").string(), schema.to_json().dump(2) + "\n");
  // The live dashboard at the metrics endpoint's / (docs/report.md), when the build has its chart library.
  if (node.metrics_port() > 0 && std::string(kUplotJs).size() > 0) {
    node.serve_dashboard(report_html({}, "deloco syncer: " + folder_name(dir), kUplotJs, kUplotCss, /*live=*/true));
    std::cerr << "deloco syncer: dashboard at http://" << dashboard_host(cfg.syncer.metrics) << ":" << node.metrics_port()
              << "/\n";
  }
  // Bound beyond loopback (e.g. syncer.metrics = ":0"): whoever reaches the address reads the metrics and the
  // dashboard. Say so, naming the real address (the URL above is only the local way in).
  if (const std::string w = node.metrics_warning(); !w.empty())
    std::cerr << "deloco syncer: WARNING: " << w << " (syncer.metrics = \"" << cfg.syncer.metrics << "\")\n";
  std::cerr << "deloco syncer" << (cfg.syncer.shards > 1 ? " shard " + std::to_string(shard) + " of " +
                                                                 std::to_string(cfg.syncer.shards)
                                                           : std::string())
            << ": serving " << endpoint << (cfg.net.plaintext ? " in PLAINTEXT" : " (CURVE)") << ", "
            << cfg.resolved_learners() << " learners, K=" << cfg.sync.quorum << ", P=" << cfg.sync.fragments
            << (a.resume ? ", resumed" : "") << (a.standby || a.follow ? ", standby of " + peer : "")
            << (!peer.empty() && !a.standby && !a.follow ? ", its standby at " + peer : "") << ", max frame " << topts.max_frame_bytes << " bytes; run folder " << dir
            << "\n";
  nlohmann::json s = node.run(install_stop_signals().requested);
  std::cerr << "deloco syncer: " << s["outer_steps"] << " merges, " << s["contributions_merged"]
            << " contributions merged, " << s["contributions_rejected"] << " rejected, val loss "
            << s["final_val_loss"] << ", uptime " << s["uptime"] << "\n"
            << (cfg.syncer.shards > 1
                    ? "deloco syncer: this shard's fragments are in " + dir + "; the global model: " + self_command() +
                          " assemble <every shard's folder> --out DIR\n"
                    : "deloco syncer: the global model is the latest checkpoint of " + dir + ": " + self_command() +
                          " eval --checkpoint " + dir + "\n");
  write_summary(a.common, s);
}

void run_learner(const NodeArgs& a) {
  ConfigSchema schema;
  RuntimeConfig cfg = load(a, schema, /*syncer=*/false);
  int64_t id = a.id;
  if (id < 0) id = environment_integer("DELOCO_LEARNER_ID", -1);
  if (id < 0) throw ConfigError("give the learner id with --id N or DELOCO_LEARNER_ID");
  std::string dir = !a.out.empty() ? a.out : cfg.syncer.out_dir;
  if (dir.empty()) dir = "runs/learner-" + std::to_string(id);
  fs::create_directories(dir);
  if (cfg.learner.state_dir.empty()) cfg.learner.state_dir = dir;  // AdamW moments survive a restart
  configure_threads(cfg.run.train.threads);
  auto corpus = std::make_shared<const Corpus>(Corpus::load(cfg.run.data));
  rec::RecordWriter log((fs::path(dir) / ("learner-" + std::to_string(id) + ".jsonl")).string());
  if (id < 0 || id >= cfg.resolved_learners())  // before building a replica for it
    throw ConfigError("learner id " + std::to_string(id) + " is not in [0, sync.learners=" +
                      std::to_string(cfg.resolved_learners()) + ")");
  // A learner group: flags, else torchrun's environment, else one rank.
  GroupOptions go;
  go.size = cfg.learner.ranks;
  go.timeout_seconds = cfg.learner.group_timeout;
  go = GroupOptions::from_environment(go);
  if (a.rank) go.rank = *a.rank;
  if (a.world_size) go.size = *a.world_size;
  if (a.local_rank) go.local_rank = *a.local_rank;
  if (a.master_port) go.master_port = *a.master_port;
  if (a.master_addr) go.master_addr = *a.master_addr;
  if (go.size != cfg.learner.ranks)
    throw ConfigError("the group has " + std::to_string(go.size) + " ranks (WORLD_SIZE / --world-size) but learner.ranks=" +
                      std::to_string(cfg.learner.ranks) + "; set both to the same number");
  if (const std::string why = go.validate(); !why.empty()) throw ConfigError("learner group: " + why);
  if (go.size > 1 && cfg.run.train.device.rfind("cuda", 0) == 0 && cfg.run.train.device.find(':') == std::string::npos)
    cfg.run.train.device = "cuda:" + std::to_string(go.local_rank);
  std::unique_ptr<Workload> replica = gpt_workloads(cfg.run, corpus)(id, cfg.resolved_learners());
  std::shared_ptr<LearnerGroup> group;
  if (go.size > 1) {
    std::cerr << "deloco learner " << id << ": rank " << go.rank << " of " << go.size << ", group at " << go.master_addr
              << ":" << go.master_port << "\n";
    group = LearnerGroup::connect(go);
    replica->join_group(group);
    if (go.rank != 0) {  // the other ranks mirror rank 0, which alone talks to the syncer
      // SIGINT/SIGTERM go to the whole group at once: these ranks keep going until rank 0 (which saves its state
      // and says goodbye first) tells them to stop, or goes away.
      install_stop_signals();
      const int64_t trained = group->follow(*replica);
      std::cerr << "deloco learner " << id << " rank " << go.rank << ": " << trained << " steps, stopped by rank 0\n";
      write_summary(a.common, {{"learner", id}, {"rank", go.rank}, {"ranks", go.size}, {"steps_trained", trained},
                               {"step", replica->step()}, {"group_comm_seconds", group->communication_seconds()}});
      return;
    }
  }
  // One connection per syncer shard (one when unsharded).
  const TransportOptions topts = node_transport_options(cfg, *replica, NodeRole::kLearner);
  LearnerLinks links = dial_learner_links(cfg, topts);
  LearnerNode node(cfg, id, std::move(links.syncers), std::move(replica),
                   [&](const nlohmann::json& j) { log.write_json(j); });
  if (group) node.lead_group(group);
  if (!links.standbys.empty()) node.standbys(std::move(links.standbys));  // a pair per shard: follow whichever leads
  node.peers(std::move(links.serve), links.serve_key, links.donor_options);  // rejoin from peers (net.serve)
  std::cerr << "deloco learner " << id << ": syncer " << cfg.net.address << (cfg.net.plaintext ? " (PLAINTEXT)" : " (CURVE)")
            << ", " << cfg.run.train.steps << " steps, push " << cfg.encoding
            << (blas_description().empty() ? "" : ", " + blas_description())
            << (malloc_description().empty() ? "" : ", " + malloc_description()) << "\n";
  nlohmann::json s = node.run(install_stop_signals().requested);
  std::cerr << "deloco learner " << id << ": step " << s["step"] << ", " << s["pushes"] << " pushes, "
            << s["broadcasts"] << " merged fragments received\n";
  write_summary(a.common, s);
  if (s.contains("error")) throw TransportError("deloco learner " + std::to_string(id) + ": " + s["error"].get<std::string>());
}

}  // namespace

void add_node_commands(CLI::App& app) {
  auto sargs = std::make_shared<NodeArgs>();
  auto* s = app.add_subcommand("syncer", "serve learners: merge their fragments (one process of a cluster)");
  add_common_options(s, &sargs->common);
  s->add_option("--bind", sargs->address, "endpoint to serve: tcp://host:port or ipc:///path (default net.address)");
  s->add_option("--out", sargs->out, "run folder (default syncer.out_dir, else runs/<config>-<time>)");
  s->add_flag("--resume", sargs->resume,
              "continue from the run folder's latest syncer checkpoint (with --standby or --follow: the state this "
              "syncer offers a pair that has no leader; the leader's image replaces it)");
  s->add_flag("--standby", sargs->standby,
              "be the standby of a pair: serve net.standby, follow the leader at net.address, take over when its "
              "lease (syncer.lease) lapses (docs/reliability.md)");
  s->add_flag("--follow", sargs->follow,
              "serve net.address but start as the standby of the syncer at net.standby (a restarted leader whose "
              "standby took over)");
  s->add_option("--shard", sargs->shard, "which shard of syncer.shards this process serves (default DELOCO_SHARD, else 0)");
  s->callback([sargs] { run_syncer(*sargs); });

  struct AssembleArgs {
    CommonOptions common;
    std::vector<std::string> shards;
    std::string out;
  };
  auto aargs = std::make_shared<AssembleArgs>();
  auto* as = app.add_subcommand("assemble", "the global model of a sharded syncer: join the shards' latest checkpoints");
  add_common_options(as, &aargs->common, /*with_config=*/false);
  as->add_option("shards", aargs->shards, "every shard's run folder (syncer --out), in any order")->required();
  as->add_option("--out", aargs->out, "run folder to commit the assembled checkpoint into")->required();
  as->callback([aargs] {
    const AssembledModel m = assemble_shards(aargs->shards, aargs->out);
    std::cout << "assembled " << aargs->shards.size() << " shards (" << m.merges << " merges"
              << (m.final ? ", final" : "") << ") into " << m.dir << "\n"
              << "evaluate it: " << self_command() << " eval --checkpoint " << aargs->out << "\n";
    rec::RunSummary summary;
    summary.command = "assemble";
    summary.extra = {{"checkpoint", m.dir}, {"merges", m.merges}, {"final", m.final}};
    write_summary(aargs->common, summary.to_json());
  });

  auto largs = std::make_shared<NodeArgs>();
  auto* l = app.add_subcommand("learner", "train one replica and talk to the syncer (one process of a cluster)");
  add_common_options(l, &largs->common);
  l->add_option("--connect", largs->address,
                "syncer endpoint; a sharded syncer: one per shard, comma-separated, or one to derive them from "
                "(default DELOCO_SYNCER, else net.address)");
  l->add_option("--id", largs->id, "learner id in [0, sync.learners) (default DELOCO_LEARNER_ID)");
  l->add_option("--out", largs->out, "folder for learner-N.jsonl (default syncer.out_dir, else runs/learner-N)");
  l->add_option("--rank", largs->rank, "rank in this learner's group of learner.ranks processes (default RANK, else 0)");
  l->add_option("--world-size", largs->world_size, "ranks in the group (default WORLD_SIZE, else learner.ranks)");
  l->add_option("--local-rank", largs->local_rank, "rank on this host: picks cuda:N (default LOCAL_RANK, else 0)");
  l->add_option("--master-addr", largs->master_addr, "host of rank 0's group store (default MASTER_ADDR, else 127.0.0.1)");
  l->add_option("--master-port", largs->master_port, "port of rank 0's group store (default MASTER_PORT, else 29500)");
  l->callback([largs] { run_learner(*largs); });
}

}  // namespace deloco::cli
