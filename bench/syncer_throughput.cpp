// syncer_throughput: how many parameters one syncer process (one shard) merges per second, against the number of
// learners M and the size of what it holds, for the merge presets. It runs the syncer core itself (deloco/sync.h,
// the code the syncer node runs): per round, M contributions arrive (receive(): shape, finiteness, counter and
// norm checks) and one merge() (weights, the merge method, the outer step, the finiteness check and rollback
// copy). Wire decoding and the broadcast encode are not included (bench/wire_bench.cpp times those).
//
// The model held is n square matrices of 1024 × 1024 (n = the size in millions), in one fragment: the whole
// state of a shard. Memory: the peak resident set while it works (the global state, the outer state, M pending
// contributions and the merge's temporaries), less the resident set before.
//
//   ./build/syncer_throughput [--sizes 1,4,16,64,128] [--learners 2,4,8,16] [--presets diloco,decoupled,isoloco]
//                             [--reps 3] [--threads 1] [--max-svd-million 16] [--max-gb 8]
//
// Prints a Markdown table: preset, size, M, median seconds per round, parameters merged per second (size / round
// time), memory. Threads default to 1, as `deloco run` gives its syncer.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <sys/wait.h>
#include <unistd.h>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "deloco/algorithm.h"
#include "deloco/sync.h"

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
double rss_mib() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}
// Peak resident set since the last reset_peak() (Linux: writing 5 to clear_refs resets VmHWM).
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }
double peak_mib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  std::string sizes = "1,4,16,64,128", learners = "2,4,8,16", presets = "diloco,decoupled,isoloco";
  int reps = 3, threads = 1;
  int64_t max_svd_million = 16;
  double max_gb = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--sizes") sizes = v;
    else if (k == "--learners") learners = v;
    else if (k == "--presets") presets = v;
    else if (k == "--reps") reps = std::stoi(v);
    else if (k == "--threads") threads = std::stoi(v);
    else if (k == "--max-svd-million") max_svd_million = std::stoll(v);
    else if (k == "--max-gb") max_gb = std::stod(v);
    else {
      std::cerr << "unknown option " << k << "\n";
      return 2;
    }
  }
  at::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  const int64_t d = 1024;
  std::printf("| preset | parameters | M | seconds per round (median of %d) | parameters merged per second | peak memory (MiB) |\n",
              reps);
  std::printf("|---|---|---|---|---|---|\n");
  for (const auto& preset : words(presets)) {
    for (int64_t millions : ints(sizes)) {
      if ((preset == "isoloco") && millions > max_svd_million) continue;  // an SVD per matrix: minutes per round
      for (int64_t M : ints(learners)) {
        const double bytes = 4.0 * static_cast<double>(millions) * d * d * static_cast<double>(M + 4);
        if (bytes > max_gb * 1e9) continue;
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
        const double before = rss_mib();
        reset_peak();
        std::vector<std::pair<std::string, at::Tensor>> global;
        std::vector<std::pair<std::string, int64_t>> sizes_bytes;
        torch::manual_seed(1);
        for (int64_t k = 0; k < millions; ++k) {
          global.emplace_back("h." + std::to_string(k) + ".weight", torch::randn({d, d}) * 0.02);
          sizes_bytes.emplace_back(global.back().first, d * d * 4);
        }
        AlgorithmConfig a;
        a.merge.preset = preset;
        a.resolve();
        SyncOptions o;
        o.learners = M;
        o.quorum = M;
        o.fragments = 1;
        o.sync_every = 40;
        o.wait_for_answer = false;
        Syncer syncer(o, plan_fragments(sizes_bytes, 1, 40), global, a.merge_plan(), a.outer);
        global.clear();  // the syncer holds its own copy, as in the node
        for (int64_t m = 0; m < M; ++m) syncer.set_connected(m, true);
        // Each learner's outer gradient: a small random step (fixed per learner, reused every round).
        std::vector<std::vector<at::Tensor>> deltas(static_cast<size_t>(M));
        for (int64_t m = 0; m < M; ++m)
          for (int64_t k = 0; k < millions; ++k) deltas[static_cast<size_t>(m)].push_back(torch::randn({d, d}) * 1e-3);
        std::vector<double> times;
        double mem = 0;
        for (int r = 0; r < reps + 1; ++r) {  // the first round warms up (allocations of the outer state)
          const auto t0 = Clock::now();
          for (int64_t m = 0; m < M; ++m) {
            Contribution c;
            c.learner = m;
            c.fragment = 0;
            c.deltas = deltas[static_cast<size_t>(m)];
            c.base_version = syncer.version(0);
            c.c_steps = 40;
            c.c_tokens = 40 * 1024;
            c.step_time = 0.1;
            const SyncReject why = syncer.receive(static_cast<double>(r), std::move(c));
            if (why != SyncReject::kNone) {
              std::cerr << "contribution refused: " << sync_reject_name(why) << "\n";
              return 1;
            }
          }
          const MergeOutcome out = syncer.merge(0);
          if (!out.ok()) {
            std::cerr << "merge rejected: " << sync_reject_name(out.rejected) << " " << out.detail << "\n";
            return 1;
          }
          if (r > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        mem = peak_mib() - before;  // the state, M pending contributions, the merge's temporaries
        const double t = median(times), n = static_cast<double>(millions) * d * d;
        std::printf("| %s | %.1fM | %lld | %.3f | %.1fM | %.0f |\n", preset.c_str(), n / 1e6, static_cast<long long>(M), t,
                    n / t / 1e6, mem);
        std::fflush(stdout);
        std::_Exit(0);
      }
    }
  }
  return 0;
}
