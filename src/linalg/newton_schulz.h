// linalg/newton_schulz.h — odd matrix polynomials by Newton–Schulz-type iterations: the one implementation behind
// Muon's orthogonalised step (train/muon.h) and the SVD-free Iso-C merge (merge iso_c_ns).
//
// An odd polynomial p(σ) = aσ + bσ³ + cσ⁵ applied to a matrix X = U S Vᵀ means U p(S) Vᵀ: every singular value goes
// through p, the singular vectors stay put. With G the Gram matrix of X's smaller side it costs three products:
//   wide X (m ≤ n): G = X Xᵀ (m×m), X ← (aI + bG + cG²) X
//   tall X (m > n): G = XᵀX (n×n), X ← X (aI + bG + cG²)
// A schedule of such steps drives every singular value in (0, 1] towards 1 (X towards its polar factor U Vᵀ) when
// the caller has scaled X so that σ_max ≤ 1 (or a little over, for schedules designed with a margin).
//
// Contract
//  * X is [..., m, n]: a single matrix or a batch of matrices of one shape (every product is a batched matmul, so a
//    model's matrices of one shape go through in one call). Any floating dtype and device; the iteration runs in
//    X's dtype. Returns a new tensor of X's shape and dtype; X is not modified.
//  * first_gram / first_gram_sq: G and G² of X (the smaller side's, as above) when the caller has computed them
//    already (Iso-C's normalisation needs them); the first step then reuses them. Both or neither.
//  * Exact zero directions stay zero (p(0) = 0); non-finite input gives non-finite output (callers check).
#pragma once

#include <array>
#include <vector>

#include <ATen/ATen.h>

namespace deloco::linalg {

struct OddQuintic {
  double a = 0, b = 0, c = 0;  // p(σ) = aσ + bσ³ + cσ⁵
};

// Applies each step of `schedule` in turn (see above).
at::Tensor odd_quintic_steps(const at::Tensor& X, const std::vector<OddQuintic>& schedule,
                             const at::Tensor& first_gram = {}, const at::Tensor& first_gram_sq = {});

// Muon's schedule (Jordan et al., 2024): `steps` repetitions of the quintic (3.4445, −4.7750, 2.0315), chosen for
// the fastest growth of small singular values (slope 3.4 at 0) at the price of not converging exactly: singular
// values end in roughly [0.7, 1.2], which is all an optimizer step needs.
std::vector<OddQuintic> muon_schedule(int steps);

// Muon's orthogonalisation of a batch [..., m, n]: each matrix divided by its Frobenius norm (+1e-7, so σ_max ≤ 1),
// cast to `dtype` (bf16 or float32) for the iteration, `steps` quintic steps, cast back to X's dtype.
at::Tensor orthogonalise(const at::Tensor& X, int steps, at::ScalarType dtype);

// Matrix-product flops of `steps` steps on a [m, n] matrix: per step 2·k²·l (the Gram), 2·k³ (its square) and
// 2·k²·l (the product with X), k = min(m, n), l = max(m, n).
double odd_quintic_flops(int64_t m, int64_t n, int steps);

}  // namespace deloco::linalg
