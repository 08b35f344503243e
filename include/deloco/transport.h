// deloco/transport.h — moving wire frames between the syncer and its learners (docs/transport.md).
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
//  * Bounds (what one peer can make a ZeroMQ server hold; docs/transport.md has the figures):
//    - every frame is at most TransportOptions::max_frame_bytes. libzmq reads a frame's declared size before
//      buffering it, and drops the connection at once when it is larger, before and after the handshake. Nodes
//      size the bound to the model (deloco/runtime.h); the 1 GiB default is for library users only.
//    - before authentication a connection holds at most one frame, for at most `handshake_timeout`: libzmq
//      hands handshake frames to the CURVE mechanism one at a time and never queues them.
//    - after authentication a peer can have `receive_limit` complete messages queued plus the one it is still
//      sending, each bounded only per frame: libzmq 4.3 delivers a multipart message only once its last frame
//      arrived and has no option bounding the frame count, so an authenticated peer can pin frames ×
//      max_frame_bytes with a message of many frames (a real learner sends two), until the message is complete
//      and read, or the peer disconnects.
//      The receive path keeps the first two frames of a message, closes the others as it reads them, and
//      delivers the message with `parts` set so the caller counts it as malformed.
//    - `queue_limit` messages are queued per peer for sending (senders share payload buffers by reference).
//    - laned clients (TransportOptions::lanes): per key (the allow-list name; in plaintext each session) at most
//      (receive_limit + 1) × max_frame_bytes held for incomplete messages, and sessions bounded per key (plaintext:
//      in all) and removed once their connections have closed; see TransportOptions::lanes.
//  * Security: with CURVE on, the server accepts a client only when the client's public key is in the allow-list;
//    each accepted message carries the key's allow-list name in Envelope::identity. Refused handshakes and
//    protocol errors (random bytes on the port) are counted in TransportStats, never delivered. A secret key file
//    readable or writable by group or others is refused (TransportError naming the file, its mode and the fix).
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
  // A view of [offset, offset + size) sharing this buffer (no copy); throws std::out_of_range past the end.
  Bytes slice(size_t offset, size_t size) const;

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
  // Messages split over lanes (TransportOptions::lanes) that arrived incomplete and were discarded, each counted once:
  // a part lost with a dropped connection or refused (lane_refused), a lead over its key's budget, what a session
  // still held when it was removed or went silent (see docs/transport.md).
  uint64_t dropped_in = 0;
  // CURVE handshakes refused by the allow-list. Server: those it refused. Client: those the server refused (our key
  // is not in its allow-list; libzmq reports the server's refusal, and keeps reconnecting with backoff).
  uint64_t auth_denied = 0;
  // Failed handshakes as libzmq reports them: wrong mechanism or server key, a malformed greeting, and allow-list
  // refusals (so those count here and in auth_denied), and connections that did not finish their handshake
  // within handshake_timeout. Junk that does not even look like ZMTP 3 is refused too, but libzmq closes it
  // without an event, so it is not always counted.
  uint64_t handshake_failures = 0;
  // Server: connections accepted, and connections closed for any reason: the peer left, a failed handshake, or
  // libzmq dropping the peer for breaking a bound. A frame over max_frame_bytes (even in the handshake) closes
  // the connection with no other event, so it shows only here. Client (ZeroMQ): handshakes completed on its first
  // connection (lane 0), counted as its monitor reports them (on the next send or receive); more than one means it
  // reconnected, and what either side still held on the old connection is gone (the learner then says hello again).
  // The in-process transport never reconnects: 0.
  uint64_t connections = 0;
  uint64_t disconnects = 0;
  // Lanes (docs/transport.md, "Bounds" under "Lanes"). lane_refused: lane frames received and not kept, so that
  // memory stays bounded: a part on a lane of a session whose lane 0 has not spoken, a lead or part over its key's
  // budget, a part that can complete nothing (its lead settled, discarded or out of order). Their messages count
  // in dropped_in. lane_sessions (server, now): laned client sessions held. lane_held_bytes (now): bytes held for
  // incomplete laned messages, every key together, each frame counted with 256 bytes of bookkeeping. lanes_up
  // (client, now): lanes it sends on, lane 0 included while connected.
  uint64_t lane_refused = 0;
  uint64_t lane_sessions = 0;
  uint64_t lane_held_bytes = 0;
  uint64_t lanes_up = 0;
  // TCP (TransportOptions::tcp_timeout, ::tcp_congestion): the longest TCP_USER_TIMEOUT fitted to a connection's
  // link so far (ms; 0: none above the floor), and the connections given the congestion control asked for.
  uint64_t tcp_timeout_ms = 0;
  uint64_t tcp_congestion_set = 0;
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
// A file holding a secret key must not be accessible by group or others (mode & 077 == 0, as ssh demands): read_*
// refuse it with a TransportError naming the file, its mode and the fix (chmod 600 <file>).
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
  std::string server_public_key;        // clients: the server's public key itself (z85); when set, the file is unused
  std::string allow;                    // server: allow-list file or directory (CURVE only)
  // Largest frame accepted (ZMQ_MAXMSGSIZE); a larger one drops the connection. Nodes size it to the model
  // (deloco/runtime.h: node_transport_options); this default is only for library users who know nothing better.
  uint64_t max_frame_bytes = (uint64_t{1} << 30) + 4096;
  int queue_limit = 10000;              // messages queued per peer for sending (ZMQ_SNDHWM); clients: also received
  int receive_limit = 0;                // server: complete messages queued per peer on receipt (ZMQ_RCVHWM; 0:
                                        // queue_limit). A full queue stops reading from that peer (TCP back-pressure),
                                        // it never drops messages; keep it small, it bounds what a peer can pin.
  std::chrono::milliseconds handshake_timeout{5000};  // ZMTP + CURVE handshake deadline per connection (ZMQ_HANDSHAKE_IVL)
  std::chrono::milliseconds reconnect{100};  // clients: first reconnect interval (doubles up to 2 s)
  // TCP only (0: the OS's, minutes). Data left unacknowledged this long drops the connection (TCP_USER_TIMEOUT,
  // ZMQ_TCP_MAXRT), and a client abandons a connect attempt after half of it (ZMQ_CONNECT_TIMEOUT) and dials again.
  // A link that was cut and came back is then used on a fresh connection within seconds, instead of waiting out the
  // old connection's retransmission backoff (which doubles to minutes) or a SYN's. This is the floor: once frames
  // arrive on a connection, its timeout is raised to 8 of its retransmission timeouts (srtt + 4·rttvar, or the current one, from
  // TCP_INFO; at most 10 min) where that is longer, so that a slow link with a deep queue, whose retransmissions
  // take seconds each, is not dropped while healthy (docs/transport.md). TransportStats::tcp_timeout_ms shows it.
  std::chrono::milliseconds tcp_timeout{0};
  // TCP only: the congestion control of every connection ("": the system's, net.ipv4.tcp_congestion_control), one
  // this kernel offers (net.ipv4.tcp_available_congestion_control: e.g. "bbr", which paces its sends and keeps a
  // slow link's queue short). Set on a connection when its first frame arrives; a name the kernel refuses leaves
  // the system's (TransportStats::tcp_congestion_set counts the connections that got it).
  std::string tcp_congestion;
  // On close (the destructor): how long messages still queued may take to leave before they are dropped (ZMQ_LINGER;
  // 0: dropped at once). A server whose last answers matter before it exits sets it; a peer that reads nothing can
  // hold the close up to this long.
  std::chrono::milliseconds linger{0};
  // Throughput (docs/transport.md, "Lanes"). A client opens `lanes` connections (ZeroMQ sockets) to its server, each
  // authenticated on its own by the same keys and allow-list. A payload of at least `split_bytes` is cut into
  // contiguous parts of about `split_bytes` (at most 255 parts) dealt round-robin over the lanes that are up, so
  // CURVE encrypts and decrypts them on several I/O threads at once, in cache-sized frames; the receiver joins them
  // (one copy). The server follows whatever each client opened and answers on the same lanes. Order per client is
  // kept: every message is delivered whole, in the order sent, or (a part lost with its connection) not at all,
  // counted in dropped_in. A split payload may not exceed max_frame_bytes. 1: one connection, the wire exactly as
  // without lanes. At most kMaxLanes.
  // A client sends on lane i > 0 only once the server has answered that connection's hello, which the server does
  // once the session's lane 0 has spoken; parts arriving on a lane of a session whose lane 0 has not are not kept.
  // Server bounds on laned clients (a key: the allow-list name with CURVE; in plaintext every session is its own):
  //  * sessions: a session is removed once none of its connections is open any more (checked at every disconnect
  //    and every second, during receive()); a key holds at most kLaneSessionsPerKey (a new one replaces the key's
  //    least recently heard); in plaintext at most kPlaintextLaneSessions in all (the least recently heard goes).
  //  * memory: the incomplete messages of all a key's sessions hold at most (receive_limit + 1) × max_frame_bytes
  //    bytes (each frame counted with 256 bytes of bookkeeping); a frame that does not fit is refused and counted
  //    (lane_refused, its message in dropped_in), never kept. A session silent for 120 s drops what it held.
  static constexpr int kMaxLanes = 8;
  static constexpr int kLaneSessionsPerKey = 2;
  static constexpr int kPlaintextLaneSessions = 1024;
  int lanes = 1;
  uint64_t split_bytes = uint64_t{1} << 20;
  // ZeroMQ I/O threads of this transport (ZMQ_IO_THREADS; each connection lives on one). A client's lane i uses
  // thread i mod io_threads; a server spreads connections over its threads.
  int io_threads = 1;
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

// Prometheus text exposition over HTTP (cpp-httplib, kept out of this header): GET /metrics (or /) answers
// render() as text/plain; version=0.0.4, other paths 404, other methods 405; every response closes its connection.
// Binds "host:port" ("*" or empty host: every interface; port 0: any free port, see port()). Throws TransportError
// when the address is malformed or unusable.
//  * Threads: a listener thread and a pool of kThreads workers. render() and route handlers run on the workers,
//    possibly several at once: they must be safe to call from there, concurrently.
//  * Bounds: a request must arrive whole within kRequestDeadline of its connection being accepted (time spent
//    waiting for a worker counts; a client trickling bytes is cut off then, whatever its pace) and be at most
//    kMaxRequestBytes; a response must be taken within kResponseDeadline. At most kQueue accepted connections
//    wait for a worker; beyond that a connection is answered 503 and closed at once. The destructor returns
//    promptly, cutting requests in progress.
//  * Response size: a response's body is its handler's body, byte for byte: Range headers are ignored (answered
//    200 with the whole body, as RFC 9110 allows), so no request can make the server build a response larger than
//    the handler's. A handler body over kMaxResponseBytes is not sent: the answer is 500 naming its size and the
//    cap. So the server holds at most about kThreads × kMaxResponseBytes of responses at once, whoever asks.
//  * Host check (against DNS rebinding: a web page whose name an attacker points at this machine): a request is
//    served only when its Host header names localhost, 127.0.0.1, [::1], the host this server was bound to, or
//    the local address the connection arrived on; any port is accepted (ssh -L tunnels change it). Others get
//    403 with a one-line reason. An HTTP/1.1 request without Host, or with two, gets 400; HTTP/1.0 may omit it.
//  * Exposure: bound beyond loopback (every interface, or a routable address), exposure_warning() says so,
//    naming the real bound address; the server itself writes nothing, its owner shows the warning.
class MetricsServer {
 public:
  static constexpr int kThreads = 4;
  static constexpr int kQueue = 32;
  static constexpr std::chrono::milliseconds kRequestDeadline{3000};
  static constexpr std::chrono::milliseconds kResponseDeadline{5000};
  static constexpr size_t kMaxRequestBytes = 64 * 1024;
  static constexpr size_t kMaxResponseBytes = 16 * 1024 * 1024;  // a handler's body, at most

  struct Reply {
    int status = 200;
    std::string content_type = "text/plain";
    std::string body;
  };
  // A GET route: `query` is the raw query string (after '?', not decoded; "" when none).
  using Handler = std::function<Reply(const std::string& query)>;

  MetricsServer(const std::string& host_port, std::function<std::string()> render);
  ~MetricsServer();
  int port() const;
  // The address the socket is bound to, numeric, with its port: "127.0.0.1:9464", "0.0.0.0:9464", "[::]:9464".
  std::string bound_address() const;
  // True when bound to a loopback address (127.0.0.0/8 or ::1): only this machine can connect.
  bool loopback_only() const;
  // "" when loopback_only(); otherwise one sentence saying the server is reachable beyond this machine, naming
  // bound_address() (and "every interface" for a wildcard bind), for the owner to print as a warning.
  std::string exposure_warning() const;
  // Serves GET `path` (exact match, starting with '/') with `handler` from now on; replaces an earlier route of
  // the same path, including / and /metrics. A handler that throws answers 500 with the exception's message.
  void add_get(const std::string& path, Handler handler);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deloco
