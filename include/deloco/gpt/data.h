// deloco/gpt/data.h — the corpus, its train/validation split, and per-learner shards of tokens.
//
// Two formats (data.format):
//  * "text" (the default): tokens are bytes (vocabulary 256). The corpus is a UTF-8 text file or a folder of them
//    (read recursively, hidden files skipped, sorted by path so the order never depends on the filesystem).
//    Split: with D >= 2 documents, every k-th document (k = round(1/val_fraction)) is held out for validation;
//    with a single document the last val_fraction of its bytes is.
//  * "tokens": already-tokenized files, memory-mapped, never copied. A file is either in llm.c's format (a header of
//    256 little-endian int32: magic 20240520, version 1 = uint16 tokens, the token count; then the tokens) or raw
//    little-endian uint16 / uint32 tokens (nanoGPT's train.bin; data.dtype says which). data.path is one file or
//    a folder whose *.bin files are read, sorted by path. Split: the files whose names match data.val_pattern
//    (default "*val*") are validation; when none matches, the last val_fraction of the token stream is.
//    A `tokens.json` beside the files (written by `deloco tokenize`) records the bytes of text behind each file;
//    with it, losses convert to bits per byte comparable with byte-level models; without it bits per byte is NaN.
//    Its "files" entries must be objects with an integer "tokens" (matching the file) and a number "bytes" (absent:
//    bits per byte NaN); a field of another type is a DataError naming the file and the field.
// Validation tokens are never trained on. data.holdout = dev | test keeps the first | second half of them.
//
// Shards: the training stream (the files one after another) is cut into M contiguous, disjoint ranges; learner i
// draws windows of T+1 tokens that lie wholly inside range i. The window for (seed, learner, step, row) is a pure
// function of those numbers (splitmix64), so batches are reproducible and resumption needs no sampler state.
//
// Errors: a missing path, an empty corpus, a file that is not valid UTF-8, a token file whose size or header is
// wrong, a token id the model cannot represent (check_vocabulary), or a shard too small for one window throw
// DataError naming the path, offset or numbers. Objects are immutable after construction and may be read from
// several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deloco/error.h"
#include "deloco/gpt/config.h"

namespace deloco {

// A read-only sequence of token ids made of segments: the bytes of a text, or the tokens of mapped files one
// after another. Copies share the segments' storage (reference counted), so a stream outlives the Corpus that
// made it.
class TokenStream {
 public:
  struct Segment {
    std::shared_ptr<const void> owner;  // keeps `data` alive
    const unsigned char* data = nullptr;
    int64_t tokens = 0;
    int width = 1;                      // bytes per token: 1 (text), 2 (uint16) or 4 (uint32)
    std::string source;                 // file the segment comes from ("" for in-memory text)
    int64_t source_first = 0;           // index, within `source`, of the segment's first token
    int64_t source_header = 0;          // bytes before the first token of `source` (1024 for llm.c files)
  };
  TokenStream() = default;
  // The bytes of `text` as tokens (byte-level). Implicit, so byte strings pass where streams are expected.
  TokenStream(std::string text);  // NOLINT(google-explicit-constructor)
  void append(Segment s);
  int64_t size() const { return size_; }
  // Writes tokens [offset, offset + n) into dst as int64; throws DataError when the range is outside the stream.
  void copy(int64_t offset, int64_t n, int64_t* dst) const;
  // Tokens [begin, end) as a new stream over the same storage.
  TokenStream slice(int64_t begin, int64_t end) const;
  const std::vector<Segment>& segments() const { return segments_; }

 private:
  std::vector<Segment> segments_;
  std::vector<int64_t> starts_;  // stream index of each segment's first token
  int64_t size_ = 0;
};

class Corpus {
 public:
  static Corpus load(const DataConfig& cfg);
  // Builds a byte-level corpus from in-memory documents (tests, examples).
  static Corpus from_documents(const std::vector<std::string>& docs, double val_fraction);

  bool is_text() const { return is_text_; }
  // The text of a text corpus (empty for token corpora).
  const std::string& train() const { return *train_text_; }
  const std::string& val() const { return *val_text_; }
  const TokenStream& train_tokens() const { return train_tokens_; }
  const TokenStream& val_tokens() const { return val_tokens_; }
  int64_t num_documents() const { return num_documents_; }  // text documents, or token files
  // The largest token id of the corpus (255 for text: every byte may occur).
  int64_t max_token() const { return max_token_; }
  // Refuses (DataError) a corpus holding a token id >= vocab_size, naming the file, the token index and its byte
  // offset; for text, a vocabulary below 256.
  void check_vocabulary(int64_t vocab_size) const;
  // Bytes of text per validation token: 1 for text; from tokens.json for token files; NaN when unknown.
  double val_bytes_per_token() const { return val_bytes_per_token_; }
  // The same over the training tokens.
  double train_bytes_per_token() const { return train_bytes_per_token_; }
  // Entropy of the training tokens' unigram distribution in bits per byte (per token / bytes per token): the loss
  // of a model that ignores context. NaN when bytes per token is unknown.
  double unigram_entropy_bits() const;

 private:
  static Corpus load_tokens(const DataConfig& cfg, const std::vector<std::string>& files);
  // Keeps the half of the validation tokens data.holdout names (DataConfig::holdout).
  Corpus keep_holdout(const std::string& which) &&;
  bool is_text_ = true;
  std::shared_ptr<const std::string> train_text_ = std::make_shared<const std::string>();
  std::shared_ptr<const std::string> val_text_ = std::make_shared<const std::string>();
  TokenStream train_tokens_, val_tokens_;
  int64_t num_documents_ = 0;
  int64_t max_token_ = 255;
  double val_bytes_per_token_ = 1.0, train_bytes_per_token_ = 1.0;
  double unigram_bits_per_token_ = 0;
};

// The range [begin, end) of the training stream that learner `learner` of `num_learners` owns.
std::pair<int64_t, int64_t> shard_range(int64_t stream_size, int64_t learner, int64_t num_learners);

class ShardSampler {
 public:
  ShardSampler(TokenStream stream, int64_t learner, int64_t num_learners, int64_t block_size, uint64_t seed);
  // Offsets (into the stream) of the `batch_size` windows of `step`.
  std::vector<int64_t> offsets(int64_t step, int64_t batch_size) const;
  // [batch_size, block_size + 1] int64 tokens of `step` on the CPU; inputs are [:, :-1], targets [:, 1:].
  at::Tensor batch(int64_t step, int64_t batch_size) const;
  std::pair<int64_t, int64_t> range() const { return {begin_, end_}; }

 private:
  TokenStream stream_;
  int64_t begin_, end_, block_size_, learner_;
  uint64_t seed_;
};

// Evenly spaced windows of block_size + 1 tokens covering up to `max_tokens` of `stream` ([N, block_size + 1]).
at::Tensor evaluation_windows(const TokenStream& stream, int64_t block_size, int64_t max_tokens);

// ---- Token files (llm.c format) -----------------------------------------------------------------------------
constexpr int32_t kLlmcMagic = 20240520;
// Writes `tokens` (each < 65536) to `path` in llm.c's format (version 1, uint16), atomically.
void write_llmc_tokens(const std::string& path, const std::vector<uint32_t>& tokens);

}  // namespace deloco
