// topk_bench: the sparse codec's cost at a model's size, side by side with int4 (issue 35, docs/wire.md).
//
// Usage: topk_bench [elements=4240000] [repeats=5] [chunk=4096] [normal|t3]
// One fragment of `elements` float outer-gradient values (normal, σ = 1e-3; t3: Student's t with 3 degrees of
// freedom, ×1e-3, heavy-tailed as pseudo-gradients are). For int4 and for top-k at 1%, 3% and 10% with 2-bit values
// (absmax, topk2), over the whole fragment and per chunk of `chunk` elements, and SparseLoCo's 2-bit bins (topk2b)
// at 3% per chunk: the learner's push (error feedback: y = x + residual, encode, decode, residual update — what
// LearnerCore does), the syncer's check (scan_floats: validate and measure) and decode into dense fp32, the payload
// bytes per element, and what the code does to the kept values of one push of x: their relative error
// (‖decoded − x‖ / ‖x‖ over the kept entries) and the fraction decoded as 0. Times are the median of `repeats`
// runs, in milliseconds. Uses only the torch-free codec code.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "deloco/wire.h"
#include "wire/quantize.h"
#include "wire/sparse.h"

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  using namespace deloco;
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4240000;
  const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  const int64_t chunk = argc > 3 ? std::atoll(argv[3]) : 4096;
  std::vector<float> x(n);
  std::mt19937 rng(1);
  const bool t3 = argc > 4 && std::string(argv[4]) == "t3";
  std::normal_distribution<float> g(0.f, 1e-3f);
  std::student_t_distribution<float> t(3.f);
  for (auto& v : x) v = t3 ? 1e-3f * t(rng) : g(rng);
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) { return 1e3 * std::chrono::duration<double>(b - a).count(); };
  std::printf("elements %zu (%s), median of %d, chunked top-k per %lld elements\n", n, t3 ? "t3" : "normal", repeats,
              static_cast<long long>(chunk));
  std::printf("%-22s %12s %10s %12s %12s %12s %10s %8s\n", "codec", "bytes", "B/elem", "push_ms", "check_ms",
              "decode_ms", "kept_err", "zeroed");
  struct Case {
    std::string name;
    Codec codec;
  };
  std::vector<Case> cases = {{"int4", Codec(Encoding::kInt4)}};
  for (double d : {0.01, 0.03, 0.1})
    for (int64_t c : {int64_t{0}, chunk}) {
      TopkOptions o;
      o.density = d;
      o.chunk = c;
      char name[64];
      std::snprintf(name, sizeof name, "topk2 %g%%%s", d * 100, c > 0 ? " chunked" : "");
      cases.push_back({name, Codec(Encoding::kTopk2, o)});
    }
  {
    TopkOptions o;
    o.density = 0.03;
    o.chunk = chunk;
    cases.push_back({"topk2b 3% chunked", Codec(Encoding::kTopk2b, o)});
  }
  std::vector<float> back(n);
  for (const Case& k : cases) {
    std::vector<double> push, check, decode;
    std::string payload;
    std::vector<float> residual(n, 0.f);
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = clock::now();
      payload = quantize_with_error_feedback(x.data(), residual.data(), n, k.codec);
      const auto t1 = clock::now();
      scan_floats(payload.data(), payload.size(), k.codec.encoding, n, {n});
      const auto t2 = clock::now();
      decode_floats_into(payload.data(), payload.size(), k.codec.encoding, n, back.data());
      const auto t3 = clock::now();
      push.push_back(ms(t0, t1));
      check.push_back(ms(t1, t2));
      decode.push_back(ms(t2, t3));
    }
    // One push of x alone: what the code does to the entries it keeps.
    const std::string one = encode_floats(x.data(), n, k.codec);
    double err = 0, norm = 0, kept = 0, zeroed = 0;
    if (is_sparse(k.codec.encoding)) {
      const SparseEntries s = decode_topk(one.data(), one.size(), k.codec.encoding, n);
      for (size_t j = 0; j < s.index.size(); ++j) {
        const double xi = x[s.index[j]], d = s.value[j];
        err += (d - xi) * (d - xi);
        norm += xi * xi;
        zeroed += d == 0.0;
      }
      kept = static_cast<double>(s.index.size());
    } else {
      decode_floats_into(one.data(), one.size(), k.codec.encoding, n, back.data());
      for (size_t i = 0; i < n; ++i) {
        err += (static_cast<double>(back[i]) - x[i]) * (static_cast<double>(back[i]) - x[i]);
        norm += static_cast<double>(x[i]) * x[i];
        zeroed += back[i] == 0.f && x[i] != 0.f;
      }
      kept = static_cast<double>(n);
    }
    std::printf("%-22s %12zu %10.4f %12.1f %12.1f %12.1f %10.3f %8.3f\n", k.name.c_str(), payload.size(),
                static_cast<double>(payload.size()) / static_cast<double>(n), median(push), median(check),
                median(decode), std::sqrt(err / norm), zeroed / kept);
  }
  return 0;
}
