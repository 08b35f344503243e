// Child processes of `deloco run` (contract in supervisor.h).
#include "run/supervisor.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>

#include "deloco/error.h"
#include "util/fs.h"

extern char** environ;

namespace deloco::run {

std::vector<std::string> child_environment(const std::vector<std::string>& extra) {
  static const char* kDrop[] = {"DELOCO_SYNCER", "DELOCO_BIND", "DELOCO_SECRET_KEY", "DELOCO_SERVER_KEY", "DELOCO_ALLOW",
                                "DELOCO_LEARNER_ID", "DELOCO_SHARD", "DELOCO_CONFIG", "DELOCO_SET", "DELOCO_OUT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    bool drop = std::find(std::begin(kDrop), std::end(kDrop), name) != std::end(kDrop);
    for (const auto& x : extra) drop = drop || x.substr(0, x.find('=')) == name;
    if (!drop) env.push_back(kv);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

pid_t spawn_self(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log,
                 const std::string& netns, const RunAs& run_as) {
  return spawn_program("/proc/self/exe", argv, env, log, netns, run_as);
}

namespace {
// In a forked child: writes `what` to stderr (the child's log) and exits 126. Async-signal-safe.
[[noreturn]] void child_fail(const char* what) {
  (void)!::write(STDERR_FILENO, what, std::strlen(what));
  ::_exit(126);
}
}  // namespace

pid_t spawn_program(const std::string& program, const std::vector<std::string>& argv,
                    const std::vector<std::string>& env, const std::string& log, const std::string& netns,
                    const RunAs& run_as) {
  int ns_fd = -1;
  if (!netns.empty()) {
    const std::string path = "/run/netns/" + netns;
    ns_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns_fd < 0) throw RunError("cannot open network namespace '" + path + "': " + std::strerror(errno));
  }
  std::vector<char*> av, ev;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  for (const auto& e : env) ev.push_back(const_cast<char*>(e.c_str()));
  ev.push_back(nullptr);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (ns_fd >= 0) ::close(ns_fd);
    throw IoError("cannot open log file '" + log + "': " + std::strerror(errno));
  }
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    if (null_fd >= 0) ::close(null_fd);
    if (ns_fd >= 0) ::close(ns_fd);
    throw RunError(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {  // child: async-signal-safe calls only
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (ns_fd >= 0 && ::setns(ns_fd, CLONE_NEWNET) != 0) child_fail("deloco run: cannot join the child's network namespace\n");
    if (run_as.drop) {  // groups first, then the group, then the user: each needs the rights the next one drops
      if (::setgroups(run_as.groups.size(), run_as.groups.empty() ? nullptr : run_as.groups.data()) != 0)
        child_fail("deloco run: setgroups failed: cannot drop root's groups in the child\n");
      if (::setgid(run_as.gid) != 0) child_fail("deloco run: setgid failed: cannot drop root's group in the child\n");
      if (::setuid(run_as.uid) != 0) child_fail("deloco run: setuid failed: cannot drop root in the child\n");
      if (::setuid(0) == 0 || ::geteuid() != run_as.uid || ::getegid() != run_as.gid)
        child_fail("deloco run: the child could regain root after dropping it\n");
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // cleared by the change of user
      if (::getppid() != parent) ::_exit(127);
    }
    ::execve(program.c_str(), av.data(), ev.data());
    static const char msg[] = "deloco run: exec of a child failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so signals to the group work at once
  ::close(fd);
  if (null_fd >= 0) ::close(null_fd);
  if (ns_fd >= 0) ::close(ns_fd);
  return pid;
}

bool collect_exit(Child& c) {
  if (c.pid == 0) return false;
  int status = 0;
  if (::waitpid(c.pid, &status, WNOHANG) != c.pid) return false;
  c.pid = 0;
  c.stopped = false;
  c.last_exit = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                  : std::string("signal ") + strsignal(WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) c.done = true;
  return true;
}

std::string record_failure(Child& c, double now) {
  c.failures.push_back(now);
  while (!c.failures.empty() && now - c.failures.front() > 120.0) c.failures.pop_front();
  const auto recent = std::count_if(c.failures.begin(), c.failures.end(), [&](double t) { return now - t <= 10.0; });
  if (recent >= 3) return "3 times within 10 s";
  if (c.failures.size() >= 5) return "5 times within 120 s";
  return "";
}

std::string tail_of(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(line);
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += "    " + l + "\n";
  return out;
}

void stop_children(const std::vector<Child*>& children, int sig, double wait_seconds, std::ostream& log) {
  std::vector<Child*> running;
  for (Child* c : children)
    if (c->pid != 0) running.push_back(c);
  if (running.empty()) return;
  log << "deloco run: sending " << strsignal(sig) << " to " << running.size() << " process(es) and waiting up to "
      << static_cast<int64_t>(wait_seconds + 0.5) << " s\n";
  for (Child* c : running) {
    ::kill(c->pid, sig);
    if (c->stopped) ::kill(c->pid, SIGCONT);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    bool any = false;
    for (Child* c : running) {
      if (c->pid == 0) continue;
      int status = 0;
      if (::waitpid(c->pid, &status, WNOHANG) == c->pid) c->pid = 0;
      else any = true;
    }
    if (!any) return;
    ::usleep(50 * 1000);
  }
  for (Child* c : running) {
    if (c->pid == 0) continue;
    log << "deloco run: " << c->name << " did not stop in time: SIGKILL\n";
    ::kill(c->pid, SIGKILL);
    ::waitpid(c->pid, nullptr, 0);
    c->pid = 0;
  }
}

}  // namespace deloco::run
