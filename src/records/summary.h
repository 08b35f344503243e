// records/summary.h — the one summary of a run: summary.json of `deloco sim`, `deloco train`, `deloco run` and a
// syncer node's own summary, built through RunSummary and read back through it (`deloco report`, the dashboard).
//
// The shared fields are typed here, once; what only one driver knows (the simulator's per-learner list, a node's
// reject counts by reason, the config) goes into `extra` under its own name.
//
// Contract
//  * to_json() is `extra` with every set typed field written over it (a typed field wins over an extra of the same
//    name); an unset optional is left out, a non-finite number is written as null.
//  * from_json() reads untrusted input: a typed field that is missing or of another JSON type stays unset (a
//    number where text is expected, say) and is listed in `wrong_types` when present but mistyped; every other
//    member of the object is kept in `extra`. A non-object gives an empty summary.
//  * write_summary_file() writes the JSON (indented) atomically: a reader sees the old file or the new one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deloco::rec {

struct RunSummary {
  std::string command;                          // "sim", "train", "run", "syncer", "eval", "sample"
  std::optional<double> final_val_loss, initial_val_loss, val_bpb;
  std::optional<std::string> loss_unit;         // "nats/token", or "nats/byte" for byte-level text
  std::optional<int64_t> tokens;                // tokens trained on by every learner together
  std::optional<int64_t> outer_steps;           // fragment merges
  std::optional<int64_t> contributions_merged, contributions_rejected, failures;
  std::optional<double> uptime, goodput;        // fractions of the run's time (deloco/sync.h: run_uptime, run_goodput)
  std::optional<double> wall_seconds;
  std::optional<int64_t> bytes_sent;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  static RunSummary from_json(const nlohmann::json& j, std::vector<std::string>* wrong_types = nullptr);
};

// Writes summary.to_json() to `path` atomically (IoError naming the path on failure).
void write_summary_file(const std::string& path, const RunSummary& summary);

}  // namespace deloco::rec
