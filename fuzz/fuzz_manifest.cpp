// libFuzzer target: the checkpoint manifest parser (util/manifest.h), as a checkpoint folder on disk presents it.
//
// Input: the manifest.json text. Properties: parse_checkpoint_manifest throws only CheckpointError (anything else
// escaping is a crash); a manifest it accepts renders back (render_checkpoint_manifest) into text it accepts again,
// with the same files and sequence; verifying arbitrary bytes against an accepted record throws only
// CheckpointError.
#include <cstdint>
#include <string>

#include "util/manifest.h"

namespace {
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_manifest: property violated: %s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  deloco::CheckpointManifest m;
  try {
    m = deloco::parse_checkpoint_manifest(text, "fuzz/manifest.json");
  } catch (const deloco::CheckpointError&) {
    return 0;
  }
  for (const auto& [name, rec] : m.files) {
    try {
      deloco::verify_checkpoint_file(rec, text, name);
    } catch (const deloco::CheckpointError&) {
    }
  }
  if (m.version != deloco::kCheckpointVersion) return 0;  // old manifests are read, never rewritten
  std::string again;
  try {
    again = deloco::render_checkpoint_manifest(m.json, m.sequence, m.files);
  } catch (const deloco::CheckpointError&) {
    fail("an accepted manifest did not render");
  }
  deloco::CheckpointManifest m2;
  try {
    m2 = deloco::parse_checkpoint_manifest(again, "fuzz/rendered.json");
  } catch (const deloco::CheckpointError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fail("a rendered manifest was refused");
  }
  if (m2.sequence != m.sequence || m2.files.size() != m.files.size()) fail("render changed the sequence or files");
  for (const auto& [name, rec] : m.files) {
    auto it = m2.files.find(name);
    if (it == m2.files.end() || it->second.bytes != rec.bytes || it->second.digest != rec.digest ||
        it->second.hash != rec.hash)
      fail("render changed a file record");
  }
  return 0;
}
