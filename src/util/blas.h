// The BLAS library under libtorch, and the one setting deloco corrects in it.
//
// Debian's libtorch does its float32 matrix multiplications in OpenBLAS, which picks its kernels by CPU model when
// the library loads. A CPU model newer than the OpenBLAS release (OpenBLAS 0.3.21 in Debian 12 on an Emerald
// Rapids Xeon, for one) makes it fall back to its generic "Prescott" SSE3 kernels: 37 instead of 231 GFLOP/s on
// 2 cores of that machine, and a training step 2.5-3x slower, silently. deloco's CLI therefore asks OpenBLAS what
// it chose and, when that is a generic kernel on a CPU with AVX-512 (or AVX2 and FMA), starts itself again with
// OPENBLAS_CORETYPE naming the kernels the CPU can run. A user's own OPENBLAS_CORETYPE is always kept, and
// DELOCO_KEEP_BLAS_CORE=1 turns the correction off.
//
// These functions do no I/O beyond asking the loaded library; none needs libtorch.
#pragma once

#include <string>
#include <string_view>

namespace deloco {

// What the CPU can run, as far as the choice of BLAS kernels is concerned (cpuid plus OS support of the state).
struct CpuFeatures {
  bool avx512 = false;    // AVX-512 F, BW, DQ and VL
  bool avx2_fma = false;  // AVX2 and FMA3
};
CpuFeatures host_cpu_features();

// The kernel family OpenBLAS chose when it loaded ("Prescott", "SkylakeX", ...), or "" when this process has no
// OpenBLAS (another BLAS, or none).
std::string openblas_core_name();

// The OPENBLAS_CORETYPE to use instead of `chosen` on a CPU with `cpu`, or "" to keep `chosen`. Only a generic
// fallback (a kernel family older than the CPU's own vector units) is replaced: "SkylakeX" when the CPU has
// AVX-512, "Haswell" when it has AVX2 and FMA. Case-insensitive on `chosen`.
std::string better_openblas_core(std::string_view chosen, CpuFeatures cpu);

// One line for logs and summaries: the kernels in use, and, when deloco set them, what OpenBLAS had chosen
// ("SkylakeX (set by deloco; OpenBLAS chose Prescott)"). "" without OpenBLAS.
std::string blas_description();

// The environment variable through which the re-executed process learns what OpenBLAS first chose.
inline constexpr const char* kBlasFallbackEnv = "DELOCO_OPENBLAS_FALLBACK";

// Two libraries read their settings from the environment in constructors that run before main(), so the only way
// to change them is to set the variable and execute the program again, once, first thing in main() (the deloco CLI
// and the benchmarks that compare against it):
// - libgomp's OMP_WAIT_POLICY: spinning OpenMP workers halve the speed of two training threads on a two-core
//   machine, so PASSIVE when the user set none;
// - OpenBLAS's OPENBLAS_CORETYPE: the kernels the CPU runs when OpenBLAS fell back to generic ones (above) and the
//   user named none (DELOCO_KEEP_BLAS_CORE=1 keeps OpenBLAS's choice).
// Returns only when nothing had to change, or when exec failed (the program then continues as it is).
void reexec_with_tuned_environment(char** argv);

}  // namespace deloco
