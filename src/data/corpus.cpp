#include <fcntl.h>
#include <fnmatch.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/gpt/data.h"
#include "util/fs.h"

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
  s.bind("data.path", &path, "text: a UTF-8 file or folder (the setup script fetches data/sotu); tokens: a token file or a folder of *.bin");
  s.bind("data.format", &format, "text (UTF-8, one token per byte) or tokens (llm.c or raw token files)",
         [this] { return format == "text" || format == "tokens" ? "" : "must be text or tokens, not '" + format + "'"; });
  s.bind("data.dtype", &dtype, "token files: auto (llm.c header), uint16 or uint32 (raw little-endian)", [this] {
    return dtype == "auto" || dtype == "uint16" || dtype == "uint32" ? "" : "must be auto, uint16 or uint32, not '" + dtype + "'";
  });
  s.bind("data.val_pattern", &val_pattern, "token files whose names match this glob are the validation set",
         [this] { return val_pattern.empty() ? "must not be empty" : ""; });
  s.bind("data.val_fraction", &val_fraction, "share of the corpus held out for validation (token files: when no file matches data.val_pattern)",
         [this] { return (val_fraction > 0 && val_fraction < 0.5) ? "" : "must be in (0, 0.5)"; });
  s.bind("data.holdout", &holdout,
         "the held-out tokens evaluations use: all; dev (their first half: tune on it); test (the second half: report it)",
         [this] { return holdout == "all" || holdout == "dev" || holdout == "test" ? "" : "must be all, dev or test, not '" + holdout + "'"; });
  s.bind("data.tokenizer", &tokenizer, "SentencePiece model that decodes samples (empty: <data.path>/tokenizer.model when present)");
}

// ---- TokenStream ----------------------------------------------------------------------------------------------

TokenStream::TokenStream(std::string text) {
  auto owned = std::make_shared<const std::string>(std::move(text));
  Segment s;
  s.data = reinterpret_cast<const unsigned char*>(owned->data());
  s.tokens = static_cast<int64_t>(owned->size());
  s.owner = std::move(owned);
  append(std::move(s));
}

void TokenStream::append(Segment s) {
  if (s.tokens <= 0) return;
  starts_.push_back(size_);
  size_ += s.tokens;
  segments_.push_back(std::move(s));
}

namespace {
template <typename T>
void widen(const unsigned char* src, int64_t n, int64_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * static_cast<int64_t>(sizeof(T)), sizeof(T));  // little-endian hosts only (x86, arm64)
    dst[i] = static_cast<int64_t>(v);
  }
}
}  // namespace

void TokenStream::copy(int64_t offset, int64_t n, int64_t* dst) const {
  if (offset < 0 || n < 0 || offset + n > size_)
    throw DataError("tokens [" + std::to_string(offset) + ", " + std::to_string(offset + n) + ") lie outside a stream of " +
                    std::to_string(size_));
  size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - (n > 0 ? 1 : 0);
  while (n > 0) {
    const Segment& s = segments_[k];
    const int64_t within = offset - starts_[k], take = std::min(n, s.tokens - within);
    const unsigned char* src = s.data + within * s.width;
    if (s.width == 1) widen<uint8_t>(src, take, dst);
    else if (s.width == 2) widen<uint16_t>(src, take, dst);
    else widen<uint32_t>(src, take, dst);
    dst += take;
    offset += take;
    n -= take;
    ++k;
  }
}

TokenStream TokenStream::slice(int64_t begin, int64_t end) const {
  if (begin < 0 || end > size_ || begin > end)
    throw DataError("slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") of a stream of " + std::to_string(size_));
  TokenStream out;
  for (size_t k = 0; k < segments_.size(); ++k) {
    const int64_t a = std::max(begin, starts_[k]), b = std::min(end, starts_[k] + segments_[k].tokens);
    if (a >= b) continue;
    Segment s = segments_[k];
    s.data += (a - starts_[k]) * s.width;
    s.source_first += a - starts_[k];
    s.tokens = b - a;
    out.append(std::move(s));
  }
  return out;
}

// ---- Token files ------------------------------------------------------------------------------------------------
namespace {

// A read-only private mapping of a whole file.
class Mapping {
 public:
  explicit Mapping(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw DataError("cannot open token file '" + path + "': " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      throw DataError("cannot stat token file '" + path + "': " + std::strerror(e));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        throw DataError("cannot map token file '" + path + "': " + std::strerror(e));
      }
      data_ = static_cast<const unsigned char*>(p);
    }
    ::close(fd);
  }
  ~Mapping() {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

int32_t read_i32(const unsigned char* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The tokens of one file as a segment, after checking its header (llm.c) or its size (raw).
TokenStream::Segment map_token_file(const std::string& path, const std::string& dtype) {
  auto m = std::make_shared<Mapping>(path);
  TokenStream::Segment s;
  s.source = path;
  const bool llmc = m->size() >= 1024 && read_i32(m->data()) == kLlmcMagic;
  if (llmc && dtype == "auto") {
    const int32_t version = read_i32(m->data() + 4), count = read_i32(m->data() + 8);
    if (version != 1)
      throw DataError("token file '" + path + "' has llm.c version " + std::to_string(version) +
                      "; deloco reads version 1 (uint16 tokens), or set data.dtype for raw files");
    const size_t expect = 1024 + 2 * static_cast<size_t>(count);
    if (count < 0 || m->size() != expect)
      throw DataError("token file '" + path + "' is " + std::to_string(m->size()) + " bytes but its llm.c header promises " +
                      std::to_string(count) + " tokens (" + std::to_string(expect) + " bytes): truncated or corrupt");
    s.width = 2;
    s.source_header = 1024;
    s.data = m->data() + 1024;
    s.tokens = count;
  } else {
    if (dtype == "auto")
      throw DataError("token file '" + path + "' has no llm.c header (magic " + std::to_string(kLlmcMagic) +
                      "); for raw token files set data.dtype = \"uint16\" or \"uint32\"");
    s.width = dtype == "uint16" ? 2 : 4;
    if (m->size() % static_cast<size_t>(s.width) != 0)
      throw DataError("token file '" + path + "' is " + std::to_string(m->size()) + " bytes, not a whole number of " + dtype +
                      " tokens");
    s.data = m->data();
    s.tokens = static_cast<int64_t>(m->size()) / s.width;
  }
  if (s.tokens == 0) throw DataError("token file '" + path + "' holds no tokens");
  s.owner = std::move(m);
  return s;
}

// Largest id of a segment, and the counts of each id (when `hist` is given and ids fit in it).
template <typename T>
int64_t scan(const TokenStream::Segment& s, std::vector<uint64_t>* hist) {
  int64_t mx = 0;
  for (int64_t i = 0; i < s.tokens; ++i) {
    T v;
    std::memcpy(&v, s.data + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    mx = std::max<int64_t>(mx, v);
    if (hist && v < hist->size()) ++(*hist)[v];
  }
  return mx;
}
int64_t scan_segment(const TokenStream::Segment& s, std::vector<uint64_t>* hist) {
  return s.width == 2 ? scan<uint16_t>(s, hist) : scan<uint32_t>(s, hist);
}

double entropy_bits(const std::vector<uint64_t>& counts) {
  double n = 0, h = 0;
  for (auto k : counts) n += static_cast<double>(k);
  for (auto k : counts)
    if (k > 0) h -= (static_cast<double>(k) / n) * std::log2(static_cast<double>(k) / n);
  return h;
}

}  // namespace

Corpus Corpus::load(const DataConfig& cfg) {
  std::error_code ec;
  if (!fs::exists(cfg.path, ec)) {
    if (cfg.format == "tokens")
      throw DataError("token data '" + cfg.path + "' does not exist (make it with `deloco tokenize --input TEXT --out DIR`, or "
                      "set data.path to a token file or folder of *.bin files)");
    throw DataError("corpus '" + cfg.path + "' does not exist (run scripts/setup.sh to fetch the default corpus, "
                    "or set data.path to a UTF-8 text file or folder)");
  }
  std::vector<std::string> files;
  if (fs::is_directory(cfg.path)) {
    for (auto it = fs::recursive_directory_iterator(cfg.path); it != fs::recursive_directory_iterator(); ++it) {
      const fs::directory_entry& e = *it;
      const std::string name = e.path().filename().string();
      if (!name.empty() && name[0] == '.') {  // hidden: a file, or a folder (.git, .ipynb_checkpoints) not entered
        if (e.is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (!e.is_regular_file()) continue;
      if (cfg.format == "tokens" && e.path().extension() != ".bin") continue;
      files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(cfg.path);
  }
  if (cfg.format == "tokens") return load_tokens(cfg, files).keep_holdout(cfg.holdout);
  std::vector<std::string> docs;
  for (const auto& f : files) {
    std::string text = read_file(f);
    int64_t bad = first_invalid_utf8(text);
    if (bad >= 0) throw DataError("corpus file '" + f + "' is not valid UTF-8 (first bad byte at offset " + std::to_string(bad) + ")");
    if (!text.empty()) docs.push_back(std::move(text));
  }
  if (docs.empty()) throw DataError("corpus '" + cfg.path + "' holds no text");
  return from_documents(docs, cfg.val_fraction).keep_holdout(cfg.holdout);
}

Corpus Corpus::keep_holdout(const std::string& which) && {
  if (which == "all") return std::move(*this);
  if (which != "dev" && which != "test") throw DataError("data.holdout must be all, dev or test, not '" + which + "'");
  const int64_t n = val_tokens_.size(), half = n / 2;
  if (half < 1) throw DataError("the held-out set has " + std::to_string(n) + " tokens: too few to split into dev and test");
  const bool dev = which == "dev";
  val_tokens_ = dev ? val_tokens_.slice(0, half) : val_tokens_.slice(half, n);
  if (is_text_ && static_cast<int64_t>(val_text_->size()) == n)
    val_text_ = std::make_shared<const std::string>(dev ? val_text_->substr(0, static_cast<size_t>(half))
                                                         : val_text_->substr(static_cast<size_t>(half)));
  return std::move(*this);
}

Corpus Corpus::from_documents(const std::vector<std::string>& docs, double val_fraction) {
  Corpus c;
  c.num_documents_ = static_cast<int64_t>(docs.size());
  std::string train, val;
  if (docs.size() >= 2) {
    const int64_t k = std::max<int64_t>(2, std::llround(1.0 / val_fraction));
    for (size_t i = 0; i < docs.size(); ++i) {
      std::string& dst = (static_cast<int64_t>(i % k) == k - 1) ? val : train;
      if (!dst.empty()) dst.push_back('\n');
      dst += docs[i];
    }
    if (val.empty()) {  // fewer than k documents: hold out the last one
      train.clear();
      for (size_t i = 0; i + 1 < docs.size(); ++i) train += (i ? "\n" : "") + docs[i];
      val = docs.back();
    }
  } else {
    const std::string& d = docs.at(0);
    size_t held = std::max<size_t>(1, static_cast<size_t>(std::llround(d.size() * val_fraction)));
    size_t cut = d.size() > held ? d.size() - held : 0;
    train = d.substr(0, cut);
    val = d.substr(cut);
  }
  std::vector<uint64_t> counts(256, 0);
  for (unsigned char ch : train) ++counts[ch];
  c.unigram_bits_per_token_ = entropy_bits(counts);
  c.train_text_ = std::make_shared<const std::string>(std::move(train));
  c.val_text_ = std::make_shared<const std::string>(std::move(val));
  // The token streams view the texts the corpus keeps (and share their ownership) instead of copying them.
  for (auto [text, stream] : {std::pair{c.train_text_, &c.train_tokens_}, std::pair{c.val_text_, &c.val_tokens_}}) {
    TokenStream::Segment seg;
    seg.data = reinterpret_cast<const unsigned char*>(text->data());
    seg.tokens = static_cast<int64_t>(text->size());
    seg.owner = text;
    stream->append(std::move(seg));
  }
  return c;
}

namespace {

// "an object", "a string", ... for "must be <type>, got <type>" (numbers as integer or number, with the value).
std::string json_kind(const nlohmann::json& v) {
  if (v.is_number_integer()) return "the integer " + v.dump();
  if (v.is_number()) return "the number " + v.dump();
  if (v.is_string()) return "a string (" + (v.get<std::string>().size() <= 40 ? v.dump() : v.dump().substr(0, 40) + "...") + ")";
  if (v.is_boolean()) return "a boolean (" + v.dump() + ")";
  if (v.is_null()) return "null";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  return v.type_name();
}

// tokens.json (written by `deloco tokenize`): {"files": {NAME: {"tokens": N, "bytes": B}, ...}, ...}, other fields
// ignored. Returns "files", checked: every field of the wrong type is refused naming the file and the field.
nlohmann::json read_tokens_json(const fs::path& path) {
  const std::string where = "'" + path.string() + "'";
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(read_file(path.string()));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(where + " is not a deloco tokens.json: " + e.what());
  }
  auto refuse = [&](const std::string& field, const std::string& want, const nlohmann::json& got) {
    throw DataError(where + ": field '" + field + "' must be " + want + ", got " + json_kind(got) +
                    " (deloco tokenize writes {\"files\": {\"train.bin\": {\"tokens\": N, \"bytes\": B}, ...}})");
  };
  if (!root.is_object()) refuse("(the document)", "an object", root);
  if (!root.contains("files")) throw DataError(where + ": field 'files' is missing (deloco tokenize writes it)");
  const nlohmann::json& files = root["files"];
  if (!files.is_object()) refuse("files", "an object", files);
  for (const auto& [name, entry] : files.items()) {
    const std::string field = "files." + name;
    if (!entry.is_object()) refuse(field, "an object", entry);
    if (!entry.contains("tokens")) throw DataError(where + ": field '" + field + ".tokens' is missing");
    if (!entry["tokens"].is_number_integer() || entry["tokens"].get<int64_t>() < 0)
      refuse(field + ".tokens", "a non-negative integer", entry["tokens"]);
    if (entry.contains("bytes") && (!entry["bytes"].is_number() || entry["bytes"].get<double>() < 0))
      refuse(field + ".bytes", "a non-negative number", entry["bytes"]);
  }
  return files;
}

}  // namespace

Corpus Corpus::load_tokens(const DataConfig& cfg, const std::vector<std::string>& files) {
  if (files.empty()) throw DataError("token data '" + cfg.path + "' holds no *.bin files");
  // tokens.json (deloco tokenize): the bytes of text behind each file, by file name.
  const fs::path dir = fs::is_directory(cfg.path) ? fs::path(cfg.path) : fs::path(cfg.path).parent_path();
  nlohmann::json meta;
  std::error_code ec;
  if (fs::exists(dir / "tokens.json", ec)) meta = read_tokens_json(dir / "tokens.json");
  Corpus c;
  c.is_text_ = false;
  c.num_documents_ = static_cast<int64_t>(files.size());
  c.max_token_ = 0;
  std::vector<uint64_t> hist(1 << 16, 0);
  struct Counts {
    int64_t tokens = 0;
    double bytes = 0;
    bool known = true;
  } train_n, val_n;
  bool any_val = false;
  std::vector<std::pair<TokenStream::Segment, bool>> segs;
  for (const auto& f : files) {
    const std::string name = fs::path(f).filename().string();
    const bool is_val = ::fnmatch(cfg.val_pattern.c_str(), name.c_str(), 0) == 0;
    any_val = any_val || is_val;
    segs.emplace_back(map_token_file(f, cfg.dtype), is_val);
  }
  const bool by_pattern = any_val;
  if (by_pattern && std::all_of(segs.begin(), segs.end(), [](const auto& p) { return p.second; }))
    throw DataError("every token file of '" + cfg.path + "' matches data.val_pattern '" + cfg.val_pattern +
                    "': nothing is left to train on");
  TokenStream all;
  for (auto& [s, is_val] : segs) {
    const std::string name = fs::path(s.source).filename().string();
    Counts& n = (by_pattern && is_val) ? val_n : train_n;
    n.tokens += s.tokens;
    if (meta.is_object() && meta.contains(name)) {
      const int64_t recorded = meta[name]["tokens"].get<int64_t>();  // read_tokens_json checked the types
      if (recorded != s.tokens)
        throw DataError("'" + (dir / "tokens.json").string() + "' records " + std::to_string(recorded) + " tokens for '" + name +
                        "' but the file holds " + std::to_string(s.tokens) + ": the metadata is stale");
      if (meta[name].contains("bytes")) n.bytes += meta[name]["bytes"].get<double>();
      else n.known = false;  // bytes not recorded: bits per byte unknown
    } else {
      n.known = false;
    }
    c.max_token_ = std::max(c.max_token_, scan_segment(s, (by_pattern && is_val) ? nullptr : &hist));
    if (by_pattern && is_val) c.val_tokens_.append(s);
    else all.append(s);
  }
  if (by_pattern) {
    c.train_tokens_ = std::move(all);
  } else {  // no validation files: the last val_fraction of the stream
    const int64_t held = std::max<int64_t>(1, std::llround(static_cast<double>(all.size()) * cfg.val_fraction));
    c.train_tokens_ = all.slice(0, all.size() - held);
    c.val_tokens_ = all.slice(all.size() - held, all.size());
    val_n = train_n;  // one ratio for both halves
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  c.train_bytes_per_token_ = train_n.known && train_n.tokens > 0 ? train_n.bytes / static_cast<double>(train_n.tokens) : nan;
  c.val_bytes_per_token_ = val_n.known && val_n.tokens > 0 ? val_n.bytes / static_cast<double>(val_n.tokens) : nan;
  c.unigram_bits_per_token_ = c.max_token_ < static_cast<int64_t>(hist.size()) ? entropy_bits(hist) : nan;
  return c;
}

void Corpus::check_vocabulary(int64_t vocab_size) const {
  if (is_text_) {
    if (vocab_size < 256)
      throw DataError("the model's vocabulary has " + std::to_string(vocab_size) +
                      " tokens but byte-level text (data.format = text) uses 256; use model.vocab_size >= 256");
    return;
  }
  if (max_token_ < vocab_size) return;
  for (const TokenStream* ts : {&train_tokens_, &val_tokens_}) {
    for (const auto& s : ts->segments()) {
      std::vector<int64_t> buf(static_cast<size_t>(s.tokens));
      TokenStream one;
      one.append(s);
      one.copy(0, s.tokens, buf.data());
      for (int64_t i = 0; i < s.tokens; ++i)
        if (buf[static_cast<size_t>(i)] >= vocab_size) {
          const int64_t index = s.source_first + i;
          throw DataError("token file '" + s.source + "' holds token id " + std::to_string(buf[static_cast<size_t>(i)]) +
                          " at token " + std::to_string(index) + " (byte offset " +
                          std::to_string(s.source_header + index * s.width) + "), but the model's vocabulary has " +
                          std::to_string(vocab_size) + " tokens (model.vocab_size, or the module's vocab_size)");
        }
    }
  }
}

double Corpus::unigram_entropy_bits() const { return unigram_bits_per_token_ / train_bytes_per_token_; }

std::pair<int64_t, int64_t> shard_range(int64_t stream_size, int64_t learner, int64_t num_learners) {
  if (num_learners < 1 || learner < 0 || learner >= num_learners)
    throw DataError("learner id " + std::to_string(learner) + " is outside 0.." + std::to_string(num_learners - 1));
  const int64_t base = stream_size / num_learners, extra = stream_size % num_learners;
  const int64_t begin = learner * base + std::min(learner, extra);
  return {begin, begin + base + (learner < extra ? 1 : 0)};
}

ShardSampler::ShardSampler(TokenStream stream, int64_t learner, int64_t num_learners, int64_t block_size, uint64_t seed)
    : stream_(std::move(stream)), block_size_(block_size), learner_(learner), seed_(seed) {
  std::tie(begin_, end_) = shard_range(stream_.size(), learner, num_learners);
  if (end_ - begin_ < block_size + 1)
    throw DataError("learner " + std::to_string(learner) + " of " + std::to_string(num_learners) + " gets a shard of " +
                    std::to_string(end_ - begin_) + " tokens, fewer than one window of " + std::to_string(block_size + 1));
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
  auto offs = offsets(step, batch_size);
  for (int64_t b = 0; b < batch_size; ++b) stream_.copy(offs[static_cast<size_t>(b)], block_size_ + 1, dst + b * (block_size_ + 1));
  return out;
}

at::Tensor evaluation_windows(const TokenStream& stream, int64_t block_size, int64_t max_tokens) {
  const int64_t n_avail = (stream.size() - 1) / block_size;
  if (n_avail < 1)
    throw DataError("validation data has " + std::to_string(stream.size()) + " tokens, fewer than one window of " +
                    std::to_string(block_size + 1));
  const int64_t n = std::max<int64_t>(1, std::min(n_avail, max_tokens / block_size));
  auto out = torch::empty({n, block_size + 1}, torch::kLong);
  auto* dst = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = (i * n_avail / n) * block_size;  // evenly spaced, non-overlapping
    stream.copy(start, block_size + 1, dst + i * (block_size + 1));
  }
  return out;
}

void write_llmc_tokens(const std::string& path, const std::vector<uint32_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw DataError("'" + path + "': " + std::to_string(tokens.size()) + " tokens do not fit one llm.c file");
  std::string bytes(1024 + 2 * tokens.size(), '\0');
  const int32_t header[3] = {kLlmcMagic, 1, static_cast<int32_t>(tokens.size())};
  std::memcpy(bytes.data(), header, sizeof(header));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] > 0xFFFF) throw DataError("'" + path + "': token id " + std::to_string(tokens[i]) + " does not fit uint16");
    const uint16_t v = static_cast<uint16_t>(tokens[i]);
    std::memcpy(bytes.data() + 1024 + 2 * i, &v, 2);
  }
  write_file_atomic(path, bytes);
}

}  // namespace deloco
