// MetricsServer: Prometheus scrapes (/metrics, and / until a route replaces it) and the GET routes its owner adds
// (add_get: the syncer's live dashboard, / and /api/data), over HTTP, on cpp-httplib (see deloco/transport.h for
// the contract).
//
// What httplib does: parsing the request line and headers, writing responses. What this file adds, because
// httplib 0.11's server has only a per-read timeout (a client sending a byte now and then holds a worker forever)
// and an unbounded job queue:
//  * DeadlineStream: the stream httplib reads the request from and writes the response to. Every wait is a poll()
//    bounded by one deadline for the whole request (kRequestDeadline) and one for the whole response
//    (kResponseDeadline), and also ends when the server stops (a pipe that becomes readable). It reads at most
//    kMaxRequestBytes. Only the worker that owns a connection ever touches its descriptor, so there is no
//    watchdog acting on descriptors from another thread, and no descriptor-reuse race.
//  * BoundedPool: kThreads workers and at most kQueue waiting connections. A connection beyond that is answered
//    503 and closed right away on the listener thread.
//  * The listening socket is ours (our binding rules and error messages); httplib's accept loop gets a dup() of it,
//    which it closes itself when it returns. Stopping is shutdown() on our descriptor: the blocked accept() fails,
//    the loop closes its dup and returns, and we close ours after joining the thread. httplib's stop() is never
//    called, since it closes the descriptor from another thread while accept() may be about to use it.
//  * Every request is answered by our pre-routing handler (exact paths, GET only), so httplib's regex routes,
//    file handlers and body readers never run.
//  * Range: httplib parses a Range header before routing and, after our handler, cuts the response to the ranges:
//    one copy of the body per range for a multi-range request (an 8 KB header of "0-," ranges made a 61 KB page a
//    165 MB response, per request). The setup hook that process_request() runs between parsing and routing
//    empties the parsed ranges, so every response is the handler's body as it is (200, not 206). A malformed
//    Range header is still answered 416 by httplib, with an empty body.
//  * Host: checked first of all in answer(), against the names this server may be reached at (see the header).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "deloco/transport.h"

namespace deloco {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kDrainTime = std::chrono::milliseconds(500);  // reading what the client still sends after our reply
constexpr auto kRetryListen = std::chrono::milliseconds(100);

// "host:port" → (host, port); host "" or "*" means every interface. Throws naming the input.
std::pair<std::string, int> split_host_port(const std::string& hp) {
  const size_t colon = hp.rfind(':');
  if (colon == std::string::npos)
    throw TransportError("metrics address '" + hp + "' must be host:port (e.g. 127.0.0.1:9464, or :0 for any port)");
  std::string host = hp.substr(0, colon);
  const std::string port_text = hp.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "*") host.clear();
  int port = -1;
  if (!port_text.empty() && port_text.size() <= 5 &&
      port_text.find_first_not_of("0123456789") == std::string::npos)
    port = std::stoi(port_text);
  if (port < 0 || port > 65535)
    throw TransportError("metrics address '" + hp + "': port '" + port_text + "' is not a number in 0..65535");
  return {host, port};
}

// A host as compared by the Host check: a numeric address in its canonical text (IPv4-mapped IPv6 as IPv4, so
// "::ffff:127.0.0.1" is "127.0.0.1"), a name lower-cased. Brackets must already be off.
std::string canonical_host(const std::string& host) {
  in6_addr a6{};
  in_addr a4{};
  char buf[INET6_ADDRSTRLEN] = "";
  if (::inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      std::memcpy(&a4, &a6.s6_addr[12], 4);
      ::inet_ntop(AF_INET, &a4, buf, sizeof buf);
    } else {
      ::inet_ntop(AF_INET6, &a6, buf, sizeof buf);
    }
    return buf;
  }
  if (::inet_pton(AF_INET, host.c_str(), &a4) == 1) {
    ::inet_ntop(AF_INET, &a4, buf, sizeof buf);
    return buf;
  }
  std::string out = host;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The host of a Host header value ("name", "name:port", "[v6]", "[v6]:port"), canonical; "" when the value is not
// of that form (a bare IPv6 address, a port that is not a number).
std::string host_of_header(const std::string& value) {
  std::string host, port;
  if (!value.empty() && value[0] == '[') {
    const size_t close = value.find(']');
    if (close == std::string::npos) return "";
    host = value.substr(1, close - 1);
    const std::string rest = value.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') return "";
    if (!rest.empty()) port = rest.substr(1);
  } else {
    const size_t colon = value.find(':');
    host = value.substr(0, colon);
    if (colon != std::string::npos) port = value.substr(colon + 1);
  }
  if (host.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return "";
  return canonical_host(host);
}

// A value from a request, for a one-line error body: printable ASCII only, at most 80 characters.
std::string printable(const std::string& v) {
  std::string out;
  for (char c : v.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out + (v.size() > 80 ? "..." : "");
}

bool is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr) >> 24) == 127;
  if (a.ss_family == AF_INET6) {
    const in6_addr& a6 = reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
  }
  return false;
}

bool is_wildcard(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (a.ss_family == AF_INET6) return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr);
  return false;
}

// Waits until `fd` is ready for `events`, the deadline passes or `stop_fd` becomes readable; true only when `fd`
// is ready (or has an error or hang-up to report, which the next recv/send returns).
bool wait_ready(int fd, short events, Clock::time_point deadline, int stop_fd) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int n = ::poll(p, 2, static_cast<int>(std::min<long long>(left, 1000 * 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || (p[1].revents != 0)) return false;
    if (p[0].revents != 0) return true;
  }
}

void ip_and_port(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    port = ntohs(in6->sin6_port);
  } else if (a.ss_family == AF_INET) {
    const auto* in4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &in4->sin_addr, buf, sizeof buf);
    port = ntohs(in4->sin_port);
  }
  ip = buf;
}

// One connection's stream, with whole-request and whole-response deadlines (see the top of the file).
class DeadlineStream final : public httplib::Stream {
 public:
  // `accepted`: when the listener accepted the connection; the request deadline counts from then, so time spent
  // waiting for a worker counts too.
  DeadlineStream(int fd, int stop_fd, Clock::time_point accepted)
      : fd_(fd), stop_fd_(stop_fd), read_deadline_(accepted + MetricsServer::kRequestDeadline) {}
  Clock::time_point read_deadline() const { return read_deadline_; }

  bool is_readable() const override { return pos_ < len_ || wait_ready(fd_, POLLIN, read_deadline_, stop_fd_); }
  bool is_writable() const override { return wait_ready(fd_, POLLOUT, write_deadline(), stop_fd_); }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (pos_ == len_) {
      const size_t room = MetricsServer::kMaxRequestBytes - std::min(total_, MetricsServer::kMaxRequestBytes);
      if (room == 0 || !wait_ready(fd_, POLLIN, read_deadline_, stop_fd_)) return -1;
      ssize_t n;
      do n = ::recv(fd_, buf_, std::min(sizeof buf_, room), 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) return n;  // 0: the client closed; <0: an error
      pos_ = 0;
      len_ = static_cast<size_t>(n);
      total_ += len_;
    }
    const size_t k = std::min(size, len_ - pos_);
    std::memcpy(ptr, buf_ + pos_, k);
    pos_ += k;
    return static_cast<ssize_t>(k);
  }

  // Writes all of `size` or fails (-1): httplib loops on short writes, and would spin on a 0.
  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      if (!wait_ready(fd_, POLLOUT, write_deadline(), stop_fd_)) return -1;
      const ssize_t n = ::send(fd_, ptr + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) return -1;
      done += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(done);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip_and_port(a, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) ip_and_port(a, ip, port);
  }
  // httplib 0.11 asks for the descriptor only to refuse ones that select() cannot watch (≥ FD_SETSIZE, answered
  // 500). This stream polls and has no such limit, so it reports none, and a busy process with many descriptors
  // still gets its scrapes.
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  Clock::time_point write_deadline() const {
    if (!write_started_) {
      write_deadline_ = Clock::now() + MetricsServer::kResponseDeadline;
      write_started_ = true;
    }
    return write_deadline_;
  }

  const int fd_, stop_fd_;
  const Clock::time_point read_deadline_;
  mutable Clock::time_point write_deadline_{};
  mutable bool write_started_ = false;
  char buf_[4096];
  size_t pos_ = 0, len_ = 0, total_ = 0;
};

// Set on the listener thread while it runs a job itself because the queue is full: the job then refuses its
// connection instead of serving it.
thread_local bool t_refuse = false;
// Set by a worker before it runs a job: when the job's connection was accepted (enqueued).
thread_local Clock::time_point t_accepted;

class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(size_t threads, size_t queue) : queue_(queue) {
    for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~BoundedPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (jobs_.size() < queue_ && !stopping_) {
        jobs_.push_back({std::move(fn), Clock::now()});
        cv_.notify_one();
        return;
      }
    }
    t_refuse = true;  // every job closes its socket, so it must run; in refusal mode it does so at once
    fn();
    t_refuse = false;
  }

  // Runs the jobs still queued (they finish at once once the server stops: their streams see the stop pipe).
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
  }

 private:
  void work() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      t_accepted = job.enqueued;
      job.fn();
    }
  }

  struct Job {
    std::function<void()> fn;
    Clock::time_point enqueued;
  };
  const size_t queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

struct MetricsServer::Impl {
  // httplib's server with our connection handling: one request per connection, on a DeadlineStream.
  class Http final : public httplib::Server {
   public:
    explicit Http(Impl* owner) : owner_(owner) {
      new_task_queue = [] { return new BoundedPool(kThreads, kQueue); };
    }
    void adopt(int listen_fd) { svr_sock_ = listen_fd; }

   private:
    bool process_and_close_socket(socket_t sock) override {
      bool ok = false;
      if (t_refuse) {
        static const char busy[] =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        ::send(sock, busy, sizeof busy - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        ::shutdown(sock, SHUT_WR);
        char buf[4096];  // what already arrived, read so that the close is less likely to reset the reply away
        for (int i = 0; i < 16 && ::recv(sock, buf, sizeof buf, MSG_DONTWAIT) > 0; ++i) {
        }
      } else {
        DeadlineStream stream(sock, owner_->stop_pipe[0], t_accepted);
        bool closed = true;
        try {
          // Between parsing and routing: forget the parsed Range, so the response is never cut into ranges.
          ok = process_request(stream, /*close_connection=*/true, closed,
                               [](httplib::Request& req) { req.ranges.clear(); });
        } catch (...) {
          ok = false;  // httplib reports handler errors itself; anything else only costs this connection
        }
        owner_->drain(sock, stream.read_deadline());
      }
      ::close(sock);
      return ok;
    }

    Impl* owner_;
  };

  int listen_fd = -1;
  int port = 0;
  std::string bound_ip;     // numeric, as getsockname() reports it
  bool bound_v6 = false;
  bool loopback = false;    // bound to a loopback address
  bool wildcard = false;    // bound to every interface
  std::set<std::string> hosts;  // canonical Host names always accepted: localhost, loopback, the bound host
  int stop_pipe[2] = {-1, -1};  // becomes readable when the server stops; every wait watches it
  std::atomic<bool> stopping{false};
  std::mutex routes_mu;
  std::map<std::string, Handler> routes;
  std::unique_ptr<Http> http;
  std::thread listener;

  // Closing with unread request bytes would make the kernel send a reset, which can destroy the response in
  // flight; so say we are done, then read and discard what the client still sends, briefly (and not at all for a
  // client past its request deadline: that one gets no more of a worker's time), before closing.
  void drain(int fd, Clock::time_point request_deadline) const {
    ::shutdown(fd, SHUT_WR);
    const auto until = std::min(Clock::now() + kDrainTime, request_deadline);
    char buf[4096];
    for (size_t drained = 0; drained < 64 * 1024;) {
      if (!wait_ready(fd, POLLIN, until, stop_pipe[0])) break;
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
  }

  // "" when the request's Host header may be served, else the reason to refuse it (and *status, 400 or 403).
  std::string refuse_host(const httplib::Request& req, int* status) const {
    const size_t n = req.get_header_value_count("Host");
    *status = 400;
    if (n > 1) return "a request must have one Host header, this one has " + std::to_string(n) + "\n";
    if (n == 0) return req.version == "HTTP/1.0" ? "" : "an HTTP/1.1 request needs a Host header\n";
    const std::string value = req.get_header_value("Host");
    const std::string host = host_of_header(value);
    if (!host.empty() && (hosts.count(host) || host == canonical_host(req.local_addr))) return "";
    *status = 403;
    return "refused: Host '" + printable(value) + "' names neither localhost nor this server's address " +
           "(a guard against DNS rebinding); use http://127.0.0.1:" + std::to_string(port) +
           "/ on this machine or the address the server listens on\n";
  }

  void answer(const httplib::Request& req, httplib::Response& res) {
    Reply reply;
    int host_status = 0;
    const std::string host_refusal = refuse_host(req, &host_status);
    if (!host_refusal.empty()) {
      reply = Reply{host_status, "text/plain", host_refusal};
    } else if (req.method != "GET") {
      reply = Reply{405, "text/plain", "only GET is supported\n"};
    } else {
      Handler h;
      {
        std::lock_guard<std::mutex> lock(routes_mu);
        auto it = routes.find(req.path);
        if (it != routes.end()) h = it->second;
      }
      if (!h) {
        reply = Reply{404, "text/plain", "not found; metrics are at /metrics\n"};
      } else {
        const size_t q = req.target.find('?');
        try {
          reply = h(q == std::string::npos ? std::string() : req.target.substr(q + 1));
        } catch (const std::exception& e) {
          reply = Reply{500, "text/plain", std::string(e.what()) + "\n"};
        } catch (...) {
          reply = Reply{500, "text/plain", "internal error\n"};
        }
      }
    }
    if (reply.body.size() > kMaxResponseBytes)
      reply = Reply{500, "text/plain",
                    "the response of " + std::to_string(reply.body.size()) + " bytes is over the server's cap of " +
                        std::to_string(kMaxResponseBytes) + " bytes (MetricsServer::kMaxResponseBytes)\n"};
    res.status = reply.status;
    res.set_content(std::string(), reply.content_type);
    res.body = std::move(reply.body);  // moved, not copied: one copy of the body per response in flight
  }

  // The listener thread: httplib's accept loop on a dup() of our socket. The loop returns when accept() fails:
  // after stop (shutdown() of our descriptor), or on an error such as a connection aborted before it was accepted,
  // which must not leave the endpoint deaf: then it listens again after a short pause.
  void listen_loop() {
    while (!stopping.load()) {
      const int fd = ::fcntl(listen_fd, F_DUPFD_CLOEXEC, 0);
      if (fd >= 0) {
        http->adopt(fd);
        http->listen_after_bind();  // closes fd before it returns
      }
      if (stopping.load()) break;
      pollfd p{stop_pipe[0], POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(kRetryListen.count()));
    }
  }
};

MetricsServer::MetricsServer(const std::string& host_port, std::function<std::string()> render)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  const auto [host, port] = split_host_port(host_port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  const int gai = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &res);
  if (gai != 0) throw TransportError("metrics address '" + host_port + "': " + ::gai_strerror(gai));
  std::string why = "no usable address";
  for (addrinfo* a = res; a != nullptr && I.listen_fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // restart quickly after a crash
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      I.listen_fd = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (I.listen_fd < 0) throw TransportError("cannot serve metrics on " + host_port + ": " + why);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(I.listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  ip_and_port(bound, I.bound_ip, I.port);
  I.bound_v6 = bound.ss_family == AF_INET6;
  I.loopback = is_loopback(bound);
  I.wildcard = is_wildcard(bound);
  I.hosts = {"localhost", "127.0.0.1", "::1"};
  if (!host.empty() && !I.wildcard) I.hosts.insert(canonical_host(host));
  if (::pipe2(I.stop_pipe, O_CLOEXEC) != 0) {
    const std::string err = std::strerror(errno);
    ::close(I.listen_fd);
    throw TransportError("cannot serve metrics on " + host_port + ": pipe: " + err);
  }

  auto metrics = [render = std::move(render)](const std::string&) {
    return Reply{200, "text/plain; version=0.0.4", render()};
  };
  I.routes["/metrics"] = metrics;
  I.routes["/"] = metrics;

  // httplib's server constructor sets SIGPIPE to "ignore" for the whole process; every send here passes
  // MSG_NOSIGNAL instead, so put back whatever the program had.
  struct sigaction old_pipe {};
  ::sigaction(SIGPIPE, nullptr, &old_pipe);
  I.http = std::make_unique<Impl::Http>(&I);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  I.http->set_pre_routing_handler([&I](const httplib::Request& req, httplib::Response& res) {
    I.answer(req, res);
    return httplib::Server::HandlerResponse::Handled;
  });
  I.listener = std::thread([&I] { I.listen_loop(); });
}

MetricsServer::~MetricsServer() {
  Impl& I = *impl_;
  I.stopping = true;
  const char wake = 1;
  (void)!::write(I.stop_pipe[1], &wake, 1);  // every wait of every worker returns
  ::shutdown(I.listen_fd, SHUT_RDWR);        // the blocked accept() fails: httplib's loop returns
  if (I.listener.joinable()) I.listener.join();
  ::close(I.listen_fd);
  ::close(I.stop_pipe[0]);
  ::close(I.stop_pipe[1]);
}

int MetricsServer::port() const { return impl_->port; }

std::string MetricsServer::bound_address() const {
  const Impl& I = *impl_;
  return (I.bound_v6 ? "[" + I.bound_ip + "]" : I.bound_ip) + ":" + std::to_string(I.port);
}

bool MetricsServer::loopback_only() const { return impl_->loopback; }

std::string MetricsServer::exposure_warning() const {
  const Impl& I = *impl_;
  if (I.loopback) return "";
  const std::string local = "127.0.0.1:" + std::to_string(I.port);
  if (I.wildcard)
    return "the metrics server listens on every interface (" + bound_address() +
           "): anyone who can reach this machine on port " + std::to_string(I.port) +
           " can read what it serves; bind it to " + local + " to keep it on this machine";
  return "the metrics server listens on " + bound_address() +
         ", not a loopback address: anyone who can reach that address can read what it serves; bind it to " + local +
         " to keep it on this machine";
}

void MetricsServer::add_get(const std::string& path, Handler handler) {
  if (path.empty() || path[0] != '/') throw TransportError("metrics route '" + path + "' must start with '/'");
  if (!handler) throw TransportError("metrics route '" + path + "' has no handler");
  std::lock_guard<std::mutex> lock(impl_->routes_mu);
  impl_->routes[path] = std::move(handler);
}

}  // namespace deloco
