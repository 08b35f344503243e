// Tests for the transports (in-process and ZeroMQ, plaintext and CURVE), key files, allow-lists and the metrics
// server. Waits are bounded by deadlines on receive()/polling loops, never by a fixed sleep.
#include "deloco/transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <zmq.h>

#include "support/raw_zmtp.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

namespace deloco {
namespace transport_cases {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "deloco-net-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

template <class Fn>
::testing::AssertionResult expect_throw_containing(Fn fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const TransportError& e) {
    const std::string what = e.what();
    for (const auto& p : parts)
      if (what.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message '" << what << "' lacks '" << p << "'";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no TransportError thrown";
}

// Keys for one server and two clients: alice (allowed) and mallory (not in the allow-list).
struct Keys {
  TempDir dir;
  std::string server_key, server_pub, allow_dir, alice_key, mallory_key;
  Keys() {
    server_key = dir / "server.key";
    server_pub = dir / "server.pub";
    allow_dir = dir / "allow";
    fs::create_directories(allow_dir);
    write_keypair(dir / "server", generate_keypair());
    write_keypair(allow_dir + "/alice", generate_keypair());
    alice_key = allow_dir + "/alice.key";  // a .key beside the .pub files: the allow-list reads only *.pub
    write_keypair(dir / "mallory", generate_keypair());
    mallory_key = dir / "mallory.key";
  }
};

TransportOptions plain_options() {
  TransportOptions o;
  o.plaintext = true;
  return o;
}

TransportOptions server_curve(const Keys& k) {
  TransportOptions o;
  o.secret_key_file = k.server_key;
  o.allow = k.allow_dir;
  return o;
}

TransportOptions client_curve(const Keys& k, const std::string& own_key) {
  TransportOptions o;
  o.secret_key_file = own_key;
  o.server_public_key_file = k.server_pub;
  return o;
}

// Sends from `c` until `s` receives a message (sends fail while a ZeroMQ connection is still being set up).
bool deliver(ClientTransport& c, ServerTransport& s, const Bytes& h, const Bytes& p, Envelope* out,
             std::chrono::milliseconds within = 10s) {
  const auto end = Clock::now() + within;
  while (Clock::now() < end) {
    if (c.send(h, p)) return s.receive(out, std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()));
    if (s.receive(out, 20ms)) return true;  // unexpected, but let the caller judge the message
  }
  return false;
}

// Polls `cond` until it holds or the deadline passes, letting the server drain messages meanwhile (none expected:
// any message received is counted in *unexpected).
template <class Cond>
bool wait_for(ServerTransport& s, Cond cond, int* unexpected, std::chrono::milliseconds within = 10s) {
  const auto end = Clock::now() + within;
  Envelope e;
  while (Clock::now() < end) {
    if (cond()) return true;
    if (s.receive(&e, 20ms)) ++*unexpected;
  }
  return cond();
}

// ---------------------------------------------------------------------------------------------------------------
// Round trips over every transport kind.

enum class Kind { Inproc, TcpPlain, TcpCurve, IpcPlain, IpcCurve, TcpCurveLanes, TcpPlainLanes };

std::string kind_name(const ::testing::TestParamInfo<Kind>& i) {
  const char* n[] = {"Inproc", "TcpPlain", "TcpCurve", "IpcPlain", "IpcCurve", "TcpCurveLanes", "TcpPlainLanes"};
  return n[static_cast<int>(i.param)];
}

class TransportRoundTrip : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    const Kind k = GetParam();
    if (k == Kind::Inproc) {
      hub_ = make_inproc_hub();
      server_ = make_inproc_server(hub_);
      client_ = make_inproc_client(hub_, "alice");
      return;
    }
    const bool curve = k == Kind::TcpCurve || k == Kind::IpcCurve || k == Kind::TcpCurveLanes;
    const bool tcp = k != Kind::IpcPlain && k != Kind::IpcCurve;
    const bool lanes = k == Kind::TcpCurveLanes || k == Kind::TcpPlainLanes;
    TransportOptions so = curve ? server_curve(keys_) : plain_options();
    TransportOptions co = curve ? client_curve(keys_, keys_.alice_key) : plain_options();
    if (lanes) {  // small parts, so that even the 5000-byte payload below is split
      so.io_threads = co.io_threads = 2;
      co.lanes = 3;
      so.split_bytes = co.split_bytes = 1024;
    }
    server_ = make_zmq_server(tcp ? "tcp://127.0.0.1:0" : "ipc://" + keys_.dir / "s.ipc", so);
    client_ = make_zmq_client(server_->endpoint(), co);
  }
  std::string expected_identity() const {
    const Kind k = GetParam();
    return k == Kind::TcpPlain || k == Kind::IpcPlain || k == Kind::TcpPlainLanes ? "" : "alice";
  }

  Keys keys_;
  std::shared_ptr<InprocHub> hub_;
  std::unique_ptr<ServerTransport> server_;
  std::unique_ptr<ClientTransport> client_;
};

TEST_P(TransportRoundTrip, BothDirections) {
  if (GetParam() == Kind::TcpPlain) {
    EXPECT_EQ(server_->endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << server_->endpoint();
    EXPECT_NE(server_->endpoint(), "tcp://127.0.0.1:0");
  }
  const Bytes h = Bytes::from_string(std::string(72, 'H')), p = Bytes::from_string(random_bytes(5000, 1));
  Envelope e;
  ASSERT_TRUE(deliver(*client_, *server_, h, p, &e));
  EXPECT_EQ(e.parts, 2);
  EXPECT_EQ(e.header.str(), h.str());
  EXPECT_EQ(e.payload.str(), p.str());
  EXPECT_EQ(e.identity, expected_identity());
  EXPECT_FALSE(e.peer.empty());

  const Bytes rh = Bytes::from_string("reply"), rp = Bytes::from_string(random_bytes(3000, 2));
  ASSERT_TRUE(server_->send(e.peer, rh, rp));
  Envelope r;
  ASSERT_TRUE(client_->receive(&r, 10s));
  EXPECT_EQ(r.parts, 2);
  EXPECT_EQ(r.header.str(), "reply");
  EXPECT_EQ(r.payload.str(), rp.str());

  // An empty payload is still a two-frame message.
  ASSERT_TRUE(server_->send(e.peer, rh, Bytes()));
  ASSERT_TRUE(client_->receive(&r, 10s));
  EXPECT_EQ(r.parts, 2);
  EXPECT_TRUE(r.payload.empty());

  EXPECT_FALSE(client_->receive(&r, 0ms));  // nothing else queued
  const TransportStats ss = server_->stats(), cs = client_->stats();
  EXPECT_EQ(ss.messages_in, 1u);
  EXPECT_EQ(ss.messages_out, 2u);
  EXPECT_EQ(ss.bytes_in, 5072u);
  EXPECT_EQ(cs.messages_in, 2u);
  EXPECT_EQ(ss.auth_denied, 0u);
}

TEST_P(TransportRoundTrip, EightMegabytePayloadArrivesIntact) {
  const Bytes big = Bytes::from_string(random_bytes(8u << 20, 3));
  Envelope e;
  ASSERT_TRUE(deliver(*client_, *server_, Bytes::from_string("big"), big, &e, 20s));
  ASSERT_EQ(e.payload.size(), big.size());
  EXPECT_EQ(std::memcmp(e.payload.data(), big.data(), big.size()), 0);
  ASSERT_TRUE(server_->send(e.peer, Bytes::from_string("back"), big));
  Envelope r;
  ASSERT_TRUE(client_->receive(&r, 20s));
  ASSERT_EQ(r.payload.size(), big.size());
  EXPECT_EQ(std::memcmp(r.payload.data(), big.data(), big.size()), 0);
}

TEST_P(TransportRoundTrip, SendToUnknownPeerFails) {
  EXPECT_FALSE(server_->send("no-such-peer", Bytes::from_string("h"), Bytes()));
  EXPECT_EQ(server_->stats().dropped_out, 1u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, TransportRoundTrip,
                         ::testing::Values(Kind::Inproc, Kind::TcpPlain, Kind::TcpCurve, Kind::IpcPlain,
                                           Kind::IpcCurve, Kind::TcpCurveLanes, Kind::TcpPlainLanes),
                         kind_name);

// ---------------------------------------------------------------------------------------------------------------
// In-process specifics.

TEST(InprocTransport, MovesByReferenceAndBoundsQueues) {
  auto hub = make_inproc_hub(3);
  auto server = make_inproc_server(hub);
  auto client = make_inproc_client(hub, "bob");
  EXPECT_THROW(make_inproc_client(hub, "bob"), TransportError);
  EXPECT_THROW(make_inproc_server(hub), TransportError);

  const Bytes p = Bytes::from_string(std::string(1000, 'x'));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(client->send(Bytes::from_string("h"), p));
  EXPECT_FALSE(client->send(Bytes::from_string("h"), p));  // the server's queue for bob is full
  EXPECT_EQ(client->stats().dropped_out, 1u);
  Envelope e;
  ASSERT_TRUE(server->receive(&e, 0ms));
  EXPECT_EQ(e.payload.data(), p.data());  // the very same buffer: no copy
  EXPECT_EQ(e.peer, "bob");
  EXPECT_EQ(e.identity, "bob");
  EXPECT_TRUE(client->send(Bytes::from_string("h"), p));  // room again

  for (int i = 0; i < 3; ++i) EXPECT_TRUE(server->send("bob", Bytes::from_string("r"), p));
  EXPECT_FALSE(server->send("bob", Bytes::from_string("r"), p));
  EXPECT_FALSE(server->send("carol", Bytes::from_string("r"), p));
  EXPECT_EQ(server->stats().dropped_out, 2u);
}

TEST(InprocTransport, ReceiveWaitsForAnotherThread) {
  auto hub = make_inproc_hub();
  auto server = make_inproc_server(hub);
  auto client = make_inproc_client(hub, "bob");
  std::thread t([&] { client->send(Bytes::from_string("late"), Bytes()); });
  Envelope e;
  EXPECT_TRUE(server->receive(&e, 10s));
  t.join();
  EXPECT_EQ(e.header.str(), "late");
  server.reset();
  EXPECT_FALSE(client->send(Bytes::from_string("h"), Bytes()));  // no server attached
}

// ---------------------------------------------------------------------------------------------------------------
// ZeroMQ specifics: authentication, malformed input, bounds, errors.

TEST(ZmqTransport, ClientKeyNotInAllowListIsRefused) {
  Keys k;
  auto server = make_zmq_server("tcp://127.0.0.1:0", server_curve(k));
  auto mallory = make_zmq_client(server->endpoint(), client_curve(k, k.mallory_key));
  int unexpected = 0;
  // Mallory's sends fail (no connection ever completes) or vanish; none may reach the server.
  ASSERT_TRUE(wait_for(*server, [&] {
    mallory->send(Bytes::from_string("h"), Bytes::from_string("evil"));
    return server->stats().auth_denied > 0;
  }, &unexpected));
  EXPECT_EQ(unexpected, 0);
  EXPECT_EQ(server->stats().messages_in, 0u);

  // An allowed client is still served, and named.
  auto alice = make_zmq_client(server->endpoint(), client_curve(k, k.alice_key));
  Envelope e;
  ASSERT_TRUE(deliver(*alice, *server, Bytes::from_string("h"), Bytes::from_string("ok"), &e));
  EXPECT_EQ(e.identity, "alice");
  EXPECT_EQ(e.payload.str(), "ok");
}

TEST(ZmqTransport, ClientWithWrongServerKeyIsRefused) {
  Keys k;
  auto server = make_zmq_server("tcp://127.0.0.1:0", server_curve(k));
  TransportOptions o = client_curve(k, k.alice_key);
  o.server_public_key_file = k.mallory_key;  // a valid key, but not the server's
  auto alice = make_zmq_client(server->endpoint(), o);
  int unexpected = 0;
  ASSERT_TRUE(wait_for(*server, [&] {
    alice->send(Bytes::from_string("h"), Bytes());
    return server->stats().handshake_failures > 0;
  }, &unexpected));
  EXPECT_EQ(unexpected, 0);
}

TEST(ZmqTransport, PlaintextClientIsRefusedByCurveServer) {
  Keys k;
  auto server = make_zmq_server("tcp://127.0.0.1:0", server_curve(k));
  auto plain = make_zmq_client(server->endpoint(), plain_options());
  int unexpected = 0;
  ASSERT_TRUE(wait_for(*server, [&] {
    plain->send(Bytes::from_string("h"), Bytes());
    return server->stats().handshake_failures > 0;
  }, &unexpected));
  EXPECT_EQ(unexpected, 0);
}

// Writes `bytes` to 127.0.0.1:port over a plain TCP socket, then waits (bounded) for the server to hang up.
void write_raw(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  char buf[256];
  for (auto end = Clock::now() + 2s; Clock::now() < end;) {  // read the greeting until the server closes
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0 && ::recv(fd, buf, sizeof buf, 0) <= 0) break;
  }
  ::close(fd);
}

int port_of(const std::string& endpoint) { return std::stoi(endpoint.substr(endpoint.rfind(':') + 1)); }

class ZmqRandomBytes : public ::testing::TestWithParam<bool> {};  // param: CURVE on

TEST_P(ZmqRandomBytes, AreNeverDeliveredAndTheServerKeepsServing) {
  Keys k;
  const bool curve = GetParam();
  auto server = make_zmq_server("tcp://127.0.0.1:0", curve ? server_curve(k) : plain_options());
  const int port = port_of(server->endpoint());
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    std::string junk = random_bytes(4096, seed);
    if (seed % 2 == 0) junk[0] = static_cast<char>(0xff);  // looks like the start of a ZMTP 3 greeting
    write_raw(port, junk);
  }
  // A proper ZMTP 3 signature followed by junk fails the greeting, which libzmq reports as a handshake failure.
  std::string greeting = random_bytes(512, 9);
  greeting[0] = static_cast<char>(0xff);
  greeting[9] = 0x7f;
  write_raw(port, greeting);
  int unexpected = 0;
  EXPECT_TRUE(wait_for(*server, [&] { return server->stats().handshake_failures > 0; }, &unexpected));
  EXPECT_EQ(unexpected, 0);
  Envelope e;
  EXPECT_FALSE(server->receive(&e, 100ms));
  auto alice = make_zmq_client(server->endpoint(), curve ? client_curve(k, k.alice_key) : plain_options());
  ASSERT_TRUE(deliver(*alice, *server, Bytes::from_string("h"), Bytes::from_string("good"), &e));
  EXPECT_EQ(e.payload.str(), "good");
  EXPECT_EQ(e.parts, 2);
  EXPECT_FALSE(server->receive(&e, 100ms));
  EXPECT_EQ(server->stats().messages_in, 1u);
}

INSTANTIATE_TEST_SUITE_P(Modes, ZmqRandomBytes, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Curve" : "Plain"; });

TEST(ZmqTransport, MessagesWithOtherThanTwoFramesCarryTheirCount) {
  auto server = make_zmq_server("tcp://127.0.0.1:0", plain_options());
  void* ctx = zmq_ctx_new();
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  const int zero = 0;
  zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
  ASSERT_EQ(zmq_connect(dealer, server->endpoint().c_str()), 0);
  zmq_send(dealer, "a", 1, ZMQ_SNDMORE);  // queued until connected (no ZMQ_IMMEDIATE on this raw socket)
  zmq_send(dealer, "bb", 2, ZMQ_SNDMORE);
  zmq_send(dealer, "ccc", 3, 0);
  zmq_send(dealer, "only", 4, 0);
  Envelope e;
  ASSERT_TRUE(server->receive(&e, 10s));
  EXPECT_EQ(e.parts, 3);
  EXPECT_EQ(e.header.str(), "a");
  EXPECT_EQ(e.payload.str(), "bb");
  ASSERT_TRUE(server->receive(&e, 10s));
  EXPECT_EQ(e.parts, 1);
  EXPECT_EQ(e.header.str(), "only");
  EXPECT_TRUE(e.payload.empty());
  zmq_close(dealer);
  zmq_ctx_term(ctx);
}

TEST(ZmqTransport, OversizedFrameIsDroppedAndTheServerKeepsServing) {
  TransportOptions o = plain_options();
  o.max_frame_bytes = 4096;
  auto server = make_zmq_server("tcp://127.0.0.1:0", o);
  auto big = make_zmq_client(server->endpoint(), plain_options());
  const auto end = Clock::now() + 10s;
  while (!big->send(Bytes::from_string("h"), Bytes::from_string(std::string(10000, 'x'))) && Clock::now() < end) {
    Envelope ignored;
    ASSERT_FALSE(server->receive(&ignored, 20ms));
  }
  auto small = make_zmq_client(server->endpoint(), plain_options());
  Envelope e;
  ASSERT_TRUE(deliver(*small, *server, Bytes::from_string("h"), Bytes::from_string("fits"), &e));
  EXPECT_EQ(e.payload.str(), "fits");
  EXPECT_FALSE(server->receive(&e, 200ms));
}

// ---------------------------------------------------------------------------------------------------------------
// Bounds on what one peer can make the server hold (issue 11, items 1 and 5).

using testing::curve_greeting_and_frame_header;
using testing::stream_until_closed;
using testing::tcp_connect;

TEST(ZmqBounds, HandshakeFrameDeclaredOverTheBoundDropsTheConnectionAtOnce) {
  Keys k;
  TransportOptions o = server_curve(k);
  o.max_frame_bytes = 64 * 1024;
  auto server = make_zmq_server("tcp://127.0.0.1:0", o);
  const int port = port_of(server->endpoint());
  // Three peers without keys, each declaring a 64 MiB handshake frame (far under the old 1 GiB bound) and
  // streaming it: each is cut off right after the frame header, long before the frame could be complete.
  const uint64_t declared = 64u << 20;
  for (int i = 0; i < 3; ++i) {
    const long long sent = testing::oversized_handshake(port, declared, 20s);
    ASSERT_NE(sent, -2) << "connection " << i << " could not be made";
    EXPECT_GE(sent, 0) << "connection " << i << " still open after 20 s";
    EXPECT_LT(sent, static_cast<long long>(declared) / 2) << "connection " << i;
  }
  // libzmq drops such a peer without a handshake-failure event: it shows as a connection and a disconnect only.
  int unexpected = 0;
  ASSERT_TRUE(wait_for(*server, [&] { return server->stats().disconnects >= 3; }, &unexpected));
  EXPECT_EQ(unexpected, 0);
  const TransportStats st = server->stats();
  EXPECT_GE(st.connections, 3u);
  EXPECT_EQ(st.auth_denied, 0u);
  EXPECT_EQ(st.messages_in, 0u);
  // A legitimate client is still served.
  auto alice = make_zmq_client(server->endpoint(), client_curve(k, k.alice_key));
  Envelope e;
  ASSERT_TRUE(deliver(*alice, *server, Bytes::from_string("h"), Bytes::from_string("still here"), &e));
  EXPECT_EQ(e.identity, "alice");
  EXPECT_EQ(e.payload.str(), "still here");
}

TEST(ZmqBounds, PartialHandshakeFrameIsReleasedAtTheHandshakeTimeout) {
  Keys k;
  TransportOptions o = server_curve(k);
  o.max_frame_bytes = 64 * 1024;
  o.handshake_timeout = 300ms;
  auto server = make_zmq_server("tcp://127.0.0.1:0", o);
  // Declares 32 KiB (within the bound), sends 1 KiB of it, then stalls: the server gives up on the handshake.
  const int fd = tcp_connect(port_of(server->endpoint()));
  ASSERT_GE(fd, 0);
  const std::string head = curve_greeting_and_frame_header(32 * 1024) + std::string(1024, 'p');
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  EXPECT_EQ(stream_until_closed(fd, 0, 15s), 0) << "the stalled handshake was not dropped";
  ::close(fd);
  int unexpected = 0;
  EXPECT_TRUE(wait_for(*server, [&] { return server->stats().handshake_failures >= 1; }, &unexpected));
  EXPECT_EQ(unexpected, 0);
  EXPECT_THROW(
      [&] {
        TransportOptions bad = server_curve(k);
        bad.handshake_timeout = 0ms;
        make_zmq_server("tcp://127.0.0.1:0", bad);
      }(),
      TransportError);
}

// An authenticated raw DEALER (alice's key) sending one multipart message.
class RawCurveDealer {
 public:
  RawCurveDealer(const Keys& k, const std::string& endpoint) : ctx_(zmq_ctx_new()), s_(zmq_socket(ctx_, ZMQ_DEALER)) {
    const KeyPair own = read_secret_key_file(k.alice_key);
    const std::string server = read_public_key_file(k.server_pub);
    const int zero = 0;
    zmq_setsockopt(s_, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s_, ZMQ_CURVE_SERVERKEY, server.c_str(), 41);
    zmq_setsockopt(s_, ZMQ_CURVE_PUBLICKEY, own.public_key.c_str(), 41);
    zmq_setsockopt(s_, ZMQ_CURVE_SECRETKEY, own.secret_key.c_str(), 41);
    zmq_connect(s_, endpoint.c_str());
  }
  ~RawCurveDealer() {
    zmq_close(s_);
    zmq_ctx_term(ctx_);
  }
  // Queued until the connection is up (no ZMQ_IMMEDIATE on this socket).
  void send_frames(int frames, size_t bytes_each) {
    const std::string f(bytes_each, 'f');
    for (int i = 0; i < frames; ++i) zmq_send(s_, f.data(), f.size(), i + 1 < frames ? ZMQ_SNDMORE : 0);
  }

 private:
  void* ctx_;
  void* s_;
};

TEST(ZmqBounds, ManyFrameMessageWithFramesOverTheBoundDropsThePeer) {
  Keys k;
  TransportOptions o = server_curve(k);
  o.max_frame_bytes = 64 * 1024;
  auto server = make_zmq_server("tcp://127.0.0.1:0", o);
  {
    RawCurveDealer raw(k, server->endpoint());
    raw.send_frames(24, 128 * 1024);  // 24 frames, each over the bound
    int unexpected = 0;
    ASSERT_TRUE(wait_for(*server, [&] { return server->stats().disconnects >= 1; }, &unexpected));
    EXPECT_EQ(unexpected, 0);
    EXPECT_EQ(server->stats().messages_in, 0u);
  }
  // Within the bound, a 24-frame message from an authenticated peer is delivered as malformed (parts = 24, the
  // first two frames kept), and the transport goes on.
  {
    RawCurveDealer raw(k, server->endpoint());
    raw.send_frames(24, 1024);
    Envelope e;
    ASSERT_TRUE(server->receive(&e, 10s));
    EXPECT_EQ(e.parts, 24);
    EXPECT_EQ(e.identity, "alice");
    EXPECT_EQ(e.header.size(), 1024u);
    EXPECT_EQ(e.payload.size(), 1024u);
  }
  auto alice = make_zmq_client(server->endpoint(), client_curve(k, k.alice_key));
  Envelope e;
  ASSERT_TRUE(deliver(*alice, *server, Bytes::from_string("h"), Bytes::from_string("fine"), &e));
  EXPECT_EQ(e.parts, 2);
  EXPECT_EQ(e.payload.str(), "fine");
}

TEST(ZmqTransport, ClientSendFailsWhileDisconnected) {
  // Nothing listens on this ipc path: the message is refused rather than queued.
  TempDir d;
  auto client = make_zmq_client("ipc://" + d / "nobody.ipc", plain_options());
  EXPECT_FALSE(client->send(Bytes::from_string("h"), Bytes()));
  EXPECT_EQ(client->stats().dropped_out, 1u);
}

TEST(ZmqTransport, EachConnectionsTcpSettingsAreFittedToItsLinkOnBothSides) {
  // A floor below what any link allows (8 × TCP's 200 ms minimum retransmission timeout): once frames flow, each
  // side fits its connection's TCP_USER_TIMEOUT above it, and sets the congestion control asked for.
  TransportOptions o = plain_options();
  o.tcp_timeout = 100ms;
  o.tcp_congestion = "reno";  // built into every Linux kernel
  auto server = make_zmq_server("tcp://127.0.0.1:0", o);
  auto client = make_zmq_client(server->endpoint(), o);
  Envelope e;
  for (int i = 0; i < 100 && !client->send(Bytes::from_string("hello"), Bytes()); ++i) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(server->receive(&e, 10s));
  ASSERT_TRUE(server->send(e.peer, Bytes::from_string("answer"), Bytes()));
  ASSERT_TRUE(client->receive(&e, 10s));
  for (const TransportStats& st : {server->stats(), client->stats()}) {
    EXPECT_GE(st.tcp_timeout_ms, 1600u);
    EXPECT_LE(st.tcp_timeout_ms, 600'000u);
    EXPECT_EQ(st.tcp_congestion_set, 1u);
  }
  // Over ipc nothing is TCP: nothing fitted.
  TempDir d;
  auto ipc_server = make_zmq_server("ipc://" + d / "t.ipc", o);
  auto ipc_client = make_zmq_client(ipc_server->endpoint(), o);
  for (int i = 0; i < 100 && !ipc_client->send(Bytes::from_string("hello"), Bytes()); ++i) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(ipc_server->receive(&e, 10s));
  EXPECT_EQ(ipc_server->stats().tcp_timeout_ms, 0u);
  EXPECT_EQ(ipc_server->stats().tcp_congestion_set, 0u);
  // A congestion control the kernel lacks is refused when the transport is made, on both sides.
  o.tcp_congestion = "no_such_cc";
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_server("tcp://127.0.0.1:0", o); }, {"net.tcp_congestion", "no_such_cc"}));
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_client(server->endpoint(), o); }, {"net.tcp_congestion", "reno"}));
}

TEST(ZmqTransport, ConstructionErrorsNameTheProblem) {
  auto server = make_zmq_server("tcp://127.0.0.1:0", plain_options());
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_server(server->endpoint(), plain_options()); },
                                      {server->endpoint(), "cannot bind"}));
  EXPECT_TRUE(expect_throw_containing([] { make_zmq_server("bogus://x", plain_options()); }, {"bogus://x"}));
  EXPECT_TRUE(expect_throw_containing([] { make_zmq_client("bogus://x", plain_options()); }, {"bogus://x"}));
  TempDir d;
  auto ipc = make_zmq_server("ipc://" + d / "a.ipc", plain_options());
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_server("ipc://" + d / "a.ipc", plain_options()); },
                                      {"a.ipc", "in use"}));

  Keys k;
  TransportOptions none;  // CURVE (the default) without keys
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_server("tcp://127.0.0.1:0", none); },
                                      {"net.secret_key", "net.plaintext = true"}));
  TransportOptions no_allow;
  no_allow.secret_key_file = k.server_key;
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_server("tcp://127.0.0.1:0", no_allow); }, {"net.allow"}));
  TransportOptions no_server_key;
  no_server_key.secret_key_file = k.alice_key;
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_client("tcp://127.0.0.1:1", no_server_key); },
                                      {"net.server_key"}));
  TransportOptions missing = server_curve(k);
  missing.secret_key_file = k.dir / "absent.key";
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_server("tcp://127.0.0.1:0", missing); }, {"absent.key"}));
}

TEST(ZmqTransport, DestructorsAreQuickWithLiveConnections) {
  Keys k;
  const auto start = Clock::now();
  {
    auto server = make_zmq_server("tcp://127.0.0.1:0", server_curve(k));
    auto alice = make_zmq_client(server->endpoint(), client_curve(k, k.alice_key));
    Envelope e;
    ASSERT_TRUE(deliver(*alice, *server, Bytes::from_string("h"), Bytes::from_string(std::string(1 << 20, 'p')), &e));
    for (int i = 0; i < 20; ++i) server->send(e.peer, Bytes::from_string("h"), e.payload);  // left unread
  }
  EXPECT_LT(Clock::now() - start, 5s);
}

// The syncer answers the last goodbyes and then exits; with LINGER 0 its close would drop answers not yet on the
// wire. With options.linger, everything queued before the destructor reaches a peer that is still reading (here a
// raw DEALER, so that only the server's side is under test).
TEST(ZmqTransport, LingerLetsQueuedMessagesLeaveBeforeTheServerCloses) {
  TransportOptions o = plain_options();
  o.linger = 10s;
  constexpr int kMessages = 20;
  constexpr size_t kBytes = size_t{256} << 10;
  void* ctx = zmq_ctx_new();
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  const int zero = 0;
  zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
  {
    auto server = make_zmq_server("tcp://127.0.0.1:0", o);
    ASSERT_EQ(zmq_connect(dealer, server->endpoint().c_str()), 0);
    zmq_send(dealer, "h", 1, ZMQ_SNDMORE);
    zmq_send(dealer, "hello", 5, 0);
    Envelope e;
    ASSERT_TRUE(server->receive(&e, 10s));
    for (int i = 0; i < kMessages; ++i)  // 5 MiB queued, then closed at once
      ASSERT_TRUE(server->send(e.peer, Bytes::from_string("h"), Bytes::from_string(std::string(kBytes, 'a' + i))));
  }
  const int timeout_ms = 10000;
  zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  int got = 0;
  std::string buf(kBytes + 1, '\0');
  for (; got < kMessages; ++got) {
    if (zmq_recv(dealer, buf.data(), buf.size(), 0) != 1) break;                                 // header
    if (zmq_recv(dealer, buf.data(), buf.size(), 0) != static_cast<int>(kBytes)) break;          // payload
    EXPECT_EQ(buf[0], 'a' + got);
  }
  EXPECT_EQ(got, kMessages);
  zmq_close(dealer);
  zmq_ctx_term(ctx);
  TransportOptions bad = plain_options();
  bad.linger = -1ms;
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_server("tcp://127.0.0.1:0", bad); }, {"linger"}));
}

// With ZMQ_IMMEDIATE, libzmq 4.3.4 terminates a client's pipe when the connection drops: what had arrived but was
// not read yet was discarded, a message being read was cut in two, and reading its next frame waited forever or
// tripped an assertion (fq.cpp: !_more). A learner lost the syncer's last answers, or hung, whenever the syncer
// exited or died. Now everything that arrived stays readable, whole and in order, and send() still refuses while
// no connection is up. Repeated: where the close falls is chance.
TEST(ZmqTransport, ClientKeepsWhatArrivedWhenTheConnectionDrops) {
  TransportOptions o = plain_options();
  o.linger = 10s;
  constexpr int kMessages = 200;
  for (int round = 0; round < 10; ++round) {
    std::unique_ptr<ClientTransport> client;
    {
      auto server = make_zmq_server("tcp://127.0.0.1:0", o);
      client = make_zmq_client(server->endpoint(), plain_options());
      Envelope e;
      ASSERT_TRUE(deliver(*client, *server, Bytes::from_string("h"), Bytes::from_string("hello"), &e));
      for (int i = 0; i < kMessages; ++i)
        ASSERT_TRUE(server->send(e.peer, Bytes::from_string("h"), Bytes::from_string(std::string(100, static_cast<char>(i)))));
    }
    Envelope r;
    int got = 0;
    while (got < kMessages && client->receive(&r, 10s)) {
      ASSERT_EQ(r.parts, 2) << "message " << got << " was cut";
      ASSERT_EQ(r.payload.size(), 100u);
      ASSERT_EQ(r.payload.data()[0], static_cast<char>(got)) << "out of order";
      ++got;
    }
    EXPECT_EQ(got, kMessages) << "round " << round;
    const auto deadline = Clock::now() + 10s;  // the disconnect reaches the client's monitor
    while (Clock::now() < deadline && client->send(Bytes::from_string("h"), Bytes()))
      std::this_thread::sleep_for(10ms);
    EXPECT_FALSE(client->send(Bytes::from_string("h"), Bytes())) << "sends still queue with nobody connected";
  }
}

// A client counts its connections (lane 0's handshakes): a second one is a reconnection, which the learner answers
// with a new hello. Before, a laned client kept its routing id across one and neither side noticed what was lost.
TEST(ZmqTransport, AClientCountsItsReconnections) {
  for (const int lanes : {1, 3}) {
    SCOPED_TRACE("lanes " + std::to_string(lanes));
    TransportOptions so = plain_options(), co = plain_options();
    co.reconnect = 20ms;
    if (lanes > 1) {
      so.lanes = 1;
      co.lanes = lanes;
      co.io_threads = 2;
      co.split_bytes = 1024;
    }
    auto server = make_zmq_server("tcp://127.0.0.1:0", so);
    const std::string endpoint = server->endpoint();
    auto client = make_zmq_client(endpoint, co);
    Envelope e;
    ASSERT_TRUE(deliver(*client, *server, Bytes::from_string("h"), Bytes::from_string("one"), &e));
    EXPECT_EQ(client->stats().connections, 1u);
    server.reset();  // the syncer restarts at the same address
    server = make_zmq_server(endpoint, so);
    const auto deadline = Clock::now() + 20s;
    while (Clock::now() < deadline && client->stats().connections < 2) {
      client->receive(&e, 10ms);  // the client reads its monitor as it sends and receives
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(client->stats().connections, 2u);
    ASSERT_TRUE(deliver(*client, *server, Bytes::from_string("h"), Bytes::from_string("two"), &e));
    EXPECT_EQ(e.payload.str(), "two");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Lanes: a client's several connections (TransportOptions::lanes).

TransportOptions laned(TransportOptions o, int lanes, uint64_t split_bytes) {
  o.lanes = lanes;
  o.io_threads = 2;
  o.split_bytes = split_bytes;
  return o;
}

TEST(ZmqLanes, ManyMessagesInBothDirectionsArriveWholeAndInOrder) {
  Keys k;
  auto server = make_zmq_server("tcp://127.0.0.1:0", laned(server_curve(k), 1, 4096));
  auto client = make_zmq_client(server->endpoint(), laned(client_curve(k, k.alice_key), 4, 4096));
  Envelope e;
  ASSERT_TRUE(deliver(*client, *server, Bytes::from_string("first"), Bytes(), &e));
  const size_t sizes[] = {50, 300000, 0, (1u << 20) + 7, 4096, 9000};
  std::vector<Bytes> sent;
  for (int i = 0; i < 36; ++i) sent.push_back(Bytes::from_string(random_bytes(sizes[i % 6], 100 + i)));
  for (int i = 0; i < 36; ++i) {
    ASSERT_TRUE(client->send(Bytes::from_string("up" + std::to_string(i)), sent[i]));
    ASSERT_TRUE(server->send(e.peer, Bytes::from_string("down" + std::to_string(i)), sent[i]));
  }
  for (int i = 0; i < 36; ++i) {
    Envelope up, down;
    ASSERT_TRUE(server->receive(&up, 20s)) << "push " << i;
    EXPECT_EQ(up.parts, 2);
    EXPECT_EQ(up.peer, e.peer);
    EXPECT_EQ(up.identity, "alice");
    ASSERT_EQ(up.header.str(), "up" + std::to_string(i)) << "out of order";
    ASSERT_EQ(up.payload.str(), sent[i].str()) << "push " << i << " not intact";
    ASSERT_TRUE(client->receive(&down, 20s)) << "broadcast " << i;
    EXPECT_EQ(down.parts, 2);
    ASSERT_EQ(down.header.str(), "down" + std::to_string(i)) << "out of order";
    ASSERT_EQ(down.payload.str(), sent[i].str()) << "broadcast " << i << " not intact";
  }
  EXPECT_EQ(server->stats().dropped_in, 0u);
  EXPECT_EQ(client->stats().dropped_in, 0u);
  int unexpected = 0;
  EXPECT_TRUE(wait_for(*server, [&] { return server->stats().connections == 4u; }, &unexpected));  // one per lane
  EXPECT_EQ(unexpected, 0);
}

// A raw DEALER standing in for one lane of a laned client (routing id 'L', 16 session bytes, lane index).
struct RawLane {
  void* ctx = zmq_ctx_new();
  void* sock = nullptr;
  RawLane(const std::string& endpoint, const std::string& session, int lane, const std::string* curve_key = nullptr,
          const std::string* server_pub = nullptr) {
    sock = zmq_socket(ctx, ZMQ_DEALER);
    const int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    const std::string rid = "L" + session + static_cast<char>(lane);
    zmq_setsockopt(sock, ZMQ_ROUTING_ID, rid.data(), rid.size());
    if (curve_key != nullptr) {
      const KeyPair kp = read_secret_key_file(*curve_key);
      const std::string spub = read_public_key_file(*server_pub);
      zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, spub.c_str(), 41);
      zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, kp.public_key.c_str(), 41);
      zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, kp.secret_key.c_str(), 41);
    }
    zmq_connect(sock, endpoint.c_str());
  }
  ~RawLane() {
    if (sock != nullptr) zmq_close(sock);
    zmq_ctx_term(ctx);
  }
  void close() {
    zmq_close(sock);
    sock = nullptr;
  }
  void send(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      zmq_send(sock, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
  }
  // One whole message within `within`, or none.
  bool receive(std::vector<std::string>* frames, std::chrono::milliseconds within = 10s) {
    frames->clear();
    zmq_pollitem_t item{sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, static_cast<long>(within.count())) <= 0) return false;
    for (int more = 1; more;) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, sock, 0) < 0) return false;
      frames->emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    return true;
  }
};

// One message on `lane` within `within`, while `server` runs (it reads its peers' frames, and answers hellos, only
// inside receive()); messages the server delivers meanwhile are counted in *unexpected.
bool receive_while_serving(RawLane& lane, ServerTransport& server, std::vector<std::string>* frames, int* unexpected,
                           std::chrono::milliseconds within = 10s) {
  Envelope e;
  for (const auto end = Clock::now() + within; Clock::now() < end;) {
    if (lane.receive(frames, 10ms)) return true;
    if (server.receive(&e, 10ms)) ++*unexpected;
  }
  return false;
}

// The lane tag as docs/transport.md gives it (36 bytes, little-endian).
std::string tag(int kind, int index, int count, uint32_t mask, uint64_t seq, uint64_t offset, uint64_t total) {
  std::string t = "DLN1";
  t += static_cast<char>(kind);
  t += static_cast<char>(index);
  t += static_cast<char>(count);
  t += '\0';
  for (int i = 0; i < 4; ++i) t += static_cast<char>(mask >> (8 * i));
  for (uint64_t v : {seq, offset, total})
    for (int i = 0; i < 8; ++i) t += static_cast<char>(v >> (8 * i));
  return t;
}
std::string lead_tag(uint32_t mask, uint64_t seq, uint64_t total) {
  return tag(1, 0, __builtin_popcount(mask), mask, seq, 0, total);
}
std::string part_tag(int index, uint64_t seq, uint64_t offset) { return tag(2, index, 0, 0, seq, offset, 0); }
// A hello; `greeting` (the offset field) numbers the connection's hellos, and the answer echoes it.
std::string hello_tag(int lane, uint64_t seq, uint64_t greeting = 0) { return tag(3, lane, 0, 0, seq, greeting, 0); }
uint64_t u64_at(const std::string& t, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(t[at + i])} << (8 * i);
  return v;
}
uint32_t mask_of(const std::string& t) {
  uint32_t m = 0;
  for (int i = 0; i < 4; ++i) m |= uint32_t{static_cast<uint8_t>(t[8 + i])} << (8 * i);
  return m;
}

TEST(ZmqLanes, LargePayloadTravelsAsPartsOnSeveralConnections) {
  // A raw ROUTER in place of the server shows what goes on the wire.
  void* ctx = zmq_ctx_new();
  void* router = zmq_socket(ctx, ZMQ_ROUTER);
  const int zero = 0;
  zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
  ASSERT_EQ(zmq_bind(router, "tcp://127.0.0.1:0"), 0);
  char ep[256];
  size_t n = sizeof ep;
  zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &n);
  auto read = [&](std::vector<std::string>* frames) {
    frames->clear();
    for (int more = 1; more;) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, router, ZMQ_DONTWAIT) < 0) return !frames->empty();
      frames->emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    return true;
  };
  {
    auto client = make_zmq_client(ep, laned(plain_options(), 3, 100000));  // 300000 bytes: three parts
    // The client greets the server on lanes 1 and 2 once their handshakes are done (it notices during its calls),
    // and sends parts there once the server answered, echoing the hello's greeting number.
    std::set<std::string> greeted;
    std::vector<std::string> f;
    Envelope none;
    for (auto end = Clock::now() + 10s; greeted.size() < 2 && Clock::now() < end;) {
      client->receive(&none, 10ms);
      while (read(&f))
        if (f.size() == 2 && f[1].size() == 36 && f[1][4] == 3) {
          greeted.insert(f[0]);
          const std::string answer = hello_tag(f[0].back(), 0, u64_at(f[1], 20));
          zmq_send(router, f[0].data(), f[0].size(), ZMQ_SNDMORE);
          zmq_send(router, answer.data(), answer.size(), 0);
        }
    }
    ASSERT_EQ(greeted.size(), 2u);
    for (auto end = Clock::now() + 10s; client->stats().lanes_up < 3 && Clock::now() < end;) client->receive(&none, 10ms);
    ASSERT_EQ(client->stats().lanes_up, 3u) << "the client does not use the lanes whose hello was answered";
    const std::string payload = random_bytes(300000, 7);
    ASSERT_TRUE(client->send(Bytes::from_string("hdr"), Bytes::from_string(payload)));
    std::map<std::string, std::string> carried;  // routing id -> payload bytes it carried
    std::string lead;
    for (auto end = Clock::now() + 10s; carried.size() < 3 && Clock::now() < end;) {
      zmq_pollitem_t item{router, 0, ZMQ_POLLIN, 0};
      zmq_poll(&item, 1, 100);
      while (read(&f)) {
        if (f.size() == 4) {  // lead: header, part 0, tag
          EXPECT_EQ(f[1], "hdr");
          lead = f[3];
          carried[f[0]] = f[2];
        } else if (f.size() == 3) {  // part: tag, bytes
          carried[f[0]] = f[2];
        }
      }
    }
    ASSERT_EQ(carried.size(), 3u) << "the payload did not use every lane";
    ASSERT_EQ(lead.size(), 36u);
    EXPECT_EQ(mask_of(lead), 7u);
    EXPECT_EQ(lead[6], 3) << "parts";
    std::string joined;  // lanes in index order: lane 0 holds the start
    for (const auto& [rid, bytes] : carried) {
      ASSERT_EQ(rid.size(), 18u);
      EXPECT_EQ(rid[0], 'L');
      EXPECT_EQ(rid.substr(1, 16), carried.begin()->first.substr(1, 16)) << "lanes of one session";
    }
    std::vector<std::pair<int, std::string>> by_lane;
    for (const auto& [rid, bytes] : carried) by_lane.emplace_back(rid.back(), bytes);
    std::sort(by_lane.begin(), by_lane.end());
    for (const auto& [lane, bytes] : by_lane) {
      EXPECT_GT(bytes.size(), 0u) << "lane " << lane;
      joined += bytes;
    }
    EXPECT_TRUE(joined == payload) << "the parts do not tile the payload";
  }
  zmq_close(router);
  zmq_ctx_term(ctx);
}

TEST(ZmqLanes, StrangerIsRefusedOnEveryLane) {
  Keys k;
  auto server = make_zmq_server("tcp://127.0.0.1:0", server_curve(k));
  auto mallory = make_zmq_client(server->endpoint(), laned(client_curve(k, k.mallory_key), 4, 1024));
  int unexpected = 0;
  ASSERT_TRUE(wait_for(*server, [&] {
    mallory->send(Bytes::from_string("h"), Bytes::from_string(std::string(5000, 'x')));
    return server->stats().auth_denied >= 4;  // each of its four connections asked, and was refused
  }, &unexpected));
  EXPECT_EQ(unexpected, 0);
  EXPECT_EQ(server->stats().messages_in, 0u);
  auto alice = make_zmq_client(server->endpoint(), laned(client_curve(k, k.alice_key), 4, 1024));
  Envelope e;
  ASSERT_TRUE(deliver(*alice, *server, Bytes::from_string("h"), Bytes::from_string("ok"), &e));
  EXPECT_EQ(e.identity, "alice");
}

TEST(ZmqLanes, LaneUnderAnotherAllowedKeyIsRefused) {
  Keys k;
  write_keypair(k.allow_dir + "/bob", generate_keypair());
  auto server = make_zmq_server("tcp://127.0.0.1:0", server_curve(k));
  const std::string session(16, 's'), server_pub = k.server_pub, bob_key = k.allow_dir + "/bob.key";
  RawLane alice0(server->endpoint(), session, 0, &k.alice_key, &server_pub);
  RawLane bob1(server->endpoint(), session, 1, &bob_key, &server_pub);
  alice0.send({"h1", "solo", lead_tag(1, 1, 4)});
  Envelope e;
  ASSERT_TRUE(server->receive(&e, 10s));
  EXPECT_EQ(e.identity, "alice");
  EXPECT_EQ(e.payload.str(), "solo");
  // Bob claims lane 1 of alice's session: his hello and his part are refused, so the lead never completes with them.
  bob1.send({hello_tag(1, 0)});
  bob1.send({part_tag(1, 2, 3), "BOB"});
  alice0.send({"h2", "abc", lead_tag(3, 2, 6)});
  int unexpected = 0;
  ASSERT_TRUE(wait_for(*server, [&] { return server->stats().auth_denied >= 2; }, &unexpected));
  EXPECT_EQ(unexpected, 0) << "a message completed with another key's part";
}

TEST(ZmqLanes, LostPartDiscardsItsMessageOnlyAndDroppedLaneIsLeftOut) {
  auto server = make_zmq_server("tcp://127.0.0.1:0", laned(plain_options(), 1, 2500));
  const std::string session = random_bytes(16, 9);
  RawLane lane0(server->endpoint(), session, 0), lane1(server->endpoint(), session, 1);
  lane1.send({hello_tag(1, 0, 1)});
  // Message 1 names lane 1, whose part never comes (lost with a connection); message 2's part is there first. The
  // server answers lane 1's hello once lane 0 spoke; a client sends parts on lane 1 only after that answer.
  lane0.send({"h1", "abc", lead_tag(3, 1, 6)});
  std::vector<std::string> f;
  int unexpected = 0;
  ASSERT_TRUE(receive_while_serving(lane1, *server, &f, &unexpected));
  ASSERT_EQ(unexpected, 0);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0][4], 3);
  EXPECT_EQ(u64_at(f[0], 20), 1u) << "the answer echoes the hello's greeting";
  lane1.send({part_tag(1, 2, 3), "XYZ"});
  lane0.send({"h2", "uvw", lead_tag(3, 2, 6)});
  lane0.send({"h3", "solo", lead_tag(1, 3, 4)});
  Envelope e;
  ASSERT_TRUE(server->receive(&e, 10s));
  EXPECT_EQ(e.header.str(), "h2");
  EXPECT_EQ(e.payload.str(), "uvwXYZ");
  EXPECT_EQ(e.parts, 2);
  EXPECT_EQ(e.peer, "L" + session + '\0');
  ASSERT_TRUE(server->receive(&e, 10s));
  EXPECT_EQ(e.header.str(), "h3");
  EXPECT_EQ(e.payload.str(), "solo");
  EXPECT_EQ(server->stats().dropped_in, 1u);

  // A hello on lane 1 (a new connection) tells that a part still awaited there is gone: message 4 is discarded
  // and message 5, after it, is delivered.
  lane0.send({"h4", "abc", lead_tag(3, 4, 6)});
  lane0.send({"h5", "next", lead_tag(1, 5, 4)});
  EXPECT_FALSE(server->receive(&e, 100ms)) << "message 5 overtook message 4";
  lane1.send({hello_tag(1, 4, 2)});
  ASSERT_TRUE(server->receive(&e, 10s));
  EXPECT_EQ(e.header.str(), "h5");
  EXPECT_EQ(server->stats().dropped_in, 2u);

  // The server answered this hello too, and splits what it sends over both lanes.
  ASSERT_TRUE(lane1.receive(&f));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0][4], 3);
  EXPECT_EQ(u64_at(f[0], 20), 2u);
  const std::string big = random_bytes(5000, 11);
  ASSERT_TRUE(server->send(e.peer, Bytes::from_string("down"), Bytes::from_string(big)));
  ASSERT_TRUE(lane1.receive(&f));
  ASSERT_EQ(f.size(), 2u);
  const std::string tail = f[1];
  ASSERT_TRUE(lane0.receive(&f));
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(mask_of(f[2]), 3u);
  EXPECT_TRUE(f[1] + tail == big);

  // Lane 1's connection drops: the server notices, and sends on lane 0 alone from then on (until it notices, a
  // message may still name lane 1; the client discards those). Both parts then travel on lane 0, the lead last.
  lane1.close();
  bool alone = false;
  std::string part1;
  for (auto end = Clock::now() + 10s; !alone && Clock::now() < end;) {
    ASSERT_TRUE(server->send(e.peer, Bytes::from_string("down"), Bytes::from_string(big)));
    while (!alone && lane0.receive(&f, 20ms)) {
      if (f.size() == 2) part1 = f[1];
      if (f.size() == 3 && mask_of(f[2]) == 1u) {
        alone = true;
        EXPECT_TRUE(f[1] + part1 == big);
      }
    }
  }
  EXPECT_TRUE(alone) << "the server kept splitting over a lane that was gone";
}

// Issue 52, defect 4 ("lanes keep what nobody bounds"): the session table, parts on a lane with no lane 0, and the
// memory a key's incomplete messages hold are bounded (docs/transport.md, "Bounds" under "Lanes").

// A laned client that comes, speaks and goes leaves no session behind; a key cycling session ids with its
// connections left open holds at most kLaneSessionsPerKey, and another key's session is not touched.
TEST(ZmqLanes, SessionTableStaysBoundedAcrossReconnectsAndCycledRoutingIds) {
  Keys k;
  const uint64_t per_key = TransportOptions::kLaneSessionsPerKey;
  for (const bool curve : {true, false}) {
    SCOPED_TRACE(curve ? "curve" : "plaintext");
    auto server = make_zmq_server("tcp://127.0.0.1:0", laned(curve ? server_curve(k) : plain_options(), 1, 1024));
    for (int i = 0; i < 10; ++i) {
      auto client = make_zmq_client(server->endpoint(),
                                    laned(curve ? client_curve(k, k.alice_key) : plain_options(), 3, 1024));
      Envelope e;
      const std::string payload = random_bytes(5000, 30 + i);
      ASSERT_TRUE(deliver(*client, *server, Bytes::from_string("h"), Bytes::from_string(payload), &e)) << i;
      EXPECT_EQ(e.payload.str(), payload);
      EXPECT_GE(server->stats().lane_sessions, 1u) << "reconnect " << i;
      if (curve) EXPECT_LE(server->stats().lane_sessions, per_key) << "reconnect " << i;
    }
    int unexpected = 0;
    EXPECT_TRUE(wait_for(*server, [&] { return server->stats().lane_sessions == 0; }, &unexpected))
        << server->stats().lane_sessions << " sessions kept after every client left";
    EXPECT_EQ(unexpected, 0);
  }

  // Cycled routing ids: one key opens a new session after another and keeps every connection open.
  write_keypair(k.allow_dir + "/bob", generate_keypair());
  auto server = make_zmq_server("tcp://127.0.0.1:0", laned(server_curve(k), 1, 1024));
  const std::string server_pub = k.server_pub, bob_key = k.allow_dir + "/bob.key", bob_session(16, 'b');
  RawLane bob0(server->endpoint(), bob_session, 0, &bob_key, &server_pub);
  RawLane bob1(server->endpoint(), bob_session, 1, &bob_key, &server_pub);
  bob1.send({hello_tag(1, 0, 1)});
  bob0.send({"b1", "solo", lead_tag(1, 1, 4)});
  Envelope e;
  ASSERT_TRUE(server->receive(&e, 10s));
  EXPECT_EQ(e.identity, "bob");
  std::vector<std::string> f;
  int unexpected = 0;
  ASSERT_TRUE(receive_while_serving(bob1, *server, &f, &unexpected)) << "bob's hello on lane 1 was not answered";
  EXPECT_EQ(unexpected, 0);
  std::vector<std::unique_ptr<RawLane>> cycled;
  for (int i = 0; i < 12; ++i) {
    cycled.push_back(
        std::make_unique<RawLane>(server->endpoint(), random_bytes(16, 200 + i), 0, &k.alice_key, &server_pub));
    cycled.back()->send({"a", "x" + std::to_string(i), lead_tag(1, 1, 2 + (i >= 10))});
    ASSERT_TRUE(server->receive(&e, 10s)) << i;
    EXPECT_EQ(e.identity, "alice");
    EXPECT_EQ(e.payload.str(), "x" + std::to_string(i));
    EXPECT_LE(server->stats().lane_sessions, 1 + per_key) << "after alice's session " << i;
  }
  // Bob's session kept its state: a message split over its two lanes still joins.
  bob1.send({part_tag(1, 2, 3), "def"});
  bob0.send({"b2", "abc", lead_tag(3, 2, 6)});
  ASSERT_TRUE(server->receive(&e, 10s));
  EXPECT_EQ(e.header.str(), "b2");
  EXPECT_EQ(e.payload.str(), "abcdef");
}

// Parts on a lane of a session whose lane 0 never spoke are refused, not held; its hello is answered only once
// lane 0 speaks, and from then on the lane's parts are kept and joined.
TEST(ZmqLanes, PartsOnALaneWhoseLaneZeroNeverSpokeAreNotHeld) {
  auto server = make_zmq_server("tcp://127.0.0.1:0", laned(plain_options(), 1, 1024));
  const std::string session = random_bytes(16, 41);
  RawLane lane1(server->endpoint(), session, 1);
  lane1.send({hello_tag(1, 0, 1)});
  const std::string chunk(10000, 'p');
  constexpr int kParts = 50;
  for (int i = 0; i < kParts; ++i) lane1.send({part_tag(1, 1 + i, 0), chunk});
  int unexpected = 0;
  ASSERT_TRUE(wait_for(*server, [&] {  // every part refused, or held
    const TransportStats st = server->stats();
    return st.lane_refused >= kParts || st.lane_held_bytes >= kParts * chunk.size();
  }, &unexpected)) << server->stats().lane_refused << " of " << kParts << " parts refused";
  EXPECT_EQ(server->stats().lane_held_bytes, 0u) << "parts with no lane 0 are held";
  EXPECT_EQ(server->stats().lane_refused, uint64_t{kParts});
  EXPECT_EQ(server->stats().lane_sessions, 1u);
  EXPECT_EQ(unexpected, 0);
  std::vector<std::string> f;
  EXPECT_FALSE(lane1.receive(&f, 200ms)) << "a hello was answered before the session's lane 0 spoke";

  RawLane lane0(server->endpoint(), session, 0);
  lane0.send({"h1", "solo", lead_tag(1, 60, 4)});
  Envelope e;
  ASSERT_TRUE(server->receive(&e, 10s));
  EXPECT_EQ(e.payload.str(), "solo");
  ASSERT_TRUE(receive_while_serving(lane1, *server, &f, &unexpected)) << "the hello was not answered once lane 0 spoke";
  EXPECT_EQ(unexpected, 0);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0][4], 3);
  EXPECT_EQ(u64_at(f[0], 20), 1u);
  lane1.send({part_tag(1, 61, 2), "cd"});
  lane0.send({"h2", "ab", lead_tag(3, 61, 4)});
  ASSERT_TRUE(server->receive(&e, 10s));
  EXPECT_EQ(e.header.str(), "h2");
  EXPECT_EQ(e.payload.str(), "abcd");
  EXPECT_EQ(server->stats().lane_held_bytes, 0u);
}

// One key floods partial messages (parts whose leads never come): what it holds stays within its budget,
// (receive_limit + 1) × max_frame_bytes, the rest is refused; another key's split messages still arrive whole.
TEST(ZmqLanes, KeyFloodingPartialMessagesStaysWithinItsBudgetWhileAnotherKeysMessagesArrive) {
  Keys k;
  write_keypair(k.allow_dir + "/bob", generate_keypair());
  TransportOptions so = laned(server_curve(k), 1, 16384);
  so.receive_limit = 4;
  so.max_frame_bytes = 64 * 1024;
  const uint64_t budget = 5 * so.max_frame_bytes;
  auto server = make_zmq_server("tcp://127.0.0.1:0", so);
  const std::string server_pub = k.server_pub, bob_key = k.allow_dir + "/bob.key", session = random_bytes(16, 51);
  RawLane bob0(server->endpoint(), session, 0, &bob_key, &server_pub);
  RawLane bob1(server->endpoint(), session, 1, &bob_key, &server_pub);
  bob1.send({hello_tag(1, 0, 1)});
  bob0.send({"b", "solo", lead_tag(1, 1, 4)});
  Envelope e;
  ASSERT_TRUE(server->receive(&e, 10s));
  std::vector<std::string> f;
  int unexpected = 0;
  ASSERT_TRUE(receive_while_serving(bob1, *server, &f, &unexpected)) << "bob's hello on lane 1 was not answered";
  EXPECT_EQ(unexpected, 0);
  const std::string chunk(32 * 1024, 'b');
  constexpr int kParts = 200;  // 6.5 MB: 20 times the budget
  for (int i = 0; i < kParts; ++i) bob1.send({part_tag(1, 2 + i, 0), chunk});
  uint64_t most = 0;
  auto held = [&] {
    const uint64_t h = server->stats().lane_held_bytes;
    most = std::max(most, h);
    return h;
  };
  const uint64_t fit = budget / chunk.size();
  ASSERT_TRUE(wait_for(*server, [&] {  // every part refused or held, or more held than the budget
    return held() > budget || server->stats().lane_refused >= kParts - fit;
  }, &unexpected)) << server->stats().lane_refused << " parts refused, " << held() << " bytes held";
  EXPECT_EQ(unexpected, 0);
  EXPECT_GT(most, 0u) << "the parts that fit are held";
  EXPECT_LE(most, budget) << "bob's parts outgrew his key's budget";

  // Alice (her own key, her own budget) sends split messages over two lanes meanwhile: all arrive, whole, in order.
  auto alice = make_zmq_client(server->endpoint(), laned(client_curve(k, k.alice_key), 2, 16384));
  ASSERT_TRUE(deliver(*alice, *server, Bytes::from_string("hi"), Bytes(), &e));
  EXPECT_EQ(e.identity, "alice");
  Envelope none;
  for (auto end = Clock::now() + 10s; alice->stats().lanes_up < 2 && Clock::now() < end;) {
    alice->receive(&none, 10ms);  // the server answers lane 1's hello, and alice reads the answer
    if (server->receive(&none, 10ms)) ++unexpected;
  }
  ASSERT_EQ(alice->stats().lanes_up, 2u);
  EXPECT_EQ(unexpected, 0);
  for (int i = 0; i < 20; ++i) {
    const std::string payload = random_bytes(50000, 60 + i);
    ASSERT_TRUE(alice->send(Bytes::from_string("a" + std::to_string(i)), Bytes::from_string(payload)));
    ASSERT_TRUE(server->receive(&e, 10s)) << i;
    ASSERT_EQ(e.header.str(), "a" + std::to_string(i));
    EXPECT_EQ(e.payload.str(), payload);
    EXPECT_EQ(e.identity, "alice");
    EXPECT_LE(held(), 2 * budget);
  }
  EXPECT_LE(held(), budget) << "alice's finished messages are still held";
}

TEST(ZmqLanes, OptionsOutOfRangeAreRefused) {
  TransportOptions o = plain_options();
  o.lanes = 0;
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_client("tcp://127.0.0.1:1", o); }, {"lanes", "[1, 8]"}));
  o.lanes = 9;
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_client("tcp://127.0.0.1:1", o); }, {"lanes", "got 9"}));
  o.lanes = 2;
  o.io_threads = 0;
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_server("tcp://127.0.0.1:0", o); }, {"io_threads"}));
}

// ---------------------------------------------------------------------------------------------------------------
// Key files and allow-lists.

TEST(KeyFiles, RoundTripWithPrivateModeAndNoOverwrite) {
  TempDir d;
  const KeyPair kp = generate_keypair();
  EXPECT_EQ(kp.public_key.size(), 40u);
  EXPECT_EQ(kp.secret_key.size(), 40u);
  write_keypair(d / "node", kp);
  const KeyPair back = read_secret_key_file(d / "node.key");
  EXPECT_EQ(back.public_key, kp.public_key);
  EXPECT_EQ(back.secret_key, kp.secret_key);
  EXPECT_EQ(read_public_key_file(d / "node.pub"), kp.public_key);
  EXPECT_EQ(read_public_key_file(d / "node.key"), kp.public_key);
  struct stat st {};
  ASSERT_EQ(::stat((d / "node.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::ifstream pub(d / "node.pub");
  std::string pub_text((std::istreambuf_iterator<char>(pub)), std::istreambuf_iterator<char>());
  EXPECT_EQ(pub_text.find("secret"), std::string::npos);

  EXPECT_TRUE(expect_throw_containing([&] { write_keypair(d / "node", generate_keypair()); },
                                      {"node.key", "already exists"}));
  EXPECT_EQ(read_secret_key_file(d / "node.key").secret_key, kp.secret_key);  // untouched
  // A stray .pub alone also blocks the pair, and nothing is left half-written.
  write_text(d / "lone.pub", "x");
  EXPECT_THROW(write_keypair(d / "lone", kp), TransportError);
  EXPECT_FALSE(fs::exists(d / "lone.key"));
}

TEST(KeyFiles, SecretKeyAccessibleByGroupOrOthersIsRefused) {
  TempDir d;
  const KeyPair kp = generate_keypair();
  write_keypair(d / "node", kp);
  const std::string key = d / "node.key";
  for (mode_t mode : {0644, 0640, 0604, 0620, 0602, 0660, 0666, 0700 | 0004}) {
    ASSERT_EQ(::chmod(key.c_str(), mode), 0);
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
    EXPECT_TRUE(expect_throw_containing([&] { read_secret_key_file(key); }, {key, octal, "chmod 600 " + key}))
        << octal;
    // Wherever a file with a secret key is read, also for its public half.
    EXPECT_TRUE(expect_throw_containing([&] { read_public_key_file(key); }, {key, "chmod 600"})) << octal;
  }
  Keys k;
  ASSERT_EQ(::chmod(k.server_key.c_str(), 0644), 0);
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_server("tcp://127.0.0.1:0", server_curve(k)); },
                                      {k.server_key, "0644", "chmod 600"}));
  ASSERT_EQ(::chmod(k.alice_key.c_str(), 0660), 0);
  EXPECT_TRUE(expect_throw_containing([&] { make_zmq_client("tcp://127.0.0.1:1", client_curve(k, k.alice_key)); },
                                      {k.alice_key, "0660"}));
  // Owner-only modes are fine, and public files may be world-readable.
  for (mode_t mode : {0600, 0400, 0700}) {
    ASSERT_EQ(::chmod(key.c_str(), mode), 0);
    EXPECT_EQ(read_secret_key_file(key).secret_key, kp.secret_key);
  }
  ASSERT_EQ(::chmod((d / "node.pub").c_str(), 0666), 0);
  EXPECT_EQ(read_public_key_file(d / "node.pub"), kp.public_key);
}

TEST(KeyFiles, MalformedFilesAreNamedWithTheProblem) {
  TempDir d;
  const KeyPair kp = generate_keypair();
  EXPECT_TRUE(expect_throw_containing([&] { read_secret_key_file(d / "missing.key"); }, {"missing.key", "no such"}));
  write_text(d / "short.key", "public-key = \"abc\"\n");
  EXPECT_TRUE(expect_throw_containing([&] { read_public_key_file(d / "short.key"); },
                                      {"short.key", "line 1", "40 Z85"}));
  write_text(d / "noquote.key", "public-key = " + kp.public_key + "\n");
  EXPECT_TRUE(expect_throw_containing([&] { read_public_key_file(d / "noquote.key"); }, {"noquote.key", "quotes"}));
  write_text(d / "garbage.key", "hello world\n");
  EXPECT_TRUE(expect_throw_containing([&] { read_public_key_file(d / "garbage.key"); }, {"garbage.key", "format"}));
  write_text(d / "only.pub", "public-key = \"" + kp.public_key + "\"\n");
  EXPECT_TRUE(expect_throw_containing([&] { read_secret_key_file(d / "only.pub"); }, {"only.pub", "secret-key"}));
  write_text(d / "empty.pub", "");
  EXPECT_TRUE(expect_throw_containing([&] { read_public_key_file(d / "empty.pub"); }, {"empty.pub", "public-key"}));
  const KeyPair other = generate_keypair();
  write_text(d / "mixed.key",
             "public-key = \"" + other.public_key + "\"\nsecret-key = \"" + kp.secret_key + "\"\n");
  ::chmod((d / "mixed.key").c_str(), 0600);
  EXPECT_TRUE(expect_throw_containing([&] { read_secret_key_file(d / "mixed.key"); }, {"mixed.key", "belong"}));
  write_text(d / "bad-char.key", "public-key = \"" + std::string(39, 'a') + "~\"\n");
  EXPECT_TRUE(expect_throw_containing([&] { read_public_key_file(d / "bad-char.key"); }, {"bad-char.key", "Z85"}));
}

TEST(AllowList, FromDirectoryOfPubFiles) {
  TempDir d;
  const KeyPair a = generate_keypair(), b = generate_keypair();
  write_keypair(d / "bob", b);
  write_keypair(d / "alice", a);
  write_text(d / "README", "not a key");
  const AllowList list = AllowList::load(d.path());
  ASSERT_EQ(list.entries.size(), 2u);
  EXPECT_EQ(list.entries[0].first, "alice");
  ASSERT_NE(list.name_of(b.public_key), nullptr);
  EXPECT_EQ(*list.name_of(b.public_key), "bob");
  EXPECT_EQ(list.name_of(generate_keypair().public_key), nullptr);

  TempDir empty;
  EXPECT_TRUE(expect_throw_containing([&] { AllowList::load(empty.path()); }, {empty.path(), "no entries"}));
  EXPECT_TRUE(expect_throw_containing([&] { AllowList::load(d / "nope"); }, {"nope", "no such"}));
}

TEST(AllowList, FromFile) {
  TempDir d;
  const KeyPair a = generate_keypair(), b = generate_keypair();
  write_text(d / "allow.txt", "# learners\n\nlearner-0 " + a.public_key + "\n  learner-1\t" + b.public_key + "\n");
  const AllowList list = AllowList::load(d / "allow.txt");
  ASSERT_EQ(list.entries.size(), 2u);
  EXPECT_EQ(*list.name_of(a.public_key), "learner-0");
  EXPECT_EQ(*list.name_of(b.public_key), "learner-1");

  write_text(d / "bad.txt", "learner-0 " + a.public_key + "\nlearner-1\n");
  EXPECT_TRUE(expect_throw_containing([&] { AllowList::load(d / "bad.txt"); }, {"bad.txt", "line 2"}));
  write_text(d / "shortkey.txt", "learner-0 abc\n");
  EXPECT_TRUE(expect_throw_containing([&] { AllowList::load(d / "shortkey.txt"); }, {"shortkey.txt", "Z85"}));
  write_text(d / "dup.txt", "x " + a.public_key + "\nx " + b.public_key + "\n");
  EXPECT_TRUE(expect_throw_containing([&] { AllowList::load(d / "dup.txt"); }, {"dup.txt", "twice"}));
  write_text(d / "samekey.txt", "x " + a.public_key + "\ny " + a.public_key + "\n");
  EXPECT_TRUE(expect_throw_containing([&] { AllowList::load(d / "samekey.txt"); }, {"samekey.txt", "same public key"}));
}

// ---------------------------------------------------------------------------------------------------------------
// Metrics server.

std::string http_get(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "connect failed";
  }
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (auto end = Clock::now() + 5s; Clock::now() < end;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

TEST(MetricsServer, ServesTextAndRefusesOtherPaths) {
  std::atomic<int> calls{0};
  MetricsServer m("127.0.0.1:0", [&] {
    ++calls;
    return std::string("deloco_up 1\n");
  });
  ASSERT_GT(m.port(), 0);
  const std::string r = http_get(m.port(), "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4\r\n"), std::string::npos) << r;
  EXPECT_NE(r.find("Content-Length: 12\r\n"), std::string::npos) << r;
  EXPECT_NE(r.find("Connection: close\r\n"), std::string::npos) << r;
  EXPECT_EQ(r.substr(r.size() - 12), "deloco_up 1\n");
  EXPECT_EQ(http_get(m.port(), "GET /?x=1 HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  const std::string nf = http_get(m.port(), "GET /secret HTTP/1.0\r\n\r\n");
  EXPECT_EQ(nf.rfind("HTTP/1.1 404", 0), 0u) << nf;
  EXPECT_EQ(nf.substr(nf.size() - 35), "not found; metrics are at /metrics\n") << nf;
  EXPECT_EQ(http_get(m.port(), "POST /metrics HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(http_get(m.port(), "HEAD /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(http_get(m.port(), "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  // A request line over 8 KiB is refused (414), and one over MetricsServer::kMaxRequestBytes is cut unanswered.
  EXPECT_EQ(http_get(m.port(), "GET /" + std::string(20000, 'a') + " HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 414", 0), 0u);
  EXPECT_EQ(http_get(m.port(), "GET /" + std::string(MetricsServer::kMaxRequestBytes, 'a') + " HTTP/1.0\r\n\r\n"), "");
  EXPECT_EQ(calls.load(), 2);
}

TEST(MetricsServer, ExtraGetRoutes) {
  MetricsServer m("127.0.0.1:0", [] { return std::string("deloco_up 1\n"); });
  std::string seen_query = "unset";
  m.add_get("/api/status", [&](const std::string& query) {
    seen_query = query;
    return MetricsServer::Reply{200, "application/json", "{\"ok\":true}"};
  });
  m.add_get("/api/broken", [](const std::string&) -> MetricsServer::Reply { throw std::runtime_error("no data"); });
  std::string r = http_get(m.port(), "GET /api/status?since=3&x=%20 HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Type: application/json\r\n"), std::string::npos) << r;
  EXPECT_EQ(r.substr(r.size() - 11), "{\"ok\":true}");
  EXPECT_EQ(seen_query, "since=3&x=%20");
  r = http_get(m.port(), "GET /api/status HTTP/1.0\r\n\r\n");
  EXPECT_EQ(seen_query, "");
  r = http_get(m.port(), "GET /api/broken HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 500", 0), 0u) << r;
  EXPECT_EQ(r.substr(r.size() - 8), "no data\n");
  EXPECT_EQ(http_get(m.port(), "GET /api HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);  // exact paths only
  EXPECT_EQ(http_get(m.port(), "GET /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_THROW(m.add_get("api", [](const std::string&) { return MetricsServer::Reply{}; }), TransportError);
}

// A client that starts a request and then sends one byte now and then, always within any per-read timeout.
class Slowloris {
 public:
  explicit Slowloris(int port) : fd_(tcp_connect(port)) {
    if (fd_ < 0) return;
    const std::string start = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    ::send(fd_, start.data(), start.size(), MSG_NOSIGNAL);
    started_ = Clock::now();
    thread_ = std::thread([this] { trickle(); });
  }
  ~Slowloris() {
    give_up_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  bool connected() const { return fd_ >= 0; }
  bool cut() const { return cut_.load(); }
  // Waits until the server closed the connection (true) or `within` passed.
  bool wait_cut(std::chrono::milliseconds within) {
    for (auto end = Clock::now() + within; Clock::now() < end && !cut_;) std::this_thread::sleep_for(10ms);
    return cut_;
  }
  std::chrono::milliseconds lived() const { return std::chrono::duration_cast<std::chrono::milliseconds>(lived_); }
  const std::string& received() const { return received_; }

 private:
  void trickle() {
    auto next = Clock::now();
    while (!give_up_) {
      if (Clock::now() >= next) {
        if (::send(fd_, "a", 1, MSG_NOSIGNAL) != 1) break;  // a reset
        next += 200ms;
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) {
        char buf[512];
        const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
        if (n <= 0) break;  // closed by the server
        received_.append(buf, static_cast<size_t>(n));
      }
    }
    if (!give_up_) {
      lived_ = Clock::now() - started_;
      char buf[512];  // what arrived before the close or reset (a failed send may be how we learnt of it)
      for (ssize_t n; (n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT)) > 0;) received_.append(buf, static_cast<size_t>(n));
      cut_ = true;
    }
  }

  int fd_;
  Clock::time_point started_;
  Clock::duration lived_{};
  std::string received_;
  std::atomic<bool> give_up_{false}, cut_{false};
  std::thread thread_;
};

TEST(MetricsServer, SlowlorisDoesNotDelayScrapesAndIsCutAtTheDeadline) {
  MetricsServer m("127.0.0.1:0", [] { return std::string("deloco_up 1\n"); });
  // The slow client connects first, so a server that takes connections one at a time would serve it first.
  Slowloris slow(m.port());
  ASSERT_TRUE(slow.connected());
  for (int i = 0; i < 3; ++i) {
    const std::string r = http_get(m.port(), "GET /metrics HTTP/1.0\r\n\r\n");
    EXPECT_EQ(r.rfind("HTTP/1.1 200 OK", 0), 0u) << r;
    EXPECT_FALSE(slow.cut()) << "scrape " << i << " was only answered after the slow client was dropped";
  }
  // The slow client, who never stops sending, is cut off at the request deadline, unanswered (a 400 at most).
  ASSERT_TRUE(slow.wait_cut(MetricsServer::kRequestDeadline + 10s));
  EXPECT_GE(slow.lived(), MetricsServer::kRequestDeadline - 100ms);
  EXPECT_EQ(slow.received().find("200 OK"), std::string::npos) << slow.received();
}

TEST(MetricsServer, ConnectionsBeyondThePoolAreRefusedAndTheServerRecovers) {
  // The pool's state is only defined while the slow clients are within the request deadline; on a machine so
  // loaded that opening them took longer than that (ASan next to a build), the scenario is run again.
  for (int attempt = 1;; ++attempt) {
    MetricsServer m("127.0.0.1:0", [] { return std::string("deloco_up 1\n"); });
    std::vector<std::unique_ptr<Slowloris>> slow;
    const auto start = Clock::now();
    for (int i = 0; i < MetricsServer::kThreads + MetricsServer::kQueue + 8; ++i) {
      slow.push_back(std::make_unique<Slowloris>(m.port()));
      ASSERT_TRUE(slow.back()->connected());
    }
    // The connections the pool cannot hold are answered 503 and closed at once (long before the deadline).
    const std::string r = http_get(m.port(), "GET /metrics HTTP/1.0\r\n\r\n");
    if (Clock::now() - start > MetricsServer::kRequestDeadline / 2 && attempt < 5) continue;
    EXPECT_EQ(r.rfind("HTTP/1.1 503", 0), 0u) << r << " (attempt " << attempt << ")";
    int refused = 0, cut = 0;
    for (auto end = Clock::now() + 2s; Clock::now() < end && refused == 0;) {
      refused = cut = 0;
      for (auto& s : slow)
        if (s->cut()) {  // received() is complete once cut() holds
          ++cut;
          refused += s->received().rfind("HTTP/1.1 503", 0) == 0;
        }
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_GE(refused, 1) << cut << " cut";
    // Once the slow clients are cut off at the deadline, scrapes are served again.
    for (auto& s : slow) EXPECT_TRUE(s->wait_cut(MetricsServer::kRequestDeadline + 10s));
    EXPECT_EQ(http_get(m.port(), "GET /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
    return;
  }
}

TEST(MetricsServer, DestructorCutsRequestsInProgress) {
  auto m = std::make_unique<MetricsServer>("127.0.0.1:0", [] { return std::string("deloco_up 1\n"); });
  Slowloris slow(m->port());
  ASSERT_TRUE(slow.connected());
  ASSERT_EQ(http_get(m->port(), "GET /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);  // it is being served
  const auto start = Clock::now();
  m.reset();
  EXPECT_LT(Clock::now() - start, MetricsServer::kRequestDeadline);  // not waiting for the slow client's deadline
  EXPECT_TRUE(slow.wait_cut(10s));
}

TEST(MetricsServer, AddressErrorsAreClear) {
  EXPECT_TRUE(expect_throw_containing([] { MetricsServer("9464", [] { return ""; }); }, {"9464", "host:port"}));
  EXPECT_TRUE(expect_throw_containing([] { MetricsServer("127.0.0.1:99999", [] { return ""; }); }, {"99999"}));
  EXPECT_TRUE(expect_throw_containing([] { MetricsServer("127.0.0.1:http", [] { return ""; }); }, {"http"}));
  MetricsServer first("127.0.0.1:0", [] { return ""; });
  const std::string taken = "127.0.0.1:" + std::to_string(first.port());
  EXPECT_TRUE(expect_throw_containing([&] { MetricsServer(taken, [] { return ""; }); }, {taken}));
}

}  // namespace
}  // namespace deloco
