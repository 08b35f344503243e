// End-to-end tests of `deloco merge`: real process, real files. CTest passes DELOCO_BINARY; when running the
// test binary by hand from the repository root, set DELOCO_BINARY=./build-merge/deloco (or similar).
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/safetensors.h"
#include "util/fs.h"

namespace deloco {
namespace merge_cli_cases {
namespace fs = std::filesystem;

struct CliResult {
  int code;
  std::string out;
};

CliResult deloco(const std::string& args) {
  const char* bin = std::getenv("DELOCO_BINARY");
  std::string cmd = std::string(bin ? bin : "./deloco") + " merge " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  CliResult r{-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class MergeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("merge_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    base_.tensors = {{"w", at::randn({6, 4})}, {"b", at::randn({4})}, {"steps", at::arange(3)}};
    save_safetensors(path("base"), base_);
    for (int i = 0; i < 3; ++i) {
      TensorFile f = base_;
      f.tensors["w"] = base_.tensors["w"] + at::randn({6, 4});
      f.tensors["b"] = base_.tensors["b"] + at::randn({4});
      save_safetensors(path("in" + std::to_string(i)), f);
      inputs_.push_back(f);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& stem) const { return (dir_ / (stem + ".safetensors")).string(); }
  std::string ins() const { return path("in0") + " " + path("in1") + " " + path("in2"); }

  fs::path dir_;
  TensorFile base_;
  std::vector<TensorFile> inputs_;
};

TEST_F(MergeCli, MergesTaskVectorsAndWritesManifest) {
  CliResult r = deloco("--method mean --base " + path("base") + " --inputs " + ins() + " --out " + path("out") +
                 " --alpha 0.5 --weights 1 1 2 --threads 2 --summary " + (dir_ / "s.json").string());
  ASSERT_EQ(r.code, 0) << r.out;
  TensorFile out = load_safetensors(path("out"));
  for (const char* n : {"w", "b"}) {
    at::Tensor tau = 0.25 * (inputs_[0].tensors[n] - base_.tensors[n]) +
                     0.25 * (inputs_[1].tensors[n] - base_.tensors[n]) +
                     0.5 * (inputs_[2].tensors[n] - base_.tensors[n]);
    EXPECT_TRUE(at::allclose(out.tensors.at(n), base_.tensors[n] + 0.5 * tau, 1e-5, 1e-5)) << n;
  }
  EXPECT_TRUE(at::equal(out.tensors.at("steps"), base_.tensors["steps"]));  // integers are copied
  auto m = nlohmann::json::parse(read_file(path("out") + ".manifest.json"));
  EXPECT_EQ(m["method"], "mean");
  EXPECT_EQ(m["alpha"], 0.5);
  EXPECT_EQ(m["inputs"].size(), 3u);
  EXPECT_EQ(m["per_tensor"]["w"], "mean");
  EXPECT_EQ(m["tensors_copied"][0], "steps");
  EXPECT_TRUE(fs::exists(dir_ / "s.json"));

  // isoloco plan: iso_c for the matrix, mean for the vector.
  r = deloco("--method isoloco --base " + path("base") + " --inputs " + ins() + " --out " + path("iso"));
  ASSERT_EQ(r.code, 0) << r.out;
  m = nlohmann::json::parse(read_file(path("iso") + ".manifest.json"));
  EXPECT_EQ(m["per_tensor"]["w"], "iso_c");
  EXPECT_EQ(m["per_tensor"]["b"], "mean");
  at::Tensor delta = load_safetensors(path("iso")).tensors.at("w") - base_.tensors["w"];
  at::Tensor s = at::linalg_svdvals(delta);
  EXPECT_LT((s.max() - s.min()).item<float>(), 1e-4 * s.max().item<float>());  // flat spectrum
}

TEST_F(MergeCli, BadInputFailsWithAClearMessage) {
  auto expect_fail = [&](const std::string& args, const std::string& needle) {
    CliResult r = deloco(args);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("deloco: error:"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << r.out;
  };
  const std::string base = " --base " + path("base") + " --out " + path("bad");
  expect_fail("--method median" + base + " --inputs " + ins(), "unknown merge method 'median'");
  expect_fail("--method mean" + base + " --inputs " + ins() + " --weights 1 2", "--weights: 2 weights given for 3");

  TensorFile shape = base_;
  shape.tensors["w"] = at::randn({4, 6});
  save_safetensors(path("shape"), shape);
  expect_fail("--method mean" + base + " --inputs " + path("in0") + " " + path("shape"), "tensor 'w' has shape");

  TensorFile missing = base_;
  missing.tensors.erase("b");
  save_safetensors(path("missing"), missing);
  expect_fail("--method mean" + base + " --inputs " + path("missing"), "tensor 'b' is in the base but missing");

  TensorFile nan = base_;
  nan.tensors["b"] = at::full({4}, NAN);
  save_safetensors(path("nan"), nan);
  expect_fail("--method mean" + base + " --inputs " + path("nan"), "tensor 'b' in " + path("nan") + " contains NaN");
  EXPECT_FALSE(fs::exists(path("bad")));  // nothing written on failure
}

}  // namespace
}  // namespace deloco
