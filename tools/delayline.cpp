// tools/delayline.cpp — the testbed's delay line (issue 56, item 3): propagation delay where the kernel has no netem.
//
// scripts/testbed.sh up --delay MS runs one of these in the bridge's namespace. Each host's link is cut in two
// there: the host's veth end `dN` and a second pair `xN`/`hN` whose `hN` joins the bridge. This program forwards
// every Ethernet frame between `dN` and `xN`, in both directions, each one held for the set one-way delay before it
// goes on. A frame crosses two host links between two hosts, so their round trip gains 4 × the delay.
//
// Frames are read and written through packet sockets with virtio-net headers (PACKET_VNET_HDR), so the kernel's
// large segments (GSO) and checksum offload pass through unchanged and are cut into wire frames after the relay.
// Memory is bounded: at most --limit-bytes wait per direction (a full queue drops what arrives, as a router's does,
// and counts it). Order is kept per direction (one FIFO: every frame is held the same time).
//
// Usage: deloco-delayline --pair dN:xN [--pair ...] --delay-ms MS [--limit-bytes N] [--ready FILE]
//   --ready FILE   written (with this process's pid) once every socket is open: the script waits for it.
// SIGTERM or SIGINT ends it; it prints its counters as one JSON line on stderr then (and on SIGUSR1).
// Needs CAP_NET_RAW (root). Exit 2 on bad arguments, 1 when an interface cannot be opened.
#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t g_stop = 0, g_dump = 0;
void on_stop(int) { g_stop = 1; }
void on_dump(int) { g_dump = 1; }

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "deloco-delayline: %s\nusage: deloco-delayline --pair A:B [--pair C:D ...] --delay-ms MS "
               "[--limit-bytes N] [--ready FILE]\n",
               why.c_str());
  std::exit(2);
}

// A packet socket on one interface: every frame it receives (not those sent from this host's stack through it, nor
// our own writes), with a virtio-net header in front; promiscuous, so frames for any MAC come in.
int open_interface(const std::string& name) {
  const unsigned index = if_nametoindex(name.c_str());
  if (index == 0) {
    std::fprintf(stderr, "deloco-delayline: no interface '%s' in this namespace\n", name.c_str());
    std::exit(1);
  }
  const int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (fd < 0) {
    std::fprintf(stderr, "deloco-delayline: packet socket: %s (needs root)\n", std::strerror(errno));
    std::exit(1);
  }
  const int one = 1;
  if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) != 0 ||
      setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) != 0) {
    std::fprintf(stderr, "deloco-delayline: %s: socket options: %s\n", name.c_str(), std::strerror(errno));
    std::exit(1);
  }
  sockaddr_ll addr{};
  addr.sll_family = AF_PACKET;
  addr.sll_protocol = htons(ETH_P_ALL);
  addr.sll_ifindex = static_cast<int>(index);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    std::fprintf(stderr, "deloco-delayline: bind %s: %s\n", name.c_str(), std::strerror(errno));
    std::exit(1);
  }
  packet_mreq mr{};
  mr.mr_ifindex = static_cast<int>(index);
  mr.mr_type = PACKET_MR_PROMISC;
  if (setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr) != 0) {
    std::fprintf(stderr, "deloco-delayline: promiscuous %s: %s\n", name.c_str(), std::strerror(errno));
    std::exit(1);
  }
  return fd;
}

struct Frame {
  int64_t due = 0;
  std::string bytes;  // virtio-net header + Ethernet frame, as read
};

// One direction of one link: frames read from `from` wait here, then go out on `to`.
struct Direction {
  std::string name;
  int from = -1, to = -1;
  std::deque<Frame> queue;
  size_t queued = 0, peak = 0;
  uint64_t forwarded = 0, forwarded_bytes = 0, dropped_full = 0, send_errors = 0;
};

void dump(const std::vector<Direction>& dirs, double delay_ms, size_t limit) {
  std::string s = "{\"delay_ms\":" + std::to_string(delay_ms) + ",\"limit_bytes\":" + std::to_string(limit) +
                  ",\"directions\":[";
  for (size_t i = 0; i < dirs.size(); ++i) {
    const Direction& d = dirs[i];
    s += (i ? "," : "") + std::string("{\"name\":\"") + d.name + "\",\"forwarded\":" + std::to_string(d.forwarded) +
         ",\"forwarded_bytes\":" + std::to_string(d.forwarded_bytes) + ",\"dropped_full\":" +
         std::to_string(d.dropped_full) + ",\"send_errors\":" + std::to_string(d.send_errors) +
         ",\"queued_bytes\":" + std::to_string(d.queued) + ",\"peak_queued_bytes\":" + std::to_string(d.peak) + "}";
  }
  s += "]}\n";
  std::fputs(s.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<std::string, std::string>> pairs;
  double delay_ms = -1;
  size_t limit = 16u << 20;
  std::string ready;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--pair") {
      const std::string v = value();
      const size_t colon = v.find(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == v.size()) usage("--pair wants A:B, got '" + v + "'");
      pairs.emplace_back(v.substr(0, colon), v.substr(colon + 1));
    } else if (a == "--delay-ms") {
      const std::string v = value();
      char* end = nullptr;
      delay_ms = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !std::isfinite(delay_ms) || delay_ms < 0 || delay_ms > 10000)
        usage("--delay-ms wants milliseconds in [0, 10000], got '" + v + "'");
    } else if (a == "--limit-bytes") {
      const std::string v = value();
      char* end = nullptr;
      const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 65536 || n > (1ull << 32))
        usage("--limit-bytes wants bytes in [65536, 4 GiB], got '" + v + "'");
      limit = static_cast<size_t>(n);
    } else if (a == "--ready") {
      ready = value();
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  if (pairs.empty()) usage("no --pair given");
  if (delay_ms < 0) usage("--delay-ms is required");
  const int64_t delay_ns = static_cast<int64_t>(std::llround(delay_ms * 1e6));

  std::vector<int> fds;
  std::vector<Direction> dirs;
  for (const auto& [a, b] : pairs) {
    const int fa = open_interface(a), fb = open_interface(b);
    fds.push_back(fa);
    fds.push_back(fb);
    dirs.push_back(Direction{a + ">" + b, fa, fb, {}, 0, 0, 0, 0, 0, 0});
    dirs.push_back(Direction{b + ">" + a, fb, fa, {}, 0, 0, 0, 0, 0, 0});
  }
  struct sigaction sa{};
  sa.sa_handler = on_stop;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sa.sa_handler = on_dump;
  sigaction(SIGUSR1, &sa, nullptr);
  if (!ready.empty()) {
    std::ofstream f(ready);
    f << getpid() << "\n";
    if (!f) {
      std::fprintf(stderr, "deloco-delayline: cannot write %s\n", ready.c_str());
      return 1;
    }
  }

  std::vector<pollfd> pfds;
  for (int fd : fds) pfds.push_back(pollfd{fd, POLLIN, 0});
  std::string buf(256 * 1024, '\0');  // a GSO segment (64 KiB, or more with big TCP) and its header
  while (!g_stop) {
    if (g_dump) {
      g_dump = 0;
      dump(dirs, delay_ms, limit);
    }
    // Due frames go out, oldest first; a full transmit queue (EAGAIN, ENOBUFS) keeps the frame for the next turn.
    int64_t t = now_ns(), next = -1;
    bool blocked = false;
    for (Direction& d : dirs) {
      while (!d.queue.empty() && d.queue.front().due <= t) {
        const Frame& f = d.queue.front();
        const ssize_t n = send(d.to, f.bytes.data(), f.bytes.size(), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == ENOBUFS || errno == EINTR)) {
          blocked = true;
          break;
        }
        if (n < 0) {
          ++d.send_errors;  // the link is down (a partition): the frame is lost, as on the wire
        } else {
          ++d.forwarded;
          d.forwarded_bytes += f.bytes.size();
        }
        d.queued -= f.bytes.size();
        d.queue.pop_front();
      }
      if (!d.queue.empty() && (next < 0 || d.queue.front().due < next)) next = d.queue.front().due;
    }
    int64_t wait_ns = next < 0 ? 200000000 : std::max<int64_t>(0, next - now_ns());
    if (blocked) wait_ns = std::min<int64_t>(wait_ns, 200000);
    timespec ts{static_cast<time_t>(wait_ns / 1000000000), static_cast<long>(wait_ns % 1000000000)};
    const int r = ppoll(pfds.data(), pfds.size(), &ts, nullptr);
    if (r < 0 && errno != EINTR) {
      std::fprintf(stderr, "deloco-delayline: poll: %s\n", std::strerror(errno));
      break;
    }
    if (r <= 0) continue;
    t = now_ns();
    for (const pollfd& p : pfds) {
      if (!(p.revents & POLLIN)) continue;
      for (;;) {
        const ssize_t n = recv(p.fd, buf.data(), buf.size(), MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0) break;  // EAGAIN: drained
        if (static_cast<size_t>(n) > buf.size()) continue;  // larger than any segment the kernel makes: dropped
        for (Direction& d : dirs) {
          if (d.from != p.fd) continue;
          if (d.queued + static_cast<size_t>(n) > limit) {
            ++d.dropped_full;
            continue;
          }
          d.queue.push_back(Frame{t + delay_ns, std::string(buf.data(), static_cast<size_t>(n))});
          d.queued += static_cast<size_t>(n);
          d.peak = std::max(d.peak, d.queued);
        }
      }
    }
  }
  dump(dirs, delay_ms, limit);
  return 0;
}
