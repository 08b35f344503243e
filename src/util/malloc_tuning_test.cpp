// Each case runs in a freshly executed process (a "threadsafe" death test), so each sees malloc as a program starts.
#include "util/malloc_tuning.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// AddressSanitizer brings its own allocator: glibc's thresholds and mallinfo2() mean nothing under it.
#if defined(__SANITIZE_ADDRESS__)
#define DELOCO_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DELOCO_UNDER_ASAN 1
#endif
#endif

namespace deloco {
namespace malloc_tuning_cases {

// Runs `body` in a fresh process; the test passes when it returns true there.
template <typename F>
void in_fresh_process(F body) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(body() ? 0 : 1), ::testing::ExitedWithCode(0), "");
}

#if defined(__GLIBC__) && !defined(DELOCO_UNDER_ASAN)
// Allocates and frees a 16 MiB block; returns how many bytes of it malloc served by mmap (0 when from the heap),
// and through `kept` whether the freed block stayed in the process (free bytes of the heap grew by its size).
char* volatile sink = nullptr;

size_t mapped_bytes_of_a_16mib_block(bool* kept) {
  constexpr size_t kSize = 16u << 20;
  const size_t mapped_before = mallinfo2().hblkhd;
  char* p = static_cast<char*>(std::malloc(kSize));
  std::memset(p, 1, kSize);
  sink = p;  // so the compiler cannot drop the allocation
  const size_t mapped = mallinfo2().hblkhd - mapped_before;
  const size_t free_before = mallinfo2().fordblks;
  std::free(p);
  *kept = mallinfo2().fordblks >= free_before + kSize;
  return mapped;
}

TEST(MallocTuning, WithoutItABigBlockIsMappedAndGivenBack) {
  in_fresh_process([] {
    bool kept = true;
    return mapped_bytes_of_a_16mib_block(&kept) >= (16u << 20) && !kept;
  });
}

TEST(MallocTuning, ABigBlockComesFromTheHeapAndStaysAfterFree) {
  in_fresh_process([] {
    ::unsetenv("DELOCO_KEEP_MALLOC");
    ::unsetenv("GLIBC_TUNABLES");
    tune_malloc_for_training();
    bool kept = false;
    return malloc_description() == "malloc keeps freed memory (set by deloco)" &&
           mapped_bytes_of_a_16mib_block(&kept) == 0 && kept;
  });
}

TEST(MallocTuning, KeepMallocLeavesTheDefaults) {
  in_fresh_process([] {
    ::setenv("DELOCO_KEEP_MALLOC", "1", 1);
    tune_malloc_for_training();
    bool kept = true;
    return malloc_description() == "malloc defaults (DELOCO_KEEP_MALLOC=1)" &&
           mapped_bytes_of_a_16mib_block(&kept) >= (16u << 20) && !kept;
  });
}

TEST(MallocTuning, OtherProgramsGetTheSameSettingThroughTheirEnvironment) {
  in_fresh_process([] {
    ::unsetenv("DELOCO_KEEP_MALLOC");
    ::unsetenv("GLIBC_TUNABLES");
    const std::vector<std::string> want = {"MALLOC_MMAP_THRESHOLD_=1073741824", "MALLOC_TRIM_THRESHOLD_=2147483647"};
    const bool given = malloc_environment() == want;
    ::setenv("DELOCO_KEEP_MALLOC", "1", 1);
    const bool kept = malloc_environment().empty();
    ::unsetenv("DELOCO_KEEP_MALLOC");
    ::setenv("MALLOC_TOP_PAD_", "4096", 1);
    const bool users = malloc_environment().empty();
    return given && kept && users;
  });
}

#endif

TEST(MallocTuning, TheUsersOwnSettingsAreKept) {
  in_fresh_process([] {
    ::unsetenv("DELOCO_KEEP_MALLOC");
    ::setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000", 1);
    tune_malloc_for_training();
    tune_malloc_for_training();  // idempotent
    return malloc_description() == "malloc as the environment sets it";
  });
}

}  // namespace
}  // namespace deloco
