// syncer_throughput: how fast one syncer process (one shard) turns M pushes, as they arrive off the wire, into the
// new Θ_p and its broadcast, against the machine's memory bandwidth. It runs the syncer core itself (deloco/sync.h,
// the code the syncer node runs): per round, M int8 (or --encoding) payloads are taken as received (decode_push:
// validated and held in their wire encoding, as the node does), checked (receive(): shape, finiteness, counters,
// norms from the encoded blocks) and merged by on_round() (weights, the merge, the outer step, the new Θ_p flat, which
// is the fp32 broadcast the node sends without a copy). Two paths side by side: `fused` (sync.fused_merge = true: one
// cache-blocked pass from the wire bytes) and `general` (false: the per-tensor path, which decodes every push to
// fp32 first, as every merge did before).
//
// The model held is n square matrices of 1024 × 1024 (n = the size in millions), in one fragment: the whole state of
// a shard. Memory: the peak resident set while it works (the global state, the outer state, the M pushes' wire
// buffers, the history the global anchor keeps, the merge's temporaries), less the resident set before, per
// parameter.
//
// Bandwidth: before the configurations, the same number of threads copies a 512 MiB buffer (memcpy, split in equal
// parts); its rate counts the bytes read plus the bytes written. A merge must move, per parameter, the M pushes
// (int8: 1 + 4/64 bytes each), Θ read and written (8), the momentum read and written (8) and the broadcast written
// (4); the GB/s column is that over the round time, and "of copy" its fraction of the copy rate. (The fused path
// writes the new Θ and the broadcast as one buffer, so it moves 4 bytes per parameter less than counted.)
//
// --broadcast-delta ENC[:DENSITY] turns on the delta broadcast (Syncer::set_delta_broadcast, e.g. topk2:0.03): every
// merge is then anchored at Θ_p + e_p and followed by the re-encoding of the new version (compress_version), whose
// time the round includes (run it with and without to see that cost); the bytes-moved column stays the merge's.
//
//   ./build/syncer_throughput [--sizes 4,16,64,128] [--learners 8] [--presets diloco,decoupled] [--paths fused,general]
//                             [--encoding int8] [--broadcast-delta topk2:0.03] [--reps 3] [--threads N] [--max-gb 12]
//
// A preset may carry algorithm keys after '@', each KEY=VALUE as in a config (the same checks), e.g. the fast
// Newton–Schulz Iso-C: --presets isoloco,isoloco@merge.method=iso_c_ns@merge.iso_ns_steps=5@merge.iso_ns_precision=bf16
// (isoloco alone merges by the SVD). A merge with no fused pass (every one but the mean's) prints its fused row as not
// taken and is measured on the general path.
//
// Threads default to the machine's cores (the fused merge's default is the process's compute threads). Prints a
// Markdown table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "deloco/algorithm.h"
#include "deloco/config.h"
#include "deloco/learner.h"
#include "deloco/sync.h"
#include "sync/fused_merge.h"
#include "wire/quantize.h"

using namespace deloco;
using Clock = std::chrono::steady_clock;

namespace {
std::vector<int64_t> ints(const std::string& csv) {
  std::vector<int64_t> v;
  std::stringstream ss(csv);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoll(x));
  return v;
}
std::vector<std::string> words(const std::string& csv) {
  std::vector<std::string> v;
  std::stringstream ss(csv);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(x);
  return v;
}
double rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}
// Peak resident set since the last reset_peak() (Linux: writing 5 to clear_refs resets VmHWM).
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }
double peak_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return 0;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The machine's copy rate with `threads` threads: bytes read + written per second (median of 7).
double copy_bandwidth(int threads) {
  const size_t n = size_t{512} << 20;
  std::vector<char> src(n, 1), dst(n, 0);
  std::vector<double> rates;
  for (int r = 0; r < 8; ++r) {
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    const size_t part = n / static_cast<size_t>(threads);
    for (int k = 0; k < threads; ++k)
      pool.emplace_back([&, k] {
        const size_t lo = part * static_cast<size_t>(k), hi = k + 1 == threads ? n : lo + part;
        std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
      });
    for (auto& t : pool) t.join();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0) rates.push_back(2.0 * static_cast<double>(n) / s);
  }
  if (dst[n / 2] != 1) std::abort();
  return median(rates);
}
}  // namespace

int main(int argc, char** argv) {
  std::string sizes = "4,16,64,128", learners = "8", presets = "diloco,decoupled", paths = "fused,general";
  std::string encoding = "int8", broadcast_delta;
  int reps = 3;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double max_gb = 12;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--sizes") sizes = v;
    else if (k == "--learners") learners = v;
    else if (k == "--presets") presets = v;
    else if (k == "--paths") paths = v;
    else if (k == "--encoding") encoding = v;
    else if (k == "--broadcast-delta") broadcast_delta = v;
    else if (k == "--reps") reps = std::stoi(v);
    else if (k == "--threads") threads = std::stoi(v);
    else if (k == "--max-gb") max_gb = std::stod(v);
    else {
      std::cerr << "unknown option " << k << "\n";
      return 2;
    }
  }
  const Encoding enc = parse_encoding(encoding);
  std::optional<Codec> delta_codec;
  if (!broadcast_delta.empty()) {
    const auto colon = broadcast_delta.find(':');
    TopkOptions t;
    if (colon != std::string::npos) t.density = std::stod(broadcast_delta.substr(colon + 1));
    delta_codec = Codec(parse_encoding(broadcast_delta.substr(0, colon)), t);
  }
  at::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  const double copy = copy_bandwidth(threads);
  const int64_t d = 1024;
  std::printf("copy bandwidth (memcpy of 512 MiB, %d threads, read + write): %.1f GB/s; fused loops: %s\n\n", threads,
              copy / 1e9, sync_detail::fused_isa());
  if (delta_codec)
    std::printf("delta broadcast: %s, density %g\n\n", encoding_name(delta_codec->encoding), delta_codec->topk.density);
  std::printf("| preset | path | parameters | M | seconds per round (median of %d) | parameters per second | "
              "of which receive | bytes moved per parameter | GB/s | of copy | peak bytes per parameter |\n", reps);
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& preset : words(presets))
    for (int64_t millions : ints(sizes))
      for (int64_t M : ints(learners))
        for (const auto& path : words(paths)) {
          const double n = static_cast<double>(millions) * d * d;
          // The general path's peak: Θ, momentum, history, M decoded pushes and their wire bytes, temporaries.
          if (n * (4.0 * static_cast<double>(M + 6) + static_cast<double>(M) * 1.1) > max_gb * 1e9) continue;
          // Each configuration in its own child process: memory freed by an earlier one cannot blur its figures.
          std::fflush(stdout);
          const pid_t child = ::fork();
          if (child < 0) {
            std::perror("fork");
            return 1;
          }
          if (child > 0) {
            int status = 0;
            ::waitpid(child, &status, 0);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
            continue;
          }
          const double before = rss_bytes();
          reset_peak();
          std::vector<std::pair<std::string, at::Tensor>> global;
          std::vector<std::pair<std::string, int64_t>> sizes_bytes;
          torch::manual_seed(1);
          for (int64_t k = 0; k < millions; ++k) {
            global.emplace_back("h." + std::to_string(k) + ".weight", torch::randn({d, d}) * 0.02);
            sizes_bytes.emplace_back(global.back().first, d * d * 4);
          }
          AlgorithmConfig a;
          {
            ConfigSchema schema;
            a.bind(schema);
            std::vector<std::string> parts;
            std::stringstream ss(preset);
            for (std::string part; std::getline(ss, part, '@');) parts.push_back(part);
            try {
              schema.apply_override("merge.preset=" + parts[0]);
              for (size_t i = 1; i < parts.size(); ++i) schema.apply_override(parts[i]);
              schema.validate();
              a.resolve();
            } catch (const std::exception& e) {
              std::cerr << "preset '" << preset << "': " << e.what() << "\n";
              std::_Exit(2);
            }
          }
          SyncOptions o;
          o.learners = M;
          o.quorum = M;
          o.fragments = 1;
          o.sync_every = 40;
          o.wait_for_answer = false;
          o.fused_merge = path == "fused";
          o.merge_threads = threads;
          const ModelPlan plan = plan_model(global, 1, 40);
          Syncer syncer(o, plan.fragments, global, a.merge_plan(), a.outer);
          syncer.share_flat(o.fused_merge);  // the node shares it; the general path as before (a copy)
          if (delta_codec) syncer.set_delta_broadcast(*delta_codec);
          global.clear();                   // the syncer holds its own copy, as in the node
          for (int64_t m = 0; m < M; ++m) syncer.note_joined(m);
          // Each learner's push as it comes off the wire: a small random step, encoded once (reused every round).
          const FlatLayout& L = plan.fragment_layouts[0];
          std::vector<std::shared_ptr<std::string>> wire;
          for (int64_t m = 0; m < M; ++m) {
            at::Tensor delta = torch::randn({L.elements}) * 1e-3;
            wire.push_back(std::make_shared<std::string>(
                encode_floats(delta.data_ptr<float>(), static_cast<size_t>(L.elements), enc)));
          }
          std::vector<double> times, receives;
          for (int r = 0; r < reps + 1; ++r) {  // the first round warms up (the momentum buffers, the history)
            const auto t0 = Clock::now();
            for (int64_t m = 0; m < M; ++m) {
              const auto& w = wire[static_cast<size_t>(m)];
              Contribution c = decode_push(m, 0, L, enc, w->data(), w->size(), syncer.version(0), 40, 40 * 1024, 0.1, w);
              const SyncReject why = syncer.receive(static_cast<double>(r), std::move(c));
              if (why != SyncReject::kNone) {
                std::cerr << "contribution refused: " << sync_reject_name(why) << "\n";
                std::_Exit(1);
              }
            }
            const auto t1 = Clock::now();
            const RoundResult out = syncer.on_round(static_cast<double>(r), 0);
            if (!out.merged()) {
              std::cerr << "merge rejected: " << sync_reject_name(out.outcome.rejected) << " " << out.outcome.detail
                        << "\n";
              std::_Exit(1);
            }
            if (r > 0) {
              times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
              receives.push_back(std::chrono::duration<double>(t1 - t0).count());
            }
          }
          if (o.fused_merge && syncer.fused_merges() == 0) {  // this merge has no fused pass: the general row counts
            std::printf("| %s | %s | %.1fM | %lld | not taken: this merge has no fused pass (see the general row) "
                        "| | | | | | |\n",
                        preset.c_str(), path.c_str(), n / 1e6, static_cast<long long>(M));
            std::fflush(stdout);
            std::_Exit(0);
          }
          if (!o.fused_merge && syncer.fused_merges() > 0) {
            std::cerr << "the general path was not the one taken\n";
            std::_Exit(1);
          }
          const double peak = peak_bytes() - before;
          const double t = median(times);
          const double push_bytes = static_cast<double>(encoded_bytes(enc, 1 << 20)) / static_cast<double>(1 << 20);
          const double moved = static_cast<double>(M) * push_bytes + 8 + 8 + 4;
          const double gbs = moved * n / t;
          std::printf("| %s | %s | %.1fM | %lld | %.3f | %.1fM | %.3f | %.2f | %.2f | %.1f%% | %.1f |\n",
                      preset.c_str(), path.c_str(), n / 1e6, static_cast<long long>(M), t, n / t / 1e6,
                      median(receives), moved, gbs / 1e9, 100.0 * gbs / copy, peak / n);
          std::fflush(stdout);
          std::_Exit(0);
        }
  return 0;
}
