// The model plan (deloco/sync.h): fragments by greedy bin-packing, their staggered offsets, shards, and the flat
// fp32 layouts every part (the syncer, the learner core, the simulator, the nodes) cuts the model into.
#include "deloco/sync.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include <torch/torch.h>

#include "deloco/config.h"

namespace deloco {

std::vector<Fragment> plan_fragments(const std::vector<std::pair<std::string, int64_t>>& tensors, int64_t P,
                                     int64_t H) {
  if (P < 1) throw SyncError("sync.fragments must be ≥ 1");
  if (H < 1) throw SyncError("sync.sync_every must be ≥ 1");
  if (P > static_cast<int64_t>(tensors.size()))
    throw SyncError("sync.fragments=" + std::to_string(P) + " is larger than the number of parameter tensors (" +
                    std::to_string(tensors.size()) + ")");
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].second > tensors[b].second; });
  std::vector<Fragment> frags(static_cast<size_t>(P));
  std::vector<std::vector<size_t>> members(frags.size());
  for (size_t i : order) {
    size_t best = 0;
    for (size_t f = 1; f < frags.size(); ++f)
      if (frags[f].bytes < frags[best].bytes) best = f;
    frags[best].bytes += tensors[i].second;
    members[best].push_back(i);
  }
  for (size_t f = 0; f < frags.size(); ++f) {
    std::sort(members[f].begin(), members[f].end());
    for (size_t i : members[f]) frags[f].names.push_back(tensors[i].first);
    frags[f].id = static_cast<int64_t>(f);
    frags[f].offset = (static_cast<int64_t>(f) * H / P) % H;
  }
  return frags;
}

std::vector<int64_t> assign_shards(const std::vector<Fragment>& fragments, int64_t S) {
  const int64_t P = static_cast<int64_t>(fragments.size());
  if (S < 1) throw SyncError("syncer.shards must be ≥ 1");
  if (S > P)
    throw SyncError("syncer.shards=" + std::to_string(S) + " is larger than sync.fragments=" + std::to_string(P) +
                    ": every shard serves at least one fragment, so set sync.fragments ≥ syncer.shards");
  std::vector<size_t> order(fragments.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return fragments[a].bytes > fragments[b].bytes; });
  std::vector<int64_t> load(static_cast<size_t>(S), 0), count(static_cast<size_t>(S), 0);
  std::vector<int64_t> shard(fragments.size(), 0);
  for (size_t i : order) {
    // A shard still without a fragment goes first (P ≥ S fragments: each gets one), then the lightest.
    size_t best = 0;
    for (size_t s = 1; s < load.size(); ++s) {
      const bool empty_s = count[s] == 0, empty_b = count[best] == 0;
      if (empty_s != empty_b ? empty_s : load[s] < load[best]) best = s;
    }
    load[best] += fragments[i].bytes;
    ++count[best];
    shard[i] = static_cast<int64_t>(best);
  }
  return shard;
}

std::vector<int64_t> shard_fragments(const std::vector<int64_t>& assignment, int64_t s) {
  std::vector<int64_t> out;
  for (size_t p = 0; p < assignment.size(); ++p)
    if (assignment[p] == s) out.push_back(static_cast<int64_t>(p));
  return out;
}

FlatLayout make_flat_layout(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors) {
  FlatLayout l;
  l.names = names;
  for (const auto& t : tensors) {
    l.shapes.push_back(t.sizes().vec());
    l.offsets.push_back(l.elements);
    l.elements += t.numel();
  }
  return l;
}

void flatten_into(const std::vector<at::Tensor>& tensors, float* out) {
  int64_t off = 0;
  for (const auto& t : tensors) {
    auto c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
    std::memcpy(out + off, c.data_ptr<float>(), static_cast<size_t>(c.numel()) * sizeof(float));
    off += c.numel();
  }
}

std::vector<at::Tensor> unflatten(const at::Tensor& flat, const FlatLayout& layout) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < layout.shapes.size(); ++i) {
    int64_t n = 1;
    for (auto d : layout.shapes[i]) n *= d;
    out.push_back(flat.narrow(0, layout.offsets[i], n).view(layout.shapes[i]));
  }
  return out;
}

ModelPlan plan_model(const std::vector<std::pair<std::string, at::Tensor>>& params, int64_t P, int64_t H) {
  ModelPlan plan;
  std::vector<std::pair<std::string, int64_t>> sizes;
  std::map<std::string, at::Tensor> by_name;
  std::vector<std::string> names;
  std::vector<at::Tensor> all;
  for (const auto& [n, t] : params) {
    sizes.emplace_back(n, t.numel() * static_cast<int64_t>(t.element_size()));
    by_name[n] = t;
    names.push_back(n);
    all.push_back(t);
  }
  plan.fragments = plan_fragments(sizes, P, H);
  for (const auto& f : plan.fragments) {
    std::vector<at::Tensor> ts;
    for (const auto& n : f.names) ts.push_back(by_name.at(n));
    plan.fragment_layouts.push_back(make_flat_layout(f.names, ts));
  }
  plan.model = make_flat_layout(names, all);
  return plan;
}

ShardPlan plan_shard(const ModelPlan& plan, int64_t S, int64_t s) {
  ShardPlan sp;
  sp.owner = assign_shards(plan.fragments, S);
  if (s < 0 || s >= S)
    throw ConfigError("shard " + std::to_string(s) + " is not in [0, syncer.shards=" + std::to_string(S) + ")");
  sp.shard = s;
  sp.shards = S;
  sp.fragments = shard_fragments(sp.owner, s);
  sp.local.assign(plan.fragments.size(), -1);
  for (size_t k = 0; k < sp.fragments.size(); ++k) {
    const auto p = static_cast<size_t>(sp.fragments[k]);
    sp.local[p] = static_cast<int64_t>(k);
    Fragment f = plan.fragments[p];
    f.id = static_cast<int64_t>(k);
    sp.local_fragments.push_back(f);
    const FlatLayout& L = plan.fragment_layouts[p];
    sp.fragment_layouts.push_back(L);
    for (size_t i = 0; i < L.names.size(); ++i) {
      sp.model.names.push_back(L.names[i]);
      sp.model.shapes.push_back(L.shapes[i]);
      sp.model.offsets.push_back(sp.model.elements + L.offsets[i]);
    }
    sp.model.elements += L.elements;
  }
  if (S == 1) sp.model = plan.model;  // unsharded: the whole model in model order, the layout of plan_model
  return sp;
}

}  // namespace deloco
