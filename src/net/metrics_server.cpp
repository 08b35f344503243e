// MetricsServer: a tiny HTTP/1.0 server for Prometheus scrapes (see deloco/transport.h). One thread, one
// connection at a time: a scrape is a few kilobytes every few seconds, so nothing fancier is warranted. The
// thread polls the listening socket with a short timeout so the destructor can stop it promptly.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "deloco/transport.h"

namespace deloco {
namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr int kPollMs = 100;            // how long the destructor may wait for the thread
constexpr int kClientTimeoutMs = 2000;  // a silent client cannot hold the thread longer than this

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

void send_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client went away; nothing to do about it
    done += static_cast<size_t>(n);
  }
}

std::string response(const std::string& status, const std::string& content_type, const std::string& body) {
  return "HTTP/1.0 " + status + "\r\nContent-Type: " + content_type + "\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

struct MetricsServer::Impl {
  int listen_fd = -1;
  int port = 0;
  std::function<std::string()> render;
  std::atomic<bool> stop{false};
  std::thread thread;

  void serve() {
    while (!stop.load()) {
      pollfd p{listen_fd, POLLIN, 0};
      if (::poll(&p, 1, kPollMs) <= 0) continue;
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      handle(fd);
      close_gracefully(fd);
    }
  }

  // Closing with unread request bytes would make the kernel send a reset, which can destroy the response in
  // flight; so say we are done, then read and discard what is left for a moment before closing.
  void close_gracefully(int fd) {
    ::shutdown(fd, SHUT_WR);
    char buf[4096];
    for (size_t drained = 0; drained < 64 * 1024;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, kPollMs) <= 0) break;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
    ::close(fd);
  }

  // Reads the request head (at most 8 KiB) and answers it.
  void handle(int fd) {
    std::string req;
    char buf[2048];
    while (req.size() < kMaxRequestBytes && req.find("\r\n\r\n") == std::string::npos &&
           req.find("\n\n") == std::string::npos) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, kClientTimeoutMs) <= 0 || stop.load()) return;
      const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, kMaxRequestBytes - req.size()), 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    const std::string line = req.substr(0, req.find_first_of("\r\n"));
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
    if (sp1 == std::string::npos) {
      send_all(fd, response("400 Bad Request", "text/plain", "bad request\n"));
      return;
    }
    const std::string method = line.substr(0, sp1);
    std::string path = line.substr(sp1 + 1, sp2 == std::string::npos ? std::string::npos : sp2 - sp1 - 1);
    path = path.substr(0, path.find('?'));
    if (method != "GET") {
      send_all(fd, response("405 Method Not Allowed", "text/plain", "only GET is supported\n"));
    } else if (path != "/metrics" && path != "/") {
      send_all(fd, response("404 Not Found", "text/plain", "not found; metrics are at /metrics\n"));
    } else {
      std::string body;
      try {
        body = render();
      } catch (const std::exception& e) {
        send_all(fd, response("500 Internal Server Error", "text/plain", std::string(e.what()) + "\n"));
        return;
      }
      send_all(fd, response("200 OK", "text/plain; version=0.0.4", body));
    }
  }
};

MetricsServer::MetricsServer(const std::string& host_port, std::function<std::string()> render)
    : impl_(std::make_unique<Impl>()) {
  impl_->render = std::move(render);
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
  for (addrinfo* a = res; a != nullptr && impl_->listen_fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // restart quickly after a crash
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
      impl_->listen_fd = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (impl_->listen_fd < 0) throw TransportError("cannot serve metrics on " + host_port + ": " + why);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  impl_->port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  impl_->thread = std::thread([impl = impl_.get()] { impl->serve(); });
}

MetricsServer::~MetricsServer() {
  impl_->stop = true;
  if (impl_->thread.joinable()) impl_->thread.join();
  ::close(impl_->listen_fd);
}

int MetricsServer::port() const { return impl_->port; }

}  // namespace deloco
