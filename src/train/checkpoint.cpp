#include "deloco/checkpoint.h"

#include <filesystem>
#include <unistd.h>

#include <torch/torch.h>

#include "deloco/fs.h"

namespace deloco {
namespace fs = std::filesystem;

void write_checkpoint(const std::string& dir, nlohmann::json manifest, const TensorFile& model,
                      const TensorFile* optimizer) {
  if (fs::exists(dir)) throw CheckpointError("checkpoint '" + dir + "' already exists; refusing to overwrite it");
  const fs::path target(dir);
  fs::create_directories(target.parent_path());
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    nlohmann::json files = nlohmann::json::object();
    auto put = [&](const std::string& name, const TensorFile& tf) {
      std::string bytes = encode_safetensors(tf);
      write_file_atomic((tmp / name).string(), bytes);
      files[name] = {{"bytes", bytes.size()}, {"fnv1a64", fnv1a64_hex(bytes.data(), bytes.size())}};
    };
    put("model.safetensors", model);
    if (optimizer) put("optimizer.safetensors", *optimizer);
    manifest["format"] = kCheckpointFormat;
    manifest["version"] = kCheckpointVersion;
    manifest["files"] = files;
    write_file_atomic((tmp / "manifest.json").string(), manifest.dump(2) + "\n");
    fsync_dir(tmp.string());
    rename_dir_atomic(tmp.string(), dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

std::string resolve_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  const fs::path latest = fs::path(path) / "latest";
  if (fs::exists(latest)) {
    std::string name = read_file(latest.string());
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    return (fs::path(path) / "checkpoints" / name).string();
  }
  if (!fs::exists(path)) throw CheckpointError("checkpoint '" + path + "' does not exist");
  throw CheckpointError("'" + path + "' is neither a checkpoint folder (no manifest.json) nor a run folder (no 'latest')");
}

Checkpoint read_checkpoint(const std::string& path, bool with_optimizer) {
  Checkpoint ck;
  ck.dir = resolve_checkpoint(path);
  const fs::path dir(ck.dir);
  const std::string manifest_path = (dir / "manifest.json").string();
  try {
    ck.manifest = nlohmann::json::parse(read_file(manifest_path));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint manifest '" + manifest_path + "' is not valid JSON: " + e.what());
  } catch (const IoError& e) {
    throw CheckpointError(std::string("checkpoint manifest cannot be read: ") + e.what());
  }
  if (!ck.manifest.is_object() || ck.manifest.value("format", "") != kCheckpointFormat)
    throw CheckpointError("'" + manifest_path + "' is not a deloco checkpoint manifest");
  if (ck.manifest.value("version", 0) > kCheckpointVersion)
    throw CheckpointError("'" + manifest_path + "' has version " + ck.manifest["version"].dump() +
                          ", newer than this deloco understands (" + std::to_string(kCheckpointVersion) + ")");
  auto load = [&](const std::string& name) {
    const std::string file = (dir / name).string();
    if (!ck.manifest.contains("files") || !ck.manifest["files"].contains(name))
      throw CheckpointError("manifest '" + manifest_path + "' does not list '" + name + "'");
    const auto& meta = ck.manifest["files"][name];
    std::string bytes;
    try {
      bytes = read_file(file);
    } catch (const IoError& e) {
      throw CheckpointError(e.what());
    }
    if (bytes.size() != meta.value("bytes", uint64_t{0}))
      throw CheckpointError("checkpoint file '" + file + "' has " + std::to_string(bytes.size()) + " bytes, the manifest says " +
                            meta["bytes"].dump() + " (truncated or replaced)");
    if (fnv1a64_hex(bytes.data(), bytes.size()) != meta.value("fnv1a64", ""))
      throw CheckpointError("checkpoint file '" + file + "' is corrupt: its hash does not match the manifest");
    return decode_safetensors(bytes, file);
  };
  ck.model = load("model.safetensors");
  if (with_optimizer && ck.manifest["files"].contains("optimizer.safetensors")) ck.optimizer = load("optimizer.safetensors");
  return ck;
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
