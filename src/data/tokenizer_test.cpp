// SentencePiece tokenizers (data/tokenizer.h) and `deloco tokenize`'s corpus conversion, on the real corpus.
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "deloco/gpt/data.h"
#include "support/proc.h"
#include "util/fs.h"

namespace deloco {
namespace tokenizer_cases {
namespace fs = std::filesystem;

const std::string kSrc = test::source_dir();

// A few addresses of the corpus: enough text for a small vocabulary, quick to train on.
std::string some_text() {
  std::string t;
  for (const char* f : {"1790_george_washington_n.txt", "1861_abraham_lincoln_r.txt", "1934_franklin_d_roosevelt_d.txt"}) {
    const fs::path p = fs::path(kSrc) / "data" / "sotu" / f;
    t += read_file(p.string()) + "\n";  // throws when the corpus is missing (run scripts/setup.sh)
  }
  return t;
}

TEST(Tokenizer, IsLosslessOnTextItNeverSaw) {
  const std::string text = some_text();
  ASSERT_GT(text.size(), 20000u) << "run scripts/setup.sh first: the corpus is missing";
  const Tokenizer tok = Tokenizer::train(text, 600, 2);
  EXPECT_EQ(tok.vocab_size(), 600);
  const std::string unseen = "Line one,\n\n  two spaces\tand a tab; ünïcödé — 東京 😀\n" + std::string(5000, 'z') +
                             " tail without newline";
  const auto ids = tok.encode(unseen);
  std::vector<int64_t> wide(ids.begin(), ids.end());
  EXPECT_EQ(tok.decode(wide), unseen);
  for (auto id : ids) EXPECT_LT(id, 600u);
  // Known text compresses: several bytes per token.
  EXPECT_LT(static_cast<double>(tok.encode(text).size()), 0.5 * static_cast<double>(text.size()));
  EXPECT_THROW(tok.decode({600}), TokenizerError);
  EXPECT_THROW(tok.decode({-1}), TokenizerError);
}

TEST(Tokenizer, SavedModelLoadsAndEncodesAlikeAndGarbageIsRefused) {
  const std::string text = some_text();
  ASSERT_FALSE(text.empty());
  const Tokenizer tok = Tokenizer::train(text, 400, 1);
  const fs::path dir = fs::temp_directory_path() / ("deloco_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  tok.save((dir / "t.model").string());
  const Tokenizer again = Tokenizer::load((dir / "t.model").string());
  EXPECT_EQ(again.encode(text.substr(0, 5000)), tok.encode(text.substr(0, 5000)));
  write_file_atomic((dir / "bad.model").string(), "not a model at all");
  try {
    Tokenizer::load((dir / "bad.model").string());
    FAIL() << "garbage accepted as a tokenizer";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.model"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::load((dir / "missing.model").string()), TokenizerError);
  EXPECT_THROW(Tokenizer::train(text, 100, 1), TokenizerError);  // below 256 bytes + merges
  fs::remove_all(dir);
}

// tokenize_corpus: the token files hold exactly the byte-level split's train and validation text, encoded, and the
// corpus loaded from them has the bytes per token that make bits per byte comparable.
TEST(Tokenizer, TokenizedCorpusKeepsTheByteLevelSplit) {
  const fs::path dir = fs::temp_directory_path() / ("deloco_tokcorpus_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "text");
  for (int i = 0; i < 10; ++i)
    write_file_atomic((dir / "text" / ("doc" + std::to_string(i) + ".txt")).string(),
                      some_text().substr(static_cast<size_t>(i) * 4000, 4000));
  DataConfig text;
  text.path = (dir / "text").string();
  text.val_fraction = 0.2;
  const auto r = tokenize_corpus(text, 500, (dir / "tok").string(), 2);
  const Corpus bytes = Corpus::load(text);
  DataConfig tokcfg;
  tokcfg.path = (dir / "tok").string();
  tokcfg.format = "tokens";
  const Corpus toks = Corpus::load(tokcfg);
  EXPECT_EQ(r.train_bytes, static_cast<int64_t>(bytes.train().size()));
  EXPECT_EQ(r.val_bytes, static_cast<int64_t>(bytes.val().size()));
  EXPECT_EQ(toks.train_tokens().size(), r.train_tokens);
  EXPECT_EQ(toks.val_tokens().size(), r.val_tokens);
  EXPECT_NEAR(toks.val_bytes_per_token(), static_cast<double>(r.val_bytes) / static_cast<double>(r.val_tokens), 1e-12);
  const Tokenizer tok = Tokenizer::load((dir / "tok" / "tokenizer.model").string());
  std::vector<int64_t> val(static_cast<size_t>(toks.val_tokens().size()));
  toks.val_tokens().copy(0, toks.val_tokens().size(), val.data());
  EXPECT_EQ(tok.decode(val), bytes.val());
  EXPECT_NO_THROW(toks.check_vocabulary(500));
  EXPECT_THROW(toks.check_vocabulary(300), DataError);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deloco
