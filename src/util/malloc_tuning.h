// util/malloc_tuning.h — keeping freed memory in the process, the other setting deloco corrects at start-up.
//
// glibc's malloc returns freed memory to the kernel eagerly: a block of 128 KiB or more is its own mmap, unmapped
// when freed, and the heap's free top is trimmed past 128 KiB (the thresholds adapt upward only up to 32 MiB).
// A training step frees and allocates the same activation and gradient buffers every step, so every step faults
// those pages in again and the kernel zeroes them. On the science suite's 4.24M-parameter bf16 model that was two
// thirds of a step's time (bench/malloc_tuning.sh). Keeping freed memory costs nothing in peak memory: the process
// reuses what it needed at its peak instead of giving it back between steps.
//
// Contract
//  * tune_malloc_for_training() sets glibc's M_MMAP_THRESHOLD to 1 GiB and M_TRIM_THRESHOLD to 2 GiB - 1, unless
//    the user chose malloc settings (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_,
//    MALLOC_MMAP_MAX_, or glibc.malloc tunables in GLIBC_TUNABLES) or set DELOCO_KEEP_MALLOC=1, or the C library
//    is not glibc. Call it once, early in main(); it is idempotent. Never throws.
//  * malloc_environment(): the same setting for a program deloco starts that is not deloco (a learner command of
//    `deloco run`, which is usually a PyTorch loop: 1.6x faster steps measured on the Llama example at 4 x 256),
//    as the environment assignments glibc reads at start-up ("MALLOC_MMAP_THRESHOLD_=...", ...); empty when
//    tune_malloc_for_training() would leave malloc alone (the user's own settings, DELOCO_KEEP_MALLOC=1, no glibc).
//    Reads only the environment.
//  * malloc_description(): one line for logs and summaries: what tune_malloc_for_training() did and, when it did
//    nothing, why ("glibc defaults (DELOCO_KEEP_MALLOC=1)"). "" before any call.
#pragma once

#include <string>
#include <vector>

namespace deloco {

void tune_malloc_for_training();
std::vector<std::string> malloc_environment();
std::string malloc_description();

}  // namespace deloco
