// deloco/checkpoint.h — checkpoints on disk: a folder holding
//   model.safetensors      parameters by their stable names (loadable by PyTorch, see docs/checkpoints.md)
//   optimizer.safetensors  inner-optimizer state (optional)
//   manifest.json          format/version, config, step, tokens seen, data position, RNG seed, model
//                          fingerprint, and the size and FNV-1a hash of every file above
//
// Contract
//  * write_checkpoint builds the folder under a temporary name beside `dir`, fsyncs every file, then renames it
//    to `dir` in one step. It refuses to replace an existing `dir`. A crash leaves either no checkpoint or a
//    complete one (plus, at worst, a stale ".tmp" folder that readers ignore).
//  * read_checkpoint verifies sizes and hashes before decoding; truncation or corruption throws
//    CheckpointError naming the file. load_parameters checks every name and shape against the model and names
//    the first mismatch; nothing in the model changes unless everything matches.
//  * A run folder holds checkpoints/step_NNNNNNNN/ folders and a file "latest" naming the newest; any function
//    taking a checkpoint path also accepts the run folder and then uses its latest checkpoint.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "deloco/error.h"
#include "deloco/model.h"
#include "deloco/safetensors.h"

namespace deloco {

class CheckpointError : public Error {
 public:
  using Error::Error;
};

struct Checkpoint {
  std::string dir;            // the resolved checkpoint folder
  nlohmann::json manifest;
  TensorFile model;
  TensorFile optimizer;       // empty when not asked for or not present
};

constexpr const char* kCheckpointFormat = "deloco-checkpoint";
constexpr int kCheckpointVersion = 1;

void write_checkpoint(const std::string& dir, nlohmann::json manifest, const TensorFile& model,
                      const TensorFile* optimizer);
Checkpoint read_checkpoint(const std::string& path, bool with_optimizer);
// Resolves a run folder to its latest checkpoint folder; returns a checkpoint folder unchanged.
std::string resolve_checkpoint(const std::string& path);
// Copies the checkpoint's tensors into the model's parameters (names and shapes must match exactly).
void load_parameters(const NamedTensors& params, const TensorFile& file, const std::string& origin);
// Snapshot of the parameters as a TensorFile (CPU copies).
TensorFile parameters_to_file(const NamedTensors& params);

}  // namespace deloco
