// The syncer's checkpoints (src/roles/syncer_node_impl.h): Θ, the outer optimizer state, fragment versions and
// the counters, written atomically; restore_from() for --resume.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "syncer_node_impl.h"
#include "train/run_checkpoint.h"
#include "util/fs.h"

namespace deloco {
namespace fs = std::filesystem;
using proto::unix_now;

nlohmann::json SyncerNode::Impl::counters() const {
  nlohmann::json peers_j = nlohmann::json::array();
  for (const auto& p : peers)
    peers_j.push_back({{"step", p.step}, {"tokens", p.tokens}, {"busy", p.busy}, {"busy_done", p.busy_done},
                       {"instance", fingerprint_hex(p.instance)}, {"joins", p.joins}});
  std::vector<bool> ret(retired.begin(), retired.end());
  return {{"merges", merges},
          {"elapsed", elapsed()},
          {"stalled", prior_stalled + stalled},
          {"unix_time", unix_now()},
          {"rejects", rejects},
          {"joins_refused", joins_refused},
          {"peers", peers_j},
          {"retired", ret},
          {"grace_waits", grace_waits},
          {"grace_wait_total", grace_wait_total},
          {"epoch", epoch()}};
}

void SyncerNode::Impl::checkpoint(bool final) {
  const double start = now();
  int64_t n_retired = 0;
  for (bool r : retired) n_retired += r ? 1 : 0;
  std::ostringstream name;  // merges, then retirements; commit order is the manifest's sequence
  name << "merges_" << std::setw(8) << std::setfill('0') << merges << "-r" << std::setw(4) << n_retired;
  if (final_fragments > 0) name << "-final";  // the final round's model (sync.final_round): no merge counted it
  nlohmann::json manifest;
  manifest["kind"] = "syncer";
  manifest["fingerprint"] = fingerprint_hex(fingerprint);
  manifest["versions"] = core->versions();
  manifest["contributions_merged"] = core->merged_contributions();
  manifest["counters"] = counters();
  manifest["step"] = merges;
  manifest["final"] = final;
  if (shard.shards > 1) {  // a shard's checkpoint holds its fragments' tensors only
    manifest["shard"] = shard.shard;
    manifest["shards"] = shard.shards;
    manifest["fragments"] = shard.fragments;
  }
  // Self-describing, like a `deloco train` checkpoint: the model, data and train sections, so `deloco eval`,
  // `sample` and `merge` (and tests/python/deloco_ref.py) rebuild the model from the checkpoint alone.
  {
    RunConfig run = cfg.run;
    ConfigSchema schema;
    run.bind(schema);
    manifest["config"] = schema.to_json();
  }
  manifest["model_fingerprint"] = model_fingerprint;
  TensorFile model, opt;
  // No copies: the write below is synchronous on the syncer's one thread, so nothing changes Θ or the outer state
  // while it reads them (a clone would double the shard's peak memory at every checkpoint).
  for (const auto& [n, t] : core->global()) model.tensors[n] = t.detach().to(torch::kCPU);
  for (const auto& [n, t] : core->outer_state()) opt.tensors[n] = t.detach().to(torch::kCPU);
  // Recovery, commit by rename, "latest", keep the three newest (util/checkpoint_store.h). A checkpoint at a
  // merge count already written (the final one after a periodic one, or after a resume) is a new folder, not a
  // skip: it holds newer counters, and a skipped checkpoint once lost a broadcast merge.
  const fs::path dir = save_run_checkpoint(cfg.syncer.out_dir, name.str(), manifest, model, &opt, /*keep=*/3).dir;
  merges_at_ckpt = merges;
  last_checkpoint = dir.string();
  excuse_peers(now() - start);
  rec::CheckpointSaved cs;
  cs.path = dir.string();
  cs.merges = merges;
  emit(std::move(cs));
  // Every merge it covers may be seen now: the staged ones become the latest broadcasts, sent to every live learner.
  group.committed(now() - start, [&](int64_t p, syncer_detail::Latest&& b) {
    latest[p] = std::move(b);
    broadcast_latest(p);
  }, [&](rec::Merge&& mr) { emit(std::move(mr)); });
}

void SyncerNode::Impl::load_counters(const nlohmann::json& c, double down) {
  const auto& pj = c.at("peers");
  const auto ret = c.at("retired").get<std::vector<bool>>();
  if (static_cast<int64_t>(pj.size()) != M || static_cast<int64_t>(ret.size()) != M)
    throw CheckpointError("the counters were written for " + std::to_string(pj.size()) + " learners, not " +
                          std::to_string(M));
  merges = c.at("merges").get<int64_t>();
  prior_elapsed = c.at("elapsed").get<double>() + down;
  prior_stalled = c.at("stalled").get<double>() + down;
  if (merges < 0 || !std::isfinite(prior_elapsed) || prior_elapsed < 0 || !std::isfinite(prior_stalled) ||
      prior_stalled < 0)
    throw CheckpointError("the counters hold a negative or non-finite count (merges " + std::to_string(merges) +
                          ", elapsed " + std::to_string(prior_elapsed) + " s, stalled " + std::to_string(prior_stalled) +
                          " s): a damaged or edited manifest");
  rejects = c.at("rejects").get<std::map<std::string, int64_t>>();
  joins_refused = c.value("joins_refused", int64_t{0});  // absent from checkpoints of older syncers
  grace_waits = c.value("grace_waits", int64_t{0});
  grace_wait_total = c.value("grace_wait_total", 0.0);
  // A resumed leader keeps its term (fencing token); one outside [1, 2^53 - 1] is a corrupt or forged file.
  const int64_t saved_epoch = c.value("epoch", int64_t{1});
  if (saved_epoch < 1 || saved_epoch > proto::kMaxEpoch)
    throw CheckpointError("the counters hold epoch " + std::to_string(saved_epoch) + ", outside [1, 2^53 - 1]");
  pair.restore_epoch(saved_epoch);
  for (int64_t m = 0; m < M; ++m) {
    peers[m].step = pj[m].at("step").get<int64_t>();
    peers[m].tokens = pj[m].at("tokens").get<int64_t>();
    if (peers[m].step < 0 || peers[m].tokens < 0)
      throw CheckpointError("the counters hold a negative step or token count for learner " + std::to_string(m) +
                            ": a damaged or edited manifest");
    peers[m].busy = pj[m].at("busy").get<double>();
    peers[m].busy_done = pj[m].at("busy_done").get<double>();
    peers[m].instance = parse_fingerprint_hex(pj[m].at("instance").get<std::string>());
    peers[m].joins = pj[m].at("joins").get<int64_t>();
    if (ret[m] && !retired[m]) {
      retired[m] = true;
      core_retire(now(), m);
    }
    // It had finished but the syncer died before its goodbye: it will not come back. Under the final round it may
    // still be finishing (waiting for answers, sending its final states): it has as long as a live learner's silence
    // is allowed to say hello (housekeeping retires it after that). Retired at once, the rounds' last pushes and the
    // final states still to come were lost, and a syncer all of whose learners were finishing stopped at once.
    if (!retired[m] && peers[m].step >= cfg.run.train.steps) {
      if (cfg.sync.final_round) {
        peers[m].finish_by = now() + cfg.net.dead_after + patience_cap();
      } else {
        retired[m] = true;
        core_retire(now(), m);
      }
    }
  }
}

void SyncerNode::Impl::restore_from(const std::string& out_dir) {
  // Clear what a crash left (uncommitted temporaries, a stale "latest"), then take the newest committed
  // checkpoint, found by scanning checkpoints/ (util/checkpoint_store.h).
  if (!recover_run_folder(out_dir))
    throw CheckpointError("run folder '" + out_dir + "' holds no committed syncer checkpoint to resume from");
  Checkpoint ck = read_checkpoint(out_dir, /*with_optimizer=*/true);
  const auto& man = ck.manifest;
  if (man.value("kind", std::string()) != "syncer")
    throw CheckpointError("'" + ck.dir + "' is not a syncer checkpoint (kind '" + man.value("kind", std::string()) + "')");
  if (!fingerprint_matches(ck, man.value("fingerprint", std::string()), fingerprint_hex(fingerprint),
                          evaluator->parameters()))
    throw CheckpointError("'" + ck.dir + "' holds a model with fingerprint " + man.value("fingerprint", std::string()) +
                          ", this config builds " + fingerprint_hex(fingerprint));
  const int64_t ck_shard = man.value("shard", int64_t{0}), ck_shards = man.value("shards", int64_t{1});
  if (ck_shard != shard.shard || ck_shards != shard.shards)
    throw CheckpointError("'" + ck.dir + "' was written by shard " + std::to_string(ck_shard) + " of " +
                          std::to_string(ck_shards) + ", this process is shard " + std::to_string(shard.shard) + " of " +
                          std::to_string(shard.shards) + " (syncer.shards and --shard must match the run folder)");
  try {
    core->restore(ck.model.tensors, ck.optimizer.tensors, man.at("versions").get<std::vector<int64_t>>(),
                  man.at("contributions_merged").get<int64_t>());
    const auto& c = man.at("counters");
    // The syncer was down from (at the latest) the checkpoint until now: counted as stalled (conservative).
    const double down = std::max(0.0, unix_now() - c.at("unix_time").get<double>());
    load_counters(c, down);
    merges_at_ckpt = merges;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("'" + ck.dir + "/manifest.json' is missing syncer fields: " + e.what());
  } catch (const SyncError& e) {
    throw CheckpointError("'" + ck.dir + "': " + e.what());
  }
  resumed = true;
  first_join = 0;  // a resumed cluster was already running: its clock continues at once
  last_checkpoint = ck.dir;
  // The learners may have missed the broadcasts of the last merges before the crash (queued, not sent): one that
  // comes back without a download gets every merged fragment as the checkpoint holds it, as after a takeover.
  rebuild_latest();
  for (auto& P : peers) P.missed = true;
}

}  // namespace deloco
