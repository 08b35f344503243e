#include "util/blas.h"

#include <gtest/gtest.h>

namespace deloco {
namespace blas_cases {

TEST(Blas, OnlyAGenericFallbackIsReplacedAndOnlyByWhatTheCpuRuns) {
  const CpuFeatures avx512{true, true}, avx2{false, true}, old{false, false};
  EXPECT_EQ(better_openblas_core("Prescott", avx512), "SkylakeX");
  EXPECT_EQ(better_openblas_core("PRESCOTT", avx2), "Haswell");
  EXPECT_EQ(better_openblas_core("Nehalem", avx512), "SkylakeX");
  EXPECT_EQ(better_openblas_core("Prescott", old), "");     // nothing better to run
  EXPECT_EQ(better_openblas_core("SkylakeX", avx512), "");  // a proper choice is kept
  EXPECT_EQ(better_openblas_core("Haswell", avx512), "");   // as is any non-generic one
  EXPECT_EQ(better_openblas_core("Zen", avx2), "");
  EXPECT_EQ(better_openblas_core("", avx512), "");  // no OpenBLAS
}

TEST(Blas, WithoutOpenBlasInTheProcessThereIsNothingToDescribe) {
  // deloco_base links no BLAS; this test binary has none, so the lookup must say so rather than guess.
  EXPECT_EQ(openblas_core_name(), "");
  EXPECT_EQ(blas_description(), "");
}

}  // namespace
}  // namespace deloco
