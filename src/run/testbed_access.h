// src/run/testbed_access.h — what `deloco run` does with root's rights on a testbed (docs/testbed.md): which testbed
// script it executes to change the hosts' links (network faults), and which user the processes it starts inside the
// hosts run as.
//
// Contract
//  * trusted_file_problem(path, euid): "" when the file `path` may be executed with the rights of user `euid`, else
//    why not, naming the path. It must be absolute and name a regular file; symlinks are resolved and the checks
//    apply to the real file and to every folder on its real path: each must be owned by root or by `euid`, and not be
//    writable by group or others (a folder with the sticky bit, as /tmp, may be: no one else can replace what is in
//    it). Whoever else could change the file, or swap it or a folder above it, could otherwise run anything as root.
//  * resolve_testbed_script(access, state_script, euid): the script to run, the first of these that is named:
//      1. access.script (`deloco run --testbed-script PATH`);
//      2. state_script, the script= of /run/<name>.testbed (the script whose `up` made the testbed);
//      3. access.source_tree + "/scripts/testbed.sh", the source tree this executable was built from, when that file
//         exists.
//    The one chosen must pass trusted_file_problem, else RunError naming it and the problem (no fall-back to the next:
//    a named script that is refused is a mistake to fix, not to skip). RunError when none is named. Never a script
//    found from the working directory or next to the executable.
//  * testbed_run_as(access.user, sudo_uid, sudo_gid, euid): the user the processes inside the testbed's hosts run as.
//    Only root drops rights (euid != 0: RunAs{} , nothing to drop). Then: access.user when given (a user name or a
//    numeric uid, looked up in the user database: its primary group and supplementary groups; "root" or 0: keep
//    root; RunError naming it when unknown); else SUDO_UID and SUDO_GID (the user who ran `sudo deloco run`: both
//    must be decimal numbers, RunError naming the bad one; 0: keep root; the groups from the user database when
//    the uid is in it, else only SUDO_GID); else nobody is known: RunAs{} (root keeps root; the caller says so).
//    `sudo_uid`/`sudo_gid` are the variables' values, nullptr when unset.
#pragma once

#include <sys/types.h>

#include <string>

#include "run/supervisor.h"

namespace deloco::run {

// How `deloco run` reaches a testbed: its command-line options and the build's source tree.
struct TestbedAccess {
  std::string script;       // --testbed-script: the testbed script to run ("" : see resolve_testbed_script)
  std::string user;         // --testbed-user: whom the hosts' processes run as ("" : SUDO_UID/SUDO_GID, see above)
  std::string source_tree;  // the source tree this executable was built from ("" : none known)
};

std::string trusted_file_problem(const std::string& path, uid_t euid);

std::string resolve_testbed_script(const TestbedAccess& access, const std::string& state_script, uid_t euid);

RunAs testbed_run_as(const std::string& user, const char* sudo_uid, const char* sudo_gid, uid_t euid);

}  // namespace deloco::run
