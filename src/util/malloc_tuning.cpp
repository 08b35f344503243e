#include "util/malloc_tuning.h"

#include <climits>
#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace deloco {
namespace {

std::string& description() {
  static std::string d;
  return d;
}

bool set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

constexpr int kMmapThreshold = 1 << 30;  // blocks below 1 GiB come from the heap and return to it
constexpr int kTrimThreshold = INT_MAX;  // the heap's free top is kept up to 2 GiB

// Why malloc is left alone, or nullptr when deloco sets it.
const char* reason_to_keep() {
  const char* keep = std::getenv("DELOCO_KEEP_MALLOC");
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (keep != nullptr && std::strcmp(keep, "1") == 0) return "malloc defaults (DELOCO_KEEP_MALLOC=1)";
  if (set("MALLOC_MMAP_THRESHOLD_") || set("MALLOC_TRIM_THRESHOLD_") || set("MALLOC_TOP_PAD_") ||
      set("MALLOC_MMAP_MAX_") || (tunables != nullptr && std::strstr(tunables, "glibc.malloc") != nullptr))
    return "malloc as the environment sets it";
#if !defined(__GLIBC__)
  return "malloc defaults (not glibc)";
#endif
  return nullptr;
}

}  // namespace

void tune_malloc_for_training() {
  std::string& d = description();
  if (!d.empty()) return;
  if (const char* why = reason_to_keep()) {
    d = why;
    return;
  }
#if defined(__GLIBC__)
  const bool ok = ::mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && ::mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
  d = ok ? "malloc keeps freed memory (set by deloco)" : "malloc defaults (glibc refused the thresholds)";
#endif
}

std::vector<std::string> malloc_environment() {
  if (reason_to_keep() != nullptr) return {};
  return {"MALLOC_MMAP_THRESHOLD_=" + std::to_string(kMmapThreshold),
          "MALLOC_TRIM_THRESHOLD_=" + std::to_string(kTrimThreshold)};
}

std::string malloc_description() { return description(); }

}  // namespace deloco
