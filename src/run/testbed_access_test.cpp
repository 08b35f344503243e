#include "run/testbed_access.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "deloco/error.h"

namespace deloco::run {
namespace testbed_access_cases {
namespace fs = std::filesystem;

// A private folder under /tmp (sticky, root's: trusted as a folder above) with scripts/testbed.sh files to choose
// from; removed with the test. Also moves the working directory there, and back.
class TestbedScript : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/deloco-tbscript-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;  // mode 0700, ours
    old_cwd_ = fs::current_path();
  }
  void TearDown() override {
    fs::current_path(old_cwd_);
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  // Makes dir_/sub/scripts/testbed.sh (mode 0755) and returns sub's path (a source tree).
  std::string tree(const std::string& sub) {
    const fs::path t = dir_ / sub;
    fs::create_directories(t / "scripts");
    std::ofstream(t / "scripts" / "testbed.sh") << "#!/bin/bash\n";
    ::chmod((t / "scripts" / "testbed.sh").c_str(), 0755);
    return t.string();
  }
  static std::string script_of(const std::string& t) { return t + "/scripts/testbed.sh"; }
  static std::string error_of(const TestbedAccess& a, const std::string& state) {
    try {
      return "no error: " + resolve_testbed_script(a, state, ::geteuid());
    } catch (const RunError& e) {
      return e.what();
    }
  }
  fs::path dir_, old_cwd_;
};

TEST_F(TestbedScript, NeverTheWorkingDirectorysScript) {
  // The working directory has a scripts/testbed.sh, and no other script is named or known: refused, not run as root.
  fs::current_path(tree("cwd"));
  const std::string e = error_of(TestbedAccess{}, "");
  EXPECT_NE(e.find("no testbed script"), std::string::npos) << e;
  EXPECT_NE(e.find("--testbed-script"), std::string::npos) << e;
  // A source tree without the script: the same, naming it.
  const std::string e2 = error_of(TestbedAccess{"", "", (dir_ / "empty").string()}, "");
  EXPECT_NE(e2.find("has no scripts/testbed.sh"), std::string::npos) << e2;
}

TEST_F(TestbedScript, ExplicitThenStateFileThenSourceTree) {
  const std::string a = tree("a"), b = tree("b"), c = tree("c");
  const uid_t me = ::geteuid();
  EXPECT_EQ(resolve_testbed_script({script_of(a), "", c}, script_of(b), me), script_of(a));
  EXPECT_EQ(resolve_testbed_script({"", "", c}, script_of(b), me), script_of(b));
  EXPECT_EQ(resolve_testbed_script({"", "", c}, "", me), script_of(c));
  // A symlink is followed to the real file, which is what is checked and returned.
  fs::create_symlink(script_of(b), dir_ / "link.sh");
  EXPECT_EQ(resolve_testbed_script({(dir_ / "link.sh").string(), "", ""}, "", me), script_of(b));
}

TEST_F(TestbedScript, RefusesWhatAnotherCouldChange) {
  const std::string a = tree("a"), c = tree("c");
  // Writable by its group: refused, naming it and the mode, with no fall-back to the source tree's.
  ::chmod(script_of(a).c_str(), 0775);
  std::string e = error_of({"", "", c}, script_of(a));
  EXPECT_NE(e.find("state file"), std::string::npos) << e;
  EXPECT_NE(e.find(script_of(a) + " is writable by its group (mode 0775)"), std::string::npos) << e;
  ::chmod(script_of(a).c_str(), 0755);
  // A folder above it writable by others (no sticky bit): anyone could swap the script.
  ::chmod((dir_ / "a" / "scripts").c_str(), 0777);
  e = error_of({script_of(a), "", c}, "");
  EXPECT_NE(e.find("folder " + a + "/scripts is writable by others (mode 0777)"), std::string::npos) << e;
  EXPECT_NE(e.find("--testbed-script"), std::string::npos) << e;
  ::chmod((dir_ / "a" / "scripts").c_str(), 0755);
  // The same folder with the sticky bit (as /tmp): no one else can replace what is in it.
  ::chmod((dir_ / "a" / "scripts").c_str(), 01777);
  EXPECT_EQ(trusted_file_problem(script_of(a), ::geteuid()), "");
  ::chmod((dir_ / "a" / "scripts").c_str(), 0755);
  // Not absolute, not there, not a regular file.
  EXPECT_NE(error_of({"scripts/testbed.sh", "", ""}, "").find("'scripts/testbed.sh' is not an absolute path"),
            std::string::npos);
  EXPECT_NE(error_of({"", "", ""}, (dir_ / "none.sh").string()).find("none.sh"), std::string::npos);
  EXPECT_NE(trusted_file_problem(a, ::geteuid()).find("is not a regular file"), std::string::npos);
  // Owned by another user: only root can make such a file here.
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(script_of(a).c_str(), 65534, 65534), 0);
    e = error_of({script_of(a), "", ""}, "");
    EXPECT_NE(e.find(script_of(a) + " is owned by uid 65534, neither root nor uid 0"), std::string::npos) << e;
  }
  // Seen from a user who is neither root nor the owner (a file root owns is trusted by all): the same.
  if (::geteuid() != 0) {
    EXPECT_NE(trusted_file_problem(script_of(c), 12345).find("owned by uid"), std::string::npos);
  }
}

TEST(TestbedRunAs, SudoUserElseConfiguredElseNobody) {
  // Root under sudo: the invoking user, with sudo's group.
  RunAs as = testbed_run_as("", "12345", "23456", 0);
  EXPECT_TRUE(as.drop);
  EXPECT_EQ(as.uid, 12345u);
  EXPECT_EQ(as.gid, 23456u);
  EXPECT_EQ(as.groups, std::vector<gid_t>{23456});  // not in the user database: only its group
  // Plain root: nobody to drop to (the caller says so).
  EXPECT_FALSE(testbed_run_as("", nullptr, nullptr, 0).drop);
  // sudo by root, and anyone not root: nothing to drop.
  EXPECT_FALSE(testbed_run_as("", "0", "0", 0).drop);
  EXPECT_FALSE(testbed_run_as("", "12345", "23456", 1000).drop);
  // A user named on the command line wins over sudo's; root by name keeps root.
  as = testbed_run_as("0", "12345", "23456", 0);
  EXPECT_FALSE(as.drop);
  EXPECT_FALSE(testbed_run_as("root", "12345", "23456", 0).drop);
  // Bad input, named.
  try {
    testbed_run_as("", "12x", "1", 0);
    ADD_FAILURE() << "SUDO_UID=12x accepted";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("SUDO_UID='12x' is not a user id"), std::string::npos) << e.what();
  }
  EXPECT_THROW(testbed_run_as("", "1000", nullptr, 0), RunError);
  try {
    testbed_run_as("no-such-user-deloco", nullptr, nullptr, 0);
    ADD_FAILURE() << "an unknown --testbed-user accepted";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("--testbed-user no-such-user-deloco: no such user"), std::string::npos)
        << e.what();
  }
}

TEST(TestbedRunAs, NamedUserFromTheUserDatabase) {
  const RunAs as = testbed_run_as("nobody", nullptr, nullptr, 0);  // every Debian has nobody (65534)
  EXPECT_TRUE(as.drop);
  EXPECT_EQ(as.name, "nobody");
  EXPECT_NE(as.uid, 0u);
  EXPECT_FALSE(as.groups.empty());
  const RunAs by_id = testbed_run_as(std::to_string(as.uid), nullptr, nullptr, 0);
  EXPECT_EQ(by_id.uid, as.uid);
  EXPECT_EQ(by_id.gid, as.gid);
}

}  // namespace
}  // namespace deloco::run
