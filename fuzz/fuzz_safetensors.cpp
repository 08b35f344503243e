// libFuzzer target: the safetensors header validator (src/io/safetensors_header.h), the one both the in-memory
// reader and the mmap reader of checkpoint merging trust before touching tensor bytes.
//
// Input: a whole file image. Properties: only SafetensorsError escapes; an accepted header's tensors lie inside the
// file, do not overlap, and hold exactly shape × element-size bytes (computed here in 128-bit arithmetic, so a
// product that wraps in 64 bits cannot slip through).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "deloco/safetensors.h"
#include "io/safetensors_header.h"

namespace {
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_safetensors: property violated: %s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  deloco::SafetensorsHeader h;
  try {
    h = deloco::parse_safetensors_header(reinterpret_cast<const char*>(data), size, "fuzz.safetensors");
  } catch (const deloco::SafetensorsError&) {
    return 0;
  }
  if (h.data_start > size) fail("data section starts past the end");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, e] : h.tensors) {
    unsigned __int128 n = 1;
    for (int64_t d : e.shape) {
      if (d < 0) fail("negative dimension accepted");
      n *= static_cast<unsigned __int128>(d);
      if (n > (static_cast<unsigned __int128>(1) << 64)) break;  // certainly wrong if accepted; checked below
    }
    const unsigned __int128 bytes = n * c10::elementSize(e.dtype);
    if (e.begin > e.end || e.end > size - h.data_start) fail("tensor outside the data section");
    if (bytes != e.end - e.begin) fail("tensor byte count differs from shape × element size");
    ranges.emplace_back(e.begin, e.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) fail("overlapping tensors accepted");
  return 0;
}
