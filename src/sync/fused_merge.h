// src/sync/fused_merge.h — the syncer's fused merge pass (private to src/sync; the caller is Syncer::merge in
// sync.cpp, which decides when it applies and proves it cannot overflow).
//
// One fragment, M contributions, the weighted-sum merges (mean, rda) and the outer step, in one cache-blocked pass
// over the fragment's flat fp32 layout: for each chunk of kFusedChunk elements it decodes every contribution
// straight from its wire payload (or reads its fp32 values) into an accumulator that stays in the L1 cache, adds
// the anchor correction (Σ_v C_v·(Θ − Θ^v), delta_anchor = global with older bases) and, under the delta broadcast,
// the residual (Σ_i c_i)·e_p (every Δ_i is anchored at Θ_p + e_p), and applies the outer rule:
//     g = s·acc,  b ← μ·b + g,  u = g + μ·b (nesterov) | b (heavy ball) | g (no momentum),  Θ' = Θ − η·u
// writing Θ' to a new buffer (Θ stays untouched: it becomes the history entry, or is dropped) and b in place.
// An rda tensor needs ‖Σ c_i Δ_i‖ before its scale s is known: a first pass over the rda tensors writes the
// accumulator to the new buffer and sums its squares; the second pass reads it back.
//
// Work is split into chunks independent of the thread count, and every sum is reduced in chunk order, so the
// result is bit-identical for any number of threads. The chunk loops are compiled for AVX-512 and AVX2+FMA as well
// as for generic x86-64 and picked at run time (__builtin_cpu_supports).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "wire/quantize_kernels.h"

namespace deloco::sync_detail {

constexpr int64_t kFusedChunk = 4096;  // elements per work item (16 KiB of accumulator: L1-resident)

// One contribution's Δ̂ over the fragment: a validated wire payload, or per tensor its fp32 values.
struct FusedSource {
  wire_kernels::View enc;               // enc.p != nullptr: the payload over the whole fragment
  std::vector<const float*> tensors;    // else: per tensor (fragment order), numel contiguous floats
};

// One tensor of the fragment, in flat order.
struct FusedTensor {
  int64_t offset = 0, numel = 0;
  bool rda = false;
  std::vector<float> coef;  // per source: c_i (mean: w_i; rda: w_i / ‖Δ_i‖, 0 for a zero Δ_i)
  // Anchor global with older bases: (Θ^v of this tensor, C_v = Σ c_i over the contributions with base v), one per
  // older base v in use; the accumulator gets C_v·(Θ − Θ^v).
  std::vector<std::pair<const float*, float>> hist;
  float residual_coef = 0;  // FusedJob::residual: Σ_i c_i; the accumulator gets residual_coef·e_p
  float* buf = nullptr;     // its momentum buffer, updated in place (FusedJob::momentum)
  double radius = 0;        // rda: Σ w_i ‖Δ_i‖
  float scale = 1;          // s (mean: 1; rda: radius / ‖dir‖, set by run_fused)
};

struct FusedJob {
  int64_t elements = 0;
  std::vector<FusedSource> sources;
  std::vector<FusedTensor> tensors;  // cover [0, elements) in order
  const float* theta = nullptr;      // Θ (read)
  const float* residual = nullptr;   // the delta broadcast's e_p over the fragment (read), or none
  float* theta_out = nullptr;        // Θ' (written; may not alias theta)
  bool momentum = false, nesterov = false;
  float lr = 0, mu = 0;
  int threads = 1;
};

struct FusedStats {
  double g_sumsq = 0;      // ‖g‖² over the fragment
  double theta_sumsq = 0;  // ‖Θ'‖²
  float theta_amax = 0;    // max |Θ'|
  float buf_amax = 0;      // max |b'| (0 without momentum)
};

// Runs both passes. Never throws once it has started writing (no allocation after its first write).
FusedStats run_fused(FusedJob& job);

// ‖Δ̂ + (Θ − Θ^v) + e‖² over one tensor (index t of the job's sources) in double: an rda weight's norm for a
// contribution anchored at the current Θ with an older base (hist_t = Θ^v of the tensor, else null) and/or at
// Θ_p + e_p under the delta broadcast (residual_t = e_p of the tensor, else null).
double fused_delta_sumsq(const FusedSource& s, size_t t, const FusedTensor& tensor, const float* theta_t,
                         const float* hist_t, const float* residual_t = nullptr);

// The instruction set the chunk loops run with here: "avx512", "avx2" or "generic".
const char* fused_isa();

}  // namespace deloco::sync_detail
