// Checkpoint (task-vector) merging: memory-mapped inputs, per-tensor merge_tensors(), streamed output and a
// manifest (contract in include/deloco/merge.h).
#include "deloco/merge.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>

#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "io/tensor_stream.h"
#include "util/fs.h"
#include "util/checkpoint_store.h"

namespace deloco {
namespace {
namespace fs = std::filesystem;

// A checkpoint folder stands for its model.safetensors; a run folder (of `deloco train`, `deloco syncer` or
// `deloco run`) for that of its newest committed checkpoint.
std::string resolve(const std::string& p) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return p;
  if (::stat((p + "/model.safetensors").c_str(), &st) == 0) return p + "/model.safetensors";
  return resolve_checkpoint(p) + "/model.safetensors";
}

// An input mapped; when it is (or was resolved to) a checkpoint folder's model.safetensors, its bytes are checked
// against the folder's manifest (size, then hash) as every other reader of a checkpoint does.
std::unique_ptr<MappedSafetensors> open_input(const std::string& given) {
  const std::string path = resolve(given);
  auto in = std::make_unique<MappedSafetensors>(path);
  const fs::path file(path);
  const fs::path manifest = file.parent_path() / "manifest.json";
  std::error_code ec;
  if (file.filename() == "model.safetensors" && fs::exists(manifest, ec)) {
    const CheckpointManifest m = read_checkpoint_manifest(manifest.string());
    verify_checkpoint_file(m.files.at("model.safetensors"), in->file_bytes(), static_cast<size_t>(in->file_size()),
                           path);
  }
  return in;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

nlohmann::json merge_checkpoints(const CheckpointMergeOptions& a) {
  if (a.inputs.empty()) throw MergeError("--inputs: at least one input file is required");
  if (!a.weights.empty() && a.weights.size() != a.inputs.size())
    throw MergeError("--weights: " + std::to_string(a.weights.size()) + " weights given for " +
                     std::to_string(a.inputs.size()) + " inputs");
  const MergeConfig& mc = a.merge;
  if (!std::isfinite(mc.alpha)) throw MergeError("--alpha must be finite");
  if (mc.dtype != "fp32" && mc.dtype != "fp64") throw MergeError("--dtype must be fp32 or fp64, not '" + mc.dtype + "'");

  MergePlan plan;
  try {
    plan = mc.plan();  // user rules before the plan's own
  } catch (const ConfigError& e) {
    throw MergeError(e.what());  // an unknown merge.preset
  }
  const std::string label = mc.label();
  MergeSelector selector(plan);  // validates method names and options before any I/O

  const auto t0 = std::chrono::steady_clock::now();
  const std::unique_ptr<MappedSafetensors> base_file = open_input(a.base);
  const MappedSafetensors& base = *base_file;
  std::vector<std::unique_ptr<MappedSafetensors>> inputs;
  for (const auto& p : a.inputs) inputs.push_back(open_input(p));

  // Every input must hold exactly the base's tensors with the same shapes.
  std::vector<std::string> merge_names, copy_names;
  for (const auto& [name, info] : base.index()) {
    for (const auto& in : inputs) {
      auto it = in->index().find(name);
      if (it == in->index().end())
        throw MergeError("tensor '" + name + "' is in the base but missing from " + in->path());
      if (it->second.shape != info.shape)
        throw MergeError("tensor '" + name + "' has shape " + shape_str(it->second.shape) + " in " + in->path() +
                         " but " + shape_str(info.shape) + " in the base");
      if (at::isFloatingType(info.dtype) != at::isFloatingType(it->second.dtype) ||
          (!at::isFloatingType(info.dtype) && it->second.dtype != info.dtype))
        throw MergeError("tensor '" + name + "' has a different dtype in " + in->path());
    }
    (at::isFloatingType(info.dtype) ? merge_names : copy_names).push_back(name);
  }
  for (const auto& in : inputs)
    for (const auto& [name, info] : in->index())
      if (!base.index().count(name))
        throw MergeError("tensor '" + name + "' is in " + in->path() + " but not in the base");

  const at::ScalarType ct = plan.options.compute_dtype;
  auto check_finite = [](const at::Tensor& t, const std::string& name, const std::string& file) {
    if (!at::isfinite(t).all().item<bool>())
      throw MergeError("tensor '" + name + "' in " + file + " contains NaN or Inf");
  };
  std::map<std::string, std::string> meta{{"format", "deloco-merge"}, {"method", label}};
  SafetensorsStreamWriter writer(a.out, base.index(), meta);
  auto load = [&](const std::string& name) {
    at::Tensor b = base.tensor(name).to(ct);
    check_finite(b, name, base.path());
    MergeInput in{name, {}, a.weights};
    for (const auto& f : inputs) {
      at::Tensor x = f->tensor(name).to(ct);
      check_finite(x, name, f->path());
      in.deltas.push_back(x.sub_(b));
    }
    return in;
  };
  auto store = [&](const std::string& name, const at::Tensor& merged) {
    at::Tensor b = base.tensor(name);
    at::Tensor out = b.to(ct).add_(merged.to(ct), mc.alpha).to(b.scalar_type());
    writer.write(name, out);
  };
  auto used = merge_tensors(selector, merge_names, load, store, static_cast<int>(mc.threads));
  for (const auto& name : copy_names) writer.write(name, base.tensor(name));
  writer.commit();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::map<std::string, int> counts;
  for (const auto& kv : used) ++counts[kv.second];
  nlohmann::json inputs_json = nlohmann::json::array();
  for (const auto& f : inputs) inputs_json.push_back({{"path", f->path()}, {"bytes", f->file_size()}});
  nlohmann::json rules = nlohmann::json::array();
  for (const auto& r : plan.rules) rules.push_back({{"pattern", r.pattern}, {"method", r.method}});
  nlohmann::json manifest = {
      {"format", "deloco-merge"},
      {"version", 1},
      {"formula", "theta = theta_base + alpha * Merge(theta_i - theta_base)"},
      {"method", label},
      {"plan", {{"default", plan.method}, {"rules", rules}, {"vector_method", plan.vector_method}}},
      {"alpha", mc.alpha},
      {"weights", a.weights},
      {"compute_dtype", mc.dtype},
      {"seed", mc.seed},
      {"options",
       {{"ties_keep", mc.ties_keep}, {"dare_drop", mc.dare_drop}, {"iso_cts_common", mc.iso_cts_common},
        {"iso_fast_polish", mc.iso_fast_polish}, {"iso_ns_steps", mc.iso_ns_steps},
        {"iso_ns_precision", mc.iso_ns_precision}}},
      {"base", {{"path", base.path()}, {"bytes", base.file_size()}}},
      {"inputs", inputs_json},
      {"output", a.out},
      {"tensors_merged", used.size()},
      {"tensors_copied", copy_names},
      {"methods_used", counts},
      {"per_tensor", used},
      {"wall_seconds", seconds},
  };
  write_file_atomic(a.out + ".manifest.json", manifest.dump(2) + "\n");
  return manifest;
}

}  // namespace deloco
