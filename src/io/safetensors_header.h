// src/io/safetensors_header.h — the one validator of safetensors headers, shared by the in-memory reader
// (safetensors.cpp) and the streaming mmap reader of checkpoint merging (src/io/tensor_stream.cpp).
//
// Contract: parse_safetensors_header() reads the 8-byte length and the JSON header of a file image of `size`
// bytes and checks every field before trusting it: the length bound (100 MiB) and that it fits the file, JSON
// object, __metadata__ of strings, each tensor's dtype (deloco/safetensors.h table), non-negative integer shape
// whose element count and byte size are computed with overflow-checked arithmetic (src/util/checked.h) and stay
// below 2^63, data_offsets inside the data section and matching that byte size, and no two tensors overlapping.
// Any failure throws SafetensorsError "'<origin>' is not a valid safetensors file: <what>" (a deloco::Error); no
// input makes it throw anything else (std::bad_alloc aside) or read outside [data, data + size). Pure.
// This header and its implementation (safetensors_header.cpp) need nothing of libtorch beyond
// c10/core/ScalarType.h (and the error class of deloco/safetensors.h), so a fuzzer can call it cheaply.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

namespace deloco {

struct SafetensorsEntry {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data section
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // offset of the data section in the file
};

SafetensorsHeader parse_safetensors_header(const char* data, uint64_t size, const std::string& origin);

}  // namespace deloco
