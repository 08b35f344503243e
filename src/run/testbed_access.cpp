// What `deloco run` runs with root's rights on a testbed (contract in testbed_access.h).
#include "run/testbed_access.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "deloco/error.h"

namespace deloco::run {
namespace fs = std::filesystem;
namespace {

std::string octal_mode(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof(b), "%04o", static_cast<unsigned>(m & 07777));
  return b;
}

// "" when `p` (a file or a folder, no symlink) is owned by root or `euid` and not writable by group or others (a
// sticky folder may be); else why not.
std::string owner_and_mode_problem(const fs::path& p, uid_t euid, bool folder) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return "cannot stat " + p.string() + ": " + std::strerror(errno);
  const std::string what = folder ? "folder " : "";
  if (st.st_uid != 0 && st.st_uid != euid)
    return what + p.string() + " is owned by uid " + std::to_string(st.st_uid) + ", neither root nor uid " +
           std::to_string(euid) + " (who runs this)";
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !(folder && (st.st_mode & S_ISVTX) != 0))
    return what + p.string() + " is writable by " + ((st.st_mode & S_IWOTH) != 0 ? "others" : "its group") +
           " (mode " + octal_mode(st.st_mode) + ")";
  return "";
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// The user database's entry of `uid` or name `user` into `as` (groups included); false when there is none.
bool from_user_database(const passwd* pw, RunAs& as) {
  if (pw == nullptr) return false;
  as.uid = pw->pw_uid;
  as.gid = pw->pw_gid;
  as.name = pw->pw_name;
  as.home = pw->pw_dir != nullptr ? pw->pw_dir : "";
  int n = 32;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  while (::getgrouplist(pw->pw_name, pw->pw_gid, groups.data(), &n) < 0) groups.resize(static_cast<size_t>(n) + 8);
  groups.resize(static_cast<size_t>(n));
  as.groups = groups;
  return true;
}

}  // namespace

std::string trusted_file_problem(const std::string& path, uid_t euid) {
  const fs::path p(path);
  if (!p.is_absolute()) return "'" + path + "' is not an absolute path";
  std::error_code ec;
  const fs::path real = fs::canonical(p, ec);
  if (ec) return "'" + path + "': " + ec.message();
  if (!fs::is_regular_file(fs::symlink_status(real, ec))) return real.string() + " is not a regular file";
  const std::string via = real == p ? "" : " (" + path + " leads there)";
  std::string why = owner_and_mode_problem(real, euid, false);
  for (fs::path d = real.parent_path(); why.empty(); d = d.parent_path()) {
    why = owner_and_mode_problem(d, euid, true);
    if (d == d.root_path()) break;
  }
  return why.empty() ? "" : why + via;
}

std::string resolve_testbed_script(const TestbedAccess& access, const std::string& state_script, uid_t euid) {
  std::string path, from;
  if (!access.script.empty()) {
    path = access.script;
    from = "--testbed-script";
  } else if (!state_script.empty()) {
    path = state_script;
    from = "the testbed's state file (script=, written by its `up`)";
  } else if (!access.source_tree.empty()) {
    const fs::path in_tree = fs::path(access.source_tree) / "scripts" / "testbed.sh";
    std::error_code ec;
    if (fs::exists(in_tree, ec)) {
      path = in_tree.string();
      from = "the source tree this executable was built from";
    }
  }
  if (path.empty())
    throw RunError("no testbed script to change the testbed's links: the state file names none, and " +
                   (access.source_tree.empty() ? std::string("no source tree is known")
                                               : "the source tree " + access.source_tree + " has no scripts/testbed.sh") +
                   "; pass --testbed-script PATH (a script owned by root and writable by no one else)");
  const std::string why = trusted_file_problem(path, euid);
  if (!why.empty())
    throw RunError("will not run the testbed script " + path + " named by " + from + " with this process's rights: " +
                   why + "; make it and its folders owned by root and writable by no one else (chown root, chmod " +
                   "go-w), or pass --testbed-script PATH of such a copy");
  std::error_code ec;
  return fs::canonical(path, ec).string();
}

RunAs testbed_run_as(const std::string& user, const char* sudo_uid, const char* sudo_gid, uid_t euid) {
  RunAs as;
  if (euid != 0) return as;
  if (!user.empty()) {
    const passwd* pw = all_digits(user) ? ::getpwuid(static_cast<uid_t>(std::stoul(user))) : ::getpwnam(user.c_str());
    if (!from_user_database(pw, as))
      throw RunError("--testbed-user " + user + ": no such user in the user database (getent passwd " + user + ")");
    as.drop = as.uid != 0;
    return as;
  }
  if (sudo_uid == nullptr && sudo_gid == nullptr) return as;
  const std::string u = sudo_uid != nullptr ? sudo_uid : "", g = sudo_gid != nullptr ? sudo_gid : "";
  if (!all_digits(u)) throw RunError("SUDO_UID='" + u + "' is not a user id (a decimal number): cannot tell whom to run the testbed's processes as; unset it, or pass --testbed-user");
  if (!all_digits(g)) throw RunError("SUDO_GID='" + g + "' is not a group id (a decimal number): cannot tell whom to run the testbed's processes as; unset it, or pass --testbed-user");
  const uid_t uid = static_cast<uid_t>(std::stoul(u));
  if (uid == 0) return as;
  if (!from_user_database(::getpwuid(uid), as)) {
    as.uid = uid;
    as.groups.clear();
  }
  as.gid = static_cast<gid_t>(std::stoul(g));  // sudo's word on the group wins over the database's primary group
  if (as.groups.empty()) as.groups = {as.gid};
  as.drop = true;
  return as;
}

}  // namespace deloco::run
