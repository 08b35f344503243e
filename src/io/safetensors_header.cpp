// The one validator of safetensors headers (contract in safetensors_header.h) and the dtype names. Uses nothing of
// libtorch beyond c10/core/ScalarType.h, so it can be built alone (fuzzing).
#include "safetensors_header.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "deloco/safetensors.h"
#include "util/checked.h"

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

uint64_t get_u64_le(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// A JSON value for an error message: strings and numbers as they are (strings cut), anything else by its type.
std::string shown(const nlohmann::json& j) {
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    return "\"" + (s.size() > 40 ? s.substr(0, 40) + "..." : s) + "\"";
  }
  if (j.is_number() || j.is_boolean() || j.is_null()) return j.dump();
  return std::string("(") + j.type_name() + ")";
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

SafetensorsHeader parse_safetensors_header(const char* bytes, uint64_t size, const std::string& origin) {
  auto fail = [&](const std::string& what) { throw SafetensorsError("'" + origin + "' is not a valid safetensors file: " + what); };
  if (size < 8) fail("shorter than the 8-byte header length (truncated?)");
  const uint64_t n = get_u64_le(bytes);
  if (n > kMaxHeaderBytes) fail("header length " + std::to_string(n) + " exceeds the 100 MiB bound");
  if (n > size - 8) fail("header length " + std::to_string(n) + " runs past the end of the file (truncated?)");
  const nlohmann::json header = nlohmann::json::parse(bytes + 8, bytes + 8 + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) fail("header is not valid JSON");
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
    const auto& dtype = e["dtype"];
    if (!dtype.is_string() || !safetensors_dtype_from_name(dtype.get_ref<const std::string&>(), &entry.dtype))
      fail("tensor '" + name + "' has an unsupported dtype " + shown(dtype));
    if (!e["shape"].is_array()) fail("tensor '" + name + "' has a shape that is not a list");
    // Checked arithmetic: a shape whose element count or byte size exceeds 2^63 must not wrap to a small number
    // that happens to match the byte range (shape [2^62] F32 with 0 bytes). The product of the non-zero
    // dimensions is bounded too, so an empty tensor's strides cannot overflow either.
    uint64_t extent = 1;
    bool empty = false;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        fail("tensor '" + name + "' has a dimension " + shown(d) + " that is not a non-negative 64-bit integer");
      const uint64_t v = d.get<uint64_t>();
      if (v == 0) empty = true;
      else if (!checked_mul(extent, v, &extent) || extent > static_cast<uint64_t>(INT64_MAX))
        fail("tensor '" + name + "' has a shape whose element count overflows 64 bits");
      entry.shape.push_back(static_cast<int64_t>(v));
    }
    uint64_t nbytes = 0;
    if (!checked_mul(extent, c10::elementSize(entry.dtype), &nbytes) || nbytes > static_cast<uint64_t>(INT64_MAX))
      fail("tensor '" + name + "' has a shape whose byte size overflows 64 bits");
    if (empty) nbytes = 0;
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("tensor '" + name + "' has malformed data_offsets");
    entry.begin = off[0].get<uint64_t>();
    entry.end = off[1].get<uint64_t>();
    if (entry.begin > entry.end || entry.end > data_size)
      fail("tensor '" + name + "' lies outside the data section (truncated file?)");
    if (entry.end - entry.begin != nbytes)
      fail("tensor '" + name + "' has " + std::to_string(entry.end - entry.begin) + " bytes but its shape needs " +
           std::to_string(nbytes));
    ranges.emplace_back(entry.begin, entry.end);
    out.tensors[name] = std::move(entry);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) fail("two tensors overlap in the data section");
  return out;
}

}  // namespace deloco
