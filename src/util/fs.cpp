#include "util/fs.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace deloco {
namespace fs = std::filesystem;
namespace {

std::string errno_text() { return std::strerror(errno); }

class PosixFileOps : public FileOps {
 public:
  void make_dirs(const std::string& path) override {
    // The folders this call creates, outermost first: each new entry is made durable in its parent.
    std::vector<fs::path> created;
    std::error_code ec;
    for (fs::path p = fs::path(path).lexically_normal(); !p.empty() && !fs::exists(p, ec);
         p = p.has_relative_path() ? p.parent_path() : fs::path())
      created.insert(created.begin(), p);
    fs::create_directories(path, ec);
    if (ec) throw IoError("cannot create folder '" + path + "': " + ec.message());
    for (const fs::path& p : created) {
      const fs::path parent = p.parent_path();
      fsync_dir(parent.empty() ? "." : parent.string());
    }
  }

  void write_file(const std::string& path, const std::string& bytes) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw IoError("cannot create '" + path + "': " + errno_text());
    const char* p = bytes.data();
    size_t left = bytes.size();
    while (left > 0) {
      ssize_t w = ::write(fd, p, left);
      if (w < 0) {
        if (errno == EINTR) continue;
        std::string err = errno_text();
        ::close(fd);
        throw IoError("cannot write '" + path + "': " + err);
      }
      p += w;
      left -= static_cast<size_t>(w);
    }
    if (::close(fd) != 0) throw IoError("cannot write '" + path + "': " + errno_text());
  }

  void sync_file(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError("cannot open '" + path + "' to flush it: " + errno_text());
    if (::fsync(fd) != 0) {
      std::string err = errno_text();
      ::close(fd);
      throw IoError("cannot flush '" + path + "': " + err);
    }
    ::close(fd);
  }

  void sync_dir(const std::string& dir) override { fsync_dir(dir); }

  void rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      throw IoError("cannot rename '" + from + "' to '" + to + "': " + errno_text());
  }

  void remove_all(const std::string& path) override {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) throw IoError("cannot remove '" + path + "': " + ec.message());
  }
};

std::string parent_of(const std::string& path) {
  const std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 10) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

FileOps& real_file_ops() {
  static PosixFileOps ops;
  return ops;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open '" + path + "': " + errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw IoError("cannot read '" + path + "'");
  return ss.str();
}

void fsync_dir(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open folder '" + d + "' to flush it: " + errno_text());
  // A filesystem without directory fsync says EINVAL (or ENOTSUP): nothing more can be done there. Any other error
  // (EIO) means the entries written in it may not be durable: the caller must not count them committed.
  if (::fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP && errno != EOPNOTSUPP) {
    const std::string err = errno_text();
    ::close(fd);
    throw IoError("cannot flush folder '" + d + "': " + err);
  }
  ::close(fd);
}

std::string temp_name_for(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

bool is_stale_temp_name(const std::string& name, const std::string& stem) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || !all_digits(name.substr(at + 5))) return false;
  if (stem.empty() ? (name.size() < 2 || name[0] != '.' || at < 2) : name.substr(0, at) != stem) return false;
  const long pid = std::stol(name.substr(at + 5));
  if (pid == static_cast<long>(::getpid())) return true;  // ours: a write of this process that did not finish
  if (pid <= 0) return true;
  // Another process's: garbage once that process is gone (ESRCH). A live one (or one we may not signal) may
  // still be writing it.
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

void write_file_atomic(const std::string& path, const std::string& bytes, FileOps& ops) {
  const std::string tmp = temp_name_for(path);
  try {
    ops.write_file(tmp, bytes);
    ops.sync_file(tmp);
    ops.rename(tmp, path);
  } catch (const IoError&) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  ops.sync_dir(parent_of(path));
}

}  // namespace deloco
