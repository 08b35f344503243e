#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deloco/gpt/data.h"
#include "util/fs.h"

namespace deloco {
namespace corpus_cases {
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

// data.holdout: dev and test are the two halves of the held-out text, disjoint, together all of it, and training
// never sees either.
TEST(Data, DevAndTestAreDisjointHalvesOfTheHeldOutSet) {
  auto dir = fs::temp_directory_path() / ("deloco_holdout_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "one.txt") << std::string(800, 'x') + std::string(100, 'd') + std::string(100, 't');
  DataConfig cfg;
  cfg.path = dir.string();
  cfg.val_fraction = 0.2;
  const Corpus all = Corpus::load(cfg);
  cfg.holdout = "dev";
  const Corpus dev = Corpus::load(cfg);
  cfg.holdout = "test";
  const Corpus test = Corpus::load(cfg);
  fs::remove_all(dir);
  EXPECT_EQ(all.val(), std::string(100, 'd') + std::string(100, 't'));
  EXPECT_EQ(dev.val(), std::string(100, 'd'));
  EXPECT_EQ(test.val(), std::string(100, 't'));
  EXPECT_EQ(dev.val_tokens().size() + test.val_tokens().size(), all.val_tokens().size());
  EXPECT_EQ(dev.train(), all.train());
  cfg.holdout = "both";
  EXPECT_THROW(Corpus::load(cfg), DataError);
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
  EXPECT_THROW(evaluation_windows(std::string("short"), 32, 1024), DataError);
}

TEST(Data, LoadsFolderAndRejectsBadInput) {
  auto dir = fs::temp_directory_path() / ("deloco_data_test_" + std::to_string(::getpid()));
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "b.txt") << "second document, long enough to be useful";
  std::ofstream(dir / "sub" / "a.txt") << "first document";
  std::ofstream(dir / ".hidden") << "never read";
  fs::create_directories(dir / ".git");  // a hidden folder is not entered (found by review: .git/HEAD was a document)
  std::ofstream(dir / ".git" / "HEAD") << "never read either";
  DataConfig cfg;
  cfg.path = dir.string();
  cfg.val_fraction = 0.4;
  auto c = Corpus::load(cfg);
  EXPECT_EQ(c.num_documents(), 2);
  EXPECT_EQ(c.train().find("never read"), std::string::npos);
  EXPECT_EQ(c.val().find("never read"), std::string::npos);
  EXPECT_EQ(c.train().find("either"), std::string::npos);

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

// ---- Token files (issue 12) ------------------------------------------------------------------------------------

class TokenFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("deloco_tokens_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // Raw little-endian tokens of `width` bytes.
  void write_raw(const fs::path& p, const std::vector<uint32_t>& toks, int width) {
    std::string b(toks.size() * static_cast<size_t>(width), '\0');
    for (size_t i = 0; i < toks.size(); ++i) std::memcpy(b.data() + i * static_cast<size_t>(width), &toks[i], static_cast<size_t>(width));
    write_file_atomic(p.string(), b);
  }
  std::vector<int64_t> all(const TokenStream& s) {
    std::vector<int64_t> v(static_cast<size_t>(s.size()));
    s.copy(0, s.size(), v.data());
    return v;
  }
  fs::path dir_;
};

std::vector<uint32_t> ramp(uint32_t first, size_t n, uint32_t mod = 1000) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (first + static_cast<uint32_t>(i)) % mod;
  return v;
}

// The llm.c file is written by Python from llm.c's description of the format (256 int32 header: magic, version 1,
// count; then uint16 tokens), not by deloco's own writer, so reader and writer cannot share a mistake.
TEST_F(TokenFiles, ReadsLlmcFilesWrittenByPythonAndSplitsByPattern) {
  const std::string py = "import struct,sys\n"
                         "def w(p, toks):\n"
                         "  h=[0]*256; h[0]=20240520; h[1]=1; h[2]=len(toks)\n"
                         "  open(p,'wb').write(struct.pack('<256i',*h)+struct.pack('<%dH'%len(toks),*toks))\n"
                         "w(sys.argv[1]+'/shard_000_train.bin', [(7*i)%50000 for i in range(3000)])\n"
                         "w(sys.argv[1]+'/shard_001_train.bin', [(7*i+1)%50000 for i in range(2000)])\n"
                         "w(sys.argv[1]+'/shard_000_val.bin', [65535-i for i in range(500)])\n";
  write_file_atomic((dir_ / "w.py").string(), py);
  ASSERT_EQ(std::system(("/usr/bin/python3 " + (dir_ / "w.py").string() + " " + dir_.string()).c_str()), 0);
  DataConfig cfg;
  cfg.path = dir_.string();
  cfg.format = "tokens";
  auto c = Corpus::load(cfg);
  EXPECT_FALSE(c.is_text());
  EXPECT_EQ(c.num_documents(), 3);
  ASSERT_EQ(c.train_tokens().size(), 5000);
  ASSERT_EQ(c.val_tokens().size(), 500);
  auto train = all(c.train_tokens());
  EXPECT_EQ(train[0], 0);
  EXPECT_EQ(train[2999], (7 * 2999) % 50000);
  EXPECT_EQ(train[3000], 1);  // the second file follows the first (files sorted by path)
  EXPECT_EQ(all(c.val_tokens())[0], 65535);
  EXPECT_EQ(c.max_token(), 65535);
  EXPECT_TRUE(std::isnan(c.val_bytes_per_token()));  // no tokens.json: bytes unknown
  // Windows that cross the file boundary read both files.
  std::vector<int64_t> w(10);
  c.train_tokens().copy(2995, 10, w.data());
  EXPECT_EQ(w[4], (7 * 2999) % 50000);
  EXPECT_EQ(w[5], 1);
  // A vocabulary that cannot hold 65535 is refused, naming the file, the token and the byte offset.
  try {
    c.check_vocabulary(50000);
    FAIL() << "token ids >= the vocabulary accepted";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("shard_000_val.bin"), std::string::npos) << m;
    EXPECT_NE(m.find("token id 65535 at token 0 (byte offset 1024)"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(c.check_vocabulary(65536));
}

TEST_F(TokenFiles, RawFilesNeedTheirDtypeAndMalformedFilesAreRefused) {
  write_raw(dir_ / "train.bin", ramp(0, 4000, 70000), 4);
  DataConfig cfg;
  cfg.path = (dir_ / "train.bin").string();
  cfg.format = "tokens";
  try {
    Corpus::load(cfg);
    FAIL() << "a raw file read without data.dtype";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("data.dtype"), std::string::npos) << e.what();
  }
  cfg.dtype = "uint32";
  auto c = Corpus::load(cfg);  // no validation file: the last 5% of the stream
  EXPECT_EQ(c.train_tokens().size(), 3800);
  EXPECT_EQ(c.val_tokens().size(), 200);
  EXPECT_EQ(all(c.val_tokens())[0], 3800);
  EXPECT_EQ(c.max_token(), 3999);
  cfg.dtype = "uint16";  // 16000 bytes are a whole number of uint16 too, but the ids differ
  EXPECT_EQ(Corpus::load(cfg).train_tokens().size(), 7600);

  write_file_atomic((dir_ / "odd.bin").string(), std::string(7, 'x'));
  cfg.path = (dir_ / "odd.bin").string();
  try {
    Corpus::load(cfg);
    FAIL() << "7 bytes read as uint16 tokens";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("odd.bin"), std::string::npos);
  }
  // An llm.c file cut short.
  write_llmc_tokens((dir_ / "cut.bin").string(), ramp(0, 100));
  std::string bytes = read_file((dir_ / "cut.bin").string());
  write_file_atomic((dir_ / "cut.bin").string(), bytes.substr(0, bytes.size() - 10));
  cfg.path = (dir_ / "cut.bin").string();
  cfg.dtype = "auto";
  try {
    Corpus::load(cfg);
    FAIL() << "a truncated llm.c file accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  cfg.path = (dir_ / "nothing_here").string();
  EXPECT_THROW(Corpus::load(cfg), DataError);
}

TEST_F(TokenFiles, TokensJsonGivesBytesPerTokenAndStaleMetadataIsRefused) {
  write_llmc_tokens((dir_ / "train.bin").string(), ramp(0, 1000));
  write_llmc_tokens((dir_ / "val.bin").string(), ramp(5, 100));
  nlohmann::json meta = {{"files", {{"train.bin", {{"tokens", 1000}, {"bytes", 4000}}}, {"val.bin", {{"tokens", 100}, {"bytes", 350}}}}}};
  write_file_atomic((dir_ / "tokens.json").string(), meta.dump());
  DataConfig cfg;
  cfg.path = dir_.string();
  cfg.format = "tokens";
  auto c = Corpus::load(cfg);
  EXPECT_DOUBLE_EQ(c.train_bytes_per_token(), 4.0);
  EXPECT_DOUBLE_EQ(c.val_bytes_per_token(), 3.5);
  // 1000 distinct ids each once: log2(1000) bits per token, over 4 bytes per token.
  EXPECT_NEAR(c.unigram_entropy_bits(), std::log2(1000.0) / 4.0, 1e-9);
  meta["files"]["val.bin"]["tokens"] = 99;
  write_file_atomic((dir_ / "tokens.json").string(), meta.dump());
  try {
    Corpus::load(cfg);
    FAIL() << "stale tokens.json accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("stale"), std::string::npos) << e.what();
  }
  cfg.val_pattern = "*";
  EXPECT_THROW(Corpus::load(cfg), DataError);  // every file would be validation
}

// Issue 29 item 11: a tokens.json field of the wrong type is refused naming the file and the field, not with a bare
// json.exception.type_error.
TEST_F(TokenFiles, TokensJsonOfTheWrongShapeIsRefusedNamingTheFileAndTheField) {
  write_llmc_tokens((dir_ / "train.bin").string(), ramp(0, 1000));
  write_llmc_tokens((dir_ / "val.bin").string(), ramp(5, 100));
  DataConfig cfg;
  cfg.path = dir_.string();
  cfg.format = "tokens";
  const std::string file = (dir_ / "tokens.json").string();
  auto refusal = [&](const nlohmann::json& meta) {
    write_file_atomic(file, meta.dump());
    try {
      Corpus::load(cfg);
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const nlohmann::json val = {{"tokens", 100}, {"bytes", 350}};
  struct Case {
    nlohmann::json meta;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{{"files", {{"train.bin", 1000}, {"val.bin", val}}}}, "field 'files.train.bin' must be an object, got the integer 1000"},
      {{{"files", {{"train.bin", {{"tokens", "1000"}, {"bytes", 4000}}}, {"val.bin", val}}}},
       "field 'files.train.bin.tokens' must be a non-negative integer, got a string (\"1000\")"},
      {{{"files", {{"train.bin", {{"tokens", 1000.5}, {"bytes", 4000}}}, {"val.bin", val}}}},
       "field 'files.train.bin.tokens' must be a non-negative integer, got the number 1000.5"},
      {{{"files", {{"train.bin", {{"tokens", 1000}, {"bytes", "4 kB"}}}, {"val.bin", val}}}},
       "field 'files.train.bin.bytes' must be a non-negative number, got a string (\"4 kB\")"},
      {{{"files", {{"train.bin", {{"bytes", 4000}}}, {"val.bin", val}}}}, "field 'files.train.bin.tokens' is missing"},
      {{{"files", nlohmann::json::array({"train.bin"})}}, "field 'files' must be an object, got an array"},
      {{{"format", "deloco-tokens"}}, "field 'files' is missing"},
      {nlohmann::json::array(), "field '(the document)' must be an object, got an array"},
  };
  for (const Case& c : cases) {
    const std::string m = refusal(c.meta);
    EXPECT_EQ(m.rfind("'" + file + "': " + c.says, 0), 0u) << c.meta.dump() << "\n -> " << m;
    EXPECT_EQ(m.find("json.exception"), std::string::npos) << m;
  }
  // Without "bytes" the tokens still load; bits per byte is unknown rather than computed from 0 bytes.
  write_file_atomic(file, nlohmann::json{{"files", {{"train.bin", {{"tokens", 1000}}}, {"val.bin", val}}}}.dump());
  const Corpus c = Corpus::load(cfg);
  EXPECT_TRUE(std::isnan(c.train_bytes_per_token()));
  EXPECT_DOUBLE_EQ(c.val_bytes_per_token(), 3.5);
}

TEST_F(TokenFiles, LearnerShardsOfATokenStreamAreDisjointAndDeterministic) {
  write_llmc_tokens((dir_ / "a.bin").string(), ramp(0, 3000, 60000));
  write_llmc_tokens((dir_ / "b.bin").string(), ramp(3000, 3000, 60000));
  DataConfig cfg;
  cfg.path = dir_.string();
  cfg.format = "tokens";
  auto c = Corpus::load(cfg);
  const int64_t M = 3, T = 32;
  for (int64_t l = 0; l < M; ++l) {
    ShardSampler s(c.train_tokens(), l, M, T, 9), again(c.train_tokens(), l, M, T, 9);
    auto [b, e] = s.range();
    auto batch = s.batch(4, 8);
    EXPECT_TRUE(batch.equal(again.batch(4, 8)));
    auto offs = s.offsets(4, 8);
    for (int64_t r = 0; r < 8; ++r) {
      EXPECT_GE(offs[r], b);
      EXPECT_LE(offs[r] + T + 1, e);
      EXPECT_EQ(batch[r][0].item<int64_t>(), offs[r]);  // ramp: the id is the stream index
      EXPECT_EQ(batch[r][T].item<int64_t>(), offs[r] + T);
    }
  }
}

}  // namespace
}  // namespace deloco
