#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/data.h"

namespace deloco {
namespace {
namespace fs = std::filesystem;

std::vector<std::string> docs(int n) {
  std::vector<std::string> d;
  for (int i = 0; i < n; ++i) d.push_back("document number " + std::to_string(i) + " " + std::string(200, 'a' + i % 26));
  return d;
}

TEST(Data, SplitHoldsOutEveryKthDocument) {
  auto c = Corpus::from_documents(docs(40), 0.05);  // k = 20: documents 19 and 39
  EXPECT_NE(c.val().find("document number 19 "), std::string::npos);
  EXPECT_NE(c.val().find("document number 39 "), std::string::npos);
  EXPECT_EQ(c.train().find("document number 19 "), std::string::npos);
  EXPECT_NE(c.train().find("document number 18 "), std::string::npos);
  EXPECT_EQ(c.num_documents(), 40);
}

TEST(Data, SingleDocumentSplitsByBytes) {
  auto c = Corpus::from_documents({std::string(900, 'x') + std::string(100, 'y')}, 0.1);
  EXPECT_EQ(c.val(), std::string(100, 'y'));
  EXPECT_EQ(c.train(), std::string(900, 'x'));
}

TEST(Data, ShardsAreDisjointAndCoverTheStream) {
  for (int64_t m : {1, 2, 3, 7}) {
    int64_t expect = 0;
    for (int64_t i = 0; i < m; ++i) {
      auto [b, e] = shard_range(1001, i, m);
      EXPECT_EQ(b, expect);
      EXPECT_GT(e, b);
      expect = e;
    }
    EXPECT_EQ(expect, 1001);
  }
  EXPECT_THROW(shard_range(100, 3, 3), DataError);
}

TEST(Data, SamplerWindowsStayInsideTheirShardAndAreDeterministic) {
  std::string stream(10000, ' ');
  for (size_t i = 0; i < stream.size(); ++i) stream[i] = static_cast<char>(i % 251);
  const int64_t M = 4, T = 16;
  for (int64_t l = 0; l < M; ++l) {
    ShardSampler s(stream, l, M, T, 42), again(stream, l, M, T, 42), other_seed(stream, l, M, T, 43);
    auto [b, e] = s.range();
    for (int64_t step = 0; step < 50; ++step) {
      auto offs = s.offsets(step, 8);
      EXPECT_EQ(offs, again.offsets(step, 8));
      for (auto o : offs) {
        EXPECT_GE(o, b);
        EXPECT_LE(o + T + 1, e);
      }
    }
    EXPECT_NE(s.offsets(0, 8), other_seed.offsets(0, 8));
    EXPECT_NE(s.offsets(0, 8), s.offsets(1, 8));
    auto batch = s.batch(3, 2);
    auto offs = s.offsets(3, 2);
    EXPECT_EQ(batch.sizes(), (std::vector<int64_t>{2, T + 1}));
    EXPECT_EQ(batch[1][5].item<int64_t>(), static_cast<unsigned char>(stream[offs[1] + 5]));
  }
  EXPECT_THROW(ShardSampler(std::string(40, 'a'), 0, 4, 16, 1), DataError);
}

TEST(Data, EvaluationWindowsAreFixed) {
  std::string text(5000, 'q');
  auto w = evaluation_windows(text, 32, 1024);
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{32, 33}));
  EXPECT_TRUE(w.equal(evaluation_windows(text, 32, 1024)));
  EXPECT_THROW(evaluation_windows("short", 32, 1024), DataError);
}

TEST(Data, LoadsFolderAndRejectsBadInput) {
  auto dir = fs::temp_directory_path() / ("deloco_data_test_" + std::to_string(::getpid()));
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "b.txt") << "second document, long enough to be useful";
  std::ofstream(dir / "sub" / "a.txt") << "first document";
  std::ofstream(dir / ".hidden") << "never read";
  DataConfig cfg;
  cfg.path = dir.string();
  cfg.val_fraction = 0.4;
  auto c = Corpus::load(cfg);
  EXPECT_EQ(c.num_documents(), 2);
  EXPECT_EQ(c.train().find("never read"), std::string::npos);
  EXPECT_EQ(c.val().find("never read"), std::string::npos);

  std::ofstream(dir / "bad.txt", std::ios::binary) << "ok \xff\xfe not utf8";
  try {
    Corpus::load(cfg);
    FAIL() << "invalid UTF-8 accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.txt"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos);
  }
  cfg.path = (dir / "missing").string();
  EXPECT_THROW(Corpus::load(cfg), DataError);
  fs::remove_all(dir);
}

TEST(Data, UnigramEntropy) {
  std::string ab;
  for (int i = 0; i < 20; ++i) ab += "ab";
  auto c = Corpus::from_documents({ab + "zz"}, 0.05);  // 42 bytes: "zz" held out, "ab" x 20 trained on
  EXPECT_EQ(c.val(), "zz");
  EXPECT_NEAR(c.unigram_entropy_bits(), 1.0, 1e-9);
}

}  // namespace
}  // namespace deloco
