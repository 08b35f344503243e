// deloco/data.h — the corpus, its train/validation split, and per-learner shards of byte-level tokens.
//
// Tokens are bytes (vocabulary 256). The corpus is a UTF-8 text file or a folder of them (read recursively,
// hidden files skipped, sorted by path so the order never depends on the filesystem).
//
// Split: with D >= 2 documents, every k-th document (k = round(1/val_fraction)) is held out for validation;
// with a single document the last val_fraction of its bytes is. Validation text is never trained on.
//
// Shards: the training stream is cut into M contiguous, disjoint ranges; learner i draws windows of T+1 bytes
// that lie wholly inside range i. The window for (seed, learner, step, row) is a pure function of those
// numbers (splitmix64), so batches are reproducible and resumption needs no sampler state.
//
// Errors: a missing path, an empty corpus, a file that is not valid UTF-8, or a shard too small for one window
// throw DataError naming the path or the numbers. Objects are immutable after construction and may be read
// from several threads.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deloco/error.h"

namespace deloco {

class ConfigSchema;

class DataError : public Error {
 public:
  using Error::Error;
};

struct DataConfig {
  std::string path = "data/sotu";
  double val_fraction = 0.05;
  void bind(ConfigSchema& schema);
};

class Corpus {
 public:
  static Corpus load(const DataConfig& cfg);
  // Builds a corpus from in-memory documents (tests, examples).
  static Corpus from_documents(const std::vector<std::string>& docs, double val_fraction);

  const std::string& train() const { return train_; }
  const std::string& val() const { return val_; }
  int64_t num_documents() const { return num_documents_; }
  // Entropy in bits of the byte distribution of the training text: the loss of a model that ignores context.
  double unigram_entropy_bits() const;

 private:
  std::string train_, val_;
  int64_t num_documents_ = 0;
};

// The range [begin, end) of the training stream that learner `learner` of `num_learners` owns.
std::pair<int64_t, int64_t> shard_range(int64_t stream_size, int64_t learner, int64_t num_learners);

class ShardSampler {
 public:
  ShardSampler(const std::string& stream, int64_t learner, int64_t num_learners, int64_t block_size, uint64_t seed);
  // Offsets (into the stream) of the `batch_size` windows of `step`.
  std::vector<int64_t> offsets(int64_t step, int64_t batch_size) const;
  // [batch_size, block_size + 1] int64 tokens of `step` on the CPU; inputs are [:, :-1], targets [:, 1:].
  at::Tensor batch(int64_t step, int64_t batch_size) const;
  std::pair<int64_t, int64_t> range() const { return {begin_, end_}; }

 private:
  const std::string* stream_;
  int64_t begin_, end_, block_size_, learner_;
  uint64_t seed_;
};

// Evenly spaced windows of block_size + 1 tokens covering up to `max_tokens` of `text` ([N, block_size + 1]).
at::Tensor evaluation_windows(const std::string& text, int64_t block_size, int64_t max_tokens);

}  // namespace deloco
