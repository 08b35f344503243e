// util/checkpoint_store.h — checkpoint folders and run folders on disk, without libtorch: the commit protocol
// of `deloco train` and the syncer, and the recovery that makes it crash-safe. deloco/checkpoint.h encodes the
// tensors and calls these.
//
// Layout: a run folder RUN holds RUN/checkpoints/<name>/ (files + manifest.json, util/manifest.h) and RUN/latest,
// a one-line hint naming the newest checkpoint.
//
// Commit protocol (commit_run_checkpoint)
//   1. recovery (below);
//   2. the folder is built as RUN/checkpoints/.<name>.tmp.<pid>: each file written and fsynced, manifest.json
//      last, the folder fsynced;
//   3. rename to RUN/checkpoints/<name>, then fsync RUN/checkpoints. THIS RENAME IS THE COMMIT: before it the
//      checkpoint does not exist, after it it is complete;
//   4. RUN/latest rewritten atomically (a hint only: nothing depends on it being current);
//   5. pruning: all but the newest `keep` committed checkpoints are renamed to ".<name>.pruned.tmp.<pid>" (so a
//      checkpoint is never half deleted) and removed.
//   <name> is `base_name` (e.g. step_00000020) unless a folder of that name exists (a run resumed from an older
//   checkpoint reaching the same step, or two checkpoints at one merge count): then "<base_name>-s<sequence>".
//   A checkpoint is never skipped and never written into an existing folder. Every manifest records a sequence,
//   one more than the largest in the run folder: commit order, which defines "newest" (not the name, not latest).
//
// Recovery (recover_run_folder): removes uncommitted garbage — RUN/checkpoints/.*.tmp.<pid> folders and files
// and RUN/latest.tmp.<pid> — left by a process that is gone (util/fs.h is_stale_temp_name), finds the newest
// committed checkpoint by scanning RUN/checkpoints (largest sequence, then name; checkpoints without a sequence,
// from manifest version 1, count as 0), and rewrites RUN/latest to name it (removes it when there is none).
//
// Reading: list_checkpoints / newest_checkpoint scan RUN/checkpoints without changing anything: entries whose
// name starts with '.' and folders without manifest.json are not checkpoints; a manifest that does not parse
// throws CheckpointError naming it (a committed checkpoint is never silently passed over). `latest` is never
// read, so a stale or missing hint cannot send a reader to an older checkpoint.
//
// Crash safety: a crash (or power loss, given that fsync and rename work as POSIX says) at any point of a commit
// leaves, after recovery, either the previous newest checkpoint or the new one as the newest, complete, with
// `latest` naming it and no temporaries. src/util/checkpoint_store_test.cpp proves it with a file layer that
// crashes after every operation (tests/support/fault_file_ops.h).
// Errors: IoError for file-system failures, CheckpointError for invalid checkpoints and names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/fs.h"
#include "util/manifest.h"

namespace deloco {

using CheckpointFiles = std::vector<std::pair<std::string, std::string>>;  // file name → bytes

struct CommittedCheckpoint {
  std::string name;  // folder name inside RUN/checkpoints
  std::string dir;   // RUN/checkpoints/<name>
  int64_t sequence = 0;
};

// Writes checkpoint folder `dir` (which must not exist) holding `files` and manifest.json (steps 2-3 above,
// without recovery, latest or pruning): for checkpoints outside a run folder. Returns nothing; throws on failure
// after removing its temporary folder (a crash leaves one: ".<name>.tmp.<pid>" beside `dir`).
void write_checkpoint_folder(const std::string& dir, const nlohmann::json& manifest, const CheckpointFiles& files,
                             int64_t sequence, FileOps& ops = real_file_ops());

// The manifest at `path` read and validated: CheckpointError when it cannot be read (naming the I/O cause) or
// does not parse (util/manifest.h). Every reader of a checkpoint folder goes through it.
CheckpointManifest read_checkpoint_manifest(const std::string& path);

std::vector<CommittedCheckpoint> list_checkpoints(const std::string& run);  // oldest first
std::optional<CommittedCheckpoint> newest_checkpoint(const std::string& run);
// Whether RUN/checkpoints holds a folder that looks committed (a manifest.json; not parsed, never throws).
bool has_committed_checkpoint(const std::string& run);

std::optional<CommittedCheckpoint> recover_run_folder(const std::string& run, FileOps& ops = real_file_ops());

// The full commit protocol; `keep` = 0 keeps every checkpoint. Returns the committed checkpoint.
CommittedCheckpoint commit_run_checkpoint(const std::string& run, const std::string& base_name,
                                          const nlohmann::json& manifest, const CheckpointFiles& files, int64_t keep,
                                          FileOps& ops = real_file_ops());

}  // namespace deloco
