#include "deloco/safetensors.h"
#include "safetensors_header.h"

#include <cstring>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/fs.h"

namespace deloco {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
};
const DtypeInfo kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

void put_u64_le(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_u64_le(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

const char* safetensors_dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  return nullptr;
}

bool safetensors_dtype_from_name(const std::string& s, at::ScalarType* out) {
  for (const auto& d : kDtypes)
    if (s == d.name) {
      *out = d.type;
      return true;
    }
  return false;
}

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
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  std::string out;
  out.resize(8 + h.size() + offset);
  put_u64_le(out.data(), h.size());
  std::memcpy(out.data() + 8, h.data(), h.size());
  char* data = out.data() + 8 + h.size();
  for (const auto& c : blobs) {
    size_t nbytes = static_cast<size_t>(c.numel()) * c.element_size();
    if (nbytes) std::memcpy(data, c.data_ptr(), nbytes);
    data += nbytes;
  }
  return out;
}

SafetensorsHeader parse_safetensors_header(const char* bytes, uint64_t size, const std::string& origin) {
  auto fail = [&](const std::string& what) { throw SafetensorsError("'" + origin + "' is not a valid safetensors file: " + what); };
  if (size < 8) fail("shorter than the 8-byte header length (truncated?)");
  uint64_t n = get_u64_le(bytes);
  if (n > kMaxHeaderBytes) fail("header length " + std::to_string(n) + " exceeds the 100 MiB bound");
  if (n > size - 8) fail("header length " + std::to_string(n) + " runs past the end of the file (truncated?)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail("header is not a JSON object");
  SafetensorsHeader out;
  out.data_start = 8 + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) fail("__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) fail("__metadata__ value '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail("tensor '" + name + "' lacks dtype, shape or data_offsets");
    SafetensorsEntry entry;
    if (!e["dtype"].is_string() || !safetensors_dtype_from_name(e["dtype"].get<std::string>(), &entry.dtype))
      fail("tensor '" + name + "' has an unsupported dtype " + e["dtype"].dump());
    if (!e["shape"].is_array()) fail("tensor '" + name + "' has a shape that is not a list");
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail("tensor '" + name + "' has a negative or non-integer dimension");
      uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > (1ull << 62) / v) fail("tensor '" + name + "' is absurdly large");
      numel *= v;
      entry.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("tensor '" + name + "' has malformed data_offsets");
    entry.begin = off[0].get<uint64_t>();
    entry.end = off[1].get<uint64_t>();
    if (entry.begin > entry.end || entry.end > data_size)
      fail("tensor '" + name + "' lies outside the data section (truncated file?)");
    const uint64_t elem = c10::elementSize(entry.dtype);
    if (entry.end - entry.begin != numel * elem)
      fail("tensor '" + name + "' has " + std::to_string(entry.end - entry.begin) + " bytes but its shape needs " +
           std::to_string(numel * elem));
    ranges.emplace_back(entry.begin, entry.end);
    out.tensors[name] = std::move(entry);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) fail("two tensors overlap in the data section");
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
