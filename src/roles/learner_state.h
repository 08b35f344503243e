// src/roles/learner_state.h — a learner's local state on disk (its inner optimizer's moments), so that a restarted
// learner process keeps them (learner.state_dir, deloco/runtime.h).
//
// <state_dir>/learner-N/state is a run folder of util/checkpoint_store.h. save_learner_state commits one
// checkpoint into it by that protocol — recovery of a crashed save's temporaries, every file and the folder
// fsynced, one rename (the commit), the parent fsynced — and keeps only the newest. A crash at any moment leaves
// the previous state or the new one, never a torn one (learner_state_test.cpp crashes it after every file
// operation). load_learner_state reads the newest committed state, verified by size and hash; a temporary of a
// crashed save is never read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "deloco/checkpoint.h"
#include "train/run_checkpoint.h"

namespace deloco {

// <state_dir>/learner-<learner>/state
std::string learner_state_dir(const std::string& state_dir, int64_t learner);

// Commits `optimizer` (the model file stays empty) with `manifest` as the state of inner step `step`
// ("step_%08d"), then prunes the older one. Throws IoError / CheckpointError.
void save_learner_state(const std::string& dir, int64_t step, const nlohmann::json& manifest,
                        const TensorFile& optimizer, FileOps& ops = real_file_ops());

// The newest committed state with its optimizer tensors, or nullopt when the folder holds none. Throws
// CheckpointError / IoError when it cannot be read (a damaged file, a manifest that does not parse).
std::optional<Checkpoint> load_learner_state(const std::string& dir);

}  // namespace deloco
