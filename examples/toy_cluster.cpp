// examples/toy_cluster.cpp — deloco's algorithm core embedded in a program of your own: no GPT, no network, no
// files. Three learners train their own tensors on their own objective; the syncer merges their outer gradients.
//
// Each learner m minimises ‖w − A_m‖² + ‖b − c_m‖² by plain gradient descent (its "inner steps"), so alone it would
// go to its own target; the merged global model must go to the average target (Ā, c̄), the minimiser of the sum.
// The program drives both halves of deloco's core exactly as deloco's own drivers do:
//   learner: LearnerCore::after_step → pushes (int8 outer gradients with error feedback) → decode_push for the syncer
//   syncer:  Syncer::receive → on_round: decide, merge, the new Θ_p flat (quorum K = 3 of 3, the "diloco" preset:
//            mean + Nesterov)
//   back:    the merged fragment → LearnerCore::receive → apply_due at the next boundary
// Build it in-tree (target example_toy_cluster) or against an installed deloco (examples/CMakeLists.txt:
// find_package(deloco) and link deloco::deloco). Exit status 0 when the global model reached the average target.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "deloco/algorithm.h"
#include "deloco/learner.h"
#include "deloco/sync.h"

using deloco::AlgorithmConfig;

int main() {
  torch::manual_seed(0);
  const int64_t M = 3, steps = 600;
  AlgorithmConfig algo;
  algo.sync.learners = M;
  algo.sync.quorum = M;       // synchronous: every merge holds all three (see the note at the end)
  algo.sync.fragments = 2;    // w and b travel separately, staggered
  algo.sync.sync_every = 10;  // H
  algo.sync.wait_for_answer = false;
  algo.merge.preset = "diloco";
  algo.encoding = "int8";
  algo.resolve();  // the preset's outer η and μ
  algo.validate();

  // Each learner's own tensors and target.
  struct Learner {
    std::vector<std::pair<std::string, at::Tensor>> params;
    at::Tensor target_w, target_b;
    std::unique_ptr<deloco::LearnerCore> core;
  };
  std::vector<Learner> learners(M);
  const at::Tensor w0 = torch::zeros({16, 16}), b0 = torch::zeros({16});
  for (auto& L : learners) {
    L.params = {{"w", w0.clone()}, {"b", b0.clone()}};
    L.target_w = torch::randn({16, 16});
    L.target_b = torch::randn({16});
  }
  at::Tensor mean_w = torch::zeros({16, 16}), mean_b = torch::zeros({16});
  for (auto& L : learners) {
    mean_w += L.target_w / M;
    mean_b += L.target_b / M;
  }

  // The model plan: the fragments and their flat layouts, the same on every side.
  const deloco::ModelPlan plan = deloco::plan_model(learners[0].params, algo.sync.fragments, algo.sync.sync_every);
  deloco::Syncer syncer(algo.sync, plan.fragments, {{"w", w0}, {"b", b0}}, algo.merge_plan(), algo.outer);
  for (int64_t m = 0; m < M; ++m) {
    learners[m].core = std::make_unique<deloco::LearnerCore>(algo.sync, plan, learners[m].params, steps,
                                                             algo.push_encoding(), algo.error_feedback);
    syncer.note_joined(m);
  }

  const double inner_lr = 0.05;
  double t = 0;  // the caller's clock: here one tick per round of inner steps
  for (int64_t step = 1; step <= steps; ++step, t += 1) {
    for (int64_t m = 0; m < M; ++m) {
      Learner& L = learners[m];
      L.core->apply_due(step - 1);  // answers whose time has come
      {
        torch::NoGradGuard ng;  // one inner step of gradient descent on ‖θ − target‖²
        L.params[0].second.sub_(2 * inner_lr * (L.params[0].second - L.target_w));
        L.params[1].second.sub_(2 * inner_lr * (L.params[1].second - L.target_b));
      }
      for (const deloco::Push& p : L.core->after_step(step, /*tokens=*/100, /*seconds=*/1.0)) {
        // What a syncer node does with a fragment_push: decode the payload, hand it to the core.
        deloco::Contribution c = deloco::decode_push(m, p, plan.fragment_layouts[p.fragment]);
        const deloco::SyncReject why = syncer.receive(t, std::move(c));
        if (why != deloco::SyncReject::kNone) std::printf("rejected: %s\n", deloco::sync_reject_name(why));
        // The round (no grace window here: a merge happens at once or not at all, so no timer to arm).
        const deloco::RoundResult r = syncer.on_round(t, p.fragment);
        if (!r.merged()) continue;
        // Broadcast: every learner receives the new Θ_p (flat fp32).
        for (auto& other : learners) other.core->receive(p.fragment, r.outcome.version, r.flat);
      }
    }
    if (step % 100 == 0) {
      const double dist = std::sqrt((syncer.global()[0].second - mean_w).pow(2).sum().item<double>() +
                                    (syncer.global()[1].second - mean_b).pow(2).sum().item<double>());
      std::printf("step %4lld  merges %3lld  ‖Θ − average target‖ = %.5f\n", static_cast<long long>(step),
                  static_cast<long long>(syncer.version(0) + syncer.version(1)), dist);
    }
  }
  const double dist = std::sqrt((syncer.global()[0].second - mean_w).pow(2).sum().item<double>() +
                                (syncer.global()[1].second - mean_b).pow(2).sum().item<double>());
  const double start = std::sqrt(mean_w.pow(2).sum().item<double>() + mean_b.pow(2).sum().item<double>());
  std::printf("global model: distance to the average target %.5f (from %.3f); %lld contributions merged\n", dist,
              start, static_cast<long long>(syncer.merged_contributions()));
  // Why not K = 2 here: this loop steps the learners in lockstep, so with K = 2 the third learner always receives
  // the merge of the other two just before its own fragment is due and sends one step of progress, which token
  // weighting (rightly) all but ignores; the global model then settles near the other two learners' average.
  return dist < 0.05 * start ? 0 : 1;
}
