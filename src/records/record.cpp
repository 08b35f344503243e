#include "records/record.h"

#include "records/kinds.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "deloco/error.h"
#include "util/text.h"

namespace deloco::rec {

std::string clip_text(const std::string& s, size_t max) { return clip_utf8(s, max); }

std::string record_kind(const nlohmann::json& j) {
  if (!j.is_object()) return {};
  auto k = j.find("kind");
  return k != j.end() && k->is_string() ? k->get<std::string>() : std::string();
}

nlohmann::json suppressed_record(const std::string& kind, const std::string& key) {
  return {{"kind", (kind.empty() ? std::string("record") : kind) + "_suppressed"}, {"reason", key},
          {"detail", "more than 20 in 10 s; still counted"}};
}

nlohmann::json done_record(const nlohmann::json& summary, bool stopped) {
  nlohmann::json j = summary.is_object() ? summary : nlohmann::json::object();
  j["kind"] = "done";
  j["stopped"] = stopped;
  return j;
}

namespace {
// All of `size` bytes at the end of the O_APPEND file `fd`; false with errno set on a failure.
bool append_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EIO;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}
}  // namespace

RecordWriter::RecordWriter(const std::string& path) : path_(path) {
  // Read access only to look at the last byte (a file we may only write is appended to without that check).
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0 && errno == EACCES) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError("cannot open '" + path + "' for appending: " + std::strerror(errno));
  // A process killed mid-record left a line without its end: end it, so this process's first record is a line
  // of its own (readers skip the cut one) instead of glued to it and lost with it.
  struct stat st {};
  char last = '\n';
  if (::fstat(fd_, &st) == 0 && st.st_size > 0 && ::pread(fd_, &last, 1, st.st_size - 1) == 1 && last != '\n' &&
      !append_all(fd_, "\n", 1)) {
    const int err = errno;
    ::close(fd_);
    throw IoError("cannot append to '" + path + "': " + std::strerror(err));
  }
}

RecordWriter::~RecordWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void RecordWriter::write_json(const nlohmann::json& record) {
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line += '\n';
  std::lock_guard<std::mutex> lock(mu_);
  if (!append_all(fd_, line.data(), line.size()))
    throw IoError("cannot append a record to '" + path_ + "': " + std::strerror(errno));
}

RecordTailer::RecordTailer(std::string path, size_t max_line) : path_(std::move(path)), max_line_(max_line) {}

void RecordTailer::poll(const std::function<void(const std::string&)>& on_line,
                        const std::function<void(uint64_t)>& on_skip, const std::function<void()>& on_restart) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    // Another file at the path (rotated), or the same one cut shorter than what was read (truncated): read the
    // file from its start, dropping any unfinished line of the old one.
    const bool replaced = seen_ && (st.st_dev != dev_ || st.st_ino != ino_);
    const bool shrank = st.st_size < offset_;
    if (replaced || shrank) {
      offset_ = 0;
      partial_.clear();
      long_bytes_ = 0;
      ++restarts_;
      if (on_restart) on_restart();
    }
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    seen_ = true;
  }
  std::vector<char> buf(size_t{1} << 16);
  for (;;) {
    const ssize_t got = ::pread(fd, buf.data(), buf.size(), offset_);
    if (got <= 0) break;
    offset_ += got;
    const size_t n = static_cast<size_t>(got);
    for (size_t begin = 0; begin < n;) {
      const char* nl = static_cast<const char*>(std::memchr(buf.data() + begin, '\n', n - begin));
      const size_t end = nl ? static_cast<size_t>(nl - buf.data()) : n;
      const size_t len = end - begin;
      if (long_bytes_ > 0) {
        long_bytes_ += len;
      } else if (partial_.size() + len > max_line_) {
        long_bytes_ = partial_.size() + len;
        std::string().swap(partial_);
      } else {
        partial_.append(buf.data() + begin, len);
      }
      if (!nl) break;
      if (long_bytes_ > 0) {
        ++skipped_;
        const uint64_t bytes = long_bytes_;
        long_bytes_ = 0;
        if (on_skip) on_skip(bytes);
      } else {
        on_line(partial_);
      }
      if (partial_.capacity() > (size_t{64} << 10)) std::string().swap(partial_);  // a long line's buffer goes
      partial_.clear();
      begin = end + 1;
    }
  }
  ::close(fd);
}

}  // namespace deloco::rec
