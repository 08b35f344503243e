// Checkpoint folders and run folders on disk (contract and commit protocol in src/util/checkpoint_store.h).
#include "util/checkpoint_store.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "util/text.h"

namespace deloco {
namespace fs = std::filesystem;
namespace {

void check_name(const std::string& name) {
  if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos || name.find(".tmp.") != std::string::npos)
    throw CheckpointError("'" + name + "' cannot name a checkpoint folder (a plain name not starting with '.')");
}

std::string pid_suffix() { return ".tmp." + std::to_string(::getpid()); }

// Entries of a folder (names only), or none when it does not exist.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return out;
    throw IoError("cannot list '" + dir.string() + "': " + ec.message());
  }
  for (; it != end; it.increment(ec)) {
    if (ec) throw IoError("cannot list '" + dir.string() + "': " + ec.message());
    out.push_back(it->path().filename().string());
  }
  return out;
}

}  // namespace

void write_checkpoint_folder(const std::string& dir, const nlohmann::json& manifest, const CheckpointFiles& files,
                             int64_t sequence, FileOps& ops) {
  const fs::path target(dir);
  const std::string name = target.filename().string();
  check_name(name);
  std::error_code ec;
  if (fs::exists(target, ec)) throw CheckpointError("checkpoint '" + dir + "' already exists; refusing to overwrite it");
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const fs::path tmp = parent / ("." + name + pid_suffix());
  ops.make_dirs(parent.string());
  ops.remove_all(tmp.string());  // a leftover of an earlier attempt of this process
  ops.make_dirs(tmp.string());
  try {
    std::map<std::string, ManifestFile> records;
    for (const auto& [file, bytes] : files) {
      check_name(file);
      if (file == "manifest.json") throw CheckpointError("'manifest.json' is reserved in a checkpoint folder");
      const std::string path = (tmp / file).string();
      ops.write_file(path, bytes);
      ops.sync_file(path);
      records[file] = describe_checkpoint_file(bytes);
    }
    const std::string mpath = (tmp / "manifest.json").string();
    ops.write_file(mpath, render_checkpoint_manifest(manifest, sequence, records));
    ops.sync_file(mpath);
    ops.sync_dir(tmp.string());
    ops.rename(tmp.string(), dir);  // the commit
  } catch (const Error&) {
    // An error (not a crash): leave no temporary behind. A crash leaves it for recovery.
    std::error_code rm;
    fs::remove_all(tmp, rm);
    throw;
  }
  ops.sync_dir(parent.string());
}

bool has_committed_checkpoint(const std::string& run) {
  try {
    for (const std::string& name : entries(fs::path(run) / "checkpoints")) {
      std::error_code ec;
      if (name[0] != '.' && fs::exists(fs::path(run) / "checkpoints" / name / "manifest.json", ec)) return true;
    }
  } catch (const IoError&) {
  }
  return false;
}

CheckpointManifest read_checkpoint_manifest(const std::string& path) {
  std::string text;
  try {
    text = read_file(path);
  } catch (const IoError& e) {
    throw CheckpointError(std::string("checkpoint manifest cannot be read: ") + e.what());
  }
  return parse_checkpoint_manifest(text, path);
}

std::vector<CommittedCheckpoint> list_checkpoints(const std::string& run) {
  const fs::path root = fs::path(run) / "checkpoints";
  std::vector<CommittedCheckpoint> out;
  for (const std::string& name : entries(root)) {
    if (name[0] == '.') continue;  // temporaries (uncommitted or being pruned)
    const fs::path dir = root / name;
    const fs::path mpath = dir / "manifest.json";
    std::error_code ec;
    if (!fs::is_directory(dir, ec) || !fs::exists(mpath, ec)) continue;
    const CheckpointManifest m = read_checkpoint_manifest(mpath.string());
    out.push_back({name, dir.string(), m.sequence});
  }
  std::sort(out.begin(), out.end(), [](const CommittedCheckpoint& a, const CommittedCheckpoint& b) {
    return a.sequence != b.sequence ? a.sequence < b.sequence : a.name < b.name;
  });
  return out;
}

std::optional<CommittedCheckpoint> newest_checkpoint(const std::string& run) {
  auto all = list_checkpoints(run);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::optional<CommittedCheckpoint> recover_run_folder(const std::string& run, FileOps& ops) {
  const fs::path root = fs::path(run) / "checkpoints";
  for (const std::string& name : entries(root))
    if (is_stale_temp_name(name, "")) ops.remove_all((root / name).string());
  for (const std::string& name : entries(fs::path(run)))
    if (is_stale_temp_name(name, "latest")) ops.remove_all((fs::path(run) / name).string());
  auto newest = newest_checkpoint(run);
  const fs::path latest = fs::path(run) / "latest";
  std::error_code ec;
  const bool have_latest = fs::exists(latest, ec);
  if (newest) {
    std::string hint;
    if (have_latest) {
      try {
        hint = trim_space(read_file(latest.string()));
      } catch (const IoError&) {
      }
    }
    if (hint != newest->name) write_file_atomic(latest.string(), newest->name + "\n", ops);
  } else if (have_latest) {
    ops.remove_all(latest.string());
    ops.sync_dir(run);
  }
  return newest;
}

CommittedCheckpoint commit_run_checkpoint(const std::string& run, const std::string& base_name,
                                          const nlohmann::json& manifest, const CheckpointFiles& files, int64_t keep,
                                          FileOps& ops) {
  check_name(base_name);
  recover_run_folder(run, ops);
  const fs::path root = fs::path(run) / "checkpoints";
  const auto before = list_checkpoints(run);
  const int64_t sequence = before.empty() ? 1 : before.back().sequence + 1;
  std::string name = base_name;
  std::error_code ec;
  if (fs::exists(root / name, ec)) name = base_name + "-s" + std::to_string(sequence);
  if (fs::exists(root / name, ec))
    throw CheckpointError("cannot name the checkpoint of sequence " + std::to_string(sequence) + ": '" +
                          (root / name).string() + "' exists too");
  write_checkpoint_folder((root / name).string(), manifest, files, sequence, ops);
  write_file_atomic((fs::path(run) / "latest").string(), name + "\n", ops);
  CommittedCheckpoint made{name, (root / name).string(), sequence};
  if (keep > 0) {
    std::vector<CommittedCheckpoint> all = before;
    all.push_back(made);
    for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
      const std::string doomed = (root / ("." + all[i].name + ".pruned" + pid_suffix())).string();
      ops.rename(all[i].dir, doomed);  // atomic: the checkpoint is whole or gone, never half deleted
      ops.remove_all(doomed);
    }
  }
  return made;
}

}  // namespace deloco
