// iso_c_ns: the iso_c target σ̄·U Vᵀ, σ̄ = (1/r)·Σ_{i≤r} σ_i (r = min(m,n)), by a Newton–Schulz-type polynomial
// iteration: matrix products only, no SVD and no eigendecomposition.
//
// For the wide view X (m ≤ n; a tall matrix is transposed, so every Gram matrix is r×r with r = min(m,n)):
//  1. Normalise. X₀ = X / max|x| (no overflow in the Gram products), A = X₀X₀ᵀ, B = A·A and
//     s = ‖B‖_F^{1/4} = (Σ σ_i⁸)^{1/8} ≥ σ_max, a safe bound (no power-iteration guess) that is much tighter
//     than ‖X‖_F and free: step 1 needs A and B anyway. Then Y = X₀/s, A /= s², B /= s⁴, all σ_i(Y) ∈ [0, 1].
//  2. Iterate K odd quintics Y ← (a I + b A + c B)·Y, A = YYᵀ, B = A·A (linalg::odd_quintic_steps, the iteration
//     Muon uses too): every singular value goes through p(σ) = aσ + bσ³ + cσ⁵ while the singular vectors stay put.
//  3. σ̄ = ⟨O, X⟩_F / r with O = Y (for the exact polar factor ⟨U Vᵀ, U S Vᵀ⟩_F = Σσ_i), result σ̄·O.
//
// The schedule (docs/merge.md "iso_c_ns"): K − 2 minimax steps, then two steps of the fixed quintic
// (15x − 10x³ + 3x⁵)/8 (p(1) = 1, p'(1) = p''(1) = 0: third-order convergence). The minimax steps are the greedy
// optimum on the current band: step j minimises max|1 − p(σ)| over [ℓ_j, u_j] (an LP on a dense grid, computed
// by `bench/merge_reference.py ns-coefficients`, our own derivation) and the next band is p's range, widened by
// 2 % at the top for round-off. The first step is designed for the lowest ℓ₀ that K − 2 steps bring to within
// 0.1 of 1 (ℓ₀ = 2.8e-4 for K = 8, 1.7e-5 for K = 10; each further step lowers it ≈ 4.2×); the later steps are
// the same for every K. The two tail steps take that band to 1 within ~1e-8, so on [ℓ₀·s, s] only round-off
// remains. Singular values below ℓ₀·s are still multiplied by ≈ 8.3 in step 1 and ≈ 4.2 in each later growth
// step but do not reach 1: they are what the error against iso_c consists of, √(Σ_i (1 − p_K(σ_i/s))²/r).
//
// Precision (MergeOptions::iso_ns_dtype): fp32 (default; fp64 when the compute dtype is fp64) or bf16 for the
// iteration. The scaling (max|x|, s, σ̄ and the product σ̄·O) is always in the compute dtype. bf16 rounds every
// iterate to 8 significant bits, so a direction whose singular value falls below ~2⁻⁸ of the top one is lost in
// the others' rounding. The minimax steps above dip inside their band: a first step designed for a tiny ℓ₀ maps
// x ≈ 0.84 to ≈ 8.3·ℓ₀ (2.3e-3 for K = 8), and a flat spectrum (small or square matrices, σ_max/s ≈ 0.85) puts
// its largest directions there, where bf16 loses them: 30–70 % off at K ≥ 6 (docs/merge.md). bf16 therefore runs
// its own, cushioned schedule (kBf16): each minimax step is fitted on [max(ℓ, u/10), u] only, so no step maps a
// value of its band's top decade below a tenth of the top; the values below u/10 grow by the step's slope (3.78
// at 0 against 4.17, so ℓ₀ is ≈ 1.5× higher at K = 8). fp32 keeps the steeper schedule: its round-off (~1e-7) is
// far below the dips, and it stays at ~1e-5 above ℓ₀.
//
// Degenerate inputs: an all-zero matrix gives zeros; exact null directions stay exactly null (p(0) = 0), so
// on a rank-deficient M the result is σ̄·U_k V_kᵀ like iso_c_fast (relative gap √((r − k)/r) to iso_c, whose
// completion is the SVD routine's arbitrary choice) — in fp32 and fp64. Numerically null directions (σ ~
// eps·σ_max, rounding noise) are lifted like any small singular value, by ~10⁴ in 8 steps; in bf16 the rounding
// of every iterate fills the null space with such noise (~2⁻⁹ of the top), so there the result leaves M's range. NaN/Inf inputs are refused by Merger::merge(); a non-finite
// scale is reported here. iso_rank_threshold is not applied (there is no spectrum to cut): it is ignored, as by
// iso_cts.
#include <array>
#include <cmath>
#include <vector>

#include <torch/torch.h>

#include "linalg/newton_schulz.h"
#include "merge/methods.h"

namespace deloco::merge_detail {
namespace {

struct Quintic {
  double a, b, c;
};

// First step for 1..9 minimax steps (index = steps − 1); it depends on the design limit ℓ₀ noted.
constexpr Quintic kFirst[] = {
    {3.34497051, -5.38546518, 3.08240916},   // ℓ₀ = 0.32
    {5.84199693, -14.3781733, 9.79745299},   // 0.084
    {7.55499184, -20.8201955, 14.7031748},   // 0.021
    {8.14232618, -23.0454661, 16.4033402},   // 4.9e-3
    {8.29727968, -23.6334692, 16.8528995},   // 1.2e-3
    {8.33529698, -23.7777842, 16.9632523},   // 2.8e-4
    {8.34445653, -23.8125581, 16.9898444},   // 6.8e-5
    {8.34665663, -23.8209108, 16.9962319},   // 1.7e-5
    {8.34718899, -23.8229319, 16.9977775},   // 4.0e-6
};
// The greedy continuation: a schedule with k minimax steps uses kFirst[k−1] and then the last k − 1 of these.
// (From ℓ₀ up the bands are nested, so these are shared by every k ≤ 9 to within 1e-5; beyond 9, kRest[0] —
// the steady growth step, ≈ 4.17× at 0 — is repeated at the front, lowering ℓ₀ by ≈ 4.17× per step.)
constexpr Quintic kRest[] = {
    {4.17339693, -2.97776071, 0.531175908}, {4.17251521, -2.97718397, 0.531115246},
    {4.16883641, -2.97476539, 0.530857582}, {4.15356114, -2.96470959, 0.529784346},
    {4.09128821, -2.92361661, 0.525400632}, {3.85507055, -2.7661805, 0.508632756},
    {3.16634036, -2.28925684, 0.458246323}, {2.20384589, -1.54025235, 0.38268353},
};
// bf16's cushioned schedule (the same generator with cushion 10): k ≥ 2 minimax steps are kBf16Lead (fitted on
// [0.102, 1.02]), k − 2 of kBf16Grow (the steady step, fitted on [u/10, u]), kBf16Last; ℓ₀ = 0.086, 0.023, 6.0e-3,
// 1.6e-3, 4.2e-4, 1.1e-4, 2.9e-5 for k = 2..8 (K = k + 2 steps with the tail).
constexpr Quintic kBf16Lead = {5.49381829, -13.0829121, 8.81585222};
constexpr Quintic kBf16Grow = {3.77993282, -4.26121841, 1.35929354};
constexpr Quintic kBf16Last = {2.30145287, -1.75409292, 0.475268729};
constexpr Quintic kTail = {15.0 / 8, -10.0 / 8, 3.0 / 8};
constexpr int kTailSteps = 2;

}  // namespace

std::vector<std::array<double, 3>> iso_ns_schedule(int steps, bool cushioned) {
  std::vector<Quintic> s;
  const int body = steps - kTailSteps;
  if (cushioned && body >= 2) {
    s.push_back(kBf16Lead);
    for (int i = 2; i < body; ++i) s.push_back(kBf16Grow);
    s.push_back(kBf16Last);
  } else if (body >= 1) {
    const int first = std::min(body, 9);
    s.push_back(kFirst[first - 1]);
    for (int i = 9; i < body; ++i) s.push_back(kRest[0]);
    const int rest = first - 1, nrest = static_cast<int>(std::size(kRest));
    for (int i = nrest - rest; i < nrest; ++i) s.push_back(kRest[i]);
  } else if (steps >= 1) {
    s.push_back(kFirst[0]);  // one or two steps: the widest-band design, then the tail
  }
  while (static_cast<int>(s.size()) < steps) s.push_back(kTail);
  std::vector<std::array<double, 3>> out;
  for (const auto& q : s) out.push_back({q.a, q.b, q.c});
  return out;
}

namespace {

class IsoCNs final : public Merger {
 public:
  IsoCNs(int steps, at::ScalarType iter_dtype) : iter_dtype_(iter_dtype) {
    for (const auto& q : iso_ns_schedule(steps, false)) schedule_.push_back({q[0], q[1], q[2]});
    for (const auto& q : iso_ns_schedule(steps, true)) cushioned_.push_back({q[0], q[1], q[2]});
  }
  const char* name() const override { return "iso_c_ns"; }
  bool needs_matrix() const override { return true; }

 protected:
  at::Tensor compute(const std::vector<at::Tensor>& d, const std::vector<double>& w, uint64_t) const override {
    at::Tensor M = weighted_sum(d, w);
    const bool tall = M.size(0) > M.size(1);
    at::Tensor X = tall ? M.t() : M;  // m ≤ n: every Gram matrix is r×r, r = min(m, n)
    const int64_t r = X.size(0);
    const double amax = X.abs().max().item<double>();
    if (!(amax > 0)) return at::zeros_like(M);
    // fp64 compute stays fp64; otherwise the option's dtype (fp32 or bf16) runs the iteration.
    const at::ScalarType it = X.scalar_type() == at::kDouble ? at::kDouble : iter_dtype_;
    at::Tensor Y = X.div(amax).to(it);
    at::Tensor A = at::matmul(Y, Y.t());
    at::Tensor B = at::matmul(A, A);
    const double s4 = at::linalg_vector_norm(B.to(X.scalar_type()), 2, c10::nullopt, false, c10::nullopt)
                          .item<double>();
    if (!std::isfinite(s4))
      throw MergeError("iso_c_ns: the normalisation bound is not finite (the Gram product overflowed)");
    if (!(s4 > 0)) return at::zeros_like(M);
    const double s = std::sqrt(std::sqrt(s4));
    Y.div_(s);
    A.div_(s * s);
    B.div_(s4);
    // The iteration itself is linalg's (shared with Muon); its first step reuses A and B.
    at::Tensor O = linalg::odd_quintic_steps(Y, it == at::kBFloat16 ? cushioned_ : schedule_, A, B).to(X.scalar_type());
    const double sbar = O.mul(X).sum().item<double>() / static_cast<double>(r);
    if (!std::isfinite(sbar))
      throw MergeError("iso_c_ns: the Newton-Schulz iteration did not stay finite (scale " + std::to_string(sbar) +
                       ")");
    O.mul_(sbar);
    return tall ? O.t().contiguous() : O;
  }

 private:
  std::vector<linalg::OddQuintic> schedule_;    // fp32 and fp64 iterations
  std::vector<linalg::OddQuintic> cushioned_;  // bf16's
  at::ScalarType iter_dtype_;
};

}  // namespace

std::unique_ptr<Merger> make_iso_c_ns(const MergeOptions& o) {
  // Default step counts from the measured accuracy (docs/merge.md): in fp32, 10 steps bring every real
  // pseudo-gradient tried within 4e-2 of iso_c (most within 1e-5); in bf16 more than 8 steps only add round-off.
  const int steps = o.iso_ns_steps > 0 ? o.iso_ns_steps : o.iso_ns_dtype == at::kBFloat16 ? 8 : 10;
  return std::make_unique<IsoCNs>(steps, o.iso_ns_dtype);
}

}  // namespace deloco::merge_detail
