#include "deloco/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "deloco/wire.h"

namespace deloco {
namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open '" + path + "': " + errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw IoError("cannot read '" + path + "'");
  return ss.str();
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some filesystems refuse directory fsync
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  namespace fs = std::filesystem;
  fs::path target(path);
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("cannot create '" + tmp + "': " + errno_text());
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      std::string err = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IoError("cannot write '" + tmp + "': " + err);
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw IoError("cannot flush '" + tmp + "': " + err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw IoError("cannot rename '" + tmp + "' to '" + path + "': " + err);
  }
  fsync_dir(target.parent_path().string());
}

void rename_dir_atomic(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw IoError("cannot rename '" + from + "' to '" + to + "': " + errno_text());
  fsync_dir(std::filesystem::path(to).parent_path().string());
}

std::string fnv1a64_hex(const void* data, size_t n) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fnv1a64(data, n)));
  return buf;
}

}  // namespace deloco
