// tests/support/proc.h — a child process for tests that start the real `deloco` executable (header-only).
//
// Proc starts DELOCO_BINARY (CTest sets it; "./deloco" otherwise) with the given arguments, stdout and stderr
// appended to a log file, and an environment of this process plus OMP_WAIT_POLICY=PASSIVE, one OpenMP and one
// OpenBLAS thread (any inherited OMP_* / OPENBLAS_* dropped) and `env`. Every wait has a deadline; the destructor
// SIGKILLs and reaps a child still running, so a failing test never leaves processes behind. It may run in another
// working directory.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace deloco::test {

// The deloco executable under test, as an absolute path (children may run in another directory): $DELOCO_BINARY,
// else ./deloco.
inline std::string deloco_binary() {
  const char* v = std::getenv("DELOCO_BINARY");
  return std::filesystem::absolute(v ? v : "./deloco").string();
}

// The source tree (for configs/ and data/): $DELOCO_SOURCE_DIR, else the current directory.
inline std::string source_dir() {
  const char* v = std::getenv("DELOCO_SOURCE_DIR");
  return v ? v : ".";
}

class Proc {
 public:
  // `cwd`: the child's working directory ("" : ours); `log` is opened before the change, relative to ours.
  Proc(std::vector<std::string> args, const std::string& log, std::vector<std::string> env = {},
       const std::string& cwd = "")
      : log_(log) {
    const std::string bin = deloco_binary();
    std::vector<std::string> argv{bin};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    std::vector<std::string> envs{"OMP_WAIT_POLICY=PASSIVE", "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1"};
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "OMP_", 4) != 0 && std::strncmp(*e, "OPENBLAS_", 9) != 0) envs.push_back(*e);
    for (auto& e : env) envs.push_back(e);
    std::vector<char*> cenv;
    for (auto& e : envs) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
    if (posix_spawn(&pid_, bin.c_str(), &fa, nullptr, cargv.data(), cenv.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Proc() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  pid_t pid() const { return pid_; }
  // Only to our child while it runs: never kill(-1, ...) (every process) after a failed spawn, nor a reaped pid.
  void signal(int sig) {
    if (pid_ > 0 && !exited_) ::kill(pid_, sig);
  }
  // Exit code (or 128 + signal) once the process ended within `seconds`; -1 when still running.
  int wait(double seconds) {
    if (pid_ <= 0) return -1;  // never started: waitpid(-1) would reap someone else's child
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!exited_) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return code_;
  }
  void kill9() {
    signal(SIGKILL);
    wait(10);
  }
  // Everything the process wrote so far.
  std::string log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Resident memory in KiB (-1 when unknown).
  long rss_kib() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return -1;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
};

// Runs `deloco args` to completion: SIGTERM after `limit_s` seconds (which `deloco run` forwards to its children),
// then up to `grace_s` more seconds before SIGKILL. Returns the exit code (124 when it had to be stopped, like
// timeout(1)) and everything it wrote, read from `log`.
struct Finished {
  int code;
  std::string out;
};
inline Finished run_to_end(const std::vector<std::string>& args, const std::string& log, double limit_s,
                           double grace_s = 60) {
  Proc p(args, log);
  if (p.pid() < 0) return {-1, ""};
  int code = p.wait(limit_s);
  if (code < 0) {
    p.signal(SIGTERM);
    if (p.wait(grace_s) < 0) p.kill9();
    code = 124;
  }
  return {code, p.log()};
}

}  // namespace deloco::test
