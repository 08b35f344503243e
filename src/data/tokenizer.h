// data/tokenizer.h — SentencePiece BPE tokenizers: training one on a text corpus (`deloco tokenize`), and
// encoding and decoding with it (`deloco sample` on a model trained on token files).
//
// Contract
//  * Tokenizers are trained lossless: no normalisation, no dummy prefix, spaces kept, byte fallback for every
//    character outside the vocabulary. decode(encode(text)) == text for any UTF-8 text that does not itself hold
//    U+2581 ("▁", SentencePiece's space marker).
//  * Text is encoded in chunks of at most 2048 bytes, cut before a space (or at a character boundary when a chunk
//    holds no space), and "\n" is always the byte token <0x0A>: chunks never change the result, because BPE pieces
//    never span a space.
//  * Errors (an unreadable or corrupt model, a vocabulary SentencePiece cannot reach, input that is not UTF-8)
//    throw TokenizerError naming the file or the problem. A Tokenizer is immutable after loading and may encode
//    and decode from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deloco/error.h"

namespace deloco {

struct DataConfig;

class Tokenizer {
 public:
  // Loads a SentencePiece model file (tokenizer.model).
  static Tokenizer load(const std::string& path);
  // Trains a BPE tokenizer of `vocab_size` pieces on `text` (byte fallback needs vocab_size >= 260).
  static Tokenizer train(const std::string& text, int64_t vocab_size, int64_t threads);

  int64_t vocab_size() const;
  std::vector<uint32_t> encode(const std::string& text) const;
  // Ids outside the vocabulary are refused (TokenizerError).
  std::string decode(const std::vector<int64_t>& ids) const;
  // The model file's bytes (what save() writes).
  const std::string& serialized() const;
  void save(const std::string& path) const;

  struct Impl;  // defined in src/data/tokenizer.cpp

 private:
  std::shared_ptr<const Impl> impl_;
};

// `deloco tokenize`: reads `text` as data.format = "text" would (so the validation documents are the byte-level
// split's), trains a tokenizer on the training text, and writes into `out_dir`: train.bin and val.bin (llm.c
// format), tokenizer.model, and tokens.json recording each file's tokens and the bytes of text behind them.
struct TokenizeReport {
  int64_t vocab_size = 0, train_tokens = 0, val_tokens = 0, train_bytes = 0, val_bytes = 0;
  double train_seconds = 0, encode_seconds = 0;
};
TokenizeReport tokenize_corpus(const DataConfig& text, int64_t vocab_size, const std::string& out_dir, int64_t threads);

}  // namespace deloco
