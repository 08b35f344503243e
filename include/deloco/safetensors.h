// deloco/safetensors.h — reading and writing the safetensors format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__":
// {str: str}}, then the raw little-endian tensor bytes. Files written here load with `safetensors.torch.load_file`
// and with the few lines of Python in docs/checkpoints.md.
//
// Contract
//  * save_safetensors writes contiguous CPU copies of the given tensors, names in sorted order, atomically
//    (temp file, fsync, rename): a crash leaves the old file or the new one. Supported dtypes: F64, F32, F16,
//    BF16, I64, I32, I16, I8, U8, BOOL.
//  * load_safetensors validates everything it reads before trusting it: header length within the file and below
//    100 MiB, valid JSON, known dtypes, non-negative shapes whose byte size equals the offsets, offsets inside
//    the data section and not overlapping. Any violation throws SafetensorsError naming the file and the tensor.
//  * Returned tensors are CPU tensors that own their memory.
#pragma once

#include <map>
#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>

#include "deloco/error.h"

namespace deloco {

struct TensorFile {
  std::map<std::string, at::Tensor> tensors;        // sorted by name
  std::map<std::string, std::string> metadata;      // the "__metadata__" object
};

// The safetensors name of a dtype ("F32", "BF16", ...), or nullptr when the format cannot store it.
const char* safetensors_dtype_name(at::ScalarType t);
// Parses a safetensors dtype name; false when unknown.
bool safetensors_dtype_from_name(const std::string& name, at::ScalarType* out);

// Serialises to bytes (no I/O), e.g. for hashing or sending.
std::string encode_safetensors(const TensorFile& file);
// Parses bytes; `origin` names the source in errors.
TensorFile decode_safetensors(const std::string& bytes, const std::string& origin);

void save_safetensors(const std::string& path, const TensorFile& file);
TensorFile load_safetensors(const std::string& path);

}  // namespace deloco
