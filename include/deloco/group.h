// deloco/group.h — a learner as a data-parallel group of R ranks (Decoupled DiLoCo: each learner is a whole
// data-parallel job on its own slice of chips).
//
// The collectives are PyTorch's own: c10d's ProcessGroupGloo over a TCPStore, as shipped in libtorch (Gloo works
// on CPU tensors and on CUDA tensors through host copies). deloco writes no all-reduce of its own.
//
// Roles inside a group
//  * Every rank holds a full replica and trains on its own part of the learner's batch; GradientSync averages the
//    gradients of every inner step across the ranks, in buckets launched while backward still runs, so the
//    replicas stay bit-identical (Gloo gives every rank the same reduced bytes).
//  * Rank 0 alone talks to the syncer (deloco/runtime.h, LearnerNode). At every step boundary it tells the other
//    ranks what comes next (lead()): train one step, or stop; and it sends them the parameters that changed
//    since the last boundary (merged fragments applied, a global state installed). The first boundary sends
//    everything: parameters, inner-optimizer state and the step. The other ranks run follow() until told to stop.
//  * A rank that fails makes every collective of its group throw (a closed connection, or the timeout): the
//    group's processes exit and the supervisor restarts the group, which rejoins like a restarted learner.
//
// Contract: every rank must make the same collective calls in the same order (as with any c10d group); the
// functions here do so by construction. Not thread-safe: one driver thread per rank (the gradient hooks run
// inside that thread's backward).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deloco {

class Workload;

struct GroupOptions {
  int64_t rank = 0;                  // this process's rank in its learner group
  int64_t size = 1;                  // ranks in the group (learner.ranks)
  int64_t local_rank = 0;            // rank on this host (picks cuda:LOCAL_RANK)
  std::string master_addr = "127.0.0.1";  // where rank 0 serves the group's TCPStore
  int64_t master_port = 29500;
  double timeout_seconds = 600;      // a collective (or the rendezvous) that takes longer fails the group

  // torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (each optional; what is
  // missing keeps the value in `defaults`). Throws ConfigError naming a variable that is not a number or out of
  // range.
  static GroupOptions from_environment(GroupOptions defaults);
  // "" when consistent, else what is wrong (rank outside [0, size), size < 1, port outside [1, 65535]).
  std::string validate() const;
};

class GradientSync;

class LearnerGroup {
 public:
  // Rendezvous: rank 0 serves a TCPStore at master_addr:master_port, the others connect; returns once all `size`
  // ranks have formed the Gloo process group. Throws GroupError (naming the address) on a timeout.
  static std::shared_ptr<LearnerGroup> connect(const GroupOptions& options);
  ~LearnerGroup();
  LearnerGroup(const LearnerGroup&) = delete;
  LearnerGroup& operator=(const LearnerGroup&) = delete;

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }

  // Collectives (every rank calls them in the same order).
  // Rank 0's `tensors` (float32, int64, ...; any device) overwrite everybody else's, in place. The tensors are
  // packed into one message per dtype.
  void broadcast(const std::vector<at::Tensor>& tensors);
  // Element-wise sum of `t` over the ranks, in place.
  void allreduce_sum(at::Tensor& t);

  // Gradient averaging for `params` (the model's parameters, bound by handle).
  std::unique_ptr<GradientSync> gradient_sync(const std::vector<std::pair<std::string, at::Tensor>>& params,
                                              double bucket_mb = 25.0);

  // ---- the driver protocol (see the top of this file) ----
  enum class Command : int64_t { kStep = 0, kStop = 1 };
  // Rank 0 at a step boundary. `changed`: names of the parameters that changed since the previous lead(); the
  // first call sends every parameter, the optimizer state and the step whatever `changed` says.
  void lead(Command command, Workload& work, const std::vector<std::string>& changed);
  // Every other rank: mirror rank 0's boundaries and train a step whenever told to, until told to stop. Returns
  // the inner steps trained.
  int64_t follow(Workload& work);

  // Seconds spent in broadcasts and in waiting for gradient buckets (the part of communication not hidden behind
  // backward), since the group was formed.
  double communication_seconds() const { return comm_seconds_; }

 private:
  LearnerGroup() = default;
  void add_comm_seconds(double s) { comm_seconds_ += s; }
  void sync_everything(Workload& work, int64_t step);
  friend class GradientSync;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t rank_ = 0, size_ = 1;
  bool led_once_ = false;
  double comm_seconds_ = 0;
};

// Averages the gradients of a set of parameters across a LearnerGroup. Construction registers a hook on every
// parameter: during backward each gradient is copied into its bucket as soon as autograd produces it, and a
// bucket whose gradients are all in is all-reduced asynchronously (buckets are launched in one fixed order on
// every rank; the first is small so that communication starts early). finish() launches what is left, waits and
// writes the mean into every parameter's .grad.
class GradientSync {
 public:
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  // Before backward.
  void prepare();
  // After backward: every .grad holds the mean over the ranks (a parameter without a gradient on some rank counts
  // as zero there).
  void finish();
  int64_t buckets() const;

 private:
  friend class LearnerGroup;
  GradientSync() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deloco
