#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/safetensors.h"
#include "io/tensor_stream.h"
#include "util/fs.h"

namespace deloco {
namespace safetensors_cases {

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

// A file image with this JSON header and `data_bytes` zero bytes of data.
std::string crafted(const std::string& header, size_t data_bytes = 0) {
  std::string h = header;
  while (h.size() % 8) h.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xff);
  return out + h + std::string(data_bytes, '\0');
}

// Issue 11 item 11: element count × element size wrapped modulo 2^64, so shape [2^62] F32 (2^64 bytes ≡ 0) with
// an empty byte range passed validation and reached libtorch. Now every size is checked arithmetic.
TEST(Safetensors, SizesThatOverflowAreRefusedNamingTheFile) {
  const std::string two62 = std::to_string(uint64_t{1} << 62), two63 = std::to_string(uint64_t{1} << 63);
  for (const std::string& header : std::vector<std::string>{
           R"({"x":{"dtype":"F32","shape":[)" + two62 + R"(],"data_offsets":[0,0]}})",
           R"({"x":{"dtype":"F64","shape":[)" + two62 + R"(,4],"data_offsets":[0,0]}})",
           R"({"x":{"dtype":"I16","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
           R"({"x":{"dtype":"U8","shape":[)" + two63 + R"(],"data_offsets":[0,0]}})",
           R"({"x":{"dtype":"U8","shape":[0,)" + two62 + "," + two62 + R"(],"data_offsets":[0,0]}})",
           R"({"x":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})",
           R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})",
           R"({"x":{"dtype":"F32","shape":[2.5],"data_offsets":[0,0]}})",
           R"({"x":{"dtype":)" + std::string(5000, '[') + std::string(5000, ']') + R"(,"shape":[1],"data_offsets":[0,4]}})",
       }) {
    const std::string e = error_of(crafted(header, 8));
    EXPECT_NE(e.find("'bad.safetensors' is not a valid safetensors file"), std::string::npos)
        << header.substr(0, 120) << " → " << e;
    EXPECT_LT(e.size(), 400u) << "the error echoes the input: " << e.substr(0, 200);
  }
  EXPECT_NE(error_of(crafted(R"({"x":{"dtype":"F32","shape":[)" + two62 + R"(],"data_offsets":[0,0]}})")).find("overflows"),
            std::string::npos);
  // Still fine: an empty tensor, and a real one.
  EXPECT_EQ(error_of(crafted(R"({"x":{"dtype":"F32","shape":[0,1000000],"data_offsets":[0,0]}})")), "");
  EXPECT_EQ(error_of(crafted(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8)), "");

  // The same through the files: load_safetensors and the streaming reader of `deloco merge`.
  const auto path = (std::filesystem::temp_directory_path() / ("deloco_st_big_" + std::to_string(::getpid()) + ".safetensors")).string();
  write_file_atomic(path, crafted(R"({"x":{"dtype":"F32","shape":[)" + two62 + R"(],"data_offsets":[0,0]}})"));
  for (int reader = 0; reader < 2; ++reader) {
    try {
      if (reader == 0) load_safetensors(path);
      else MappedSafetensors m(path);
      ADD_FAILURE() << "reader " << reader << " accepted a [2^62] F32 tensor of 0 bytes";
    } catch (const SafetensorsError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove(path);
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
