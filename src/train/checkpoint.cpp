#include "deloco/checkpoint.h"
#include "train/run_checkpoint.h"

#include <filesystem>

#include <torch/torch.h>

#include "deloco/gpt/model.h"
#include "util/fs.h"
#include "util/checkpoint_store.h"

namespace deloco {
namespace fs = std::filesystem;
namespace {

CheckpointFiles encode_files(const TensorFile& model, const TensorFile* optimizer) {
  CheckpointFiles files;
  files.emplace_back("model.safetensors", encode_safetensors(model));
  if (optimizer) files.emplace_back("optimizer.safetensors", encode_safetensors(*optimizer));
  return files;
}

}  // namespace

void write_checkpoint(const std::string& dir, nlohmann::json manifest, const TensorFile& model,
                      const TensorFile* optimizer, FileOps& ops) {
  write_checkpoint_folder(dir, manifest, encode_files(model, optimizer), /*sequence=*/0, ops);
}

CommittedCheckpoint save_run_checkpoint(const std::string& run, const std::string& base_name,
                                        const nlohmann::json& manifest, const TensorFile& model,
                                        const TensorFile* optimizer, int64_t keep, FileOps& ops) {
  return commit_run_checkpoint(run, base_name, manifest, encode_files(model, optimizer), keep, ops);
}

std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / "manifest.json", ec)) return path;
  if (fs::is_directory(fs::path(path) / "checkpoints", ec) || fs::exists(fs::path(path) / "latest", ec)) {
    auto newest = newest_checkpoint(path);
    if (!newest) throw CheckpointError("run folder '" + path + "' holds no committed checkpoint");
    return newest->dir;
  }
  if (!fs::exists(path, ec)) throw CheckpointError("checkpoint '" + path + "' does not exist");
  throw CheckpointError("'" + path + "' is neither a checkpoint folder (no manifest.json) nor a run folder (no checkpoints/)");
}

Checkpoint read_checkpoint(const std::string& path, bool with_optimizer) {
  Checkpoint ck;
  ck.dir = resolve_checkpoint(path);
  const fs::path dir(ck.dir);
  const std::string manifest_path = (dir / "manifest.json").string();
  CheckpointManifest m = read_checkpoint_manifest(manifest_path);
  auto load = [&](const std::string& name) {
    const std::string file = (dir / name).string();
    std::string bytes;
    try {
      bytes = read_file(file);
    } catch (const IoError& e) {
      throw CheckpointError(e.what());
    }
    verify_checkpoint_file(m.files.at(name), bytes, file);
    return decode_safetensors(bytes, file);
  };
  ck.model = load("model.safetensors");  // parse_checkpoint_manifest requires it to be listed
  if (with_optimizer && m.files.count("optimizer.safetensors")) ck.optimizer = load("optimizer.safetensors");
  ck.version = m.version;
  ck.manifest = std::move(m.json);
  return ck;
}

bool fingerprint_matches(const Checkpoint& ck, const std::string& recorded, const std::string& fingerprint,
                         const NamedTensors& params) {
  if (recorded == fingerprint) return true;
  return ck.version == 1 && recorded == model_fingerprint_short_basis(params);
}

void load_parameters(const NamedTensors& params, const TensorFile& file, const std::string& origin) {
  for (const auto& [name, p] : params) {
    auto it = file.tensors.find(name);
    if (it == file.tensors.end())
      throw CheckpointError("'" + origin + "' lacks tensor '" + name + "' that the model needs (a different model shape?)");
    if (it->second.sizes() != p.sizes())
      throw CheckpointError("'" + origin + "': tensor '" + name + "' has shape " + c10::str(it->second.sizes()) +
                            " but the model expects " + c10::str(p.sizes()) + " (a checkpoint of another model shape)");
  }
  if (file.tensors.size() != params.size()) {
    for (const auto& [name, t] : file.tensors) {
      bool known = false;
      for (const auto& pp : params) known |= pp.first == name;
      if (!known) throw CheckpointError("'" + origin + "' has tensor '" + name + "' that the model does not (a different model shape?)");
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    torch::Tensor dst = p;
    dst.copy_(file.tensors.at(name));
  }
}

TensorFile parameters_to_file(const NamedTensors& params) {
  TensorFile f;
  for (const auto& [name, p] : params) f.tensors[name] = p.detach().to(torch::kCPU).clone();
  return f;
}

}  // namespace deloco

static_assert(deloco::kCheckpointVersion == 2, "update Checkpoint::version's default in deloco/checkpoint.h");
