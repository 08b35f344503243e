// The global model of a sharded syncer (deloco/runtime.h, assemble_shards) from shard checkpoints written here with
// the checkpoint store, as shards write them: the union of their tensors and versions, and a clear error for every
// set of folders that is not one run's complete shards.
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/runtime.h"
#include "train/run_checkpoint.h"

namespace deloco {
namespace shard_assembly_cases {
namespace fs = std::filesystem;

class ShardAssembly : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("deloco_assemble_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Shard `s` of `S` holding `tensors` (value = its index + 1), fragments `fr` at `versions`, after `merges`.
  std::string shard(int64_t s, int64_t S, const std::vector<std::string>& tensors, std::vector<int64_t> fr,
                    std::vector<int64_t> versions, int64_t merges, const std::string& fp = "00000000000000aa") {
    const fs::path d = dir_ / ("shard-" + std::to_string(s));
    nlohmann::json m{{"kind", "syncer"}, {"fingerprint", fp}, {"versions", versions}, {"step", merges},
                     {"contributions_merged", 2 * merges}, {"final", true}, {"shard", s}, {"shards", S},
                     {"fragments", fr}, {"counters", {{"merges", merges}}}};
    TensorFile model, opt;
    for (size_t i = 0; i < tensors.size(); ++i) model.tensors[tensors[i]] = torch::full({2}, static_cast<float>(i + 1));
    opt.tensors["momentum." + tensors[0]] = torch::zeros({2});
    save_run_checkpoint(d.string(), "merges_" + std::to_string(merges), m, model, &opt, 3);
    return d.string();
  }
  fs::path dir_;
};

TEST_F(ShardAssembly, TheGlobalModelIsTheUnionOfTheShards) {
  const auto a = shard(0, 2, {"w1", "w3"}, {1, 3}, {5, 6}, 11);
  const auto b = shard(1, 2, {"w0"}, {0, 2}, {7, 8}, 15);
  const AssembledModel m = assemble_shards({b, a}, (dir_ / "global").string());  // any order
  EXPECT_EQ(m.merges, 26);
  EXPECT_TRUE(m.final);
  const Checkpoint ck = read_checkpoint((dir_ / "global").string(), /*with_optimizer=*/false);
  EXPECT_EQ(ck.manifest["versions"], (nlohmann::json{7, 5, 8, 6}));  // by global fragment id
  EXPECT_EQ(ck.manifest["contributions_merged"], 52);
  EXPECT_FALSE(ck.manifest.contains("shard"));
  EXPECT_EQ(ck.manifest["assembled_from"].size(), 2u);
  ASSERT_EQ(ck.model.tensors.size(), 3u);
  EXPECT_EQ(ck.model.tensors.at("w3")[0].item<float>(), 2.0f);
  EXPECT_EQ(ck.model.tensors.at("w0")[0].item<float>(), 1.0f);
}

TEST_F(ShardAssembly, FoldersThatAreNotOneRunsShardsAreRefused) {
  auto error = [&](const std::vector<std::string>& dirs) {
    try {
      assemble_shards(dirs, (dir_ / "global").string());
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto a = shard(0, 2, {"w1"}, {1}, {5}, 11);
  const auto b = shard(1, 2, {"w0"}, {0}, {7}, 15);
  EXPECT_NE(error({a}).find("shard 0 of 2, but 1 folder was given"), std::string::npos) << error({a});  // one missing
  EXPECT_NE(error({a, a}).find("given twice"), std::string::npos) << error({a, a});
  EXPECT_NE(error({a, (dir_ / "nothing").string()}).find("no committed syncer checkpoint"), std::string::npos);
  const auto other = shard(1, 2, {"w0"}, {0}, {7}, 15, "00000000000000bb");
  fs::rename(other, dir_ / "other");
  EXPECT_NE(error({a, (dir_ / "other").string()}).find("another model"), std::string::npos);
  const auto overlap = shard(1, 2, {"w1"}, {1}, {7}, 15);  // replaces b: claims shard 0's tensor and fragment
  EXPECT_NE(error({a, overlap}).find("two shards"), std::string::npos) << error({a, overlap});
  (void)b;
}

}  // namespace
}  // namespace deloco
