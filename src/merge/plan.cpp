// Per-parameter-group selection: glob rules from tensor names to methods, named plans, and the selector that
// resolves a plan into one Merger per method.
#include <torch/torch.h>

#include "deloco/merge.h"

namespace deloco {

bool glob_match(const std::string& p, const std::string& s) {
  // Iterative matcher with one backtrack point for the last '*'.
  size_t pi = 0, si = 0, star = std::string::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi;
      ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

std::vector<MergeRule> MergePlan::parse_rules(const std::string& text) {
  std::vector<MergeRule> rules;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) {
      if (end == text.size()) break;
      continue;
    }
    const size_t eq = item.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      throw MergeError("merge rule '" + item + "' is not of the form pattern=method");
    rules.push_back({item.substr(0, eq), item.substr(eq + 1)});
  }
  return rules;
}

MergePlan MergePlan::preset(const std::string& name) {
  MergePlan p;
  if (name == "diloco") {
    p.method = "mean";
  } else if (name == "decoupled") {
    p.method = "rda";
    for (const char* pat : {"*embed*", "*wte*", "*wpe*", "*tok_emb*", "*pos_emb*", "*lm_head*"})
      p.rules.push_back({pat, "mean"});
  } else if (name == "isoloco") {
    p.method = "iso_c";
  } else {
    throw MergeError("unknown merge plan '" + name + "' (known: diloco, decoupled, isoloco)");
  }
  return p;
}

MergeSelector::MergeSelector(const MergePlan& plan) : plan_(plan) {
  auto add = [&](const std::string& m) {
    if (!mergers_.count(m)) mergers_[m] = make_merger(m, plan_.options);
  };
  add(plan_.method);
  add(plan_.vector_method);
  for (const auto& r : plan_.rules) add(r.method);
}

const Merger& MergeSelector::select(const std::string& name, int64_t dim) const {
  for (const auto& r : plan_.rules)
    if (glob_match(r.pattern, name)) return *mergers_.at(r.method);  // explicit choice (matrix methods still
                                                                      // fall back to the mean on vectors)
  return *mergers_.at(dim < 2 ? plan_.vector_method : plan_.method);
}

}  // namespace deloco
