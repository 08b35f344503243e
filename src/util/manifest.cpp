// Checkpoint manifests (contract in src/util/manifest.h).
#include "util/manifest.h"

#include <limits>

#include "util/hash.h"

namespace deloco {
namespace {

bool is_hex(const std::string& s, size_t digits) {
  if (s.size() != digits) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// A short description of a JSON value's type, never its content (which may be huge or deeply nested).
const char* type_of(const nlohmann::json& j) { return j.type_name(); }

bool non_negative_int(const nlohmann::json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  return j.is_number_integer() && j.get<int64_t>() >= 0;
}

bool plain_file_name(const std::string& s) {
  if (s.empty() || s.size() > 255 || s[0] == '.') return false;
  for (char c : s)
    if (c == '/' || c == '\\' || c == '\0') return false;
  return true;
}

[[noreturn]] void manifest_error(const std::string& origin, const std::string& what) {
  throw CheckpointError("checkpoint manifest '" + origin + "' " + what);
}

}  // namespace

CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& origin) {
  auto fail = [&origin](const std::string& what) { manifest_error(origin, what); };
  if (text.size() > kMaxManifestBytes)
    fail("has " + std::to_string(text.size()) + " bytes, more than the " + std::to_string(kMaxManifestBytes >> 20) +
         " MiB a manifest may have");
  CheckpointManifest m;
  m.json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.json.is_discarded()) fail("is not valid JSON");
  const nlohmann::json& j = m.json;
  if (!j.is_object()) fail("is not a JSON object");
  auto f = j.find("format");
  if (f == j.end() || !f->is_string() || f->get_ref<const std::string&>() != kCheckpointFormat)
    fail("is not a deloco checkpoint manifest (no \"format\": \"" + std::string(kCheckpointFormat) + "\")");
  auto v = j.find("version");
  if (v == j.end() || !v->is_number_integer()) fail("has no integer \"version\"");
  if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(kCheckpointVersion)
                              : v->get<int64_t>() > kCheckpointVersion)
    fail("has version " + v->dump() + ", newer than this deloco understands (" + std::to_string(kCheckpointVersion) +
         ")");
  if (!v->is_number_unsigned() || v->get<uint64_t>() < 1) fail("has an invalid version " + v->dump());
  m.version = static_cast<int>(v->get<uint64_t>());

  auto s = j.find("sequence");
  if (s != j.end()) {
    if (!non_negative_int(*s)) fail("has a \"sequence\" that is not a non-negative integer");
    m.sequence = s->get<int64_t>();
  }
  for (const char* key : {"step", "tokens_seen"}) {
    auto it = j.find(key);
    if (it != j.end() && !non_negative_int(*it))
      fail(std::string("has a \"") + key + "\" that is not a non-negative integer (" + type_of(*it) + ")");
  }
  for (const char* key : {"kind", "model_fingerprint", "fingerprint"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_string())
      fail(std::string("has a \"") + key + "\" that is not a string (" + type_of(*it) + ")");
  }
  auto c = j.find("config");
  if (c != j.end() && !c->is_object()) fail(std::string("has a \"config\" that is not an object (") + type_of(*c) + ")");

  auto files = j.find("files");
  if (files == j.end() || !files->is_object()) fail("has no \"files\" object");
  for (auto it = files->begin(); it != files->end(); ++it) {
    const std::string& name = it.key();
    if (!plain_file_name(name)) fail("lists a file with an invalid name (a plain file name is required)");
    const nlohmann::json& e = *it;
    if (!e.is_object()) fail("has a record of '" + name + "' that is not an object");
    auto b = e.find("bytes");
    if (b == e.end() || !b->is_number_unsigned()) fail("has no byte count of '" + name + "'");
    ManifestFile rec;
    rec.bytes = b->get<uint64_t>();
    if (m.version >= 2) {
      auto h = e.find("hash");
      auto d = e.find("digest");
      if (h == e.end() || !h->is_string() || h->get_ref<const std::string&>() != kBlake2b256Name)
        fail("has no known \"hash\" of '" + name + "' (expected \"" + std::string(kBlake2b256Name) + "\")");
      if (d == e.end() || !d->is_string() || !is_hex(d->get_ref<const std::string&>(), 64))
        fail("has no \"digest\" of '" + name + "' (64 lowercase hex digits)");
      rec.hash = kBlake2b256Name;
      rec.digest = d->get<std::string>();
    } else {
      auto d = e.find(kLegacyFnvHashName);
      if (d == e.end() || !d->is_string() || !is_hex(d->get_ref<const std::string&>(), 16))
        fail("has no \"fnv1a64\" hash of '" + name + "' (16 lowercase hex digits)");
      rec.hash = kLegacyFnvHashName;
      rec.digest = d->get<std::string>();
    }
    m.files[name] = rec;
  }
  if (!m.files.count("model.safetensors")) fail("does not list 'model.safetensors'");
  return m;
}

ManifestFile describe_checkpoint_file(const std::string& bytes) {
  ManifestFile r;
  r.bytes = bytes.size();
  r.hash = kBlake2b256Name;
  r.digest = blake2b256_hex(bytes.data(), bytes.size());
  return r;
}

void verify_checkpoint_file(const ManifestFile& record, const std::string& bytes, const std::string& path) {
  verify_checkpoint_file(record, bytes.data(), bytes.size(), path);
}

void verify_checkpoint_file(const ManifestFile& record, const char* data, size_t size, const std::string& path) {
  if (size != record.bytes)
    throw CheckpointError("checkpoint file '" + path + "' has " + std::to_string(size) +
                          " bytes, the manifest says " + std::to_string(record.bytes) + " (truncated or replaced)");
  bool ok = false;
  if (record.hash == kBlake2b256Name) {
    ok = blake2b256_hex(data, size) == record.digest;
  } else if (record.hash == kLegacyFnvHashName) {
    ok = fnv1a64_hex(data, size) == record.digest || fnv1a64_short_basis_hex(data, size) == record.digest;
  } else {
    throw CheckpointError("checkpoint file '" + path + "' has a record with the unknown hash '" + record.hash + "'");
  }
  if (!ok)
    throw CheckpointError("checkpoint file '" + path + "' is corrupt: its " + record.hash +
                          " hash does not match the manifest");
}

std::string render_checkpoint_manifest(nlohmann::json manifest, int64_t sequence,
                                       const std::map<std::string, ManifestFile>& files) {
  nlohmann::json fj = nlohmann::json::object();
  for (const auto& [name, r] : files) fj[name] = {{"bytes", r.bytes}, {"hash", r.hash}, {"digest", r.digest}};
  manifest["format"] = kCheckpointFormat;
  manifest["version"] = kCheckpointVersion;
  manifest["sequence"] = sequence;
  manifest["files"] = fj;
  // Invalid UTF-8 in a writer's string (a config value) must not make the checkpoint unwritable.
  return manifest.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace deloco
