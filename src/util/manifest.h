// util/manifest.h — the manifest.json of a checkpoint folder: parsing and validation without libtorch (so a
// fuzzer can drive it), and the per-file size and hash records.
//
// A manifest is a JSON object:
//   format    "deloco-checkpoint"
//   version   1 or 2 (kCheckpointVersion). Version 2 hashes files with BLAKE2b-256 and records a sequence;
//             version 1 (deloco before issue 11) recorded FNV-1a-64 hashes ("fnv1a64").
//   sequence  commit order within its run folder (optional, non-negative integer; 0 or missing: none)
//   files     {name: {"bytes": N, "hash": "blake2b-256", "digest": 64 hex}}                     (version 2)
//             {name: {"bytes": N, "fnv1a64": 16 hex}}                                           (version 1)
//             names are plain file names; "model.safetensors" must be listed
//   and the writer's own fields, of which the ones readers rely on are checked when present: step, tokens_seen
//   (non-negative integers), kind, model_fingerprint, fingerprint (strings), config (object).
//
// Contract
//  * parse_checkpoint_manifest never trusts its input: on anything else than a manifest as above (invalid JSON,
//    wrong types, a version newer than this build, text over kMaxManifestBytes) it throws CheckpointError
//    "checkpoint manifest '<origin>' ..." naming the problem. It throws no other exception type for any input
//    except std::bad_alloc (the libFuzzer target relies on this).
//  * verify_checkpoint_file checks bytes against their record (size first, then hash) and throws CheckpointError
//    naming `path` ("truncated or replaced", "corrupt"). A version 1 "fnv1a64" record is accepted with the
//    standard FNV-1a basis or with the short basis deloco wrongly used before commit c2749d1 (util/hash.h), so
//    every checkpoint written by earlier versions still verifies.
//  * render_checkpoint_manifest completes a writer's manifest (format, version, sequence, files) as text.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "deloco/error.h"

namespace deloco {

constexpr const char* kCheckpointFormat = "deloco-checkpoint";
constexpr int kCheckpointVersion = 2;
constexpr size_t kMaxManifestBytes = size_t{64} << 20;
constexpr const char* kLegacyFnvHashName = "fnv1a64";  // version 1 records

struct ManifestFile {
  uint64_t bytes = 0;
  std::string hash;    // kBlake2b256Name ("blake2b-256") or kLegacyFnvHashName
  std::string digest;  // lowercase hex: 64 digits for blake2b-256, 16 for fnv1a64
};

struct CheckpointManifest {
  nlohmann::json json;       // the whole validated object, writer's fields included
  int version = kCheckpointVersion;
  int64_t sequence = 0;
  std::map<std::string, ManifestFile> files;
};

CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& origin);
// The record of `bytes` in the current format (size and BLAKE2b-256).
ManifestFile describe_checkpoint_file(const std::string& bytes);
void verify_checkpoint_file(const ManifestFile& record, const std::string& bytes, const std::string& path);
void verify_checkpoint_file(const ManifestFile& record, const char* data, size_t size, const std::string& path);
std::string render_checkpoint_manifest(nlohmann::json manifest, int64_t sequence,
                                       const std::map<std::string, ManifestFile>& files);

}  // namespace deloco
