// transport_throughput: one-way throughput over tcp loopback, raw ZeroMQ against our ZmqTransport, and CURVE
// against the speed of its own cipher.
//
// Usage: transport_throughput [rounds=5] [megabytes_per_measurement=300] [lanes=4] [io_threads=2]
// For each payload size (the default model as fp32, 1853568 x 4 = 7.41 MB, and 1 MB) a sender thread pushes
// messages of two frames (72-byte header + payload) to a receiver as fast as it can; the time runs from the first
// send to the last receive. The contenders, measured in alternation within every round so that machine noise
// hits them alike:
//   limit   libsodium's crypto_box_easy_afternm and crypto_box_open_easy_afternm (XSalsa20-Poly1305 with a
//           precomputed key: what libzmq 4.3 calls for every frame of a CURVE connection, one frame one box, the
//           frame being the payload plus ZeroMQ's flags byte) on one thread; the limit for one stream is the slower
//           of the two, each at one core
//   raw     plain libzmq DEALER -> ROUTER, payload sent zero-copy from one buffer, blocking sends
//   plain   make_zmq_client -> make_zmq_server, plaintext (send() is non-blocking: the sender retries on false)
//   curve1  the same with CURVE, one connection (TransportOptions::lanes = 1: the transport before lanes)
//   curveL  CURVE with `lanes` connections and `io_threads` ZeroMQ I/O threads per side
// Then push+broadcast for one learner-syncer pair: the client pushes and the server broadcasts the same number of
// messages at once; MB/s per direction, one lane against `lanes`.
// Reported: the median MB/s (1 MB = 1e6 bytes) over rounds and the ratios. Sender and receiver share this host: on
// a 2-core machine the encrypting and the decrypting side compete for the same two cores.
#include <sodium.h>
#include <sys/resource.h>
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
#include "util/malloc_tuning.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
constexpr size_t kHeaderBytes = 72;

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

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

// CURVE's cipher on one thread: {encrypt MB/s, decrypt MB/s} for `count` boxes of `payload` bytes plus the flags
// byte libzmq puts in front of every frame.
std::pair<double, double> sodium_limit(size_t payload, int count) {
  unsigned char pk[crypto_box_PUBLICKEYBYTES], sk[crypto_box_SECRETKEYBYTES], k[crypto_box_BEFORENMBYTES];
  unsigned char nonce[crypto_box_NONCEBYTES] = {};
  crypto_box_keypair(pk, sk);
  if (crypto_box_beforenm(k, pk, sk) != 0) throw std::runtime_error("crypto_box_beforenm failed");
  const size_t mlen = payload + 1;
  std::vector<unsigned char> plain(mlen, 'p'), box(mlen + crypto_box_MACBYTES), back(mlen);
  auto t0 = Clock::now();
  for (int i = 0; i < count; ++i) {
    nonce[0] = static_cast<unsigned char>(i);
    crypto_box_easy_afternm(box.data(), plain.data(), mlen, nonce, k);
  }
  const double enc = seconds_since(t0);
  t0 = Clock::now();
  for (int i = 0; i < count; ++i)
    if (crypto_box_open_easy_afternm(back.data(), box.data(), box.size(), nonce, k) != 0)
      throw std::runtime_error("limit: a box failed to open");
  const double dec = seconds_since(t0);
  const double mb = static_cast<double>(payload) * count / 1e6;
  return {mb / enc, mb / dec};
}

deloco::Envelope connect_pair(deloco::ServerTransport& server, deloco::ClientTransport& client,
                              const deloco::Bytes& header, const deloco::Bytes& payload, int lanes) {
  deloco::Envelope e;
  for (auto end = Clock::now() + 10s; !client.send(header, payload);)  // warm-up: wait for the handshake
    if (Clock::now() > end) throw std::runtime_error("ours: client never connected");
  if (!server.receive(&e, 10s)) throw std::runtime_error("ours: warm-up message lost");
  // Lanes past the first connect at their own pace, and carry parts once the server answered their hello: run both
  // ends until every lane is up, then one more message each way.
  deloco::Envelope r;
  for (auto end = Clock::now() + 10s; client.stats().lanes_up < static_cast<uint64_t>(lanes);) {
    if (Clock::now() > end) throw std::runtime_error("ours: lanes never came up");
    if (server.receive(&r, 1ms) || client.receive(&r, 1ms)) throw std::runtime_error("ours: unexpected message");
  }
  if (!client.send(header, payload) || !server.receive(&r, 10s)) throw std::runtime_error("ours: warm-up lost");
  if (!server.send(e.peer, header, payload) || !client.receive(&r, 10s)) throw std::runtime_error("ours: warm-up lost");
  return e;
}

// Our transport: returns MB/s for `count` messages of `payload` bytes.
// With cpu_per_gb: the process's CPU seconds (every thread, both ends) per GB moved.
double ours(const deloco::Bytes& payload, int count, const deloco::TransportOptions& server_opts,
            const deloco::TransportOptions& client_opts, double* cpu_per_gb = nullptr) {
  auto server = deloco::make_zmq_server("tcp://127.0.0.1:0", server_opts);
  auto client = deloco::make_zmq_client(server->endpoint(), client_opts);
  const deloco::Bytes header = deloco::Bytes::from_string(std::string(kHeaderBytes, 'h'));
  deloco::Envelope e = connect_pair(*server, *client, header, payload, client_opts.lanes);
  const double cpu0 = cpu_seconds();
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
  if (cpu_per_gb != nullptr) *cpu_per_gb = (cpu_seconds() - cpu0) / (static_cast<double>(payload.size()) * count / 1e9);
  return static_cast<double>(payload.size()) * count / s / 1e6;
}

// One pair, both directions at once: the client pushes `count` messages while the server broadcasts `count` to it.
// Returns MB/s per direction (the slower direction's completion time).
double both_ways(const deloco::Bytes& payload, int count, const deloco::TransportOptions& server_opts,
                 const deloco::TransportOptions& client_opts) {
  auto server = deloco::make_zmq_server("tcp://127.0.0.1:0", server_opts);
  auto client = deloco::make_zmq_client(server->endpoint(), client_opts);
  const deloco::Bytes header = deloco::Bytes::from_string(std::string(kHeaderBytes, 'h'));
  const std::string peer = connect_pair(*server, *client, header, payload, client_opts.lanes).peer;
  const auto t0 = Clock::now();
  std::thread learner([&] {  // a transport belongs to one thread: this one sends and receives for the client
    deloco::Envelope e;
    for (int i = 0; i < count; ++i)
      while (!client->send(header, payload)) std::this_thread::yield();
    for (int i = 0; i < count; ++i)
      if (!client->receive(&e, 30s) || e.payload.size() != payload.size()) throw std::runtime_error("broadcast lost");
  });
  deloco::Envelope e;
  for (int i = 0; i < count; ++i)
    while (!server->send(peer, header, payload)) std::this_thread::yield();
  for (int i = 0; i < count; ++i)
    if (!server->receive(&e, 30s) || e.payload.size() != payload.size()) throw std::runtime_error("push lost");
  learner.join();
  return static_cast<double>(payload.size()) * count / seconds_since(t0) / 1e6;
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
  const int lanes = argc > 3 ? std::atoi(argv[3]) : 4;
  const int io_threads = argc > 4 ? std::atoi(argv[4]) : 2;
  if (sodium_init() < 0) return 1;
  deloco::tune_malloc_for_training();  // as `deloco` does at start: freed frames stay in the process (no page faults)

  // Throwaway CURVE keys for the curve contenders.
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
  deloco::TransportOptions lanes_server = curve_server, lanes_client = curve_client;
  lanes_server.io_threads = lanes_client.io_threads = io_threads;
  lanes_client.lanes = lanes;

  std::printf("one-way throughput, tcp loopback, %d rounds (medians; MB = 1e6 bytes), %.0f MB per measurement; "
              "curveL: %d lanes, %d I/O threads per side; %u cores on this host, shared by sender and receiver\n",
              rounds, budget_mb, lanes, io_threads, std::thread::hardware_concurrency());
  std::printf("%-9s %5s %9s %9s %9s %9s %9s %9s %9s %7s %7s %8s %8s %9s %9s\n", "payload", "msgs", "enc MB/s",
              "dec MB/s", "limit", "raw", "plain", "curve1", "curveL", "pl/raw", "c1/lim", "cL/lim", "goal 0.8",
              "both c1", "both cL");
  std::vector<std::string> cpu_lines;
  for (size_t size : {size_t{1853568} * 4, size_t{1000000}}) {
    const std::string bytes(size, 'p');
    const deloco::Bytes payload = deloco::Bytes::from_string(bytes);
    const int count = std::max(4, static_cast<int>(budget_mb * 1e6 / static_cast<double>(size)));
    const int curve_count = count / 2 + 1;
    std::vector<double> enc, dec, limit, raw, ours_plain, curve1, curve_lanes, both1, both_lanes, cpu1, cpuL, cpu_box;
    for (int r = 0; r < rounds; ++r) {
      const auto [e, d] = sodium_limit(size, curve_count);
      enc.push_back(e);
      dec.push_back(d);
      limit.push_back(std::min(e, d));
      cpu_box.push_back(1e3 / e + 1e3 / d);
      raw.push_back(raw_zmq(bytes, count));
      ours_plain.push_back(ours(payload, count, plain, plain));
      double c1 = 0, cL = 0;
      curve1.push_back(ours(payload, curve_count, curve_server, curve_client, &c1));
      curve_lanes.push_back(ours(payload, curve_count, lanes_server, lanes_client, &cL));
      cpu1.push_back(c1);
      cpuL.push_back(cL);
      both1.push_back(both_ways(payload, curve_count / 2 + 1, curve_server, curve_client));
      both_lanes.push_back(both_ways(payload, curve_count / 2 + 1, lanes_server, lanes_client));
    }
    const double ml = median(limit), mr = median(raw), mp = median(ours_plain), m1 = median(curve1),
                 mL = median(curve_lanes);
    char label[32];
    std::snprintf(label, sizeof label, "%.2f MB", static_cast<double>(size) / 1e6);
    std::printf("%-9s %5d %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f %7.2f %7.2f %8.2f %8s %9.0f %9.0f\n", label,
                count, median(enc), median(dec), ml, mr, mp, m1, mL, mp / mr, m1 / ml, mL / ml,
                mL / ml >= 0.8 ? "met" : "missed", median(both1), median(both_lanes));
    char line[200];
    std::snprintf(line, sizeof line, "%-9s %11.2f %11.2f %11.2f %11.2f\n", label, median(cpu_box), median(cpu1),
                  median(cpuL), 2 / median(cpuL) * 1e3 / ml);
    cpu_lines.push_back(line);
  }
  std::printf("\nCPU seconds per GB (every thread of both ends; this host has %u cores)\n",
              std::thread::hardware_concurrency());
  std::printf("%-9s %11s %11s %11s %11s\n", "payload", "enc+dec", "curve1", "curveL", "2 cores/lim");
  for (const auto& l : cpu_lines) std::fputs(l.c_str(), stdout);
  std::printf("limit: the slower of encrypt and decrypt on one core; both: MB/s per direction with a push and a "
              "broadcast stream at once on one pair; enc+dec: the cipher alone, both ways; 2 cores/lim: the most "
              "curveL could carry at its CPU cost with two whole cores, against the limit\n");
  std::filesystem::remove_all(dir);
  return 0;
}
