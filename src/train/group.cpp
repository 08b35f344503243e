// Learner groups over c10d (contract in deloco/group.h). Compiled with USE_C10D_GLOO, which the c10d Gloo header
// needs, and outside the precompiled header (CMakeLists.txt).
#include "deloco/group.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "deloco/config.h"
#include "deloco/error.h"
#include "deloco/workload.h"
#include "util/env.h"

namespace deloco {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool is_loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }
}  // namespace

GroupOptions GroupOptions::from_environment(GroupOptions d) {
  d.rank = environment_integer_in("RANK", d.rank, 0, 1 << 20);
  d.size = environment_integer_in("WORLD_SIZE", d.size, 1, 1 << 20);
  d.local_rank = environment_integer_in("LOCAL_RANK", d.local_rank, 0, 1 << 20);
  d.master_port = environment_integer_in("MASTER_PORT", d.master_port, 1, 65535);
  d.master_addr = environment_string("MASTER_ADDR", d.master_addr);
  return d;
}

std::string GroupOptions::validate() const {
  if (size < 1) return "the group size must be at least 1, not " + std::to_string(size);
  if (rank < 0 || rank >= size)
    return "rank " + std::to_string(rank) + " is not in [0, " + std::to_string(size) + ") (RANK / --rank)";
  if (master_port < 1 || master_port > 65535)
    return "master port " + std::to_string(master_port) + " is not in [1, 65535] (MASTER_PORT / --master-port)";
  if (master_addr.empty()) return "the master address is empty (MASTER_ADDR / --master-addr)";
  if (!(timeout_seconds > 0)) return "the group timeout must be positive";
  return "";
}

struct LearnerGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

std::shared_ptr<LearnerGroup> LearnerGroup::connect(const GroupOptions& o) {
  if (const std::string why = o.validate(); !why.empty()) throw ConfigError("learner group: " + why);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_seconds * 1000));
  std::shared_ptr<LearnerGroup> g(new LearnerGroup());
  g->impl_ = std::make_unique<Impl>();
  g->rank_ = o.rank;
  g->size_ = o.size;
  const std::string where = o.master_addr + ":" + std::to_string(o.master_port);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(o.master_port);
    so.isServer = o.rank == 0;
    so.numWorkers = static_cast<size_t>(o.size);
    so.waitWorkers = true;
    so.timeout = timeout;
    g->impl_->store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    // The interface Gloo binds: GLOO_SOCKET_IFNAME as in PyTorch; the loopback when the group is on one host;
    // else the interface of this host's name.
    if (const std::string ifname = environment_string("GLOO_SOCKET_IFNAME"); !ifname.empty())
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (is_loopback(o.master_addr))
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    g->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(g->impl_->store, static_cast<int>(o.rank),
                                                               static_cast<int>(o.size), opts);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw GroupError("learner group: rank " + std::to_string(o.rank) + " of " + std::to_string(o.size) +
                     " could not form the group at " + where + ": " + e.what());
  }
  return g;
}

LearnerGroup::~LearnerGroup() = default;

void LearnerGroup::broadcast(const std::vector<at::Tensor>& tensors) {
  if (size_ == 1 || tensors.empty()) return;
  const auto t0 = Clock::now();
  at::NoGradGuard no_grad;
  // One message per (dtype, device), in order of first appearance: the same on every rank.
  std::vector<std::pair<std::pair<at::ScalarType, std::string>, std::vector<size_t>>> groups;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto key = std::make_pair(tensors[i].scalar_type(), tensors[i].device().str());
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {}});
      it = std::prev(groups.end());
    }
    it->second.push_back(i);
  }
  for (const auto& [key, idx] : groups) {
    std::vector<at::Tensor> parts;
    for (size_t i : idx) parts.push_back(tensors[i].reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(parts)};
    impl_->pg->broadcast(flat)->wait();
    if (rank_ == 0) continue;
    int64_t off = 0;
    for (size_t i : idx) {
      const int64_t n = tensors[i].numel();
      tensors[i].copy_(flat[0].narrow(0, off, n).view(tensors[i].sizes()));
      off += n;
    }
  }
  comm_seconds_ += seconds_since(t0);
}

void LearnerGroup::allreduce_sum(at::Tensor& t) {
  if (size_ == 1) return;
  std::vector<at::Tensor> v{t};
  impl_->pg->allreduce(v)->wait();
}

// ------------------------------------------------------------------ gradients
struct GradientSync::Impl {
  LearnerGroup* group = nullptr;
  c10d::ProcessGroupGloo* pg = nullptr;
  std::vector<at::Tensor> params;
  std::vector<unsigned> hooks;
  struct Bucket {
    at::Tensor flat;
    std::vector<size_t> members;  // parameter indices
    int64_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;
  std::vector<int64_t> offset_of;
  std::vector<bool> ready;
  size_t next_launch = 0;
  bool armed = false;
  std::mutex mu;  // hooks run in the backward's thread(s); CUDA backward may use device threads

  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      std::vector<at::Tensor> v{buckets[next_launch].flat};
      buckets[next_launch].work = pg->allreduce(v);
      ++next_launch;
    }
  }
  void on_grad(size_t i, const at::Tensor& g) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed || ready[i]) return;
    Bucket& b = buckets[bucket_of[i]];
    b.flat.narrow(0, offset_of[i], params[i].numel()).copy_(g.reshape({-1}));
    ready[i] = true;
    --b.pending;
    launch_ready();
  }
};

std::unique_ptr<GradientSync> LearnerGroup::gradient_sync(const std::vector<std::pair<std::string, at::Tensor>>& params,
                                                          double bucket_mb) {
  std::unique_ptr<GradientSync> s(new GradientSync());
  auto& I = *(s->impl_ = std::make_unique<GradientSync::Impl>());
  I.group = this;
  I.pg = impl_->pg.get();
  for (const auto& [name, p] : params) I.params.push_back(p);
  const size_t n = I.params.size();
  I.bucket_of.assign(n, 0);
  I.offset_of.assign(n, 0);
  I.ready.assign(n, false);
  // Buckets in reverse parameter order (the order backward tends to produce gradients), the first one small (1 MB)
  // so that the first all-reduce starts early, as DistributedDataParallel does. One dtype and device per bucket.
  const double cap = std::max(bucket_mb, 0.001) * 1024 * 1024;
  double bytes = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = n - 1 - k;
    const at::Tensor& p = I.params[i];
    const bool fresh = I.buckets.empty() ||
                       bytes >= (I.buckets.size() == 1 ? std::min(cap, 1024.0 * 1024) : cap) ||
                       I.params[I.buckets.back().members.front()].scalar_type() != p.scalar_type() ||
                       I.params[I.buckets.back().members.front()].device() != p.device();
    if (fresh) {
      I.buckets.emplace_back();
      bytes = 0;
    }
    auto& b = I.buckets.back();
    I.bucket_of[i] = I.buckets.size() - 1;
    I.offset_of[i] = b.members.empty() ? 0 : I.offset_of[b.members.back()] + I.params[b.members.back()].numel();
    b.members.push_back(i);
    bytes += static_cast<double>(p.numel() * p.element_size());
  }
  for (auto& b : I.buckets) {
    const at::Tensor& last = I.params[b.members.back()];
    b.flat = at::zeros({I.offset_of[b.members.back()] + last.numel()}, last.options().requires_grad(false));
  }
  GradientSync::Impl* raw = &I;
  for (size_t i = 0; i < n; ++i)
    I.hooks.push_back(I.params[i].register_hook([raw, i](const at::Tensor& g) { raw->on_grad(i, g); }));
  return s;
}

GradientSync::~GradientSync() {
  if (!impl_) return;
  for (size_t i = 0; i < impl_->hooks.size(); ++i) impl_->params[i].remove_hook(impl_->hooks[i]);
}

int64_t GradientSync::buckets() const { return static_cast<int64_t>(impl_->buckets.size()); }

void GradientSync::prepare() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& I = *impl_;
  std::fill(I.ready.begin(), I.ready.end(), false);
  for (auto& b : I.buckets) {
    b.pending = static_cast<int64_t>(b.members.size());
    b.work.reset();
  }
  I.next_launch = 0;
  I.armed = true;
}

void GradientSync::finish() {
  auto& I = *impl_;
  const auto t0 = Clock::now();
  {
    std::lock_guard<std::mutex> lock(I.mu);
    // A parameter that got no gradient on this rank contributes zeros, so every rank launches every bucket.
    for (size_t i = 0; i < I.params.size(); ++i)
      if (!I.ready[i]) {
        auto& b = I.buckets[I.bucket_of[i]];
        b.flat.narrow(0, I.offset_of[i], I.params[i].numel()).zero_();
        I.ready[i] = true;
        --b.pending;
      }
    I.launch_ready();
    I.armed = false;
  }
  at::NoGradGuard no_grad;
  const double inv = 1.0 / static_cast<double>(I.group->size());
  for (auto& b : I.buckets) {
    b.work->wait();
    b.flat.mul_(inv);
    for (size_t i : b.members) {
      at::Tensor& p = I.params[i];
      at::Tensor mean = b.flat.narrow(0, I.offset_of[i], p.numel()).view(p.sizes());
      if (p.grad().defined())
        p.mutable_grad().copy_(mean);
      else
        p.mutable_grad() = mean.clone();
    }
  }
  I.group->add_comm_seconds(seconds_since(t0));
}

// ------------------------------------------------------------------ the driver protocol
namespace {
// The control message of a step boundary: [command, step, full, n_changed, changed parameter indices...].
constexpr int64_t kHeader = 4;
}  // namespace

void LearnerGroup::sync_everything(Workload& work, int64_t step) {
  std::vector<at::Tensor> all;
  for (auto& [name, p] : work.parameters()) all.push_back(p);
  broadcast(all);
  std::map<std::string, at::Tensor> st = work.optimizer_state();  // CPU copies, in name order on every rank
  std::vector<at::Tensor> state;
  for (auto& [k, v] : st) state.push_back(v);
  broadcast(state);
  if (rank_ != 0) {
    work.load_optimizer_state(st);
    work.set_step(step);
  }
}

void LearnerGroup::lead(Command command, Workload& work, const std::vector<std::string>& changed) {
  if (rank_ != 0) throw std::logic_error("LearnerGroup::lead is rank 0's");
  if (size_ == 1) return;
  auto& params = work.parameters();
  const int64_t n = static_cast<int64_t>(params.size());
  at::Tensor ctrl = at::zeros({kHeader + n}, at::kLong);
  auto c = ctrl.accessor<int64_t, 1>();
  const bool full = !led_once_;
  c[0] = static_cast<int64_t>(command);
  c[1] = work.step();
  c[2] = full ? 1 : 0;
  std::vector<int64_t> idx;
  if (!full)
    for (int64_t i = 0; i < n; ++i)
      if (std::find(changed.begin(), changed.end(), params[static_cast<size_t>(i)].first) != changed.end()) idx.push_back(i);
  c[3] = static_cast<int64_t>(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) c[kHeader + static_cast<int64_t>(k)] = idx[k];
  broadcast({ctrl});
  led_once_ = true;
  if (command == Command::kStop) return;
  if (full) return sync_everything(work, work.step());
  std::vector<at::Tensor> send;
  for (int64_t i : idx) send.push_back(params[static_cast<size_t>(i)].second);
  broadcast(send);
}

int64_t LearnerGroup::follow(Workload& work) {
  if (rank_ == 0) throw std::logic_error("LearnerGroup::follow is for ranks other than 0");
  auto& params = work.parameters();
  const int64_t n = static_cast<int64_t>(params.size());
  int64_t trained = 0;
  for (;;) {
    at::Tensor ctrl = at::zeros({kHeader + n}, at::kLong);
    broadcast({ctrl});
    auto c = ctrl.accessor<int64_t, 1>();
    if (c[0] == static_cast<int64_t>(Command::kStop)) return trained;
    if (c[0] != static_cast<int64_t>(Command::kStep) || c[3] < 0 || c[3] > n)
      throw GroupError("learner group: rank 0 sent a malformed control message");
    if (c[2] == 1) {
      sync_everything(work, c[1]);
    } else {
      std::vector<at::Tensor> recv;
      for (int64_t k = 0; k < c[3]; ++k) {
        const int64_t i = c[kHeader + k];
        if (i < 0 || i >= n) throw GroupError("learner group: rank 0 named parameter " + std::to_string(i));
        recv.push_back(params[static_cast<size_t>(i)].second);
      }
      broadcast(recv);
      work.set_step(c[1]);
    }
    work.inner_step();
    ++trained;
  }
}

}  // namespace deloco

namespace deloco {
void Workload::join_group(std::shared_ptr<LearnerGroup>) {
  throw GroupError("this workload cannot train as a learner group (learner.ranks > 1 needs join_group)");
}
}  // namespace deloco
