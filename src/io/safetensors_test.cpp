#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/fs.h"
#include "deloco/safetensors.h"

namespace deloco {
namespace {

TensorFile sample() {
  TensorFile f;
  f.tensors["a.weight"] = torch::randn({3, 4});
  f.tensors["b.bias"] = torch::arange(5, torch::kLong);
  f.tensors["c.half"] = torch::randn({2, 2}).to(torch::kBFloat16);
  f.tensors["empty"] = torch::zeros({0, 3});
  f.metadata["format"] = "pt";
  return f;
}

TEST(Safetensors, RoundTripIsBitExact) {
  auto f = sample();
  auto g = decode_safetensors(encode_safetensors(f), "mem");
  ASSERT_EQ(g.tensors.size(), f.tensors.size());
  for (auto& [k, v] : f.tensors) {
    EXPECT_EQ(g.tensors[k].scalar_type(), v.scalar_type()) << k;
    EXPECT_TRUE(g.tensors[k].equal(v)) << k;
  }
  EXPECT_EQ(g.metadata.at("format"), "pt");
  // Header layout: 8-byte length then JSON, data aligned to 8 bytes.
  auto bytes = encode_safetensors(f);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
}

std::string error_of(const std::string& bytes) {
  try {
    decode_safetensors(bytes, "bad.safetensors");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RejectsTruncationAndCorruption) {
  auto bytes = encode_safetensors(sample());
  EXPECT_NE(error_of(bytes.substr(0, 5)).find("bad.safetensors"), std::string::npos);
  EXPECT_NE(error_of(bytes.substr(0, bytes.size() - 1)).find("outside the data section"), std::string::npos);
  std::string huge = bytes;
  huge[7] = 0x7f;  // header length ~ 2^63
  EXPECT_NE(error_of(huge).find("exceeds"), std::string::npos);
  std::string bad_json = bytes;
  bad_json[8] = '[';
  EXPECT_NE(error_of(bad_json), "");
  // Shape that does not match the byte range.
  TensorFile one;
  one.tensors["x"] = torch::ones({4});
  std::string s = encode_safetensors(one);
  auto pos = s.find("[4]");
  ASSERT_NE(pos, std::string::npos);
  s[pos + 1] = '5';
  EXPECT_NE(error_of(s).find("'x'"), std::string::npos);
  EXPECT_EQ(error_of(bytes), "");
}

TEST(Safetensors, FileRoundTripAndMissingFile) {
  auto path = (std::filesystem::temp_directory_path() / ("deloco_st_" + std::to_string(::getpid()) + ".safetensors")).string();
  auto f = sample();
  save_safetensors(path, f);
  auto g = load_safetensors(path);
  for (auto& [k, v] : f.tensors) EXPECT_TRUE(g.tensors.at(k).equal(v)) << k;
  std::filesystem::remove(path);
  EXPECT_THROW(load_safetensors(path), SafetensorsError);
}

}  // namespace
}  // namespace deloco
