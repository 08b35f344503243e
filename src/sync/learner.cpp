// The learner half of the algorithm core (deloco/learner.h): counters, due fragments, pushes of the outer gradient
// with error feedback, the τ answer rule, the wait rule, apply-and-reset, the step-time estimate.
#include "deloco/learner.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <torch/torch.h>

#include "sync/codec_fit.h"
#include "wire/quantize.h"

namespace deloco {

Contribution decode_push(int64_t learner, int64_t fragment, const FlatLayout& layout, Encoding encoding,
                         const void* payload, size_t bytes, int64_t base_version, int64_t c_steps, int64_t c_tokens,
                         double step_time, std::shared_ptr<const void> owner) {
  const size_t n = static_cast<size_t>(layout.elements);
  validate_floats(payload, bytes, encoding, n);  // the same errors as decoding
  Contribution c;
  c.learner = learner;
  c.fragment = fragment;
  c.encoded.encoding = encoding;
  c.encoded.elements = layout.elements;
  c.encoded.bytes = bytes;
  if (owner) {
    c.encoded.owner = std::move(owner);
    c.encoded.data = static_cast<const char*>(payload);
  } else {
    auto copy = std::make_shared<std::string>(static_cast<const char*>(payload), bytes);
    c.encoded.data = copy->data();
    c.encoded.owner = std::move(copy);
  }
  c.base_version = base_version;
  c.c_steps = c_steps;
  c.c_tokens = c_tokens;
  c.step_time = step_time;
  return c;
}

Contribution decode_push(int64_t learner, const Push& p, const FlatLayout& layout) {
  return decode_push(learner, p.fragment, layout, p.encoding, p.payload.data(), p.payload.size(), p.base_version,
                     p.c_steps, p.c_tokens, p.step_time);
}

LearnerCore::LearnerCore(const SyncOptions& opts, const ModelPlan& plan,
                         std::vector<std::pair<std::string, at::Tensor>> params, int64_t total_steps,
                         Codec push_codec, bool error_feedback, double error_feedback_decay)
    : opts_(opts),
      fragments_(plan.fragments),
      params_(std::move(params)),
      layouts_(plan.fragment_layouts),
      model_layout_(plan.model),
      total_steps_(total_steps),
      codec_(push_codec),
      codecs_(plan.fragments.size(), push_codec),
      error_feedback_(error_feedback),
      error_feedback_decay_(static_cast<float>(error_feedback_decay)) {
  if (!(error_feedback_decay > 0 && error_feedback_decay <= 1))
    throw SyncError("the error feedback decay (net.error_feedback_decay) must be in (0, 1] (got " +
                    std::to_string(error_feedback_decay) + ")");
  check_float_codec(codec_, "the push (net.encoding)");
  if (params_.size() != model_layout_.names.size() || layouts_.size() != fragments_.size())
    throw SyncError("the model plan describes " + std::to_string(model_layout_.names.size()) +
                    " parameter tensors, the learner has " + std::to_string(params_.size()));
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].first != model_layout_.names[i] || params_[i].second.sizes().vec() != model_layout_.shapes[i])
      throw SyncError("parameter " + std::to_string(i) + " '" + params_[i].first +
                      "' is not the model plan's (another name, order or shape)");
    by_name[params_[i].first] = i;
  }
  const size_t P = fragments_.size();
  for (const auto& f : fragments_) {
    std::vector<size_t> idx;
    for (const auto& n : f.names) {
      auto it = by_name.find(n);
      if (it == by_name.end()) throw SyncError("fragment " + std::to_string(f.id) + " names unknown tensor '" + n + "'");
      idx.push_back(it->second);
    }
    index_.push_back(std::move(idx));
  }
  c_steps_.assign(P, 0);
  c_tokens_.assign(P, 0);
  sent_at_.assign(P, -1);
  sent_base_.assign(P, -1);
  held_version_.assign(P, 0);
  sync_every_ = opts_.sync_every;
  theta_push_.assign(P, at::Tensor());
  overdue_.assign(P, false);
  c_steps_push_.assign(P, 0);
  c_tokens_push_.assign(P, 0);
  last_push_.assign(P, -1);
  pending_.assign(P, std::nullopt);
  residual_.resize(P);
  residual_before_.resize(P);
  held_.resize(P);
  for (size_t p = 0; p < P; ++p) {
    held_[p] = torch::empty({layouts_[p].elements}, torch::kFloat);
    std::vector<at::Tensor> ts;
    for (size_t i : index_[p]) ts.push_back(params_[i].second);
    flatten_into(ts, held_[p].data_ptr<float>());
  }
}

std::vector<Push> LearnerCore::after_step(int64_t step, int64_t tokens, double seconds) {
  acc_time_ += seconds;
  ++acc_steps_;
  for (size_t p = 0; p < fragments_.size(); ++p) {
    ++c_steps_[p];
    c_tokens_[p] += tokens;
  }
  std::vector<Push> out;
  // sync.final_round: the last step pushes nothing; every fragment's rest goes in the final round (final_pushes()).
  if (opts_.final_round && step >= total_steps_) return out;
  for (size_t p = 0; p < fragments_.size(); ++p) {
    // A stretched period (set_link_period) or dynamic local updates: due a period after the previous push.
    const int64_t period = std::max(sync_every_, link_period_);
    const bool since_last = (opts_.dynamic_local_updates || link_period_ > opts_.sync_every) && last_push_[p] >= 0;
    bool due = since_last ? step - last_push_[p] >= period : fragment_due(fragments_[p], step, opts_.sync_every);
    // The last step pushes what the schedule would leave behind, under the options that let it grow past H steps
    // (sync.apply = rebase keeps progress across answers; a stretched period): the final model gets it.
    if (step == total_steps_ && (opts_.apply == "rebase" || link_period_ > opts_.sync_every) && c_steps_[p] > 0 &&
        last_push_[p] != step)
      due = true;
    // sync.apply = rebase: a push that fell due while the previous one was unanswered goes as soon as the answer is
    // applied, not a whole period later (on a slow link the answers come about a period late).
    if (overdue_[p] && sent_at_[p] < 0 && c_steps_[p] > 0) due = true;
    if (!due) continue;
    // sync.apply = rebase: while its previous push is unanswered a fragment does not push again (its progress stays
    // in θ for the next one): a new push would carry the outstanding one's part a second time.
    if (opts_.apply == "rebase" && sent_at_[p] >= 0) {
      overdue_[p] = true;
      continue;
    }
    overdue_[p] = false;
    last_push_[p] = step;
    if (out.empty()) {  // the estimate that goes with this step's pushes
      last_step_time_ = acc_time_ / static_cast<double>(acc_steps_);
      acc_time_ = 0;
      acc_steps_ = 0;
    }
    out.push_back(make_push(p, step, /*final=*/false));
  }
  return out;
}

Push LearnerCore::make_push(size_t p, int64_t step, bool final) {
  Push push;
  push.fragment = static_cast<int64_t>(p);
  push.base_version = held_version_[p];
  push.c_steps = c_steps_[p];
  push.c_tokens = c_tokens_[p];
  push.step = step;
  push.step_time = step_time();
  const Codec& codec = codecs_[p];
  push.encoding = codec.encoding;
  push.elements = layouts_[p].elements;
  // Δ_p = Θ_p^v − θ_p, the outer gradient against the held version.
  std::vector<float> delta(static_cast<size_t>(layouts_[p].elements));
  std::vector<at::Tensor> ts;
  for (size_t i : index_[p]) ts.push_back(params_[i].second);
  flatten_into(ts, delta.data());
  if (opts_.apply == "rebase" && !final) {  // θ as pushed, and the counters then (apply())
    theta_push_[p] = torch::from_blob(delta.data(), {layouts_[p].elements}, torch::kFloat).clone();
    c_steps_push_[p] = c_steps_[p];
    c_tokens_push_[p] = c_tokens_[p];
  }
  const float* held = held_[p].data_ptr<float>();
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = held[i] - delta[i];
  // A residual left by a lossy codec goes out with the next push whatever its codec (fp32 sends it whole).
  if (error_feedback_ && (codec.encoding != Encoding::kFp32 || !residual_[p].empty())) {
    if (residual_[p].size() != delta.size()) residual_[p].assign(delta.size(), 0.0f);
    if (!final) residual_before_[p] = residual_[p];  // given back if the syncer refuses this push (refused())
    push.payload =
        quantize_with_error_feedback(delta.data(), residual_[p].data(), delta.size(), codec, error_feedback_decay_);
  } else {
    push.payload = encode_floats(delta.data(), delta.size(), codec);
  }
  push.final = final;
  if (!final) {
    sent_at_[p] = step;
    sent_base_[p] = held_version_[p];
  }
  return push;
}

std::vector<Push> LearnerCore::final_pushes(int64_t step) {
  std::vector<Push> out;
  if (!opts_.final_round || step < total_steps_) return out;
  for (size_t p = 0; p < fragments_.size(); ++p)
    if (sent_at_[p] < 0) out.push_back(make_push(p, step, /*final=*/true));
  return out;
}

std::vector<int64_t> LearnerCore::in_flight() const {
  std::vector<int64_t> out;
  for (size_t p = 0; p < fragments_.size(); ++p)
    if (sent_at_[p] >= 0) out.push_back(static_cast<int64_t>(p));
  return out;
}

std::vector<int64_t> LearnerCore::held_back_at_end(int64_t step) const {
  std::vector<int64_t> out;
  if (step < total_steps_ || opts_.final_round) return out;
  for (size_t p = 0; p < fragments_.size(); ++p)
    if (overdue_[p] && c_steps_[p] > 0) out.push_back(static_cast<int64_t>(p));
  return out;
}

void LearnerCore::set_sync_every(int64_t h) {
  if (h <= opts_.overlap || h > opts_.sync_every)
    throw SyncError("a learner's sync period must be in (sync.overlap=" + std::to_string(opts_.overlap) +
                    ", sync.sync_every=" + std::to_string(opts_.sync_every) + "] (got " + std::to_string(h) + ")");
  if (opts_.dynamic_local_updates) sync_every_ = h;
}

void LearnerCore::set_push_codec(int64_t fragment, const Codec& codec) {
  if (fragment < 0 || static_cast<size_t>(fragment) >= fragments_.size())
    throw SyncError("push codec for unknown fragment " + std::to_string(fragment));
  check_float_codec(codec, "the push (net.encoding)");
  codecs_[static_cast<size_t>(fragment)] = codec;
}

void LearnerCore::set_link_period(int64_t h) {
  if (h != 0 && (h < opts_.sync_every || h > kMaxLinkStretch * opts_.sync_every))
    throw SyncError("a learner's stretched sync period must be 0 or in [sync.sync_every=" +
                    std::to_string(opts_.sync_every) + ", " + std::to_string(kMaxLinkStretch) + " × that] (got " +
                    std::to_string(h) + ")");
  link_period_ = h;
}

void LearnerCore::receive(int64_t fragment, int64_t version, at::Tensor flat, int64_t covers) {
  const size_t p = static_cast<size_t>(fragment);
  if (fragment < 0 || p >= fragments_.size()) throw SyncError("answer for unknown fragment " + std::to_string(fragment));
  if (flat.numel() != layouts_[p].elements || flat.scalar_type() != at::kFloat || !flat.device().is_cpu())
    throw SyncError("answer for fragment " + std::to_string(fragment) + " has " + std::to_string(flat.numel()) +
                    " elements, the fragment " + std::to_string(layouts_[p].elements) + " (flat fp32 CPU expected)");
  if (version <= held_version_[p]) return;
  if (pending_[p] && pending_[p]->version >= version) return;
  pending_[p] = Answer{version, flat.contiguous(), covers};
}

int64_t LearnerCore::newest_version(int64_t fragment) const {
  const size_t p = static_cast<size_t>(fragment);
  if (fragment < 0 || p >= fragments_.size()) throw SyncError("unknown fragment " + std::to_string(fragment));
  return pending_[p] ? std::max(pending_[p]->version, held_version_[p]) : held_version_[p];
}

bool LearnerCore::receive_delta(int64_t fragment, int64_t version, const at::Tensor& delta, int64_t covers) {
  const size_t p = static_cast<size_t>(fragment);
  if (fragment < 0 || p >= fragments_.size()) throw SyncError("delta for unknown fragment " + std::to_string(fragment));
  if (delta.numel() != layouts_[p].elements || delta.scalar_type() != at::kFloat || !delta.device().is_cpu())
    throw SyncError("delta for fragment " + std::to_string(fragment) + " has " + std::to_string(delta.numel()) +
                    " elements, the fragment " + std::to_string(layouts_[p].elements) + " (flat fp32 CPU expected)");
  const int64_t newest = newest_version(fragment);
  if (version <= newest) return true;
  if (newest != version - 1) return false;
  const at::Tensor& base = pending_[p] && pending_[p]->version == newest ? pending_[p]->flat : held_[p];
  receive(fragment, version, add_delta(base, delta), covers);
  return true;
}

at::Tensor add_delta(const at::Tensor& base, const at::Tensor& delta) {
  if (base.numel() != delta.numel() || base.scalar_type() != at::kFloat || delta.scalar_type() != at::kFloat ||
      !base.device().is_cpu() || !delta.device().is_cpu())
    throw SyncError("add_delta: a delta of " + std::to_string(delta.numel()) + " elements for a base of " +
                    std::to_string(base.numel()) + " (flat fp32 CPU expected)");
  const at::Tensor bc = base.contiguous(), dc = delta.contiguous();
  at::Tensor flat = torch::empty({base.numel()}, torch::kFloat);
  const float* b = bc.data_ptr<float>();
  const float* d = dc.data_ptr<float>();
  float* out = flat.data_ptr<float>();
  for (int64_t i = 0; i < base.numel(); ++i) out[i] = b[i] + d[i];  // as Syncer::compress_version
  return flat;
}

bool LearnerCore::answers_push(size_t p) const {
  if (!pending_[p]) return false;
  if (sent_at_[p] < 0 || pending_[p]->covers < 0) return true;  // nothing outstanding, or an unmarked answer
  return pending_[p]->covers > sent_base_[p];
}

bool LearnerCore::answer_due(size_t p, int64_t step) const {
  const int64_t sent = sent_at_[p];
  return sent < 0 || step >= sent + opts_.overlap || step >= total_steps_;
}

void LearnerCore::apply(size_t p, int64_t version, const at::Tensor& flat, bool covers_push) {
  torch::NoGradGuard ng;
  if (opts_.apply == "rebase") {
    // θ ← Θ' + (θ − R). Answering the outstanding push: R = θ at the push, and the counters keep only what came after
    // it. Otherwise R = the version held, and a push still outstanding moves with the rest (Θ' − held added to its
    // θ), so that the answer to it later keeps exactly the progress after it.
    const bool answered = sent_at_[p] >= 0 && covers_push && theta_push_[p].defined();
    const at::Tensor shift = answered ? flat - theta_push_[p] : flat - held_[p];
    auto views = unflatten(shift, layouts_[p]);
    for (size_t i = 0; i < index_[p].size(); ++i) {
      at::Tensor& local = params_[index_[p][i]].second;
      local.add_(views[i].to(local.device(), local.scalar_type()));
    }
    if (answered) {
      c_steps_[p] -= c_steps_push_[p];
      c_tokens_[p] -= c_tokens_push_[p];
      theta_push_[p] = at::Tensor();
      sent_at_[p] = -1;
    } else if (sent_at_[p] >= 0 && theta_push_[p].defined()) {
      theta_push_[p] = theta_push_[p] + (flat - held_[p]);
    }
    held_[p] = flat;
    held_version_[p] = version;
    return;
  }
  auto views = unflatten(flat, layouts_[p]);
  for (size_t i = 0; i < index_[p].size(); ++i) {
    at::Tensor& local = params_[index_[p][i]].second;
    apply_global(local, views[i].to(local.device()), opts_.alpha);
  }
  held_[p] = flat;
  held_version_[p] = version;
  c_steps_[p] = 0;
  c_tokens_[p] = 0;
  sent_at_[p] = -1;
}

std::vector<Applied> LearnerCore::apply_due(int64_t step) {
  std::vector<Applied> done;
  for (size_t p = 0; p < fragments_.size(); ++p) {
    if (!pending_[p] || !answer_due(p, step)) continue;
    // Waiting for the merge of its own push, the learner keeps a newer Θ_p that lacks it (see the header): applied
    // now, its next push would be based one version behind and, anchored globally, carry the last update again.
    if (opts_.wait_for_answer && !answers_push(p)) continue;
    const bool covers = answers_push(p);
    Answer a = std::move(*pending_[p]);
    pending_[p].reset();
    apply(p, a.version, a.flat, covers);
    done.push_back({static_cast<int64_t>(p), a.version});
  }
  return done;
}

std::vector<int64_t> LearnerCore::waiting_for(int64_t step) const {
  std::vector<int64_t> w;
  if (!opts_.wait_for_answer) return w;
  for (size_t p = 0; p < fragments_.size(); ++p)
    if (sent_at_[p] >= 0 && answer_due(p, step) && !answers_push(p)) w.push_back(static_cast<int64_t>(p));
  return w;
}

void LearnerCore::install(const at::Tensor& flat_model, const std::vector<int64_t>& versions) {
  if (flat_model.numel() != model_layout_.elements || flat_model.scalar_type() != at::kFloat)
    throw SyncError("global state has " + std::to_string(flat_model.numel()) + " elements, the model " +
                    std::to_string(model_layout_.elements));
  if (versions.size() != fragments_.size())
    throw SyncError("global state lists " + std::to_string(versions.size()) + " fragment versions, the learner has " +
                    std::to_string(fragments_.size()) + " fragments");
  torch::NoGradGuard ng;
  const at::Tensor cpu = flat_model.to(torch::kCPU).contiguous();
  auto views = unflatten(cpu, model_layout_);
  for (size_t i = 0; i < params_.size(); ++i) params_[i].second.copy_(views[i]);
  for (size_t p = 0; p < fragments_.size(); ++p) {
    std::vector<at::Tensor> ts;
    for (size_t i : index_[p]) ts.push_back(views[i]);
    held_[p] = torch::empty({layouts_[p].elements}, torch::kFloat);
    flatten_into(ts, held_[p].data_ptr<float>());
    held_version_[p] = versions[p];
    c_steps_[p] = c_tokens_[p] = 0;
    residual_[p].clear();
    residual_before_[p].clear();
    last_push_[p] = -1;
    overdue_[p] = false;
  }
  forget_in_flight();
  acc_time_ = 0;
  acc_steps_ = 0;
  last_step_time_ = -1;
}

void LearnerCore::install_fragments(const std::vector<int64_t>& fragments, const at::Tensor& flat,
                                    const std::vector<int64_t>& versions) {
  int64_t elements = 0;
  for (int64_t p : fragments) {
    if (p < 0 || p >= static_cast<int64_t>(fragments_.size()))
      throw SyncError("a state names fragment " + std::to_string(p) + ", the learner has " +
                      std::to_string(fragments_.size()));
    elements += layouts_[static_cast<size_t>(p)].elements;
  }
  if (versions.size() != fragments.size())
    throw SyncError("a state of " + std::to_string(fragments.size()) + " fragments lists " +
                    std::to_string(versions.size()) + " versions");
  if (flat.numel() != elements || flat.scalar_type() != at::kFloat)
    throw SyncError("a state of " + std::to_string(fragments.size()) + " fragments has " +
                    std::to_string(flat.numel()) + " elements, they hold " + std::to_string(elements));
  torch::NoGradGuard ng;
  const at::Tensor cpu = flat.to(torch::kCPU).contiguous();
  int64_t off = 0;
  for (size_t k = 0; k < fragments.size(); ++k) {
    const auto p = static_cast<size_t>(fragments[k]);
    const int64_t n = layouts_[p].elements;
    held_[p] = cpu.narrow(0, off, n).clone();
    auto views = unflatten(held_[p], layouts_[p]);
    for (size_t j = 0; j < index_[p].size(); ++j) params_[index_[p][j]].second.copy_(views[j]);
    held_version_[p] = versions[k];
    c_steps_[p] = c_tokens_[p] = 0;
    residual_[p].clear();
    residual_before_[p].clear();
    last_push_[p] = -1;
    overdue_[p] = false;
    sent_at_[p] = -1;
    pending_[p].reset();
    off += n;
  }
}

void LearnerCore::forget_in_flight() {
  for (size_t p = 0; p < fragments_.size(); ++p) {
    sent_at_[p] = -1;
    pending_[p].reset();
  }
}

void LearnerCore::forget_in_flight(const std::vector<int64_t>& fragments) {
  for (int64_t p : fragments) {
    sent_at_.at(static_cast<size_t>(p)) = -1;
    pending_.at(static_cast<size_t>(p)).reset();
  }
}

void LearnerCore::refused(int64_t fragment) {
  if (fragment < 0 || fragment >= static_cast<int64_t>(fragments_.size()))
    throw SyncError("refused: fragment " + std::to_string(fragment) + " is not in [0, " +
                    std::to_string(fragments_.size()) + ")");
  const size_t p = static_cast<size_t>(fragment);
  // The refused push delivered nothing, and the next push carries its progress again (Θ^v − θ is cumulative): its
  // residual goes back to what it was before it, or the next push would also send what the codec left out of this one
  // a second time. Under wait_for_answer the outstanding push is the latest one (the next is due after send + τ);
  // without it a refusal may name an earlier push, so the residual is kept.
  if (opts_.wait_for_answer && sent_at_[p] >= 0 && residual_before_[p].size() == residual_[p].size())
    residual_[p] = residual_before_[p];
  sent_at_[p] = -1;
}

void LearnerCore::drop_drift(int64_t fragment) {
  refused(fragment);
  const size_t p = static_cast<size_t>(fragment);
  torch::NoGradGuard ng;
  auto views = unflatten(held_[p], layouts_[p]);
  for (size_t i = 0; i < index_[p].size(); ++i) {
    at::Tensor& local = params_[index_[p][i]].second;
    local.copy_(views[i].to(local.device()));
  }
  c_steps_[p] = 0;
  c_tokens_[p] = 0;
  std::fill(residual_[p].begin(), residual_[p].end(), 0.0f);
}

double LearnerCore::step_time() const {
  if (last_step_time_ >= 0) return last_step_time_;
  return acc_steps_ > 0 ? acc_time_ / static_cast<double>(acc_steps_) : 0.0;
}

}  // namespace deloco
