// Tests of MetricsServer's response bounds, Host check and exposure warning (deloco/transport.h), over real HTTP
// on 127.0.0.1 against a real server. Every client read is bounded in time and in bytes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "deloco/transport.h"

namespace deloco {
namespace metrics_server_cases {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Answer {
  std::string raw;  // what came back, at most `cap` bytes
  int status = 0;
  std::string headers, body;
};

// Sends `request` to 127.0.0.1:port and reads until the server closes, 10 s pass or `cap` bytes arrived.
Answer exchange(int port, const std::string& request, size_t cap = 64 << 20) {
  Answer a;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return a;
  }
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  char buf[1 << 16];
  for (const auto end = Clock::now() + 10s; Clock::now() < end && a.raw.size() < cap;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    a.raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t split = a.raw.find("\r\n\r\n");
  if (a.raw.rfind("HTTP/1.1 ", 0) == 0 && split != std::string::npos) {
    a.status = std::stoi(a.raw.substr(9, 3));
    a.headers = a.raw.substr(0, split);
    a.body = a.raw.substr(split + 4);
  }
  return a;
}

std::string get(const std::string& path, const std::string& host, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n" + extra + "\r\n";
}

// The request of the issue: one Range header of about 2,700 ranges "0-" (8 KB), each the whole body.
std::string many_ranges() {
  std::string r = "bytes=0-";
  while (r.size() + 3 < 8100) r += ",0-";
  return r;
}

TEST(MetricsServerBounds, RangeRequestsGetTheWholeBodyOnce) {
  const std::string page(4096, 'p');
  MetricsServer m("127.0.0.1:0", [] { return std::string("deloco_up 1\n"); });
  m.add_get("/page", [&](const std::string&) { return MetricsServer::Reply{200, "text/html", page}; });
  const std::string host = "127.0.0.1:" + std::to_string(m.port());

  // ~2,700 ranges: before, a multipart/byteranges response of ~2,700 copies (11 MB); now the page once.
  const Answer multi = exchange(m.port(), get("/page", host, "Range: " + many_ranges() + "\r\n"));
  EXPECT_EQ(multi.status, 200);
  EXPECT_TRUE(multi.body == page) << multi.body.size() << " bytes of body";
  EXPECT_LT(multi.raw.size(), page.size() + 1024);
  EXPECT_EQ(multi.headers.find("multipart/byteranges"), std::string::npos) << multi.headers;

  // One range is ignored too: the whole body, 200 (RFC 9110 lets a server ignore Range).
  const Answer one = exchange(m.port(), get("/page", host, "Range: bytes=0-9\r\n"));
  EXPECT_EQ(one.status, 200);
  EXPECT_TRUE(one.body == page) << one.body.size() << " bytes of body";

  // A malformed Range is httplib's 416, with nothing of the body.
  const Answer bad = exchange(m.port(), get("/page", host, "Range: lines=1-2\r\n"));
  EXPECT_EQ(bad.status, 416);
  EXPECT_LT(bad.raw.size(), 1024u);
}

TEST(MetricsServerBounds, HandlerBodyOverTheCapIsAnsweredWithAShortError) {
  MetricsServer m("127.0.0.1:0", [] { return std::string("deloco_up 1\n"); });
  m.add_get("/at-cap", [](const std::string&) {
    return MetricsServer::Reply{200, "text/plain", std::string(MetricsServer::kMaxResponseBytes, 'a')};
  });
  m.add_get("/over-cap", [](const std::string&) {
    return MetricsServer::Reply{200, "text/plain", std::string(MetricsServer::kMaxResponseBytes + 1, 'a')};
  });
  const std::string host = "localhost:" + std::to_string(m.port());
  const Answer at = exchange(m.port(), get("/at-cap", host));
  EXPECT_EQ(at.status, 200);
  EXPECT_EQ(at.body.size(), MetricsServer::kMaxResponseBytes);
  const Answer over = exchange(m.port(), get("/over-cap", host));
  EXPECT_EQ(over.status, 500);
  EXPECT_LT(over.raw.size(), 1024u);
  EXPECT_NE(over.body.find(std::to_string(MetricsServer::kMaxResponseBytes + 1) + " bytes"), std::string::npos)
      << over.body;
  EXPECT_NE(over.body.find("cap of " + std::to_string(MetricsServer::kMaxResponseBytes)), std::string::npos)
      << over.body;
}

TEST(MetricsServerHost, OnlyLocalNamesAndTheBoundAddressAreServed) {
  MetricsServer m("127.0.0.1:0", [] { return std::string("deloco_up 1\n"); });
  const std::string p = std::to_string(m.port());
  for (const std::string& host : std::vector<std::string>{"127.0.0.1:" + p, "127.0.0.1", "localhost:" + p, "LocalHost", "[::1]:" + p,
                                 "[::1]", "localhost:8080" /* an ssh tunnel's port */, "[::ffff:127.0.0.1]:" + p}) {
    const Answer a = exchange(m.port(), get("/metrics", host));
    EXPECT_EQ(a.status, 200) << host;
    EXPECT_EQ(a.body, "deloco_up 1\n") << host;
  }
  for (const std::string& host : std::vector<std::string>{"evil.example", "evil.example:" + p, "127.0.0.1.evil.example:" + p,
                                 "localhost.evil.example", "10.1.2.3:" + p, "::1", "127.0.0.1:http"}) {
    const Answer a = exchange(m.port(), get("/metrics", host));
    EXPECT_EQ(a.status, 403) << "'" << host << "'";
    EXPECT_NE(a.body.find("DNS rebinding"), std::string::npos) << a.body;
    EXPECT_EQ(a.body.find("deloco_up"), std::string::npos) << host;
    EXPECT_LT(a.raw.size(), 1024u);
  }
  // The check comes first: a refused Host learns nothing of the routes either.
  EXPECT_EQ(exchange(m.port(), get("/nowhere", "evil.example")).status, 403);
  // HTTP/1.1 needs exactly one Host; HTTP/1.0 may go without.
  EXPECT_EQ(exchange(m.port(), "GET /metrics HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(exchange(m.port(), get("/metrics", "")).status, 400);  // an empty Host is none
  EXPECT_EQ(exchange(m.port(), "GET /metrics HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n").status, 400);
  const Answer old = exchange(m.port(), "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(old.status, 200);
  EXPECT_EQ(old.body, "deloco_up 1\n");
}

TEST(MetricsServerExposure, LoopbackBindHasNoWarning) {
  MetricsServer m("127.0.0.1:0", [] { return std::string(); });
  EXPECT_TRUE(m.loopback_only());
  EXPECT_EQ(m.bound_address(), "127.0.0.1:" + std::to_string(m.port()));
  EXPECT_EQ(m.exposure_warning(), "");
}

// ":0" binds every interface (the test connects only to 127.0.0.1): the warning names the real address, and the
// Host check still refuses foreign names.
TEST(MetricsServerExposure, WildcardBindWarnsNamingTheRealAddress) {
  MetricsServer m(":0", [] { return std::string("deloco_up 1\n"); });
  const std::string p = std::to_string(m.port());
  EXPECT_FALSE(m.loopback_only());
  EXPECT_TRUE(m.bound_address() == "0.0.0.0:" + p || m.bound_address() == "[::]:" + p) << m.bound_address();
  const std::string w = m.exposure_warning();
  EXPECT_NE(w.find("every interface (" + m.bound_address() + ")"), std::string::npos) << w;
  EXPECT_NE(w.find("127.0.0.1:" + p), std::string::npos) << w;  // the way to keep it local
  EXPECT_EQ(exchange(m.port(), get("/metrics", "127.0.0.1:" + p)).status, 200);
  EXPECT_EQ(exchange(m.port(), get("/metrics", "evil.example:" + p)).status, 403);
}

}  // namespace
}  // namespace deloco
