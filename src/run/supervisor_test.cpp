#include "run/supervisor.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include <gtest/gtest.h>

namespace deloco::run {
namespace supervisor_cases {
namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `script` with /bin/sh through spawn_program (netns, run_as) and returns its exit status and its log.
std::pair<int, std::string> run_sh(const fs::path& dir, const std::string& script, const std::string& netns,
                                   const RunAs& as) {
  const fs::path log = dir / "child.log";
  fs::remove(log);
  const pid_t pid = spawn_program("/bin/sh", {"sh", "-c", script}, child_environment({}), log.string(), netns, as);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_all(log)};
}

// A child started inside a network namespace (a testbed host) with a RunAs drops root there: its user, group and
// supplementary groups are the RunAs's, and it is in that namespace (spawn_program itself checks that root cannot
// be regained: a child that could exits 126). Root only (the namespace is made with `ip netns add` and removed at
// the end).
TEST(Supervisor, ChildInANetworkNamespaceDropsRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (a network namespace, a change of user)";
  const std::string ns = "dlsup" + std::to_string(::getpid());
  if (std::system(("ip netns add " + ns + " 2>/dev/null").c_str()) != 0) GTEST_SKIP() << "cannot make a namespace";
  struct Remove {
    std::string ns;
    fs::path dir;
    ~Remove() {
      (void)!std::system(("ip netns del " + ns).c_str());
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove{ns, fs::temp_directory_path() / ("deloco-sup-" + std::to_string(::getpid()))};
  fs::create_directories(remove.dir);
  const std::string probe = "echo uid=$(id -u) gid=$(id -g) groups=$(id -G); echo net=$(readlink /proc/self/ns/net)";
  // The namespace the child must be in: the inode of /run/netns/NAME, as /proc/PID/ns/net names it.
  struct stat st {};
  ASSERT_EQ(::stat(("/run/netns/" + ns).c_str(), &st), 0);
  const std::string want_net = "net=net:[" + std::to_string(st.st_ino) + "]";

  RunAs as;
  as.drop = true;
  as.uid = 65534;
  as.gid = 65533;
  as.groups = {65533, 65532};
  auto [rc, log] = run_sh(remove.dir, probe, ns, as);
  EXPECT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("uid=65534 gid=65533 groups=65533 65532"), std::string::npos) << log;
  EXPECT_NE(log.find(want_net), std::string::npos) << log;

  // Without a RunAs the child keeps this process's user (root), in the namespace all the same.
  std::tie(rc, log) = run_sh(remove.dir, probe, ns, RunAs{});
  EXPECT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("uid=0 gid=0"), std::string::npos) << log;
  EXPECT_NE(log.find(want_net), std::string::npos) << log;
}

}  // namespace
}  // namespace deloco::run
