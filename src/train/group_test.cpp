// Learner groups (deloco/group.h) on the real c10d Gloo process group over a real TCPStore, the ranks as threads
// of this process (the process-level cluster is tested in src/cli/run_cli_test.cpp).
#include "deloco/group.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <future>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/config.h"
#include "deloco/gpt/train.h"

namespace deloco {
namespace group_cases {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::shared_ptr<const Corpus> corpus() {
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) {
    std::string d;
    for (int k = 0; k < 50; ++k) d += "a learner of many ranks " + std::to_string(i * 7 + k) + " trains as one. ";
    docs.push_back(d);
  }
  return std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.05));
}

RunConfig tiny(int64_t batch) {
  RunConfig c;
  c.model.block_size = 16;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.train.batch_size = batch;
  c.train.steps = 20;
  c.train.warmup_steps = 2;
  c.train.lr = 3e-3;
  c.train.eval_tokens = 256;
  c.train.precision = "fp32";  // not auto: the references are float32 on every machine
  return c;
}

// Runs fn(rank, group) on `size` threads that form one group; returns when all are done (rethrowing).
template <class Fn>
void as_group(int64_t size, Fn fn) {
  const int port = free_port();
  std::vector<std::future<void>> ranks;
  for (int64_t r = 0; r < size; ++r)
    ranks.push_back(std::async(std::launch::async, [=] {
      GroupOptions o;
      o.rank = r;
      o.size = size;
      o.master_port = port;
      o.timeout_seconds = 60;
      fn(r, LearnerGroup::connect(o));
    }));
  for (auto& f : ranks) f.get();
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// The equivalence: one learner of 2 ranks with batch b each trains like one rank with batch 2b.
TEST(LearnerGroup, TwoRanksOfBatchBMatchOneRankOfBatch2B) {
  auto data = corpus();
  Trainer single(tiny(8), data);
  for (int i = 0; i < 10; ++i) single.train_step();

  std::vector<std::vector<at::Tensor>> got(2);
  std::vector<int64_t> tokens(2);
  // Built here, one after the other: model initialisation draws from libtorch's global generator.
  std::vector<std::unique_ptr<Trainer>> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(std::make_unique<Trainer>(tiny(4), data));
  as_group(2, [&](int64_t r, std::shared_ptr<LearnerGroup> g) {
    Trainer& t = *ranks[static_cast<size_t>(r)];
    t.join_group(g);
    for (int i = 0; i < 10; ++i) tokens[r] += t.inner_step().tokens;
    for (auto& [n, p] : t.parameters()) got[r].push_back(p.detach().clone());
  });
  EXPECT_EQ(tokens[0], 10 * 8 * 16);  // the group's tokens, counted once per step
  // Within 1e-5 (the bound) element by element, and 1e-6 of the whole model's norm: only the order of the
  // float additions differs (two means of b rows averaged, against one mean of 2b rows).
  const auto& want = single.parameters();
  double diff2 = 0, norm2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(max_abs_diff(got[0][i], want[i].second), 1e-5) << want[i].first;
    EXPECT_TRUE(torch::equal(got[0][i], got[1][i])) << want[i].first << ": the replicas drifted apart";
    diff2 += (got[0][i] - want[i].second).pow(2).sum().item<double>();
    norm2 += want[i].second.pow(2).sum().item<double>();
  }
  EXPECT_LE(std::sqrt(diff2 / norm2), 1e-6);
  // And it did train: the parameters moved from their initial values.
  Trainer fresh(tiny(8), data);
  EXPECT_GT((want[0].second - fresh.parameters()[0].second).abs().max().item<double>(), 1e-4);
}

// Small buckets: many all-reduces launched during backward, in one order on both ranks; same result.
TEST(LearnerGroup, ManySmallBucketsGiveTheSameGradients) {
  auto data = corpus();
  Trainer single(tiny(8), data);
  for (int i = 0; i < 3; ++i) single.train_step();
  std::vector<at::Tensor> got;
  int64_t n_buckets = 0;
  std::vector<std::unique_ptr<Trainer>> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(std::make_unique<Trainer>(tiny(4), data));
  as_group(2, [&](int64_t r, std::shared_ptr<LearnerGroup> g) {
    Trainer& t = *ranks[static_cast<size_t>(r)];
    auto sync = g->gradient_sync(t.parameters(), 0.004);  // ~4 KB buckets, next to the trainer's own
    if (r == 0) n_buckets = sync->buckets();
    sync.reset();
    t.join_group(g);
    for (int i = 0; i < 3; ++i) t.train_step();
    if (r == 0)
      for (auto& [n, p] : t.parameters()) got.push_back(p.detach().clone());
  });
  EXPECT_GT(n_buckets, 5);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_LE(max_abs_diff(got[i], single.parameters()[i].second), 1e-5);
}

// The driver protocol: the first boundary sends everything (parameters, optimizer state, step); later ones only
// what rank 0 says changed; stop ends follow().
TEST(LearnerGroup, FollowersMirrorWhatRank0ChangesAndStopWhenTold) {
  auto data = corpus();
  std::vector<std::vector<at::Tensor>> params(2), moments(2);
  std::vector<int64_t> steps(2), followed(2);
  std::vector<std::unique_ptr<Trainer>> ranks;
  for (int r = 0; r < 2; ++r) {
    RunConfig c = tiny(4);
    c.train.seed = 1000 + r;  // different initial weights: joining (and the first boundary) must overwrite them
    ranks.push_back(std::make_unique<Trainer>(c, data));
  }
  as_group(2, [&](int64_t r, std::shared_ptr<LearnerGroup> g) {
    Trainer& t = *ranks[static_cast<size_t>(r)];
    if (r == 0) {
      t.train_step();  // alone, before joining: moments exist and the step differs before the first boundary
      t.set_step(5);
      t.join_group(g);
      g->lead(LearnerGroup::Command::kStep, t, {});
      t.inner_step();
      {
        torch::NoGradGuard ng;
        t.parameters()[1].second.add_(0.5);  // a merged fragment applied on rank 0
      }
      g->lead(LearnerGroup::Command::kStep, t, {t.parameters()[1].first});
      t.inner_step();
      g->lead(LearnerGroup::Command::kStop, t, {});
    } else {
      t.join_group(g);
      followed[r] = g->follow(t);
    }
    steps[r] = t.step();
    for (auto& [n, p] : t.parameters()) params[r].push_back(p.detach().clone());
    for (auto& [k, v] : t.optimizer_state()) moments[r].push_back(v);
  });
  EXPECT_EQ(followed[1], 2);
  EXPECT_EQ(steps[0], 7);
  EXPECT_EQ(steps[1], 7);
  for (size_t i = 0; i < params[0].size(); ++i) EXPECT_TRUE(torch::equal(params[0][i], params[1][i])) << i;
  ASSERT_EQ(moments[0].size(), moments[1].size());
  for (size_t i = 0; i < moments[0].size(); ++i) EXPECT_TRUE(torch::equal(moments[0][i], moments[1][i])) << i;
}

TEST(LearnerGroup, OptionsComeFromTorchrunsEnvironmentAndBadOnesAreNamed) {
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("MASTER_ADDR", "10.0.0.7", 1);
  ::setenv("MASTER_PORT", "29611", 1);
  ::unsetenv("LOCAL_RANK");
  GroupOptions o = GroupOptions::from_environment({});
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.size, 4);
  EXPECT_EQ(o.local_rank, 0);
  EXPECT_EQ(o.master_addr, "10.0.0.7");
  EXPECT_EQ(o.master_port, 29611);
  EXPECT_EQ(o.validate(), "");
  o.rank = 4;
  EXPECT_NE(o.validate().find("rank 4 is not in [0, 4)"), std::string::npos) << o.validate();
  ::setenv("MASTER_PORT", "http", 1);
  try {
    GroupOptions::from_environment({});
    ADD_FAILURE() << "a non-numeric MASTER_PORT was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT='http'"), std::string::npos) << e.what();
  }
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
}

}  // namespace
}  // namespace deloco
