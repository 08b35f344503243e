// Checkpoints with tensors: the commit protocol of `deloco train` and the syncer (save_run_checkpoint) under a
// crash after every file operation, read back bit-exact through read_checkpoint and Trainer::restore; and the
// checkpoints of earlier deloco versions (manifest version 1, FNV-1a hashes of either basis) still load.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deloco/checkpoint.h"
#include "deloco/config.h"
#include "deloco/gpt/train.h"
#include "support/fault_file_ops.h"
#include "train/run_checkpoint.h"
#include "util/hash.h"

namespace deloco {
namespace checkpoint_cases {
namespace fs = std::filesystem;

std::shared_ptr<const Corpus> small_corpus() {
  std::vector<std::string> docs;
  for (int i = 0; i < 20; ++i) {
    std::string d;
    for (int k = 0; k < 40; ++k) d += "a checkpoint is a folder " + std::to_string(i * k) + " renamed into place. ";
    docs.push_back(d);
  }
  return std::make_shared<const Corpus>(Corpus::from_documents(docs, 0.05));
}

RunConfig tiny_run() {
  RunConfig c;
  c.model.block_size = 16;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.n_embd = 16;
  c.train.batch_size = 2;
  c.train.steps = 20;
  c.train.warmup_steps = 2;
  c.train.eval_tokens = 256;
  c.train.precision = "fp32";  // not auto: the references are float32 on every machine
  return c;
}

fs::path fresh_dir() {
  const fs::path d = fs::temp_directory_path() / ("deloco_cktest_" + std::to_string(::getpid()) + "_" +
                                                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

bool same(const TensorFile& a, const TensorFile& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [k, v] : a.tensors) {
    auto it = b.tensors.find(k);
    if (it == b.tensors.end() || it->second.scalar_type() != v.scalar_type() || !it->second.equal(v)) return false;
  }
  return true;
}

bool has_temporaries(const fs::path& run) {
  for (const auto& e : fs::recursive_directory_iterator(run)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp.") != std::string::npos || n[0] == '.') return true;
  }
  return false;
}

struct State {
  TensorFile model, opt;
};

// The trainer's state after `steps` steps, as `deloco train` checkpoints it.
State train_state(Trainer& tr) { return {parameters_to_file(tr.parameters()), tr.optimizer_file()}; }

// A syncer-like state: Θ and outer momentum of random values.
State syncer_state(int seed) {
  torch::manual_seed(seed);
  State s;
  s.model.tensors["wte.weight"] = torch::randn({7, 5});
  s.model.tensors["ln_f.bias"] = torch::randn({5});
  s.opt.tensors["momentum/wte.weight"] = torch::randn({7, 5});
  return s;
}

// The commit of `next` (after `before`, all with keep = 3) crashes after k operations for every k; the run folder
// then resumes (recovery, read_checkpoint of the run folder) from the previous state or the new one, bit-exact,
// with "latest" naming it and nothing temporary left.
void crash_every_operation(const std::vector<std::pair<std::string, State>>& before,
                           const std::pair<std::string, State>& next, const std::string& kind,
                           const std::function<void(const Checkpoint&, const State&)>& check_resume) {
  const fs::path root = fresh_dir();
  const fs::path base = root / "base";
  for (const auto& [name, st] : before) save_run_checkpoint(base.string(), name, {{"kind", kind}}, st.model, &st.opt, 3);
  const fs::path probe = root / "probe";
  fs::copy(base, probe, fs::copy_options::recursive);
  test::FaultFileOps counting(-1);
  save_run_checkpoint(probe.string(), next.first, {{"kind", kind}}, next.second.model, &next.second.opt, 3, counting);
  const int64_t N = counting.ops();
  ASSERT_GE(N, 13);
  for (int64_t k = 0; k <= N; ++k) {
    SCOPED_TRACE(kind + ": crash after " + std::to_string(k) + " of " + std::to_string(N) + " operations");
    const fs::path run = root / ("k" + std::to_string(k));
    fs::copy(base, run, fs::copy_options::recursive);
    test::FaultFileOps faulty(k);
    try {
      save_run_checkpoint(run.string(), next.first, {{"kind", kind}}, next.second.model, &next.second.opt, 3, faulty);
    } catch (const test::SimulatedCrash&) {
    }
    recover_run_folder(run.string());
    const Checkpoint ck = read_checkpoint(run.string(), /*with_optimizer=*/true);
    const std::string got = fs::path(ck.dir).filename().string();
    const State& want = got == next.first ? next.second : before.back().second;
    ASSERT_TRUE(got == next.first || got == before.back().first) << got;
    if (k == N) EXPECT_EQ(got, next.first);
    EXPECT_TRUE(same(ck.model, want.model));
    EXPECT_TRUE(same(ck.optimizer, want.opt));
    check_resume(ck, want);
    std::string latest = read_file((run / "latest").string());
    EXPECT_EQ(latest, got + "\n");
    EXPECT_FALSE(has_temporaries(run));
    fs::remove_all(run);
  }
  fs::remove_all(root);
}

TEST(Checkpoint, TrainCheckpointsSurviveACrashAfterEveryOperation) {
  const auto corpus = small_corpus();
  const RunConfig cfg = tiny_run();
  Trainer tr(cfg, corpus);
  std::vector<std::pair<std::string, State>> before;
  for (int s = 2; s <= 6; s += 2) {
    tr.train_step();
    tr.train_step();
    before.emplace_back("step_0000000" + std::to_string(s), train_state(tr));
  }
  tr.train_step();
  tr.train_step();
  const std::pair<std::string, State> next{"step_00000008", train_state(tr)};
  Trainer resumed(cfg, corpus);
  crash_every_operation(before, next, "train", [&](const Checkpoint& ck, const State& want) {
    resumed.restore(ck);  // what `deloco train --resume RUN` does
    EXPECT_TRUE(same(parameters_to_file(resumed.parameters()), want.model));
  });
}

TEST(Checkpoint, SyncerCheckpointsSurviveACrashAfterEveryOperation) {
  crash_every_operation({{"merges_00000002-r0000", syncer_state(1)}, {"merges_00000004-r0000", syncer_state(2)},
                         {"merges_00000004-r0001", syncer_state(3)}},
                        {"merges_00000006-r0001", syncer_state(4)}, "syncer",
                        [](const Checkpoint& ck, const State&) { EXPECT_EQ(ck.manifest["kind"], "syncer"); });
}

// Rewrites a checkpoint's manifest the way deloco wrote it before issue 11: version 1, no sequence, FNV-1a-64
// file hashes (`fnv` gives the basis) and a model fingerprint of the same basis.
void make_version_one(const fs::path& dir, const std::function<std::string(const std::string&)>& fnv,
                      const std::string& fingerprint) {
  auto m = nlohmann::json::parse(read_file((dir / "manifest.json").string()));
  m["version"] = 1;
  m.erase("sequence");
  m["model_fingerprint"] = fingerprint;
  for (auto& [name, rec] : m["files"].items()) {
    const std::string bytes = read_file((dir / name).string());
    rec = {{"bytes", bytes.size()}, {"fnv1a64", fnv(bytes)}};
  }
  std::ofstream(dir / "manifest.json") << m.dump(2);
}

TEST(Checkpoint, CheckpointsOfEarlierVersionsStillLoad) {
  const auto corpus = small_corpus();
  const RunConfig cfg = tiny_run();
  Trainer tr(cfg, corpus);
  tr.train_step();
  const fs::path root = fresh_dir();
  auto opt = tr.optimizer_file();
  // Before commit c2749d1: the short FNV basis for file hashes and the fingerprint; after it: the standard one.
  const auto short_fnv = [](const std::string& b) { return fnv1a64_short_basis_hex(b.data(), b.size()); };
  const auto std_fnv = [](const std::string& b) { return fnv1a64_hex(b.data(), b.size()); };
  struct Era {
    const char* name;
    std::function<std::string(const std::string&)> fnv;
    std::string fingerprint;
  };
  for (const Era& era : {Era{"short", short_fnv, model_fingerprint_short_basis(tr.parameters())},
                         Era{"standard", std_fnv, model_fingerprint(tr.parameters())}}) {
    SCOPED_TRACE(era.name);
    const fs::path dir = root / era.name;
    write_checkpoint(dir.string(), tr.position(), parameters_to_file(tr.parameters()), &opt);
    make_version_one(dir, era.fnv, era.fingerprint);
    const Checkpoint ck = read_checkpoint(dir.string(), true);
    EXPECT_EQ(ck.version, 1);
    Trainer again(cfg, corpus);
    EXPECT_NO_THROW(again.restore(ck));
    EXPECT_EQ(again.step(), 1);
    EXPECT_TRUE(same(parameters_to_file(again.parameters()), parameters_to_file(tr.parameters())));
    // Corruption is still caught.
    std::string model = read_file((dir / "model.safetensors").string());
    model[model.size() - 3] ^= 0x10;
    std::ofstream(dir / "model.safetensors", std::ios::binary) << model;
    try {
      read_checkpoint(dir.string(), false);
      ADD_FAILURE() << "a corrupt version 1 checkpoint was read";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos) << e.what();
    }
  }
  // A version 2 checkpoint must carry the standard fingerprint: the short one is another model there.
  write_checkpoint((root / "v2").string(), tr.position(), parameters_to_file(tr.parameters()), &opt);
  Checkpoint v2 = read_checkpoint((root / "v2").string(), true);
  EXPECT_EQ(v2.version, 2);
  EXPECT_EQ(v2.manifest["files"]["model.safetensors"]["hash"], "blake2b-256");
  EXPECT_FALSE(fingerprint_matches(v2, model_fingerprint_short_basis(tr.parameters()), model_fingerprint(tr.parameters()),
                                   tr.parameters()));
  fs::remove_all(root);
}

TEST(Checkpoint, RunFolderResolvesToTheNewestCommittedWhateverLatestSays) {
  const fs::path run = fresh_dir();
  const State a = syncer_state(1), b = syncer_state(2);
  save_run_checkpoint(run.string(), "step_00000010", {}, a.model, &a.opt, 3);
  save_run_checkpoint(run.string(), "step_00000020", {}, b.model, &b.opt, 3);
  std::ofstream(run / "latest") << "step_00000010\n";  // stale: a crash before the hint was rewritten
  EXPECT_TRUE(same(read_checkpoint(run.string(), false).model, b.model));
  fs::remove(run / "latest");  // missing: a crash before the first hint
  EXPECT_EQ(resolve_checkpoint(run.string()), (run / "checkpoints" / "step_00000020").string());
  EXPECT_TRUE(has_committed_checkpoint(run.string()));
  fs::remove_all(run / "checkpoints");
  std::ofstream(run / "latest") << "step_00000020\n";  // a hint naming nothing committed
  try {
    resolve_checkpoint(run.string());
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("no committed checkpoint"), std::string::npos) << e.what();
  }
  fs::remove_all(run);
}

}  // namespace
}  // namespace deloco
