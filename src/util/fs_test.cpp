#include "util/fs.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "deloco/wire.h"
#include "support/fault_file_ops.h"
#include "util/hash.h"

namespace deloco {
namespace fs_cases {
namespace fs = std::filesystem;

// Standard FNV-1a-64 test vectors (offset basis 14695981039346656037 = 0xcbf29ce484222325). These passed before
// issue 11 too: fs.cpp's own loop with the short basis was replaced by wire.h's standard fnv1a64() in commit
// c2749d1, after the commit the issue was filed against (063ded5).
TEST(Fs, FnvHexIsStandardFnv1a64) {
  EXPECT_EQ(kFnvOffset, 14695981039346656037ull);
  EXPECT_EQ(fnv1a64_hex("", 0), "cbf29ce484222325");
  EXPECT_EQ(fnv1a64_hex("a", 1), "af63dc4c8601ec8c");
  EXPECT_EQ(fnv1a64_hex("foobar", 6), "85944171f73967e8");
  EXPECT_EQ(std::stoull(fnv1a64_hex("deloco", 6), nullptr, 16), fnv1a64("deloco", 6));
}

// The short basis deloco's checkpoints used before c2749d1: kept only to verify them. Its value of "" is the
// basis itself, which differs from the standard one.
TEST(Fs, ShortBasisFnvIsTheOldCheckpointHash) {
  EXPECT_EQ(kFnvShortBasis, 1469598103934665603ull);
  EXPECT_EQ(fnv1a64_short_basis_hex("", 0), "14650fb0739d0383");
  EXPECT_NE(fnv1a64_short_basis_hex("a", 1), fnv1a64_hex("a", 1));
}

// BLAKE2b-256 (RFC 7693 BLAKE2b with a 32-byte digest, no key) test vectors.
TEST(Fs, Blake2b256MatchesTheStandardVectors) {
  EXPECT_EQ(blake2b256_hex("", 0), "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");
  EXPECT_EQ(blake2b256_hex("abc", 3), "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
  EXPECT_EQ(std::string(kBlake2b256Name), "blake2b-256");
}

TEST(Fs, WriteFileAtomicLeavesOldOrNewAfterACrashAtAnyStep) {
  const fs::path dir = fs::temp_directory_path() / ("deloco_fs_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "f").string();
  for (int64_t k = 0; k <= 4; ++k) {
    write_file_atomic(path, "old");
    test::FaultFileOps ops(k);
    try {
      write_file_atomic(path, "new", ops);
      EXPECT_EQ(k, 4);
    } catch (const test::SimulatedCrash&) {
      EXPECT_LT(k, 4);
    }
    const std::string got = read_file(path);
    EXPECT_TRUE(got == "old" || got == "new") << got;
    EXPECT_EQ(got, k >= 3 ? "new" : "old") << "k=" << k;  // the rename (operation 3) is the switch
    EXPECT_EQ(is_stale_temp_name(fs::path(temp_name_for(path)).filename().string(), "f"), true);
    fs::remove(temp_name_for(path));
  }
  fs::remove_all(dir);
}

// A folder flush that fails is an error, not a silent best effort (found by review: the fsync after a checkpoint's
// commit rename is its durability point, and an error there was dropped, the checkpoint counted committed).
TEST(Fs, AFolderFlushThatFailsIsAnError) {
  const std::string missing = ::testing::TempDir() + "/deloco_no_such_folder_" + std::to_string(::getpid());
  try {
    fsync_dir(missing);
    ADD_FAILURE() << "flushed a folder that does not exist";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(fsync_dir(::testing::TempDir()));
  // make_dirs creates every missing level (each made durable in its parent) and is idempotent.
  const std::string nested = missing + "/a/b";
  real_file_ops().make_dirs(nested);
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  EXPECT_NO_THROW(real_file_ops().make_dirs(nested));
  std::filesystem::remove_all(missing);
}

TEST(Fs, StaleTempNamesAreOnlyThoseOfDeadProcesses) {
  const std::string me = std::to_string(::getpid());
  EXPECT_TRUE(is_stale_temp_name(".step_00000010.tmp." + me, ""));
  EXPECT_TRUE(is_stale_temp_name(".step_00000010.tmp.999999999", ""));
  EXPECT_TRUE(is_stale_temp_name("latest.tmp.999999999", "latest"));
  EXPECT_FALSE(is_stale_temp_name("latest.tmp.999999999", ""));  // hidden names only without a stem
  EXPECT_FALSE(is_stale_temp_name(".x.tmp." + std::to_string(::getppid()), ""));  // a live process's
  EXPECT_FALSE(is_stale_temp_name("step_00000010", ""));
  EXPECT_FALSE(is_stale_temp_name(".step.tmp.12x", ""));
  EXPECT_FALSE(is_stale_temp_name("summary.json.tmp.999999999", "latest"));
}

}  // namespace
}  // namespace deloco
