// tests/support/fault_file_ops.h — a FileOps (util/fs.h) that "crashes" after its k-th operation, for proving
// crash safety the way leveldb's fault-injection Env does (header-only).
//
// FaultFileOps performs operations on the real file system until `crash_after` of them have succeeded; the next
// one, and every one after it, throws SimulatedCrash without doing anything, as if the process had died there
// (SimulatedCrash is no std::exception, so no handler of the code under test swallows it). crash_after < 0 never
// crashes: run the sequence once like that to learn its length N from ops(), then once for every k in 0..N.
//
// With lose_unsynced, the crash is a power loss instead: what was not made durable is lost. Renames whose
// destination folder was not fsynced (sync_dir) since are undone, newest first (a replaced file comes back, kept
// meanwhile in `scratch`), and files written but never fsynced (sync_file) lose their contents (truncated to 0).
// Removals and folder creations count as durable at once (a lost removal would only bring back something
// recovery deletes or ignores).
#pragma once

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "util/fs.h"

namespace deloco::test {

struct SimulatedCrash {
  int64_t after_ops;
};

class FaultFileOps : public FileOps {
 public:
  explicit FaultFileOps(int64_t crash_after, bool lose_unsynced = false, std::string scratch = "")
      : crash_after_(crash_after), lose_unsynced_(lose_unsynced), scratch_(std::move(scratch)) {}

  int64_t ops() const { return done_; }
  bool crashed() const { return crashed_; }
  const std::vector<std::string>& log() const { return log_; }

  void make_dirs(const std::string& path) override {
    step("make_dirs " + path);
    real_file_ops().make_dirs(path);
  }
  void write_file(const std::string& path, const std::string& bytes) override {
    step("write_file " + path);
    real_file_ops().write_file(path, bytes);
    unsynced_.insert(path);
  }
  void sync_file(const std::string& path) override {
    step("sync_file " + path);
    real_file_ops().sync_file(path);
    unsynced_.erase(path);
  }
  void sync_dir(const std::string& dir) override {
    step("sync_dir " + dir);
    real_file_ops().sync_dir(dir);
    const std::string d = norm(dir);
    std::vector<Rename> keep;
    for (auto& r : renames_)
      if (norm(parent(r.to)) != d) keep.push_back(r);
    renames_.swap(keep);
  }
  void rename(const std::string& from, const std::string& to) override {
    step("rename " + from + " -> " + to);
    Rename r{from, to, ""};
    namespace fs = std::filesystem;
    if (lose_unsynced_ && fs::exists(to) && !fs::is_directory(to)) {
      r.backup = scratch_ + "/backup." + std::to_string(done_);
      fs::copy_file(to, r.backup, fs::copy_options::overwrite_existing);
    }
    real_file_ops().rename(from, to);
    renames_.push_back(r);
    // Unsynced files move with their names (a file, or the files inside a renamed folder).
    std::set<std::string> moved;
    for (const auto& u : unsynced_)
      moved.insert(u == from ? to : (u.rfind(from + "/", 0) == 0 ? to + u.substr(from.size()) : u));
    unsynced_.swap(moved);
  }
  void remove_all(const std::string& path) override {
    step("remove_all " + path);
    real_file_ops().remove_all(path);
  }

 private:
  struct Rename {
    std::string from, to, backup;
  };

  static std::string parent(const std::string& p) {
    const std::string s = std::filesystem::path(p).parent_path().string();
    return s.empty() ? "." : s;
  }
  static std::string norm(const std::string& p) { return std::filesystem::path(p).lexically_normal().string(); }

  void step(const std::string& what) {
    if (crashed_ || (crash_after_ >= 0 && done_ >= crash_after_)) {
      if (!crashed_ && lose_unsynced_) power_loss();
      crashed_ = true;
      throw SimulatedCrash{done_};
    }
    ++done_;
    log_.push_back(what);
  }

  void power_loss() {
    namespace fs = std::filesystem;
    for (const auto& u : unsynced_)
      if (fs::exists(u) && fs::is_regular_file(u)) fs::resize_file(u, 0);
    for (auto it = renames_.rbegin(); it != renames_.rend(); ++it) {
      if (!fs::exists(it->to) || fs::exists(it->from)) continue;
      fs::rename(it->to, it->from);
      if (!it->backup.empty()) fs::rename(it->backup, it->to);
    }
  }

  int64_t crash_after_;
  bool lose_unsynced_;
  std::string scratch_;
  int64_t done_ = 0;
  bool crashed_ = false;
  std::vector<std::string> log_;
  std::set<std::string> unsynced_;
  std::vector<Rename> renames_;
};

}  // namespace deloco::test
