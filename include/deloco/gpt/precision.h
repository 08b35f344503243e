// deloco/gpt/precision.h — train.precision = "auto": choose the training compute precision by measuring it.
//
// bfloat16 pays only where the machine's matrix units run it faster than float32 (AMX, tensor cores); on a CPU
// without them a bf16 matrix product can run at half the float32 rate, and the same setting then slows training
// down. resolve_precision() times float32 and bfloat16 matrix products at the model's own matrix shapes on the
// training device, alternately, and picks bf16 only where it is faster by a margin.
//
// Contract
//  * setting "fp32" or "bf16": returned as chosen, nothing measured (measured = false, rates 0).
//  * setting "auto": measures (measured = true) and chooses "bf16" iff bf16_gflops ≥ margin × fp32_gflops. The
//    probe runs the distinct (rows × in) · (in × out) products of `shapes`, each weighted by how often it occurs,
//    rows capped so one pass stays cheap; it takes a fraction of a second on a CPU and is cached per process for
//    the same device, shapes and thread count (learners in one process agree).
//  * Any other setting: throws ConfigError naming train.precision.
//  * The rates are what the process would get: at the current intra-op thread count (set it first).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace deloco {

struct PrecisionChoice {
  std::string setting;      // as configured: fp32 | bf16 | auto
  std::string chosen;       // what the training forward computes in: fp32 | bf16
  bool measured = false;    // the probe ran (setting auto)
  double fp32_gflops = 0;   // measured matmul rates at the model's shapes (0 when not measured)
  double bf16_gflops = 0;
  double probe_seconds = 0; // wall time of the probe
  // One line for logs: "fp32 (auto: bf16 matmul 61 GFLOP/s, fp32 118 GFLOP/s at the model's shapes)".
  std::string describe() const;
};

// A matrix product the model's forward runs: rows × in times in × out.
using MatmulShape = std::array<int64_t, 3>;

// The forward's matrix products of a model whose 2-D parameters (weights stored out × in, as torch.nn.Linear and
// embeddings) are `weight_shapes`, for `rows` = batch × context tokens.
std::vector<MatmulShape> forward_matmuls(const std::vector<std::array<int64_t, 2>>& weight_shapes, int64_t rows);

constexpr double kBf16Margin = 1.1;  // bf16 must be this much faster to be chosen

PrecisionChoice resolve_precision(const std::string& setting, const std::vector<MatmulShape>& shapes,
                                  const c10::Device& device, double margin = kBf16Margin);

}  // namespace deloco
