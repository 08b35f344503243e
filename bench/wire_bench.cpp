// wire_bench: encode/decode throughput of the wire codec and bytes per outer step of the default model.
//
// Usage: wire_bench [elements=1853568] [repeats=5]
// For each float encoding: encode (quantize + frame + checksum) and decode (validate + checksum + dequantize) of
// one message holding every parameter; throughput in MB/s of fp32 input (4 bytes per element), best of repeats.
// Uses only the torch-free deloco_base code (the bench foreach links deloco_torch, which carries it).
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

int main(int argc, char** argv) {
  using namespace deloco;
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1853568;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  std::vector<float> x(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.f, 1e-3f);
  for (auto& v : x) v = g(rng);
  std::vector<float> back(n);

  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const double mb = 4.0 * static_cast<double>(n) / 1e6;
  std::printf("elements %zu (fp32 %.3f MB), best of %d\n", n, mb, repeats);
  std::printf("%-6s %14s %12s %10s %10s %14s\n", "enc", "frame_bytes", "vs_fp32", "enc_MB/s", "dec_MB/s", "max_abs_err");
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4}) {
    double best_enc = 1e30, best_dec = 1e30;
    std::string frame;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = clock::now();
      const std::string payload = encode_floats(x.data(), n, e);
      MessageHeader h;
      h.kind = MessageKind::kFragmentPush;
      h.encoding = e;
      h.element_count = n;
      frame = encode_message(h, payload);
      const auto t1 = clock::now();
      const DecodedMessage m = decode_message(frame.data(), frame.size());
      decode_floats_into(m.payload, m.payload_size, e, n, back.data());
      const auto t2 = clock::now();
      best_enc = std::min(best_enc, secs(t0, t1));
      best_dec = std::min(best_dec, secs(t1, t2));
    }
    double err = 0;
    for (size_t i = 0; i < n; ++i) err = std::max(err, static_cast<double>(std::fabs(back[i] - x[i])));
    std::printf("%-6s %14zu %11.3fx %10.0f %10.0f %14.3g\n", encoding_name(e), frame.size(),
                static_cast<double>(frame.size()) / (kWireHeaderBytes + 4.0 * n), mb / best_enc, mb / best_dec, err);
  }
  {  // the checksum alone (FNV-1a-64 is byte-serial: it bounds fp32 throughput)
    double best = 1e30;
    volatile uint64_t sink = 0;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = clock::now();
      sink = sink + fnv1a64(x.data(), 4 * n);
      best = std::min(best, secs(t0, clock::now()));
    }
    std::printf("fnv1a64 checksum alone: %.0f MB/s\n", mb / best);
  }
  return 0;
}
