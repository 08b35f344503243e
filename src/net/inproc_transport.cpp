// In-process transport: a hub in memory that one server and any number of named clients attach to (see
// deloco/transport.h). Messages move as Envelopes holding shared Bytes, so payloads are never copied. Queues are
// bounded like the ZeroMQ high-water marks: `queue_limit` messages per client inbox, and per sending client in
// the server's inbox.
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "deloco/transport.h"

namespace deloco {

class InprocHub {
 public:
  explicit InprocHub(int queue_limit) : limit(static_cast<size_t>(queue_limit > 0 ? queue_limit : 1)) {}

  struct Mailbox {
    std::deque<Envelope> inbox;
    std::condition_variable cv;
  };

  const size_t limit;
  std::mutex mu;  // guards everything below
  bool has_server = false;
  std::deque<Envelope> server_inbox;
  std::condition_variable server_cv;
  std::map<std::string, size_t> queued_from;  // messages of each client waiting in server_inbox
  std::map<std::string, std::shared_ptr<Mailbox>> clients;
};

namespace {

// Waits on `cv` until `box` has a message or the timeout passes; pops it into `out`. `lock` holds hub->mu.
bool pop_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, std::deque<Envelope>& box,
               std::chrono::milliseconds timeout, Envelope* out) {
  if (!cv.wait_for(lock, timeout, [&] { return !box.empty(); })) return false;
  *out = std::move(box.front());
  box.pop_front();
  return true;
}

void count(TransportStats& s, bool in, const Envelope& e) {
  (in ? s.messages_in : s.messages_out)++;
  (in ? s.bytes_in : s.bytes_out) += e.header.size() + e.payload.size();
}

class InprocServer final : public ServerTransport {
 public:
  explicit InprocServer(std::shared_ptr<InprocHub> hub) : hub_(std::move(hub)) {
    std::lock_guard<std::mutex> l(hub_->mu);
    if (hub_->has_server) throw TransportError("inproc hub already has a server");
    hub_->has_server = true;
  }
  ~InprocServer() override {
    std::lock_guard<std::mutex> l(hub_->mu);
    hub_->has_server = false;
    hub_->server_inbox.clear();
    hub_->queued_from.clear();
  }

  std::string endpoint() const override { return "inproc"; }

  bool receive(Envelope* out, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> l(hub_->mu);
    if (!pop_until(l, hub_->server_cv, hub_->server_inbox, timeout, out)) return false;
    auto it = hub_->queued_from.find(out->peer);
    if (it != hub_->queued_from.end() && --it->second == 0) hub_->queued_from.erase(it);
    count(stats_, true, *out);
    return true;
  }

  bool send(const std::string& peer, const Bytes& header, const Bytes& payload) override {
    std::lock_guard<std::mutex> l(hub_->mu);
    auto it = hub_->clients.find(peer);
    if (it == hub_->clients.end() || it->second->inbox.size() >= hub_->limit) {
      stats_.dropped_out++;
      return false;
    }
    Envelope e;
    e.header = header;
    e.payload = payload;
    count(stats_, false, e);
    it->second->inbox.push_back(std::move(e));
    it->second->cv.notify_one();
    return true;
  }

  // Counters change only under the hub's mutex, so taking it makes the snapshot safe from any thread.
  TransportStats stats() const override {
    std::lock_guard<std::mutex> l(hub_->mu);
    return stats_;
  }

 private:
  std::shared_ptr<InprocHub> hub_;
  TransportStats stats_;
};

class InprocClient final : public ClientTransport {
 public:
  InprocClient(std::shared_ptr<InprocHub> hub, std::string identity)
      : hub_(std::move(hub)), identity_(std::move(identity)), box_(std::make_shared<InprocHub::Mailbox>()) {
    if (identity_.empty()) throw TransportError("inproc client needs a non-empty identity");
    std::lock_guard<std::mutex> l(hub_->mu);
    if (!hub_->clients.emplace(identity_, box_).second)
      throw TransportError("inproc hub already has a client named '" + identity_ + "'");
  }
  ~InprocClient() override {
    std::lock_guard<std::mutex> l(hub_->mu);
    hub_->clients.erase(identity_);
  }

  bool receive(Envelope* out, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> l(hub_->mu);
    if (!pop_until(l, box_->cv, box_->inbox, timeout, out)) return false;
    count(stats_, true, *out);
    return true;
  }

  bool send(const Bytes& header, const Bytes& payload) override {
    std::lock_guard<std::mutex> l(hub_->mu);
    size_t& queued = hub_->queued_from[identity_];
    if (!hub_->has_server || queued >= hub_->limit) {
      if (queued == 0) hub_->queued_from.erase(identity_);
      stats_.dropped_out++;
      return false;
    }
    Envelope e;
    e.peer = identity_;
    e.identity = identity_;
    e.header = header;
    e.payload = payload;
    count(stats_, false, e);
    ++queued;
    hub_->server_inbox.push_back(std::move(e));
    hub_->server_cv.notify_one();
    return true;
  }

  TransportStats stats() const override {
    std::lock_guard<std::mutex> l(hub_->mu);
    return stats_;
  }

 private:
  std::shared_ptr<InprocHub> hub_;
  const std::string identity_;
  std::shared_ptr<InprocHub::Mailbox> box_;
  TransportStats stats_;
};

}  // namespace

std::shared_ptr<InprocHub> make_inproc_hub(int queue_limit) { return std::make_shared<InprocHub>(queue_limit); }

std::unique_ptr<ServerTransport> make_inproc_server(const std::shared_ptr<InprocHub>& hub) {
  return std::make_unique<InprocServer>(hub);
}

std::unique_ptr<ClientTransport> make_inproc_client(const std::shared_ptr<InprocHub>& hub,
                                                    const std::string& identity) {
  return std::make_unique<InprocClient>(hub, identity);
}

}  // namespace deloco
