#include "deloco/safetensors.h"
#include "safetensors_header.h"

#include <cstring>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "util/fs.h"

namespace deloco {
namespace {

void put_u64_le(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
}  // namespace

std::string encode_safetensors(const TensorFile& file) {
  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::vector<at::Tensor> blobs;
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    if (name == "__metadata__") throw SafetensorsError("tensor name '__metadata__' is reserved");
    const char* dt = safetensors_dtype_name(t.scalar_type());
    if (!dt) throw SafetensorsError("tensor '" + name + "' has a dtype safetensors cannot store");
    at::Tensor c = t.detach().to(torch::kCPU).contiguous();
    uint64_t nbytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", dt}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    blobs.push_back(c);
  }
  std::string h;
  try {
    h = header.dump();
  } catch (const nlohmann::json::exception& e) {  // a tensor name or metadata string that is not UTF-8
    throw SafetensorsError(std::string("cannot write a safetensors header: ") + e.what());
  }
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  std::string out;
  out.resize(8 + h.size() + offset);
  put_u64_le(out.data(), h.size());  // little-endian length, then the JSON header
  std::memcpy(out.data() + 8, h.data(), h.size());
  char* data = out.data() + 8 + h.size();
  for (const auto& c : blobs) {
    size_t nbytes = static_cast<size_t>(c.numel()) * c.element_size();
    if (nbytes) std::memcpy(data, c.data_ptr(), nbytes);
    data += nbytes;
  }
  return out;
}

TensorFile decode_safetensors(const std::string& bytes, const std::string& origin) {
  const SafetensorsHeader h = parse_safetensors_header(bytes.data(), bytes.size(), origin);
  const char* data = bytes.data() + h.data_start;
  TensorFile out;
  out.metadata = h.metadata;
  for (const auto& [name, e] : h.tensors) {
    at::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data + e.begin, e.end - e.begin);
    out.tensors[name] = t;
  }
  return out;
}

void save_safetensors(const std::string& path, const TensorFile& file) {
  write_file_atomic(path, encode_safetensors(file));
}

TensorFile load_safetensors(const std::string& path) {
  std::string bytes;
  try {
    bytes = read_file(path);
  } catch (const IoError& e) {
    throw SafetensorsError(e.what());
  }
  return decode_safetensors(bytes, path);
}

}  // namespace deloco
