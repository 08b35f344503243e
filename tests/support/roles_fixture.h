// tests/support/roles_fixture.h — what the roles tests that run a real syncer and learner nodes in one process
// share: a tiny synthetic corpus, the tiny runtime config they start from, and scope guards that end the node
// threads however a test leaves its scope (a failed ASSERT included).
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "deloco/gpt/data.h"
#include "deloco/runtime.h"

namespace deloco::testing {

// 20 documents of one repeated letter each plus a few words; 10% held out.
inline std::shared_ptr<const Corpus> letters_corpus() {
  static std::shared_ptr<const Corpus> c = [] {
    std::vector<std::string> docs;
    for (int i = 0; i < 20; ++i) docs.push_back(std::string(2000, static_cast<char>('a' + i % 26)) + " words and more words");
    return std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.1));
  }();
  return c;
}

// A 1-layer GPT of width 32 on 16-token contexts, 2 learners, quorum 1, 2 fragments, H = 4, the decoupled merge,
// plaintext, heartbeats every 0.2 s, the syncer in dir/syncer without periodic checkpoints, evaluations or metrics.
// Each test sets what it is about (steps, liveness, chunk sizes, ...) on top.
inline RuntimeConfig tiny_runtime_config(const std::filesystem::path& dir) {
  RuntimeConfig cfg;
  cfg.run.model.block_size = 16;
  cfg.run.model.n_layer = 1;
  cfg.run.model.n_head = 2;
  cfg.run.model.n_embd = 32;
  cfg.run.train.batch_size = 2;
  cfg.run.train.precision = "fp32";  // not auto: the references are float32 on every machine
  cfg.run.train.eval_tokens = 128;
  cfg.run.train.threads = 1;
  cfg.sync.learners = 2;
  cfg.sync.quorum = 1;
  cfg.sync.fragments = 2;
  cfg.sync.sync_every = 4;
  cfg.merge.preset = "decoupled";
  cfg.net.plaintext = true;
  cfg.net.heartbeat = 0.2;
  cfg.syncer.out_dir = (dir / "syncer").string();
  cfg.syncer.checkpoint_every = 0;
  cfg.syncer.eval_interval = 0;
  cfg.syncer.metrics = "";
  return cfg;
}

// Ends a syncer's run thread: sets `stop`, joins.
struct StopOnExit {
  std::atomic<bool>* stop;
  std::thread* t;
  ~StopOnExit() {
    stop->store(true);
    if (t->joinable()) t->join();
  }
};

// Joins a thread that ends by itself (a learner node's run).
struct JoinOnExit {
  std::thread* t;
  ~JoinOnExit() {
    if (t->joinable()) t->join();
  }
};

}  // namespace deloco::testing
