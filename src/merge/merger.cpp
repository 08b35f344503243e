// Merger::merge — the checks and conversions every method shares — and the registry of methods by name.
#include <cmath>
#include <sstream>

#include <torch/torch.h>

#include "deloco/merge.h"
#include "deloco/wire.h"
#include "merge/methods.h"

namespace deloco {
namespace {

using Factory = std::unique_ptr<Merger> (*)(const MergeOptions&);
struct Entry {
  const char* name;
  Factory make;
};
const Entry kMethods[] = {
    {"mean", merge_detail::make_mean},         {"rda", merge_detail::make_rda},
    {"iso_c", merge_detail::make_iso_c},       {"iso_c_fast", merge_detail::make_iso_c_fast},
    {"iso_c_ns", merge_detail::make_iso_c_ns},
    {"iso_cts", merge_detail::make_iso_cts},   {"tsv", merge_detail::make_tsv},
    {"ties", merge_detail::make_ties},         {"dare", merge_detail::make_dare},
};

std::string where(const MergeInput& in) { return "tensor '" + in.name + "'"; }

uint64_t splitmix64_finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Per-tensor, per-round seed: 64-bit FNV-1a of the name mixed with the user seed (splitmix64 finaliser), then,
// for round ≠ 0, the round mixed in by one more finaliser step. Round 0 gives the streams of versions without
// rounds. For fixed (seed, name) distinct non-zero rounds give distinct seeds (each step is a bijection).
uint64_t tensor_seed(uint64_t seed, const std::string& name, uint64_t round) {
  const uint64_t h = fnv1a64(name.data(), name.size());
  uint64_t z = splitmix64_finalize(h + 0x9e3779b97f4a7c15ull * (seed + 1));
  if (round != 0) z = splitmix64_finalize(z + 0x9e3779b97f4a7c15ull * round);
  return z;
}

}  // namespace

void MergeOptions::validate() const {
  if (compute_dtype != at::kFloat && compute_dtype != at::kDouble)
    throw MergeError("merge compute dtype must be float32 or float64");
  if (!(ties_keep > 0.0 && ties_keep <= 1.0)) throw MergeError("ties_keep must be in (0, 1]");
  if (!(dare_drop >= 0.0 && dare_drop < 1.0)) throw MergeError("dare_drop must be in [0, 1)");
  if (!(iso_cts_common > 0.0 && iso_cts_common <= 1.0)) throw MergeError("iso_cts_common must be in (0, 1]");
  if (iso_fast_polish < 0 || iso_fast_polish > 10) throw MergeError("iso_fast_polish must be in [0, 10]");
  if (iso_ns_steps < 0 || iso_ns_steps > 30) throw MergeError("iso_ns_steps must be in [0, 30] (0 = by precision)");
  if (iso_ns_dtype != at::kFloat && iso_ns_dtype != at::kBFloat16)
    throw MergeError("iso_ns_precision must be fp32 or bf16");
  if (!(iso_rank_threshold >= 0.0 && iso_rank_threshold < 1.0))  // also rejects NaN and Inf
    throw MergeError("iso_rank_threshold must be finite and in [0, 1) (0 = off)");
}

at::Tensor Merger::merge(const MergeInput& in) const {
  const size_t T = in.deltas.size();
  if (T == 0) throw MergeError(where(in) + ": no contributions to merge (empty input list)");
  if (!in.weights.empty() && in.weights.size() != T) {
    std::ostringstream os;
    os << where(in) << ": " << in.weights.size() << " weights given for " << T << " contributions";
    throw MergeError(os.str());
  }
  const at::Tensor& first = in.deltas[0];
  for (size_t i = 0; i < T; ++i) {
    const at::Tensor& d = in.deltas[i];
    if (!d.defined()) throw MergeError(where(in) + ": contribution " + std::to_string(i) + " is undefined");
    if (!at::isFloatingType(d.scalar_type()))
      throw MergeError(where(in) + ": contribution " + std::to_string(i) + " is not a floating-point tensor");
    if (d.sizes() != first.sizes()) {
      std::ostringstream os;
      os << where(in) << ": contribution " << i << " has shape " << d.sizes() << " but contribution 0 has "
         << first.sizes();
      throw MergeError(os.str());
    }
    if (d.device() != first.device())
      throw MergeError(where(in) + ": contributions live on different devices");
    if (!at::isfinite(d).all().item<bool>())
      throw MergeError(where(in) + ": contribution " + std::to_string(i) + " contains NaN or Inf");
  }
  std::vector<double> w(T, 1.0 / static_cast<double>(T));
  if (!in.weights.empty()) {
    double sum = 0;
    for (size_t i = 0; i < T; ++i) {
      if (!std::isfinite(in.weights[i]) || in.weights[i] < 0)
        throw MergeError(where(in) + ": weight " + std::to_string(i) + " must be finite and >= 0");
      sum += in.weights[i];
    }
    if (!(sum > 0)) throw MergeError(where(in) + ": the weights sum to zero");
    for (size_t i = 0; i < T; ++i) w[i] = in.weights[i] / sum;
  }

  // Compute dtype: the option, but never below fp64 inputs' precision.
  at::ScalarType ct = first.scalar_type() == at::kDouble ? at::kDouble : compute_dtype_;
  const bool as_matrix = needs_matrix() && first.dim() >= 2;
  std::vector<at::Tensor> xs;
  xs.reserve(T);
  for (const auto& d : in.deltas) {
    at::Tensor x = d.detach().to(ct);
    if (as_matrix) x = x.reshape({x.size(0), -1});
    xs.push_back(x);
  }
  at::Tensor out;
  if (needs_matrix() && first.dim() < 2)
    out = merge_detail::weighted_sum(xs, w);
  else
    out = compute(xs, w, tensor_seed(seed_, in.name, in.round));
  if (!at::isfinite(out).all().item<bool>())
    throw MergeError(where(in) + ": method " + name() + " produced a non-finite value (please report)");
  return out.reshape(first.sizes()).to(first.scalar_type());
}

std::unique_ptr<Merger> make_merger(const std::string& name, const MergeOptions& opts) {
  opts.validate();
  for (const auto& e : kMethods)
    if (name == e.name) {
      auto m = e.make(opts);
      m->compute_dtype_ = opts.compute_dtype;
      m->seed_ = opts.seed;
      return m;
    }
  std::string known;
  for (const auto& e : kMethods) known += std::string(known.empty() ? "" : ", ") + e.name;
  throw MergeError("unknown merge method '" + name + "' (known: " + known + ")");
}

const std::vector<std::string>& merger_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& e : kMethods) v.push_back(e.name);
    return v;
  }();
  return names;
}

}  // namespace deloco
