#include "util/manifest.h"

#include <random>

#include <gtest/gtest.h>

#include "util/hash.h"

namespace deloco {
namespace manifest_cases {

std::string error_of(const std::string& text) {
  try {
    parse_checkpoint_manifest(text, "ck/manifest.json");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

const std::string kGood = render_checkpoint_manifest({{"step", 20}, {"kind", "train"}, {"config", {{"a", 1}}}}, 7,
                                                     {{"model.safetensors", describe_checkpoint_file("weights")}});

TEST(Manifest, RoundTrip) {
  auto m = parse_checkpoint_manifest(kGood, "x");
  EXPECT_EQ(m.version, kCheckpointVersion);
  EXPECT_EQ(m.sequence, 7);
  ASSERT_EQ(m.files.count("model.safetensors"), 1u);
  const auto& f = m.files.at("model.safetensors");
  EXPECT_EQ(f.bytes, 7u);
  EXPECT_EQ(f.hash, "blake2b-256");
  EXPECT_EQ(f.digest, blake2b256_hex("weights", 7));
  EXPECT_EQ(m.json["step"], 20);
  EXPECT_EQ(m.json["files"]["model.safetensors"]["hash"], "blake2b-256");
  EXPECT_NO_THROW(verify_checkpoint_file(f, "weights", "ck/model.safetensors"));
}

TEST(Manifest, RejectsEverythingElseWithTheFileName) {
  nlohmann::json good = nlohmann::json::parse(kGood);
  auto with = [&](const std::string& pointer, const nlohmann::json& v) {
    nlohmann::json j = good;
    j[nlohmann::json::json_pointer(pointer)] = v;
    return j.dump();
  };
  auto without = [&](const std::string& pointer) {
    nlohmann::json j = good;
    j.at(nlohmann::json::json_pointer(pointer).parent_pointer()).erase(nlohmann::json::json_pointer(pointer).back());
    return j.dump();
  };
  EXPECT_EQ(error_of(kGood), "");
  for (const std::string& bad :
       {std::string(""), std::string("{"), std::string("[]"), std::string("\"x\""), std::string("{\"format\":1}"),
        with("/format", "other"), without("/format"), with("/version", 3), with("/version", 0), with("/version", -1),
        with("/version", "2"), with("/version", 1.5), without("/version"), with("/sequence", -1),
        with("/sequence", "1"), with("/step", -5), with("/step", 1e30), with("/step", "20"), with("/kind", 3),
        with("/model_fingerprint", nlohmann::json::array()), with("/config", "tiny"), without("/files"),
        with("/files", nlohmann::json::array()), with("/files", nlohmann::json::object()),
        with("/files/model.safetensors/bytes", -1), with("/files/model.safetensors/bytes", "7"),
        without("/files/model.safetensors/bytes"), with("/files/model.safetensors/hash", "sha1"),
        with("/files/model.safetensors/digest", "ABC"), without("/files/model.safetensors/digest"),
        with("/files/model.safetensors", 7), with("/files/..", good["files"]["model.safetensors"]),
        with("/files/a~1b", good["files"]["model.safetensors"]), std::string(kMaxManifestBytes + 1, ' ')}) {
    const std::string e = error_of(bad);
    EXPECT_NE(e.find("ck/manifest.json"), std::string::npos) << "accepted or unnamed: " << bad.substr(0, 200) << " → " << e;
  }
  EXPECT_NE(error_of(with("/version", 3)).find("newer than this deloco"), std::string::npos);
  // A deeply nested value is refused without recursion trouble (and never echoed back).
  EXPECT_NE(error_of("{\"format\":\"deloco-checkpoint\",\"version\":2,\"kind\":" + std::string(100000, '[') +
                     std::string(100000, ']') + "}"),
            "");
}

// A cheap stand-in for the libFuzzer target: random byte edits of a valid manifest either parse or throw
// CheckpointError, nothing else.
TEST(Manifest, RandomEditsOnlyEverThrowCheckpointError) {
  std::mt19937 g(11);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string t = kGood;
    for (int e = 0, n = 1 + static_cast<int>(g() % 4); e < n; ++e) {
      const size_t at = g() % t.size();
      switch (g() % 3) {
        case 0: t[at] = static_cast<char>(g() & 0xff); break;
        case 1: t.erase(at, 1 + g() % 8); break;
        default: {
          static const char kJsonish[] = "{}[]\":,0-9e\\";
          t.insert(at, std::string(1 + g() % 3, kJsonish[g() % (sizeof(kJsonish) - 1)]));
          break;
        }
      }
      if (t.empty()) t = "{";
    }
    try {
      parse_checkpoint_manifest(t, "fuzz");
      ++accepted;
    } catch (const CheckpointError&) {
    }
  }
  EXPECT_GT(accepted, 0);  // some edits keep it valid (inside strings, whitespace)
}

TEST(Manifest, VersionOneWithEitherFnvBasisStillVerifies) {
  const std::string bytes = "old checkpoint bytes";
  for (const std::string& digest : {fnv1a64_hex(bytes.data(), bytes.size()), fnv1a64_short_basis_hex(bytes.data(), bytes.size())}) {
    const nlohmann::json j = {{"format", "deloco-checkpoint"},
                              {"version", 1},
                              {"files", {{"model.safetensors", {{"bytes", bytes.size()}, {"fnv1a64", digest}}}}}};
    auto m = parse_checkpoint_manifest(j.dump(), "old");
    EXPECT_EQ(m.version, 1);
    EXPECT_EQ(m.sequence, 0);
    EXPECT_NO_THROW(verify_checkpoint_file(m.files.at("model.safetensors"), bytes, "old/model.safetensors"));
    std::string flipped = bytes;
    flipped[3] ^= 1;
    EXPECT_THROW(verify_checkpoint_file(m.files.at("model.safetensors"), flipped, "old/model.safetensors"), CheckpointError);
  }
  // A version 1 manifest has no blake2b records; a version 2 one no fnv1a64 ones.
  EXPECT_NE(error_of(R"({"format":"deloco-checkpoint","version":1,"files":{"model.safetensors":{"bytes":1,"hash":"blake2b-256","digest":")" +
                     std::string(64, '0') + R"("}}})"),
            "");
  EXPECT_NE(error_of(R"({"format":"deloco-checkpoint","version":2,"files":{"model.safetensors":{"bytes":1,"fnv1a64":"0000000000000000"}}})"), "");
}

TEST(Manifest, VerifyNamesTheFileAndTheProblem) {
  const ManifestFile r = describe_checkpoint_file("abcdef");
  try {
    verify_checkpoint_file(r, "abcde", "ck/model.safetensors");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("ck/model.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos);
  }
  try {
    verify_checkpoint_file(r, "abcdeX", "ck/model.safetensors");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos);
  }
}

}  // namespace
}  // namespace deloco
