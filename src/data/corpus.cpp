#include <algorithm>
#include <cmath>
#include <filesystem>

#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/data.h"
#include "deloco/fs.h"

namespace deloco {
namespace fs = std::filesystem;
namespace {

// Returns the byte offset of the first invalid UTF-8 sequence, or -1.
int64_t first_invalid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return static_cast<int64_t>(i);
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

void DataConfig::bind(ConfigSchema& s) {
  s.bind("data.path", &path, "UTF-8 text file or folder of text files (the setup script fetches data/sotu)");
  s.bind("data.val_fraction", &val_fraction, "share of the corpus held out for validation",
         [this] { return (val_fraction > 0 && val_fraction < 0.5) ? "" : "must be in (0, 0.5)"; });
}

Corpus Corpus::load(const DataConfig& cfg) {
  std::error_code ec;
  if (!fs::exists(cfg.path, ec))
    throw DataError("corpus '" + cfg.path + "' does not exist (run scripts/setup.sh to fetch the default corpus, "
                    "or set data.path to a UTF-8 text file or folder)");
  std::vector<std::string> files;
  if (fs::is_directory(cfg.path)) {
    for (const auto& e : fs::recursive_directory_iterator(cfg.path)) {
      if (!e.is_regular_file()) continue;
      const std::string name = e.path().filename().string();
      if (!name.empty() && name[0] == '.') continue;
      files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(cfg.path);
  }
  std::vector<std::string> docs;
  for (const auto& f : files) {
    std::string text = read_file(f);
    int64_t bad = first_invalid_utf8(text);
    if (bad >= 0) throw DataError("corpus file '" + f + "' is not valid UTF-8 (first bad byte at offset " + std::to_string(bad) + ")");
    if (!text.empty()) docs.push_back(std::move(text));
  }
  if (docs.empty()) throw DataError("corpus '" + cfg.path + "' holds no text");
  return from_documents(docs, cfg.val_fraction);
}

Corpus Corpus::from_documents(const std::vector<std::string>& docs, double val_fraction) {
  Corpus c;
  c.num_documents_ = static_cast<int64_t>(docs.size());
  if (docs.size() >= 2) {
    const int64_t k = std::max<int64_t>(2, std::llround(1.0 / val_fraction));
    for (size_t i = 0; i < docs.size(); ++i) {
      std::string& dst = (static_cast<int64_t>(i % k) == k - 1) ? c.val_ : c.train_;
      if (!dst.empty()) dst.push_back('\n');
      dst += docs[i];
    }
    if (c.val_.empty()) {  // fewer than k documents: hold out the last one
      c.train_.clear();
      for (size_t i = 0; i + 1 < docs.size(); ++i) c.train_ += (i ? "\n" : "") + docs[i];
      c.val_ = docs.back();
    }
  } else {
    const std::string& d = docs.at(0);
    size_t held = std::max<size_t>(1, static_cast<size_t>(std::llround(d.size() * val_fraction)));
    size_t cut = d.size() > held ? d.size() - held : 0;
    c.train_ = d.substr(0, cut);
    c.val_ = d.substr(cut);
  }
  return c;
}

double Corpus::unigram_entropy_bits() const {
  std::vector<double> counts(256, 0.0);
  for (unsigned char ch : train_) counts[ch] += 1;
  double h = 0, n = static_cast<double>(train_.size());
  for (double k : counts)
    if (k > 0) h -= (k / n) * std::log2(k / n);
  return h;
}

std::pair<int64_t, int64_t> shard_range(int64_t stream_size, int64_t learner, int64_t num_learners) {
  if (num_learners < 1 || learner < 0 || learner >= num_learners)
    throw DataError("learner id " + std::to_string(learner) + " is outside 0.." + std::to_string(num_learners - 1));
  const int64_t base = stream_size / num_learners, extra = stream_size % num_learners;
  const int64_t begin = learner * base + std::min(learner, extra);
  return {begin, begin + base + (learner < extra ? 1 : 0)};
}

ShardSampler::ShardSampler(const std::string& stream, int64_t learner, int64_t num_learners, int64_t block_size,
                           uint64_t seed)
    : stream_(&stream), block_size_(block_size), learner_(learner), seed_(seed) {
  std::tie(begin_, end_) = shard_range(static_cast<int64_t>(stream.size()), learner, num_learners);
  if (end_ - begin_ < block_size + 1)
    throw DataError("learner " + std::to_string(learner) + " of " + std::to_string(num_learners) + " gets a shard of " +
                    std::to_string(end_ - begin_) + " bytes, fewer than one window of " + std::to_string(block_size + 1));
}

std::vector<int64_t> ShardSampler::offsets(int64_t step, int64_t batch_size) const {
  const uint64_t choices = static_cast<uint64_t>(end_ - begin_ - block_size_);  // windows [o, o + T + 1) fit
  std::vector<int64_t> out(static_cast<size_t>(batch_size));
  uint64_t h = splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(learner_) + 0x51ED27ULL));
  h = splitmix64(h ^ static_cast<uint64_t>(step));
  for (int64_t b = 0; b < batch_size; ++b) {
    h = splitmix64(h);
    out[static_cast<size_t>(b)] = begin_ + static_cast<int64_t>(h % choices);
  }
  return out;
}

at::Tensor ShardSampler::batch(int64_t step, int64_t batch_size) const {
  auto out = torch::empty({batch_size, block_size_ + 1}, torch::kLong);
  auto* dst = out.data_ptr<int64_t>();
  const auto* src = reinterpret_cast<const unsigned char*>(stream_->data());
  auto offs = offsets(step, batch_size);
  for (int64_t b = 0; b < batch_size; ++b)
    for (int64_t t = 0; t <= block_size_; ++t) dst[b * (block_size_ + 1) + t] = src[offs[static_cast<size_t>(b)] + t];
  return out;
}

at::Tensor evaluation_windows(const std::string& text, int64_t block_size, int64_t max_tokens) {
  const int64_t n_avail = (static_cast<int64_t>(text.size()) - 1) / block_size;
  if (n_avail < 1)
    throw DataError("validation text has " + std::to_string(text.size()) + " bytes, fewer than one window of " +
                    std::to_string(block_size + 1));
  const int64_t n = std::max<int64_t>(1, std::min(n_avail, max_tokens / block_size));
  auto out = torch::empty({n, block_size + 1}, torch::kLong);
  auto* dst = out.data_ptr<int64_t>();
  const auto* src = reinterpret_cast<const unsigned char*>(text.data());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = (i * n_avail / n) * block_size;  // evenly spaced, non-overlapping
    for (int64_t t = 0; t <= block_size; ++t) dst[i * (block_size + 1) + t] = src[start + t];
  }
  return out;
}

}  // namespace deloco
