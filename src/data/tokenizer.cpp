// SentencePiece BPE tokenizers (contract in src/data/tokenizer.h).
#include "data/tokenizer.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "deloco/gpt/data.h"
#include "spm/spm_shim.h"
#include "util/fs.h"

namespace deloco {
namespace fs = std::filesystem;

namespace {
// libdeloco_spm, opened once (why it is a separate library: src/spm/spm_shim.h).
struct Shim {
  decltype(&dspm_load) load;
  decltype(&dspm_train) train;
  decltype(&dspm_piece_size) piece_size;
  decltype(&dspm_piece_to_id) piece_to_id;
  decltype(&dspm_encode) encode;
  decltype(&dspm_decode) decode;
  decltype(&dspm_close) close;
  decltype(&dspm_free) free;
};

std::vector<std::string> shim_candidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("DELOCO_SPM_LIBRARY")) c.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    c.push_back((exe.parent_path() / "libdeloco_spm.so").string());                     // the build folder
    c.push_back((exe.parent_path().parent_path() / "lib" / "libdeloco_spm.so").string());  // an install prefix
  }
  c.emplace_back(DELOCO_SPM_BUILD_PATH);
  c.emplace_back(DELOCO_SPM_INSTALL_PATH);
  return c;
}

const Shim& shim() {
  static std::once_flag once;
  static Shim s;
  static std::string error;
  std::call_once(once, [] {
    void* h = nullptr;
    std::string tried;
    for (const auto& path : shim_candidates()) {
      std::error_code ec;
      if (!fs::exists(path, ec)) continue;
      h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (h) break;
      tried += std::string(" ") + ::dlerror();
    }
    if (!h) {
      error = "cannot load libdeloco_spm.so (SentencePiece), built beside the deloco binary; set DELOCO_SPM_LIBRARY to its path" + tried;
      return;
    }
    auto sym = [&](const char* name) {
      void* f = ::dlsym(h, name);
      if (!f) error = std::string("libdeloco_spm.so lacks ") + name;
      return f;
    };
    s.load = reinterpret_cast<decltype(s.load)>(sym("dspm_load"));
    s.train = reinterpret_cast<decltype(s.train)>(sym("dspm_train"));
    s.piece_size = reinterpret_cast<decltype(s.piece_size)>(sym("dspm_piece_size"));
    s.piece_to_id = reinterpret_cast<decltype(s.piece_to_id)>(sym("dspm_piece_to_id"));
    s.encode = reinterpret_cast<decltype(s.encode)>(sym("dspm_encode"));
    s.decode = reinterpret_cast<decltype(s.decode)>(sym("dspm_decode"));
    s.close = reinterpret_cast<decltype(s.close)>(sym("dspm_close"));
    s.free = reinterpret_cast<decltype(s.free)>(sym("dspm_free"));
  });
  if (!error.empty()) throw TokenizerError(error);
  return s;
}

// Throws the shim's error message (and frees it) when `rc` is non-zero.
void check(int rc, char* err, const std::string& what) {
  if (rc == 0) return;
  std::string msg = err ? err : "unknown error";
  shim().free(err);
  throw TokenizerError(what + ": " + msg);
}
}  // namespace

struct Tokenizer::Impl {
  void* handle = nullptr;
  std::string proto;
  int newline = -1;
  int pieces = 0;
  ~Impl() {
    if (handle) shim().close(handle);
  }
};

namespace {
constexpr size_t kChunk = 2048;

// Pieces of `line` (no '\n') of at most kChunk bytes, each cut before a space, or at a UTF-8 character boundary.
template <typename F>
void for_each_chunk(const std::string& text, F&& f) {
  size_t line_begin = 0;
  while (line_begin <= text.size()) {
    size_t line_end = text.find('\n', line_begin);
    const bool last = line_end == std::string::npos;
    if (last) line_end = text.size();
    size_t p = line_begin;
    while (p < line_end) {
      size_t e = std::min(line_end, p + kChunk);
      if (e < line_end) {
        const size_t sp = text.rfind(' ', e);
        if (sp != std::string::npos && sp > p) e = sp;
        else
          while (e > p + 1 && (static_cast<unsigned char>(text[e]) & 0xC0) == 0x80) --e;
      }
      f(std::string_view(text).substr(p, e - p), false);
      p = e;
    }
    if (last) break;
    f(std::string_view(), true);  // the newline
    line_begin = line_end + 1;
  }
}

std::shared_ptr<Tokenizer::Impl> from_proto(std::string proto, const std::string& origin) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  char* err = nullptr;
  check(shim().load(proto.data(), proto.size(), &impl->handle, &err), err, "'" + origin + "' is not a SentencePiece model");
  impl->proto = std::move(proto);
  impl->pieces = shim().piece_size(impl->handle);
  impl->newline = shim().piece_to_id(impl->handle, "<0x0A>");
  if (impl->newline < 0)
    throw TokenizerError("'" + origin + "' has no byte piece <0x0A>: deloco needs a tokenizer trained with byte_fallback "
                         "(make one with `deloco tokenize`)");
  return impl;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  std::string bytes;
  try {
    bytes = read_file(path);
  } catch (const std::exception& e) {
    throw TokenizerError("cannot read tokenizer '" + path + "': " + e.what());
  }
  Tokenizer t;
  t.impl_ = from_proto(std::move(bytes), path);
  return t;
}

Tokenizer Tokenizer::train(const std::string& text, int64_t vocab_size, int64_t threads) {
  if (vocab_size < 260 || vocab_size > 65536)
    throw TokenizerError("a tokenizer vocabulary of " + std::to_string(vocab_size) +
                         " is outside [260, 65536]: byte fallback needs 256 byte pieces plus at least a few merges, and "
                         "token files store uint16 ids");
  std::vector<dspm_text> chunks;
  for_each_chunk(text, [&](std::string_view c, bool newline) {
    if (!newline && !c.empty()) chunks.push_back({c.data(), c.size()});
  });
  if (chunks.empty()) throw TokenizerError("no text to train a tokenizer on");
  const std::vector<std::string> args = {
      "model_type=bpe",
      "vocab_size=" + std::to_string(vocab_size),
      "byte_fallback=true",
      "normalization_rule_name=identity",
      "add_dummy_prefix=false",
      "remove_extra_whitespaces=false",
      "character_coverage=0.9995",
      "max_sentence_length=" + std::to_string(kChunk + 16),
      "bos_id=-1",
      "eos_id=-1",
      "num_threads=" + std::to_string(std::max<int64_t>(1, threads)),
  };
  std::vector<dspm_text> opts;
  for (const auto& a : args) opts.push_back({a.data(), a.size()});
  char *bytes = nullptr, *err = nullptr;
  size_t n = 0;
  check(shim().train(chunks.data(), chunks.size(), opts.data(), opts.size(), &bytes, &n, &err), err,
        "SentencePiece could not train a " + std::to_string(vocab_size) + "-piece BPE");
  std::string proto(bytes, n);
  shim().free(bytes);
  Tokenizer t;
  t.impl_ = from_proto(std::move(proto), "trained tokenizer");
  return t;
}

int64_t Tokenizer::vocab_size() const { return impl_->pieces; }
const std::string& Tokenizer::serialized() const { return impl_->proto; }
void Tokenizer::save(const std::string& path) const { write_file_atomic(path, impl_->proto); }

std::vector<uint32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3);
  for_each_chunk(text, [&](std::string_view c, bool newline) {
    if (newline) {
      out.push_back(static_cast<uint32_t>(impl_->newline));
      return;
    }
    int* ids = nullptr;
    size_t n = 0;
    char* err = nullptr;
    check(shim().encode(impl_->handle, c.data(), c.size(), &ids, &n, &err), err, "cannot encode text");
    for (size_t i = 0; i < n; ++i) out.push_back(static_cast<uint32_t>(ids[i]));
    shim().free(ids);
  });
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> v;
  v.reserve(ids.size());
  for (auto id : ids) {
    if (id < 0 || id >= vocab_size())
      throw TokenizerError("token id " + std::to_string(id) + " is outside the tokenizer's " + std::to_string(vocab_size()) + " pieces");
    v.push_back(static_cast<int>(id));
  }
  char *text = nullptr, *err = nullptr;
  size_t n = 0;
  check(shim().decode(impl_->handle, v.data(), v.size(), &text, &n, &err), err, "cannot decode");
  std::string out(text, n);
  shim().free(text);
  return out;
}

TokenizeReport tokenize_corpus(const DataConfig& text_cfg, int64_t vocab_size, const std::string& out_dir, int64_t threads) {
  DataConfig cfg = text_cfg;
  cfg.format = "text";
  const Corpus corpus = Corpus::load(cfg);
  TokenizeReport r;
  auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = Tokenizer::train(corpus.train(), vocab_size, threads);
  r.train_seconds = seconds_since(t0);
  r.vocab_size = tok.vocab_size();
  t0 = std::chrono::steady_clock::now();
  // The two halves encode on their own threads (each chunk's result is independent of the others).
  std::vector<uint32_t> train_ids, val_ids;
  std::exception_ptr err;
  std::thread val_thread([&] {
    try {
      val_ids = tok.encode(corpus.val());
    } catch (...) {
      err = std::current_exception();
    }
  });
  train_ids = tok.encode(corpus.train());
  val_thread.join();
  if (err) std::rethrow_exception(err);
  r.encode_seconds = seconds_since(t0);
  fs::create_directories(out_dir);
  write_llmc_tokens((fs::path(out_dir) / "train.bin").string(), train_ids);
  write_llmc_tokens((fs::path(out_dir) / "val.bin").string(), val_ids);
  tok.save((fs::path(out_dir) / "tokenizer.model").string());
  r.train_tokens = static_cast<int64_t>(train_ids.size());
  r.val_tokens = static_cast<int64_t>(val_ids.size());
  r.train_bytes = static_cast<int64_t>(corpus.train().size());
  r.val_bytes = static_cast<int64_t>(corpus.val().size());
  nlohmann::json meta = {
      {"format", "deloco-tokens"},
      {"version", 1},
      {"tokenizer", "tokenizer.model"},
      {"vocab_size", r.vocab_size},
      {"source", text_cfg.path},
      {"val_fraction", text_cfg.val_fraction},
      {"files",
       {{"train.bin", {{"tokens", r.train_tokens}, {"bytes", r.train_bytes}}},
        {"val.bin", {{"tokens", r.val_tokens}, {"bytes", r.val_bytes}}}}},
  };
  write_file_atomic((fs::path(out_dir) / "tokens.json").string(), meta.dump(2) + "\n");
  return r;
}

}  // namespace deloco
