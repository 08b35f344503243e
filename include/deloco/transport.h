// deloco/transport.h — moving wire frames between the syncer and its learners (DESIGN.md §5).
//
// Two small interfaces: a ServerTransport (the syncer: one endpoint, many peers) and a ClientTransport (a learner:
// one server). Two implementations of each: in-process (a hub in memory, for tests) and ZeroMQ (ROUTER on the
// server, DEALER on clients; tcp:// and ipc:// endpoints; CURVE authentication and encryption unless plaintext is
// explicitly asked for). The transport moves bytes only; decoding and validating wire frames (deloco/wire.h) is
// the roles' job, so there is one place that judges what is malformed.
//
// One wire message is always exactly two transport frames: the 72-byte header and the payload (possibly empty).
// Sending never copies the payload (ZeroMQ gets a reference to the shared buffer); receiving never copies it either
// (the Bytes keeps the ZeroMQ message alive).
//
// Contract
//  * Bounds: a server refuses any frame larger than TransportOptions::max_frame_bytes (ZeroMQ drops the connection),
//    keeps at most `queue_limit` messages per direction and peer, and a message with other than two frames is
//    delivered with `parts` set so the caller can count it as malformed. Memory therefore stays bounded whatever a
//    peer sends.
//  * Security: with CURVE on, the server accepts a client only when the client's public key is in the allow-list;
//    each accepted message carries the key's allow-list name in Envelope::identity. Refused handshakes and
//    protocol errors (random bytes on the port) are counted in TransportStats, never delivered.
//  * Liveness is not the transport's business: it never reports a peer dead. Roles use heartbeats (wire.h).
//  * send() never blocks for long: when the peer is unknown, not connected or its queue is full it returns false
//    and the message is dropped (counted).
//  * Threads: one thread uses a transport object at a time (the owner's comms thread); stats() may be called from
//    any thread. Errors at construction (bad endpoint, address in use, unreadable key) throw TransportError
//    naming the endpoint or file.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "deloco/error.h"

namespace deloco {

class TransportError : public Error {
 public:
  using Error::Error;
};

// An immutable, shared byte buffer (a view plus whatever keeps the bytes alive). Cheap to copy.
class Bytes {
 public:
  Bytes() = default;
  Bytes(std::shared_ptr<const void> owner, const char* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  static Bytes from_string(std::string s);              // takes ownership
  static Bytes copy(const void* data, size_t size);     // copies
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::string str() const { return std::string(data_ ? data_ : "", size_); }

 private:
  std::shared_ptr<const void> owner_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// One received message.
struct Envelope {
  std::string peer;      // server side: opaque routing id of the sending connection (stable while it lives)
  std::string identity;  // server side with CURVE: the allow-list name of the client's key ("" in plaintext)
  Bytes header;          // first frame
  Bytes payload;         // second frame
  int parts = 2;         // frames the message had; anything but 2 is malformed (header/payload then hold the first two)
};

struct TransportStats {
  uint64_t messages_in = 0, messages_out = 0;
  uint64_t bytes_in = 0, bytes_out = 0;     // header + payload bytes
  uint64_t dropped_out = 0;                 // sends refused (unknown peer, not connected, queue full)
  uint64_t auth_denied = 0;                 // CURVE handshakes refused by the allow-list
  // Failed handshakes as libzmq reports them: wrong mechanism or server key, a malformed greeting, and allow-list
  // refusals (so those count here and in auth_denied). Junk that does not even look like ZMTP 3 is refused too,
  // but libzmq closes it without an event, so it is not always counted.
  uint64_t handshake_failures = 0;
};

// A CURVE key pair, Z85 text (40 characters each).
struct KeyPair {
  std::string public_key;
  std::string secret_key;
};
KeyPair generate_keypair();  // throws TransportError when ZeroMQ was built without CURVE
// Key files: "<stem>.key" (mode 0600: public and secret) and "<stem>.pub" (public only). Format, one per line:
//   public-key = "<z85>"      secret-key = "<z85>"      (the .pub file has only the first line)
// write_keypair refuses to overwrite an existing file. read_* throw TransportError naming the file and the problem.
void write_keypair(const std::string& stem, const KeyPair& kp);
KeyPair read_secret_key_file(const std::string& path);   // a .key file
std::string read_public_key_file(const std::string& path);  // a .pub or .key file: its public key

// The server's allow-list: entries of (name, public key). A file lists one entry per line: "<name> <z85 key>"
// (blank lines and '#' comments skipped); a directory contributes every "<name>.pub" file in it.
struct AllowList {
  std::vector<std::pair<std::string, std::string>> entries;  // (name, z85 public key)
  static AllowList load(const std::string& path);             // file or directory; throws TransportError
  const std::string* name_of(const std::string& z85) const;   // nullptr when not allowed
};

struct TransportOptions {
  bool plaintext = false;               // must be set explicitly to run without CURVE
  std::string secret_key_file;          // own .key file (server and clients, CURVE only)
  std::string server_public_key_file;   // clients: the server's .pub file (CURVE only)
  std::string allow;                    // server: allow-list file or directory (CURVE only)
  uint64_t max_frame_bytes = (uint64_t{1} << 30) + 4096;  // larger frames drop the connection
  int queue_limit = 10000;              // messages queued per peer and direction (ZeroMQ high-water marks)
  std::chrono::milliseconds reconnect{100};  // clients: first reconnect interval (doubles up to 2 s)
};

class ServerTransport {
 public:
  virtual ~ServerTransport() = default;
  // The bound endpoint as peers should dial it (a tcp://host:0 bind reports the port chosen).
  virtual std::string endpoint() const = 0;
  // Waits up to `timeout` for one message; false on timeout.
  virtual bool receive(Envelope* out, std::chrono::milliseconds timeout) = 0;
  // Queues header + payload for `peer`; false (and counted as dropped) when it cannot.
  virtual bool send(const std::string& peer, const Bytes& header, const Bytes& payload) = 0;
  virtual TransportStats stats() const = 0;
};

class ClientTransport {
 public:
  virtual ~ClientTransport() = default;
  virtual bool receive(Envelope* out, std::chrono::milliseconds timeout) = 0;
  // Queues header + payload for the server; false (dropped, counted) while not connected or when the queue is full.
  virtual bool send(const Bytes& header, const Bytes& payload) = 0;
  virtual TransportStats stats() const = 0;
};

// ZeroMQ. endpoint: "tcp://host:port" (port 0 or "*": any free port) or "ipc:///path". Throws TransportError.
std::unique_ptr<ServerTransport> make_zmq_server(const std::string& endpoint, const TransportOptions& opts);
std::unique_ptr<ClientTransport> make_zmq_client(const std::string& endpoint, const TransportOptions& opts);

// In-process: a hub that any number of clients attach to; messages move by reference. Same contract otherwise
// (bounded queues, two frames per message); identity is the name passed to connect().
class InprocHub;
std::shared_ptr<InprocHub> make_inproc_hub(int queue_limit = 10000);
std::unique_ptr<ServerTransport> make_inproc_server(const std::shared_ptr<InprocHub>& hub);
std::unique_ptr<ClientTransport> make_inproc_client(const std::shared_ptr<InprocHub>& hub, const std::string& identity);

// Prometheus text exposition over HTTP/1.0: GET /metrics (or /) answers render(), other paths 404. Runs its own
// thread, which calls render(): it must be safe to call from there. Binds "host:port" ("*" or empty host: every
// interface; port 0: any free port, see port()). Throws TransportError when the address is malformed or unusable.
class MetricsServer {
 public:
  MetricsServer(const std::string& host_port, std::function<std::string()> render);
  ~MetricsServer();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deloco
