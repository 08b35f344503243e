#include "util/blas.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>

namespace deloco {

CpuFeatures host_cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // libgcc sets these only when the OS saves the vector state too (xgetbv), so a masked AVX-512 reads false.
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return f;
}

std::string openblas_core_name() {
  // Looked up at run time: deloco does not link OpenBLAS itself, libtorch's BLAS may be another library.
  using CoreName = char* (*)();
  auto fn = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (fn == nullptr) return "";
  const char* name = fn();
  return name != nullptr ? std::string(name) : std::string();
}

std::string better_openblas_core(std::string_view chosen, CpuFeatures cpu) {
  std::string lower(chosen);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  // OpenBLAS's x86 fallbacks when it does not know a CPU model: the pre-AVX families.
  static constexpr std::array<std::string_view, 12> kGeneric = {"prescott", "katmai",  "coppermine", "northwood",
                                                                "banias",   "core2",   "penryn",     "dunnington",
                                                                "nehalem",  "atom",    "generic",    "unknown"};
  if (std::find(kGeneric.begin(), kGeneric.end(), lower) == kGeneric.end()) return "";
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return "";
}

std::string blas_description() {
  const std::string core = openblas_core_name();
  if (core.empty()) return "";
  std::string out = "OpenBLAS " + core;
  if (const char* was = std::getenv(kBlasFallbackEnv); was != nullptr && *was != '\0')
    out += " (set by deloco; OpenBLAS chose " + std::string(was) + ")";
  return out;
}

void reexec_with_tuned_environment(char** argv) {
  bool changed = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    changed = true;
  }
  const char* keep = std::getenv("DELOCO_KEEP_BLAS_CORE");
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && (keep == nullptr || std::strcmp(keep, "1") != 0)) {
    const std::string chosen = openblas_core_name();
    const std::string better = better_openblas_core(chosen, host_cpu_features());
    if (!better.empty()) {
      ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
      ::setenv(kBlasFallbackEnv, chosen.c_str(), 1);  // so logs can say what was corrected
      changed = true;
    }
  }
  if (changed) ::execv("/proc/self/exe", argv);
}

}  // namespace deloco
