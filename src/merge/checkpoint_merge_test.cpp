// merge_checkpoints() as a library call (the `deloco merge` process is tested in src/cli/merge_cli_test.cpp).
#include "deloco/merge.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <type_traits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/gpt/data.h"
#include "deloco/outer.h"
#include "deloco/safetensors.h"
#include "deloco/sync.h"
#include "io/tensor_stream.h"

namespace deloco {
namespace checkpoint_merge_cases {
namespace fs = std::filesystem;

// The torch-side error classes share deloco::Error (the torch-free ones: src/util/error_test.cpp).
static_assert(std::is_base_of_v<Error, MergeError>);
static_assert(std::is_base_of_v<Error, SafetensorsError>);
static_assert(std::is_base_of_v<Error, CheckpointError>);
static_assert(std::is_base_of_v<Error, DataError>);
static_assert(std::is_base_of_v<Error, OuterError>);
static_assert(std::is_base_of_v<Error, SyncError>);

class CheckpointMerge : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("checkpoint_merge_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    base_.tensors = {{"w", at::randn({6, 4})}, {"b", at::randn({4})}, {"steps", at::arange(3)}};
    for (int i = 0; i < 2; ++i) {
      TensorFile f = base_;
      f.tensors["w"] = base_.tensors["w"] + at::randn({6, 4});
      f.tensors["b"] = base_.tensors["b"] + at::randn({4});
      save_safetensors(path("in" + std::to_string(i)), f);
      inputs_.push_back(f);
    }
    save_safetensors(path("base"), base_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& stem) const { return (dir_ / (stem + ".safetensors")).string(); }
  CheckpointMergeOptions options() const {
    CheckpointMergeOptions o;
    o.base = path("base");
    o.inputs = {path("in0"), path("in1")};
    o.out = path("out");
    o.merge.threads = 2;
    return o;
  }
  fs::path dir_;
  TensorFile base_;
  std::vector<TensorFile> inputs_;
};

TEST_F(CheckpointMerge, MeanOfTaskVectorsScaledByAlphaWithManifest) {
  CheckpointMergeOptions o = options();
  o.merge.alpha = 0.5;
  const nlohmann::json m = merge_checkpoints(o);
  const TensorFile out = load_safetensors(o.out);
  for (const char* name : {"w", "b"}) {
    const at::Tensor b = base_.tensors.at(name);
    const at::Tensor want =
        b + 0.5 * ((inputs_[0].tensors.at(name) - b) + (inputs_[1].tensors.at(name) - b)) / 2;
    EXPECT_TRUE(at::allclose(out.tensors.at(name), want, 1e-5, 1e-6)) << name;
  }
  EXPECT_TRUE(out.tensors.at("steps").equal(base_.tensors.at("steps")));
  EXPECT_EQ(m["tensors_merged"].get<int64_t>(), 2);
  EXPECT_EQ(m["tensors_copied"], nlohmann::json::array({"steps"}));
  EXPECT_EQ(m["alpha"].get<double>(), 0.5);
  EXPECT_TRUE(fs::exists(o.out + ".manifest.json"));
}

// A checkpoint folder is read as every reader of a checkpoint reads it: its model.safetensors checked against the
// manifest (size, then BLAKE2b-256). Found by review: merge mapped the file with only the safetensors header
// checked, so a flipped data byte (or another file of the same shapes) merged silently.
TEST_F(CheckpointMerge, ACheckpointFolderIsVerifiedAgainstItsManifest) {
  CheckpointMergeOptions o = options();
  for (int i = 0; i < 2; ++i)
    write_checkpoint((dir_ / ("ck" + std::to_string(i))).string(), nlohmann::json{{"kind", "train"}, {"step", 0}},
                     inputs_[static_cast<size_t>(i)], nullptr);
  o.inputs = {(dir_ / "ck0").string(), (dir_ / "ck1").string()};
  EXPECT_NO_THROW(merge_checkpoints(o));
  const TensorFile clean = load_safetensors(o.out);
  // One byte of ck1's tensor data flipped (the last byte of the file: inside w or b, not the header).
  const std::string model = (dir_ / "ck1" / "model.safetensors").string();
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x10));
  }
  EXPECT_NO_THROW(MappedSafetensors{model}) << "the header is intact: only the manifest can tell";
  fs::remove(o.out);
  try {
    merge_checkpoints(o);
    ADD_FAILURE() << "merged a corrupt checkpoint";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(model), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(o.out));
  o.inputs = {(dir_ / "ck0").string(), model};  // named by its file: the folder's manifest still applies
  EXPECT_THROW(merge_checkpoints(o), CheckpointError);
  o.inputs = {(dir_ / "ck0").string(), path("in1")};  // a plain file (no manifest beside it) as before
  EXPECT_NO_THROW(merge_checkpoints(o));
  for (const char* name : {"w", "b"}) EXPECT_TRUE(load_safetensors(o.out).tensors.at(name).equal(clean.tensors.at(name)));
}

TEST_F(CheckpointMerge, RefusesBadSettingsAndMismatchedInputsWithoutWritingOutput) {
  CheckpointMergeOptions o = options();
  o.weights = {1.0};
  EXPECT_THROW(merge_checkpoints(o), MergeError);
  o = options();
  o.merge.method = "no_such_method";
  EXPECT_THROW(merge_checkpoints(o), MergeError);
  o = options();
  o.merge.preset = "no_such_preset";
  EXPECT_THROW(merge_checkpoints(o), MergeError);
  TensorFile extra = inputs_[1];
  extra.tensors["extra"] = at::zeros({2});
  save_safetensors(path("in1"), extra);
  o = options();
  try {
    merge_checkpoints(o);
    ADD_FAILURE() << "an input with an extra tensor was merged";
  } catch (const MergeError& e) {
    EXPECT_NE(std::string(e.what()).find("'extra'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(o.out));
}

}  // namespace
}  // namespace deloco
