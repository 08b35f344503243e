// A learner's local state on disk (contract in learner_state.h): the checkpoint store's commit, newest kept.
#include "learner_state.h"

#include <filesystem>

namespace deloco {

std::string learner_state_dir(const std::string& state_dir, int64_t learner) {
  return (std::filesystem::path(state_dir) / ("learner-" + std::to_string(learner)) / "state").string();
}

void save_learner_state(const std::string& dir, int64_t step, const nlohmann::json& manifest,
                        const TensorFile& optimizer, FileOps& ops) {
  const std::string digits = std::to_string(step);
  const std::string name = "step_" + std::string(digits.size() < 8 ? 8 - digits.size() : 0, '0') + digits;
  save_run_checkpoint(dir, name, manifest, TensorFile{}, &optimizer, /*keep=*/1, ops);
}

std::optional<Checkpoint> load_learner_state(const std::string& dir) {
  const auto newest = newest_checkpoint(dir);  // committed checkpoints only
  if (!newest) return std::nullopt;
  return read_checkpoint(newest->dir, /*with_optimizer=*/true);
}

}  // namespace deloco
