#include "io/tensor_stream.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/safetensors.h"
#include "util/checked.h"
#include "util/fs.h"

namespace deloco {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw SafetensorsError(path + ": " + what);
}

}  // namespace


MappedSafetensors::MappedSafetensors(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail(path, "too short to be a safetensors file");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) fail(path, std::string("mmap failed: ") + std::strerror(errno));
  base_ = static_cast<const char*>(p);
  try {
    // The one header validator (src/io/safetensors_header.h) checks every field against the mapped file's size.
    SafetensorsHeader h = parse_safetensors_header(base_, size_, path);
    data_start_ = h.data_start;
    index_ = std::move(h.tensors);
    metadata_ = std::move(h.metadata);
  } catch (...) {
    ::munmap(const_cast<char*>(base_), size_);
    base_ = nullptr;
    throw;
  }
}

MappedSafetensors::~MappedSafetensors() {
  if (base_) ::munmap(const_cast<char*>(base_), size_);
}

at::Tensor MappedSafetensors::tensor(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail(path_, "no tensor named '" + name + "'");
  const TensorInfo& info = it->second;
  at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(info.dtype));
  if (info.end > info.begin) std::memcpy(t.data_ptr(), base_ + data_start_ + info.begin, info.end - info.begin);
  return t;
}

SafetensorsStreamWriter::SafetensorsStreamWriter(const std::string& path,
                                                 const std::map<std::string, TensorInfo>& layout,
                                                 const std::map<std::string, std::string>& metadata)
    : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())), layout_(layout) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (auto& [name, info] : layout_) {
    const char* dt = safetensors_dtype_name(info.dtype);
    if (!dt) throw SafetensorsError(path + ": tensor '" + name + "' has a dtype safetensors cannot store");
    uint64_t bytes = c10::elementSize(info.dtype);
    for (int64_t s : info.shape)
      if (s < 0 || !checked_mul(bytes, static_cast<uint64_t>(s), &bytes))
        throw SafetensorsError(path + ": tensor '" + name + "' has a negative or overflowing shape");
    info.begin = off;
    if (!checked_add(off, bytes, &off) || off > static_cast<uint64_t>(INT64_MAX) / 2)
      throw SafetensorsError(path + ": the tensors' total size overflows");
    info.end = off;
    h[name] = {{"dtype", dt}, {"shape", info.shape}, {"data_offsets", {info.begin, info.end}}};
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  data_start_ = 8 + header.size();
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(tmp_ + ": cannot create: " + std::strerror(errno));
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  if (::pwrite(fd_, len, 8, 0) != 8 ||
      ::pwrite(fd_, header.data(), header.size(), 8) != static_cast<ssize_t>(header.size()) ||
      ::ftruncate(fd_, static_cast<off_t>(data_start_ + off)) != 0)
    throw IoError(tmp_ + ": write failed: " + std::strerror(errno));
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void SafetensorsStreamWriter::write(const std::string& name, const at::Tensor& t) {
  auto it = layout_.find(name);
  if (it == layout_.end()) throw IoError(path_ + ": tensor '" + name + "' is not in the output layout");
  const TensorInfo& info = it->second;
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  if (c.scalar_type() != info.dtype || c.sizes() != at::IntArrayRef(info.shape))
    throw IoError(path_ + ": tensor '" + name + "' does not match the output layout");
  const char* p = static_cast<const char*>(c.data_ptr());
  uint64_t done = 0, n = info.end - info.begin;
  while (done < n) {
    ssize_t w = ::pwrite(fd_, p + done, n - done, static_cast<off_t>(data_start_ + info.begin + done));
    if (w <= 0) throw IoError(tmp_ + ": write failed: " + std::strerror(errno));
    done += static_cast<uint64_t>(w);
  }
}

void SafetensorsStreamWriter::commit() {
  if (::fsync(fd_) != 0) throw IoError(tmp_ + ": fsync failed: " + std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) throw IoError(path_ + ": rename failed: " + std::strerror(errno));
  committed_ = true;
  const size_t slash = path_.rfind('/');
  fsync_dir(slash == std::string::npos ? "." : path_.substr(0, slash == 0 ? 1 : slash));
}

}  // namespace deloco
