// src/merge/methods.h — internal: one factory per merge method (each defined in its own file) and the small
// linear-algebra helpers they share.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deloco/merge.h"

namespace deloco::merge_detail {

std::unique_ptr<Merger> make_mean(const MergeOptions& o);
std::unique_ptr<Merger> make_rda(const MergeOptions& o);
std::unique_ptr<Merger> make_iso_c(const MergeOptions& o);
std::unique_ptr<Merger> make_iso_c_fast(const MergeOptions& o);
std::unique_ptr<Merger> make_iso_c_ns(const MergeOptions& o);
std::unique_ptr<Merger> make_iso_cts(const MergeOptions& o);
std::unique_ptr<Merger> make_tsv(const MergeOptions& o);
std::unique_ptr<Merger> make_ties(const MergeOptions& o);
std::unique_ptr<Merger> make_dare(const MergeOptions& o);

// Σ w_i x_i.
at::Tensor weighted_sum(const std::vector<at::Tensor>& xs, const std::vector<double>& w);
// A power of two near max|x| (1 for an all-zero or non-finite x): dividing by it is exact, so a method that works on
// x / scale and multiplies back gives bit-identical results at ordinary magnitudes, and no square it forms
// (a Gram matrix, a norm's sum of squares) overflows or underflows at extreme ones.
double pow2_scale(const at::Tensor& x);
// Relative threshold below which a singular value counts as zero: max(m,n)·eps(dtype of m).
double rank_tolerance(const at::Tensor& matrix);
// Number of singular values (sorted descending) above rank_tolerance·S[0]; 0 for an all-zero matrix.
int64_t numerical_rank(const at::Tensor& S, const at::Tensor& matrix);
// The orthogonal factor P·Qᵀ of A = P D Qᵀ (columns made orthonormal while staying as close to A as possible);
// columns in A's numerical null space are dropped.
at::Tensor orthogonalize_columns(const at::Tensor& A);
// iso_c_ns: the K = steps odd quintics (a, b, c) of p(x) = a·x + b·x³ + c·x⁵, applied in order (iso_c_ns.cpp);
// `cushioned`: bf16's schedule, whose steps map no value of their band's top decade below a tenth of the top.
std::vector<std::array<double, 3>> iso_ns_schedule(int steps, bool cushioned = false);

}  // namespace deloco::merge_detail
