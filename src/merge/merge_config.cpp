// The [merge] section, bound once for training and `deloco merge` (deloco/merge.h).
#include "deloco/merge.h"

#include <algorithm>

#include "deloco/algorithm.h"
#include "deloco/config.h"

namespace deloco {

const std::vector<std::string>& merge_plan_names() {
  static const std::vector<std::string> names = {"diloco", "decoupled", "isoloco"};
  return names;
}

namespace {
bool is_plan_name(const std::string& m) {
  const auto& n = merge_plan_names();
  return std::find(n.begin(), n.end(), m) != n.end();
}
// "" when `m` is a merger name, else the merger's complaint (which lists the known names).
std::string merger_error(const std::string& m) {
  try {
    make_merger(m);
    return "";
  } catch (const MergeError& e) {
    return e.what();
  }
}
}  // namespace

MergeOptions MergeConfig::options() const {
  MergeOptions o;
  o.compute_dtype = dtype == "fp64" ? at::kDouble : at::kFloat;
  o.seed = static_cast<uint64_t>(seed);
  o.ties_keep = ties_keep;
  o.dare_drop = dare_drop;
  o.iso_cts_common = iso_cts_common;
  o.iso_fast_polish = static_cast<int>(std::clamp<int64_t>(iso_fast_polish, -1, 1000));  // out of range stays so
  o.iso_ns_steps = static_cast<int>(std::clamp<int64_t>(iso_ns_steps, -1, 1000));
  // An unknown name maps to a dtype validate() refuses, so the key's check names it.
  o.iso_ns_dtype = iso_ns_precision == "fp32" ? at::kFloat : iso_ns_precision == "bf16" ? at::kBFloat16 : at::kHalf;
  return o;
}

MergePlan MergeConfig::plan() const {
  MergePlan p;
  if (method.empty()) p = algorithm_preset(preset).plan;
  else if (is_plan_name(method)) p = MergePlan::preset(method);
  else p.method = method;
  const auto own = MergePlan::parse_rules(rules);
  p.rules.insert(p.rules.begin(), own.begin(), own.end());
  p.vector_method = vector_method;
  p.options = options();
  return p;
}

std::string MergeConfig::label() const {
  if (!method.empty()) return method;
  const MergePlan& p = algorithm_preset(preset).plan;
  return p.rules.empty() ? p.method : preset;
}

void MergeConfig::bind(ConfigSchema& s, Use use) {
  std::string presets;
  for (const auto& p : algorithm_presets()) presets += (presets.empty() ? "" : " | ") + p.name;
  s.bind("merge.preset", &preset,
         presets + (use == Use::kTraining ? " (its merge plan and outer optimizer)" : " (its merge plan)"), [this] {
           try {
             algorithm_preset(preset);
             return std::string();
           } catch (const ConfigError& e) {
             return std::string(e.what());
           }
         });
  s.bind("merge.method", &method,
         "one merge method for every matrix (mean, rda, iso_c, ...), or a plan (diloco, decoupled, isoloco); "
         "\"\": the preset's plan",
         [this] {
           if (method.empty() || is_plan_name(method)) return std::string();
           const std::string err = merger_error(method);
           return err.empty() ? err : err + "; or a plan: diloco, decoupled, isoloco";
         });
  s.bind("merge.rules", &rules, "per-tensor rules 'glob=method,...' tried before the plan's (first match wins)", [this] {
    try {
      for (const auto& r : MergePlan::parse_rules(rules))
        if (const std::string err = merger_error(r.method); !err.empty()) return "rule '" + r.pattern + "': " + err;
      return std::string();
    } catch (const MergeError& e) {
      return std::string(e.what());
    }
  });
  s.bind("merge.vector_method", &vector_method, "method for tensors of rank < 2 that no rule names",
         [this] { return merger_error(vector_method); });
  s.bind("merge.dtype", &dtype, "compute precision: fp32 | fp64", [this] {
    return dtype == "fp32" || dtype == "fp64" ? std::string() : "must be fp32 or fp64, not '" + dtype + "'";
  });
  s.bind("merge.seed", &seed, "seed of random methods (dare)");
  // Each option key reports MergeOptions::validate()'s complaint about itself ("ties_keep must be in (0, 1]").
  auto option_check = [this](const std::string& name) {
    return [this, name] {
      try {
        options().validate();
      } catch (const MergeError& e) {
        const std::string what = e.what();
        if (what.rfind(name, 0) == 0) return what;
      }
      return std::string();
    };
  };
  s.bind("merge.ties_keep", &ties_keep, "ties: fraction of entries kept per contribution", option_check("ties_keep"));
  s.bind("merge.dare_drop", &dare_drop, "dare: drop probability", option_check("dare_drop"));
  s.bind("merge.iso_cts_common", &iso_cts_common, "iso_cts: fraction of the rank given to the common subspace",
         option_check("iso_cts_common"));
  s.bind("merge.iso_fast_polish", &iso_fast_polish, "iso_c_fast: Newton-Schulz clean-up steps",
         option_check("iso_fast_polish"));
  s.bind("merge.iso_ns_steps", &iso_ns_steps, "iso_c_ns: Newton-Schulz quintic steps (3 matrix products each; 0 = 10 in fp32, 8 in bf16)",
         option_check("iso_ns_steps"));
  s.bind("merge.iso_ns_precision", &iso_ns_precision, "iso_c_ns: iteration precision fp32 | bf16 (scaling in fp32)",
         option_check("iso_ns_precision"));
  if (use == Use::kCheckpoints) {
    s.bind("merge.alpha", &alpha, "deloco merge: scale of the merged task vector");
    s.bind("merge.threads", &threads, "deloco merge: worker threads (0 = one per core)");
  }
}

}  // namespace deloco
