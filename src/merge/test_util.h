// src/merge/test_util.h — helpers shared by the merge and outer tests: locating and reading the reference
// fixtures made by tests/python/make_merge_fixtures.py.
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "deloco/safetensors.h"

namespace deloco::test {

// $DELOCO_SOURCE_DIR/tests/fixtures/merge/<file>, else searched upwards from the working directory.
inline std::string merge_fixture(const std::string& file) {
  const char* root = std::getenv("DELOCO_SOURCE_DIR");
  std::string rel = "tests/fixtures/merge/" + file;
  if (root) return std::string(root) + "/" + rel;
  std::string prefix;
  for (int i = 0; i < 5; ++i, prefix += "../")
    if (std::ifstream(prefix + rel).good()) return prefix + rel;
  return rel;
}

inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>() /
         std::max(1e-300, b.to(at::kDouble).norm().item<double>());
}

}  // namespace deloco::test
