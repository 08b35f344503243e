// train/muon.h — Muon (Jordan et al., 2024; at scale: Liu et al., "Muon is scalable", 2025), the inner optimizer of
// MuLoCo (Thérien et al., 2025): momentum on each hidden weight matrix, its update orthogonalised by a few
// Newton–Schulz steps (linalg/newton_schulz.h), scaled by the matrix's shape; AdamW for everything else.
//
// For a hidden matrix W (m×n) with gradient G (times the clipping coefficient), per step:
//   B ← μ·B + G                              (momentum; B starts at zero)
//   U = G + μ·B  (Nesterov)  or  U = B
//   O = NS_k(U / ‖U‖_F)                      (k quintic steps, in bf16 or fp32: orthogonalise())
//   W ← W·(1 − η·λ) − η·s(m, n)·O            (decoupled weight decay λ, then the step)
// with η = lr · muon_lr / train.lr (the schedule's warm-up and cosine, at Muon's own peak) and the scale
//   s = 0.2·√max(m, n)   ("rms", the default: O's RMS is ≈ 1/√max(m,n), so the step's RMS is 0.2, AdamW's typical
//                         one, and train.lr and train.weight_decay carry over from AdamW, as Liu et al. do), or
//   s = √max(1, m/n)     ("shape": Jordan's original scale, with its own learning rate ~0.02).
// Which matrices: every 2-D parameter except embeddings and the output head; those, and every 1-D parameter
// (biases, norm gains), take AdamW with train.lr, train.beta1/2 and train.weight_decay, as in the Muon and MuLoCo
// papers. The built-in GPT's names decide: wte, wpe and lm_head (a tied head is wte). A TorchScript model's names
// and shapes: a name containing wte, wpe, emb or head, or a dimension equal to the vocabulary (shape alone cannot
// tell a head [V, C] from a hidden matrix [4C, C] when V = 4C: such a model's hidden matrices go to AdamW too).
// Matrices of one shape are orthogonalised together in one batched pass.
#pragma once

#include <optional>
#include <vector>

#include "train/adamw.h"
#include "train/inner_optimizer.h"

namespace deloco {

struct MuonOptions {
  double lr_ratio = 1.0;       // Muon's peak learning rate over train.lr (train.muon_lr / train.lr)
  double momentum = 0.95;      // μ
  bool nesterov = true;
  int ns_steps = 5;
  at::ScalarType ns_dtype = at::kFloat;  // the Newton–Schulz iteration's dtype: kFloat or kBFloat16
  bool rms_scale = true;       // "rms" (0.2·√max(m,n)) or "shape" (√max(1, m/n))
  double weight_decay = 0.1;
};

// Whether Muon takes parameter `name` of shape `sizes` in a model with vocabulary `vocab`, the built-in GPT
// (model.kind = gpt) or a TorchScript model (see above).
bool muon_takes(const std::string& name, at::IntArrayRef sizes, int64_t vocab, bool builtin_gpt);

class Muon final : public InnerOptimizer {
 public:
  // use_muon[i]: params[i] goes to Muon (a 2-D tensor), else to AdamW (with `adam`).
  Muon(NamedTensors params, const std::vector<bool>& use_muon, AdamWOptions adam, MuonOptions opts);
  void step(double lr, double grad_scale = 1.0) override;
  void zero_grad() override;
  int64_t steps() const override { return adam_.steps(); }
  // AdamW's entries for its parameters, "muon_momentum/<name>" for Muon's, and "step".
  std::map<std::string, torch::Tensor> state() const override;
  void load_state(const std::map<std::string, torch::Tensor>& state) override;
  const char* name() const override { return "muon"; }
  // The Newton–Schulz dtype, settable once train.precision = auto has chosen (the trainer's first step).
  void set_ns_dtype(at::ScalarType t) { opts_.ns_dtype = t; }
  const MuonOptions& options() const { return opts_; }
  // The names Muon takes (the rest are AdamW's).
  std::vector<std::string> muon_names() const;

 private:
  NamedTensors muon_;          // Muon's matrices
  AdamW adam_;                 // the other parameters
  MuonOptions opts_;
  mutable std::vector<torch::Tensor> momentum_;  // allocated by the first step() or state()
  void allocate() const;
};

}  // namespace deloco
