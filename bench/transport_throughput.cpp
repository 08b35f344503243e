// transport_throughput: one-way throughput over tcp loopback, raw ZeroMQ against our ZmqTransport.
//
// Usage: transport_throughput [rounds=5] [megabytes_per_measurement=300]
// For each payload size (the default model as fp32, 1853568 x 4 = 7.41 MB, and 1 MB) a sender thread pushes
// messages of two frames (72-byte header + payload) to a receiver as fast as it can; the time runs from the first
// send to the last receive. Three contenders, measured in alternation within every round so that machine noise
// hits them alike:
//   raw    plain libzmq DEALER -> ROUTER, payload sent zero-copy from one buffer, blocking sends
//   plain  make_zmq_client -> make_zmq_server, plaintext (send() is non-blocking: the sender retries on false)
//   curve  the same with CURVE authentication and encryption
// Reported: the median MB/s (1 MB = 1e6 bytes) over rounds and the ratios to raw.
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "deloco/transport.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
constexpr size_t kHeaderBytes = 72;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string(what) + ": " + zmq_strerror(zmq_errno()));
}

void no_free(void*, void*) {}

// Raw libzmq: returns MB/s for `count` messages of `payload` bytes.
double raw_zmq(const std::string& payload, int count) {
  void* rctx = zmq_ctx_new();
  void* sctx = zmq_ctx_new();
  void* router = zmq_socket(rctx, ZMQ_ROUTER);
  void* dealer = zmq_socket(sctx, ZMQ_DEALER);
  const int zero = 0;
  zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
  check(zmq_bind(router, "tcp://127.0.0.1:0") == 0, "bind");
  char ep[256];
  size_t n = sizeof ep;
  zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &n);
  check(zmq_connect(dealer, ep) == 0, "connect");
  const std::string header(kHeaderBytes, 'h');

  auto send_one = [&] {
    zmq_msg_t h, p;
    zmq_msg_init_size(&h, header.size());
    std::memcpy(zmq_msg_data(&h), header.data(), header.size());
    zmq_msg_init_data(&p, const_cast<char*>(payload.data()), payload.size(), no_free, nullptr);
    check(zmq_msg_send(&h, dealer, ZMQ_SNDMORE) >= 0 && zmq_msg_send(&p, dealer, 0) >= 0, "send");
  };
  auto receive_one = [&] {
    size_t got = 0;
    for (int more = 1, part = 0; more; ++part) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      check(zmq_msg_recv(&m, router, 0) >= 0, "recv");
      if (part == 2) got = zmq_msg_size(&m);
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    if (got != payload.size()) throw std::runtime_error("raw: wrong payload size");
  };
  send_one();  // warm-up: the connection is up before the clock starts
  receive_one();
  const auto t0 = Clock::now();
  std::thread sender([&] {
    for (int i = 0; i < count; ++i) send_one();
  });
  for (int i = 0; i < count; ++i) receive_one();
  const double s = seconds_since(t0);
  sender.join();
  zmq_close(dealer);
  zmq_close(router);
  zmq_ctx_term(sctx);
  zmq_ctx_term(rctx);
  return static_cast<double>(payload.size()) * count / s / 1e6;
}

// Our transport: returns MB/s for `count` messages of `payload` bytes.
double ours(const deloco::Bytes& payload, int count, const deloco::TransportOptions& server_opts,
            const deloco::TransportOptions& client_opts) {
  auto server = deloco::make_zmq_server("tcp://127.0.0.1:0", server_opts);
  auto client = deloco::make_zmq_client(server->endpoint(), client_opts);
  const deloco::Bytes header = deloco::Bytes::from_string(std::string(kHeaderBytes, 'h'));
  deloco::Envelope e;
  for (auto end = Clock::now() + 10s; !client->send(header, payload);)  // warm-up: wait for the handshake
    if (Clock::now() > end) throw std::runtime_error("ours: client never connected");
  if (!server->receive(&e, 10s)) throw std::runtime_error("ours: warm-up message lost");
  const auto t0 = Clock::now();
  std::thread sender([&] {
    for (int i = 0; i < count; ++i)
      while (!client->send(header, payload)) std::this_thread::yield();  // queue full: try again
  });
  for (int i = 0; i < count; ++i) {
    if (!server->receive(&e, 30s)) throw std::runtime_error("ours: message lost");
    if (e.payload.size() != payload.size()) throw std::runtime_error("ours: wrong payload size");
  }
  const double s = seconds_since(t0);
  sender.join();
  return static_cast<double>(payload.size()) * count / s / 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const double budget_mb = argc > 2 ? std::atof(argv[2]) : 300;

  // Throwaway CURVE keys for the curve contender.
  std::string dir = (std::filesystem::temp_directory_path() / "deloco-bench-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return 1;
  std::filesystem::create_directories(dir + "/allow");
  deloco::write_keypair(dir + "/server", deloco::generate_keypair());
  deloco::write_keypair(dir + "/allow/learner", deloco::generate_keypair());
  deloco::TransportOptions plain;
  plain.plaintext = true;
  deloco::TransportOptions curve_server, curve_client;
  curve_server.secret_key_file = dir + "/server.key";
  curve_server.allow = dir + "/allow";
  curve_client.secret_key_file = dir + "/allow/learner.key";
  curve_client.server_public_key_file = dir + "/server.pub";

  std::printf("one-way throughput, tcp loopback, %d rounds (medians; MB = 1e6 bytes), %.0f MB per measurement\n",
              rounds, budget_mb);
  std::printf("%-10s %6s %10s %10s %10s %11s %11s\n", "payload", "msgs", "raw MB/s", "plain MB/s", "curve MB/s",
              "plain/raw", "curve/raw");
  for (size_t size : {size_t{1853568} * 4, size_t{1000000}}) {
    const std::string bytes(size, 'p');
    const deloco::Bytes payload = deloco::Bytes::from_string(bytes);
    const int count = std::max(4, static_cast<int>(budget_mb * 1e6 / static_cast<double>(size)));
    std::vector<double> raw, ours_plain, ours_curve;
    for (int r = 0; r < rounds; ++r) {
      raw.push_back(raw_zmq(bytes, count));
      ours_plain.push_back(ours(payload, count, plain, plain));
      ours_curve.push_back(ours(payload, count / 4 + 1, curve_server, curve_client));  // encryption is slower
    }
    const double mr = median(raw), mp = median(ours_plain), mc = median(ours_curve);
    char label[32];
    std::snprintf(label, sizeof label, "%.2f MB", static_cast<double>(size) / 1e6);
    std::printf("%-10s %6d %10.0f %10.0f %10.0f %11.2f %11.2f\n", label, count, mr, mp, mc, mp / mr, mc / mr);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
