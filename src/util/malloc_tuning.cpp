#include "deloco/malloc_tuning.h"

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

}  // namespace

void tune_malloc_for_training() {
  std::string& d = description();
  if (!d.empty()) return;
  const char* keep = std::getenv("DELOCO_KEEP_MALLOC");
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (keep != nullptr && std::strcmp(keep, "1") == 0) {
    d = "malloc defaults (DELOCO_KEEP_MALLOC=1)";
  } else if (set("MALLOC_MMAP_THRESHOLD_") || set("MALLOC_TRIM_THRESHOLD_") || set("MALLOC_TOP_PAD_") ||
             set("MALLOC_MMAP_MAX_") || (tunables != nullptr && std::strstr(tunables, "glibc.malloc") != nullptr)) {
    d = "malloc as the environment sets it";
  } else {
#if defined(__GLIBC__)
    const bool ok = ::mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1 && ::mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
    d = ok ? "malloc keeps freed memory (set by deloco)" : "malloc defaults (glibc refused the thresholds)";
#else
    d = "malloc defaults (not glibc)";
#endif
  }
}

std::string malloc_description() { return description(); }

}  // namespace deloco
