// model/kernels.h — fused element-wise pieces of the GPT's training step, as autograd functions.
//
// libtorch 1.13 computes the GPT's non-matmul work as chains of separate ATen operations, each a pass over memory
// (and, under bf16 autocast, casts between them): the attention's scaling, causal mask and softmax are four passes
// forward and three backward over the [B, nh, T, T] scores; the loss writes the whole log-softmax [B·T, V]; the
// residual add, the layer norm after it and autocast's bf16 copy of its output are three passes. ATen's kernels
// run at AVX2 at most in Debian's libtorch. Each function here does one of those chains in one pass per direction,
// with a hand-written backward:
//
//   causal_softmax(s, scale)  softmax over the last dim of scale · s with entries j > i masked out (row i of each
//                             T×T block; s [..., T, T]): softmax(masked_fill(s·scale, triu(1), -inf), -1).
//   gelu(x)                   exact GELU, x · Φ(x) (torch::gelu without approximation). Not used by the GPT:
//                             on a Zen 4 it measured 0.6-1.0x ATen's GELU (bench/fused_step.cpp --kernels), which
//                             is already vectorised and cheap next to its erf; kept measurable.
//   layer_norm(x, w, b, eps, out)  layer_norm(x)·w + b over the last dim (x float32), written as `out`
//                             (float32 or bf16: under bf16 autocast the bf16 copy the next linear would make);
//   add_layer_norm(x, r, ...) h = x + r (r float32 or bf16) and layer_norm(h)·w + b: the residual add and the
//                             norm after it in one pass, {h (float32), y (`out`)}.
//   cross_entropy(logits, t)  mean over rows of −log softmax(logits)[t] (logits [N, V], t [N] int64), float32,
//                             computed in float32 whatever the logits' dtype.
//
// Contract
//  * Values are those of the ATen compositions named above to float32 rounding (the fused exp/erf have a relative
//    error of a few 1e-7; sums run in another order); bf16 inputs are read as float32 and results written back as bf16 (rounded to nearest
//    even), so a bf16 output differs from ATen's only by that final rounding. Gradients are exact derivatives of
//    the same functions, written in the input's dtype.
//  * The fused loops run for contiguous CPU tensors of float32 or bfloat16, vectorised with AVX-512 when the CPU
//    has it (chosen at run time; the binary targets generic x86-64) and portable C++ otherwise, split across
//    intra-op threads. Other devices, dtypes or layouts run the ATen composition (same autograd results).
//  * kernels::avx512_active() says which loops run; set_avx512(false) forces the portable ones (tests).
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

namespace deloco::kernels {

at::Tensor causal_softmax(const at::Tensor& scores, double scale);
at::Tensor gelu(const at::Tensor& x);
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets);
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, at::ScalarType out);
std::pair<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& w,
                                                 const at::Tensor& b, double eps, at::ScalarType out);

// The ATen compositions the fused functions replace (the unfused path and the tests' reference).
at::Tensor causal_softmax_reference(const at::Tensor& scores, double scale);
at::Tensor cross_entropy_reference(const at::Tensor& logits, const at::Tensor& targets);

bool avx512_active();
void set_avx512(bool on);  // on: only where the CPU has it

}  // namespace deloco::kernels
