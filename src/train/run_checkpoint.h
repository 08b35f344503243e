// train/run_checkpoint.h — committing a checkpoint into one of deloco's run folders (`deloco train`, the syncer,
// the learner-local state): write_checkpoint (deloco/checkpoint.h) under the protocol of util/checkpoint_store.h.
//
// Contract
//  * Recovery first (recover_run_folder), then the commit by rename, `latest` as a hint, pruning to the newest
//    `keep` (0: keep all). Never skips a checkpoint and never collides with an existing folder: a taken
//    `base_name` gets "-s<sequence>". A crash at any point leaves the previous checkpoints readable.
//  * Errors: IoError / CheckpointError naming the path; nothing committed then.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "deloco/checkpoint.h"
#include "util/checkpoint_store.h"

namespace deloco {

CommittedCheckpoint save_run_checkpoint(const std::string& run, const std::string& base_name,
                                        const nlohmann::json& manifest, const TensorFile& model,
                                        const TensorFile* optimizer, int64_t keep, FileOps& ops = real_file_ops());

}  // namespace deloco
