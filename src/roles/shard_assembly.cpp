// The global model of a sharded syncer (deloco/runtime.h, assemble_shards): each shard's latest committed
// checkpoint holds its fragments; together they are the model. Torch-light: tensors are moved, not computed on.
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <set>
#include <sstream>

#include <ATen/core/Tensor.h>

#include "deloco/checkpoint.h"
#include "deloco/runtime.h"
#include "train/run_checkpoint.h"
#include "util/checkpoint_store.h"

namespace deloco {
namespace fs = std::filesystem;

AssembledModel assemble_shards(const std::vector<std::string>& shard_dirs, const std::string& out_dir) {
  if (shard_dirs.empty()) throw CheckpointError("assemble: no shard run folders given");
  const int64_t S = static_cast<int64_t>(shard_dirs.size());
  std::vector<Checkpoint> cks(shard_dirs.size());
  std::vector<bool> seen(shard_dirs.size(), false);
  for (const auto& dir : shard_dirs) {
    if (!has_committed_checkpoint(dir) && !fs::exists(fs::path(dir) / "manifest.json"))
      throw CheckpointError("'" + dir + "' holds no committed syncer checkpoint");
    Checkpoint ck = read_checkpoint(dir, /*with_optimizer=*/false);
    const auto& m = ck.manifest;
    if (m.value("kind", std::string()) != "syncer")
      throw CheckpointError("'" + ck.dir + "' is not a syncer checkpoint (kind '" + m.value("kind", std::string()) + "')");
    const int64_t shards = m.value("shards", int64_t{1}), shard = m.value("shard", int64_t{0});
    if (shards != S)
      throw CheckpointError("'" + ck.dir + "' is shard " + std::to_string(shard) + " of " + std::to_string(shards) +
                            ", but " + std::to_string(S) + (S == 1 ? " folder was" : " folders were") +
                            " given: give every shard's run folder, once each");
    if (shard < 0 || shard >= S || seen[static_cast<size_t>(shard)])
      throw CheckpointError("'" + ck.dir + "' is shard " + std::to_string(shard) + ", given twice (or out of range)");
    seen[static_cast<size_t>(shard)] = true;
    cks[static_cast<size_t>(shard)] = std::move(ck);
  }
  const std::string fp = cks[0].manifest.value("fingerprint", std::string());
  nlohmann::json manifest = cks[0].manifest;  // the model, data and train sections are every shard's
  TensorFile model;
  int64_t P = 0, merges = 0, merged = 0;
  bool final = true;
  for (const auto& ck : cks) P += static_cast<int64_t>(ck.manifest.value("fragments", std::vector<int64_t>{}).size());
  if (S == 1) P = static_cast<int64_t>(cks[0].manifest.value("versions", std::vector<int64_t>{}).size());
  std::vector<int64_t> versions(static_cast<size_t>(P), -1);
  nlohmann::json from = nlohmann::json::array();
  for (const auto& ck : cks) {
    const auto& m = ck.manifest;
    if (m.value("fingerprint", std::string()) != fp)
      throw CheckpointError("'" + ck.dir + "' holds another model (fingerprint " + m.value("fingerprint", std::string()) +
                            ", shard 0's is " + fp + ")");
    for (const auto& [name, t] : ck.model.tensors) {
      if (model.tensors.count(name))
        throw CheckpointError("tensor '" + name + "' is in two shards' checkpoints ('" + ck.dir + "'): not one run's shards");
      model.tensors[name] = t;
    }
    const auto v = m.value("versions", std::vector<int64_t>{});
    const auto fr = S == 1 ? std::vector<int64_t>{} : m.value("fragments", std::vector<int64_t>{});
    if (S > 1 && v.size() != fr.size())
      throw CheckpointError("'" + ck.dir + "/manifest.json' lists " + std::to_string(v.size()) + " versions for " +
                            std::to_string(fr.size()) + " fragments");
    for (size_t k = 0; k < v.size(); ++k) {
      const int64_t p = S == 1 ? static_cast<int64_t>(k) : fr[k];
      if (p < 0 || p >= P || versions[static_cast<size_t>(p)] >= 0)
        throw CheckpointError("'" + ck.dir + "' names fragment " + std::to_string(p) + " that another shard holds");
      versions[static_cast<size_t>(p)] = v[k];
    }
    merges += m.value("step", int64_t{0});
    merged += m.value("contributions_merged", int64_t{0});
    final = final && m.value("final", false);
    from.push_back({{"shard", m.value("shard", int64_t{0})}, {"checkpoint", ck.dir}, {"merges", m.value("step", int64_t{0})}});
  }
  for (const char* k : {"shard", "shards", "fragments", "counters"}) manifest.erase(k);
  manifest["versions"] = versions;
  manifest["step"] = merges;
  manifest["contributions_merged"] = merged;
  manifest["final"] = final;
  manifest["assembled_from"] = from;
  std::ostringstream name;
  name << "assembled_" << std::setw(8) << std::setfill('0') << merges;
  const CommittedCheckpoint c = save_run_checkpoint(out_dir, name.str(), manifest, model, nullptr, /*keep=*/3);
  return AssembledModel{c.dir, merges, final};
}

}  // namespace deloco
