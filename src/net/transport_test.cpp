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

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace deloco {
namespace {

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

enum class Kind { Inproc, TcpPlain, TcpCurve, IpcPlain, IpcCurve };

std::string kind_name(const ::testing::TestParamInfo<Kind>& i) {
  const char* n[] = {"Inproc", "TcpPlain", "TcpCurve", "IpcPlain", "IpcCurve"};
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
    const bool curve = k == Kind::TcpCurve || k == Kind::IpcCurve;
    const bool tcp = k == Kind::TcpPlain || k == Kind::TcpCurve;
    server_ = make_zmq_server(tcp ? "tcp://127.0.0.1:0" : "ipc://" + keys_.dir / "s.ipc",
                              curve ? server_curve(keys_) : plain_options());
    client_ = make_zmq_client(server_->endpoint(), curve ? client_curve(keys_, keys_.alice_key) : plain_options());
  }
  std::string expected_identity() const {
    const Kind k = GetParam();
    return k == Kind::TcpPlain || k == Kind::IpcPlain ? "" : "alice";
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
                                           Kind::IpcCurve),
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

TEST(ZmqTransport, ClientSendFailsWhileDisconnected) {
  // Nothing listens on this ipc path: with ZMQ_IMMEDIATE the message is refused rather than queued.
  TempDir d;
  auto client = make_zmq_client("ipc://" + d / "nobody.ipc", plain_options());
  EXPECT_FALSE(client->send(Bytes::from_string("h"), Bytes()));
  EXPECT_EQ(client->stats().dropped_out, 1u);
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
  int calls = 0;
  MetricsServer m("127.0.0.1:0", [&] {
    ++calls;
    return std::string("deloco_up 1\n");
  });
  ASSERT_GT(m.port(), 0);
  const std::string r = http_get(m.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4\r\n"), std::string::npos) << r;
  EXPECT_EQ(r.substr(r.size() - 12), "deloco_up 1\n");
  EXPECT_EQ(http_get(m.port(), "GET / HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 200", 0), 0u);
  EXPECT_EQ(http_get(m.port(), "GET /secret HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);
  EXPECT_EQ(http_get(m.port(), "POST /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 405", 0), 0u);
  // A huge request head is cut at 8 KiB and still answered (here: 404 for the junk path).
  EXPECT_EQ(http_get(m.port(), "GET /" + std::string(20000, 'a') + " HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 404", 0),
            0u);
  EXPECT_EQ(calls, 2);
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
