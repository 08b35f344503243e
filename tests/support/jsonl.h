// tests/support/jsonl.h — reading the JSON-lines records a running deloco process writes (syncer.jsonl,
// learner-M.jsonl, metrics.jsonl) and polling for a condition with a deadline (header-only).
//
// The files are read while their writer may still be appending: a line that does not parse (the one being written)
// is skipped, never an error. A test that means to check the file is well formed parses it strictly itself.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace deloco::test {

// Every complete record of the JSON-lines file `f`, in file order (none when it does not exist yet).
inline std::vector<nlohmann::json> json_lines(const std::filesystem::path& f) {
  std::vector<nlohmann::json> out;
  std::ifstream in(f);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

// The records of `all` from index `from` on whose "kind" is `kind`.
inline std::vector<nlohmann::json> of_kind(const std::vector<nlohmann::json>& all, const std::string& kind,
                                           size_t from = 0) {
  std::vector<nlohmann::json> out;
  for (size_t i = from; i < all.size(); ++i)
    if (all[i].value("kind", "") == kind) out.push_back(all[i]);
  return out;
}

// The complete records of `kind` in the file `f`.
inline std::vector<nlohmann::json> records(const std::filesystem::path& f, const std::string& kind) {
  return of_kind(json_lines(f), kind);
}

// Asks `cond` every 50 ms until it holds or `seconds` have passed; its last answer (asked once more at the deadline).
inline bool wait_for(const std::function<bool()>& cond, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

}  // namespace deloco::test
