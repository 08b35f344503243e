// deloco/checkpoint.h — checkpoints on disk: a folder holding
//   model.safetensors      parameters by their stable names (loadable by PyTorch, see docs/checkpoints.md)
//   optimizer.safetensors  inner-optimizer state (optional)
//   manifest.json          format/version/sequence, config, step, tokens seen, data position, RNG seed, model
//                          fingerprint, and the size and BLAKE2b-256 hash of every file above (src/util/manifest.h)
//
// Contract
//  * write_checkpoint builds the folder under a temporary name beside `dir`, fsyncs every file, then renames it
//    to `dir` in one step (the commit). It refuses to replace an existing `dir`. A crash leaves either no
//    checkpoint or a complete one (plus, at worst, a ".<name>.tmp.<pid>" folder that readers ignore).
//  * deloco's own run folders are written by save_run_checkpoint (src/train/run_checkpoint.h), with the commit
//    protocol of src/util/checkpoint_store.h.
//  * read_checkpoint parses the manifest with parse_checkpoint_manifest (torch-free, src/util/manifest.h) and
//    verifies sizes and hashes before decoding; truncation or corruption throws CheckpointError naming the file.
//    Version 1 manifests (FNV-1a hashes, deloco before issue 11) still load. load_parameters checks every name
//    and shape against the model and names the first mismatch; nothing in the model changes unless everything
//    matches.
//  * A run folder holds checkpoints/<name>/ folders and a file "latest" naming the newest; any function taking
//    a checkpoint path also accepts the run folder and then uses its newest committed checkpoint, found by
//    scanning checkpoints/ (so a stale or missing "latest" does not matter). These readers change nothing; the
//    writers (`deloco train --resume`, the syncer) call recover_run_folder before they write.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "deloco/error.h"
#include "deloco/safetensors.h"
#include "deloco/workload.h"  // NamedTensors

namespace deloco {

class FileOps;  // the file operations a write goes through (real_file_ops(): POSIX); tests inject failures
FileOps& real_file_ops();

struct Checkpoint {
  std::string dir;            // the resolved checkpoint folder
  nlohmann::json manifest;
  int version = 2;  // of the manifest (the current format, 2); 1 for checkpoints of deloco before issue 11
  TensorFile model;
  TensorFile optimizer;       // empty when not asked for or not present
};

void write_checkpoint(const std::string& dir, nlohmann::json manifest, const TensorFile& model,
                      const TensorFile* optimizer, FileOps& ops = real_file_ops());
Checkpoint read_checkpoint(const std::string& path, bool with_optimizer);
// Resolves a run folder to its newest committed checkpoint folder; returns a checkpoint folder unchanged.
std::string resolve_checkpoint(const std::string& path);
// Copies the checkpoint's tensors into the model's parameters (names and shapes must match exactly).
void load_parameters(const NamedTensors& params, const TensorFile& file, const std::string& origin);
// Snapshot of the parameters as a TensorFile (CPU copies).
TensorFile parameters_to_file(const NamedTensors& params);
// Whether a checkpoint's recorded model fingerprint is that of `params` (fingerprint = model_fingerprint(params)).
// Version 1 checkpoints may carry the fingerprint of the short FNV basis (src/util/hash.h), accepted too.
bool fingerprint_matches(const Checkpoint& ck, const std::string& recorded, const std::string& fingerprint,
                         const NamedTensors& params);

}  // namespace deloco
