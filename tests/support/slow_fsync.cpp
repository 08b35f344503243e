// A slow disk for integration tests: LD_PRELOAD this library and every fsync(2) of the process first sleeps
// DELOCO_TEST_FSYNC_DELAY_US microseconds (default 30000), then syncs as usual. A real process on a real file
// system whose disk answers late, as a loaded CI machine's does, without root or ptrace.
#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>

extern "C" int fsync(int fd) {
  using Fn = int (*)(int);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "fsync"));
  static const long delay_us = [] {
    const char* v = std::getenv("DELOCO_TEST_FSYNC_DELAY_US");
    return v ? std::atol(v) : 30000L;
  }();
  timespec ts{delay_us / 1000000, (delay_us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
  return real ? real(fd) : (errno = ENOSYS, -1);
}
