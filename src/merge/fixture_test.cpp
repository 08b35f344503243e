// Merge methods against float64 references computed independently by PyTorch
// (tests/python/make_merge_fixtures.py → tests/fixtures/merge/merge_methods.safetensors).
#include <sstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/merge.h"
#include "merge/test_util.h"

namespace deloco {
namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

TEST(MergeFixture, MatchesPyTorchReferences) {
  TensorFile f = load_safetensors(test::merge_fixture("merge_methods.safetensors"));
  MergeOptions opts;
  opts.compute_dtype = at::kDouble;
  int checked = 0;
  for (const auto& c : split(f.metadata.at("cases"))) {
    const int T = std::stoi(f.metadata.at(c + ".T"));
    MergeInput in;
    in.name = c;
    for (int i = 0; i < T; ++i) in.deltas.push_back(f.tensors.at(c + ".delta" + std::to_string(i)));
    for (const auto& w : split(f.metadata.at(c + ".weights"))) in.weights.push_back(std::stod(w));
    for (const auto& m : split(f.metadata.at("methods"))) {
      at::Tensor got = make_merger(m, opts)->merge(in);
      const at::Tensor& want = f.tensors.at(c + "." + m);
      EXPECT_LT(test::rel_err(got, want), 1e-10) << m << " on " << c;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 18);
}

}  // namespace
}  // namespace deloco
