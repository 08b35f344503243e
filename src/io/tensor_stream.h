// src/io/tensor_stream.h — streaming access to safetensors files for checkpoint merging (merge_checkpoints(),
// `deloco merge`), so a merge holds only the tensors in flight instead of whole models.
//
//  * MappedSafetensors maps a file read-only and validates its header up front (header length, JSON, known
//    dtypes, shapes matching the byte ranges, ranges inside the file); errors throw SafetensorsError naming the
//    file and tensor. tensor(name) returns an owned CPU copy of one tensor. Thread-safe after construction.
//  * SafetensorsStreamWriter lays out the header for a known list of tensors, then accepts the tensors in any
//    order from any thread (pwrite at precomputed offsets). commit() fsyncs and atomically renames the
//    temporary file over `path`; if commit() is never reached the temporary file is removed.
// Both assume a little-endian host, like the rest of deloco's safetensors code.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "io/safetensors_header.h"

namespace deloco {

using TensorInfo = SafetensorsEntry;  // dtype, shape, byte range inside the data section

class MappedSafetensors {
 public:
  explicit MappedSafetensors(const std::string& path);
  ~MappedSafetensors();
  MappedSafetensors(const MappedSafetensors&) = delete;
  MappedSafetensors& operator=(const MappedSafetensors&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& index() const { return index_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_size() const { return size_; }
  const char* file_bytes() const { return base_; }  // the whole file, mapped (file_size() bytes)
  at::Tensor tensor(const std::string& name) const;  // throws SafetensorsError for an unknown name

 private:
  std::string path_;
  const char* base_ = nullptr;
  uint64_t size_ = 0, data_start_ = 0;
  std::map<std::string, TensorInfo> index_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsStreamWriter {
 public:
  SafetensorsStreamWriter(const std::string& path, const std::map<std::string, TensorInfo>& layout,
                          const std::map<std::string, std::string>& metadata);
  ~SafetensorsStreamWriter();
  void write(const std::string& name, const at::Tensor& t);  // dtype and shape must match the layout
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> layout_;
  bool committed_ = false;
};


}  // namespace deloco
