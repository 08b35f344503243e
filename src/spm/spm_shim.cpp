// libdeloco_spm: SentencePiece behind a C interface (why: src/spm/spm_shim.h).
#include "spm/spm_shim.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

namespace sentencepiece::logging {
void SetMinLogLevel(int v);  // exported by libsentencepiece, absent from its installed headers
}

namespace {
char* copy_out(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) {
    std::memcpy(p, s.data(), s.size());
    p[s.size()] = '\0';
  }
  return p;
}
int fail(char** err, const std::string& message) {
  if (err) *err = copy_out(message);
  return 1;
}

class Sentences : public sentencepiece::SentenceIterator {
 public:
  Sentences(const dspm_text* s, size_t n) : s_(s), n_(n) { load(); }
  bool done() const override { return i_ >= n_; }
  void Next() override {
    ++i_;
    load();
  }
  const std::string& value() const override { return current_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void load() {
    if (i_ < n_) current_.assign(s_[i_].data, s_[i_].size);
  }
  const dspm_text* s_;
  size_t n_, i_ = 0;
  std::string current_;
};
}  // namespace

extern "C" {

int dspm_load(const char* proto, size_t size, void** handle, char** err) {
  try {
    auto* sp = new sentencepiece::SentencePieceProcessor();
    auto st = sp->LoadFromSerializedProto(std::string(proto, size));
    if (!st.ok()) {
      delete sp;
      return fail(err, st.ToString());
    }
    *handle = sp;
    return 0;
  } catch (const std::exception& e) {
    return fail(err, e.what());
  }
}

int dspm_train(const dspm_text* sentences, size_t count, const dspm_text* options, size_t num_options, char** proto,
               size_t* proto_size, char** err) {
  try {
    sentencepiece::logging::SetMinLogLevel(1);
    std::unordered_map<std::string, std::string> args;
    for (size_t i = 0; i < num_options; ++i) {
      const std::string kv(options[i].data, options[i].size);
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) return fail(err, "option '" + kv + "' is not key=value");
      args[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    Sentences it(sentences, count);
    std::string out;
    auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &out);
    if (!st.ok()) return fail(err, st.ToString());
    *proto = static_cast<char*>(std::malloc(out.size() ? out.size() : 1));
    std::memcpy(*proto, out.data(), out.size());
    *proto_size = out.size();
    return 0;
  } catch (const std::exception& e) {
    return fail(err, e.what());
  }
}

int dspm_piece_size(const void* h) { return static_cast<const sentencepiece::SentencePieceProcessor*>(h)->GetPieceSize(); }

int dspm_piece_to_id(const void* h, const char* piece) {
  auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(h);
  const int id = sp->PieceToId(piece);
  return sp->IdToPiece(id) == piece ? id : -1;
}

int dspm_encode(const void* h, const char* text, size_t size, int** ids, size_t* count, char** err) {
  try {
    std::vector<int> v;
    auto st = static_cast<const sentencepiece::SentencePieceProcessor*>(h)->Encode(std::string_view(text, size), &v);
    if (!st.ok()) return fail(err, st.ToString());
    *ids = static_cast<int*>(std::malloc(sizeof(int) * (v.size() ? v.size() : 1)));
    std::memcpy(*ids, v.data(), sizeof(int) * v.size());
    *count = v.size();
    return 0;
  } catch (const std::exception& e) {
    return fail(err, e.what());
  }
}

int dspm_decode(const void* h, const int* ids, size_t count, char** text, size_t* size, char** err) {
  try {
    std::string out;
    auto st = static_cast<const sentencepiece::SentencePieceProcessor*>(h)->Decode(std::vector<int>(ids, ids + count), &out);
    if (!st.ok()) return fail(err, st.ToString());
    *text = copy_out(out);
    *size = out.size();
    return 0;
  } catch (const std::exception& e) {
    return fail(err, e.what());
  }
}

void dspm_close(void* h) { delete static_cast<sentencepiece::SentencePieceProcessor*>(h); }
void dspm_free(void* p) { std::free(p); }

}  // extern "C"
