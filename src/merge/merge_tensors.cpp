// merge_tensors: a small work queue that merges a model tensor by tensor on a few threads. Each worker takes
// the next name, asks the caller for its contributions, merges, hands the result back and drops everything
// before taking the next name, so at most `threads` tensors are in flight.
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include <torch/torch.h>

#include "deloco/merge.h"

namespace deloco {

std::map<std::string, std::string> merge_tensors(
    const MergeSelector& selector, const std::vector<std::string>& names,
    const std::function<MergeInput(const std::string&)>& load,
    const std::function<void(const std::string&, const at::Tensor&)>& store, int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max(1, std::min<int>(threads, static_cast<int>(names.size())));

  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::exception_ptr error;
  std::map<std::string, std::string> used;

  auto work = [&] {
    while (!failed.load()) {
      const size_t i = next.fetch_add(1);
      if (i >= names.size()) return;
      try {
        MergeInput in = load(names[i]);
        if (in.name.empty()) in.name = names[i];
        const int64_t dim = in.deltas.empty() ? 0 : in.deltas[0].dim();
        const Merger& m = selector.select(names[i], dim);
        at::Tensor out = m.merge(in);
        in = MergeInput();  // release the contributions before storing
        store(names[i], out);
        std::lock_guard<std::mutex> lock(mu);
        used[names[i]] = m.name();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed.store(true);
      }
    }
  };

  if (threads == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
  return used;
}

}  // namespace deloco
