// The LanguageModel seam (contract in include/deloco/gpt/model.h): the built-in GPT, and a user's TorchScript module
// checked before anything trains it.
#include <algorithm>
#include <sstream>

#include <torch/script.h>
#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/gpt/model.h"
#include "model/kernels.h"
#include "util/text.h"

namespace deloco {

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

torch::Tensor LanguageModel::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  return next_token_loss(forward(idx), targets);
}

torch::Tensor LanguageModel::loss_of_logits(const torch::Tensor& logits, const torch::Tensor& targets) {
  return next_token_loss(logits, targets);
}

namespace {

class GptModel final : public LanguageModel {
 public:
  GptModel(const ModelConfig& cfg, uint64_t seed, const torch::Device& device) : gpt_(cfg, seed) {
    gpt_->to(device);
    params_ = named_parameters(*gpt_);
  }
  torch::Tensor forward(const torch::Tensor& idx) override { return gpt_->forward(idx); }
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets) override { return gpt_->loss(idx, targets); }
  torch::Tensor loss_of_logits(const torch::Tensor& logits, const torch::Tensor& targets) override {
    if (!gpt_->fused()) return next_token_loss(logits, targets);
    return kernels::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  }
  void set_fused(bool on) override { gpt_->set_fused(on); }
  NamedTensors& parameters() override { return params_; }
  void train(bool on) override { gpt_->train(on); }
  bool training() const override { return gpt_->is_training(); }
  int64_t vocab_size() const override { return gpt_->config().vocab_size; }
  int64_t block_size() const override { return gpt_->config().block_size; }

 private:
  GPT gpt_;
  NamedTensors params_;
};

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream o;
  o << "[";
  for (int64_t d = 0; d < t.dim(); ++d) o << (d ? ", " : "") << t.size(d);
  o << "] " << t.dtype();
  return o.str();
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

class ScriptedModel final : public LanguageModel {
 public:
  ScriptedModel(ModelConfig* cfg, const torch::Device& device) : path_(cfg->path) {
    const std::string where = "model.path '" + path_ + "'";
    const std::string expected =
        "deloco expects forward(self, idx: Tensor) -> Tensor, idx int64 [B, T], logits float [B, T, V]";
    try {
      module_ = torch::jit::load(path_, device);
    } catch (const c10::Error& e) {
      throw ConfigError(where + " is not a TorchScript module saved by torch.jit.save: " + first_line(e.what_without_backtrace()));
    }
    auto method = module_.find_method("forward");
    if (!method) throw ConfigError(where + ": the module has no forward method; " + expected);
    const c10::FunctionSchema& schema = method->function().getSchema();
    std::ostringstream sig;
    sig << schema;
    if (schema.arguments().size() != 2 || !schema.arguments()[1].type()->isSubtypeOf(*c10::TensorType::get()) ||
        schema.returns().size() != 1 || !schema.returns()[0].type()->isSubtypeOf(*c10::TensorType::get()))
      throw ConfigError(where + ": its forward is " + sig.str() + "; " + expected);
    if (module_.hasattr("vocab_size")) cfg->vocab_size = int_attr("vocab_size", where);
    if (module_.hasattr("block_size")) cfg->block_size = int_attr("block_size", where);
    vocab_size_ = cfg->vocab_size;
    block_size_ = cfg->block_size;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      if (p.value.scalar_type() != torch::kFloat)
        throw ConfigError(where + ": parameter '" + p.name + "' is " + std::string(c10::toString(p.value.scalar_type())) +
                          "; deloco trains float32 parameters (save the module in float32; train.precision sets the "
                          "compute precision)");
      params_.emplace_back(p.name, p.value);
    }
    if (params_.empty()) throw ConfigError(where + ": the module has no parameters to train");
    // One trial forward on ids [2, T]: the shape of the logits is the last thing to agree on.
    torch::NoGradGuard no_grad;
    module_.eval();
    c10::IValue out;
    try {
      out = module_.forward({torch::zeros({2, block_size_}, torch::TensorOptions().dtype(torch::kLong).device(device))});
    } catch (const std::exception& e) {  // c10::Error, or the interpreter's std::runtime_error / JITException
      throw ConfigError(where + ": forward failed on int64 ids [2, " + std::to_string(block_size_) +
                        "] (model.block_size): " + script_error_text(e) + "; " + expected);
    }
    if (!out.isTensor()) throw ConfigError(where + ": forward returned " + out.tagKind() + ", not a tensor; " + expected);
    const torch::Tensor y = out.toTensor();
    module_.train();
    if (y.dim() != 3 || y.size(0) != 2 || y.size(1) != block_size_ || y.size(2) != vocab_size_ || !y.is_floating_point())
      throw ConfigError(where + ": forward on int64 ids [2, " + std::to_string(block_size_) + "] returned " + shape_of(y) +
                        ", expected [2, " + std::to_string(block_size_) + ", " + std::to_string(vocab_size_) +
                        "] float (V = " + std::to_string(vocab_size_) +
                        (module_.hasattr("vocab_size") ? " from the module's vocab_size" : " from model.vocab_size") + ")");
    if (!torch::isfinite(y).all().item<bool>())
      throw ConfigError(where + ": forward on int64 ids [2, " + std::to_string(block_size_) +
                        "] (all zeros) returned non-finite logits (NaN or infinite) from the module's initial parameters");
  }
  torch::Tensor forward(const torch::Tensor& idx) override {
    c10::IValue out;
    try {
      out = module_.forward({idx});
    } catch (const std::exception& e) {
      throw ModelError(path_, script_error_text(e));
    }
    if (!out.isTensor()) throw ModelError(path_, "it returned " + out.tagKind() + ", not a tensor");
    return out.toTensor();
  }
  NamedTensors& parameters() override { return params_; }
  void train(bool on) override { module_.train(on); }
  bool training() const override { return module_.is_training(); }
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t block_size() const override { return block_size_; }

 private:
  int64_t int_attr(const char* name, const std::string& where) {
    const c10::IValue v = module_.attr(name);
    if (!v.isInt() || v.toInt() < 1)
      throw ConfigError(where + ": the module's attribute " + name + " must be a positive int (it is " + v.tagKind() + ")");
    return v.toInt();
  }

  std::string path_;
  torch::jit::script::Module module_;
  NamedTensors params_;
  int64_t vocab_size_ = 0, block_size_ = 0;
};

}  // namespace

ModelError::ModelError(const std::string& path, const std::string& detail, const std::string& where)
    : Error("model.path=" + path + ": forward failed" + (where.empty() ? "" : " " + where) + ": " + detail),
      path_(path),
      detail_(detail) {}

ModelError::ModelError(const std::string& message) : Error(message) {}

std::string script_error_text(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10_error != nullptr ? c10_error->what_without_backtrace() : std::string(e.what());
  // Everything before C++ frames (c10's "Exception raised from ..." and "frame #N: ..." lines).
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("Exception raised from ", 0) == 0 || l.rfind("frame #", 0) == 0) break;
    lines.push_back(l);
  }
  // A TorchScript traceback: sections of `  File "...", line N, in F` each followed by indented code with a
  // "<--- HERE" marker; the innermost (original source when the module carries it) comes last, the error after it.
  size_t first = 0, last_file = lines.size();
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].rfind("  File \"", 0) == 0) last_file = i;
  std::string location, code;
  if (last_file < lines.size()) {
    location = trim_space(lines[last_file]);
    std::string previous;
    size_t i = last_file + 1;
    for (; i < lines.size() && (lines[i].empty() || lines[i][0] == ' '); ++i) {
      if (lines[i].find("<--- HERE") != std::string::npos) {
        if (code.empty()) code = trim_space(previous);
      } else if (!trim_space(lines[i]).empty()) {
        previous = lines[i];
      }
    }
    first = i;
  }
  std::vector<std::string> message;
  for (size_t i = first; i < lines.size() && message.size() < 5; ++i)
    if (!trim_space(lines[i]).empty() && lines[i] != "The following operation failed in the TorchScript interpreter.")
      message.push_back(trim_space(lines[i]));
  std::string out;
  for (const auto& m : message) out += (out.empty() ? "" : "\n") + m;
  if (out.empty()) out = trim_space(first_line(text));
  if (!location.empty()) out += " (" + location + (code.empty() ? "" : ": " + code) + ")";
  return out;
}

std::unique_ptr<LanguageModel> make_language_model(ModelConfig* cfg, uint64_t seed, const torch::Device& device) {
  if (cfg->kind == "torchscript") return std::make_unique<ScriptedModel>(cfg, device);
  if (cfg->kind != "gpt") throw ConfigError("model.kind must be gpt or torchscript, not '" + cfg->kind + "'");
  return std::make_unique<GptModel>(*cfg, seed, device);
}

}  // namespace deloco
