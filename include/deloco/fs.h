// deloco/fs.h — small file helpers with crash-safe writes.
//
// Contract: write_file_atomic writes to "<path>.tmp.<pid>", fsyncs it, renames it over `path` and fsyncs the
// directory, so a reader sees either the old file or the complete new one, never a torn file. All functions
// throw IoError naming the path on failure; none leave a temporary file behind on error.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "deloco/error.h"

namespace deloco {

class IoError : public Error {
 public:
  using Error::Error;
};

std::string read_file(const std::string& path);
void write_file_atomic(const std::string& path, const std::string& bytes);
// Renames directory `from` to `to` atomically (to must not exist) and fsyncs the parent.
void rename_dir_atomic(const std::string& from, const std::string& to);
void fsync_dir(const std::string& dir);
// fnv1a64() of deloco/wire.h over a byte range, written as 16 lowercase hex digits (integrity checks, not security).
std::string fnv1a64_hex(const void* data, size_t n);

}  // namespace deloco
