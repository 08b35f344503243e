// The shared algorithm configuration and the table of presets (deloco/algorithm.h).
#include "deloco/algorithm.h"

#include <cmath>
#include <limits>

#include "deloco/config.h"
#include "deloco/gpt/config.h"
#include "wire/sparse.h"

namespace deloco {

namespace {
AlgorithmPreset make(const std::string& name, MergePlan plan, const std::string& kind, double lr, double mu) {
  AlgorithmPreset p;
  p.name = name;
  p.plan = std::move(plan);
  p.outer.kind = kind;
  p.outer.lr = lr;
  p.outer.momentum = mu;
  return p;
}
AlgorithmPreset with_inner(AlgorithmPreset p, const std::string& inner) {
  p.inner = inner;
  return p;
}
MergePlan method_plan(const std::string& method) {
  MergePlan p;
  p.method = method;
  return p;
}
}  // namespace

const std::vector<AlgorithmPreset>& algorithm_presets() {
  static const std::vector<AlgorithmPreset> table = {
      make("diloco", MergePlan::preset("diloco"), "nesterov", 0.7, 0.9),
      make("decoupled", MergePlan::preset("decoupled"), "nesterov", 0.7, 0.9),
      make("isoloco", MergePlan::preset("isoloco"), "nesterov", 1.8, 0.8),
      make("iso_c_sgd", method_plan("iso_c"), "sgd", 2.1, 0.0),
      make("iso_cts", method_plan("iso_cts"), "nesterov", 3.1, 0.8),
      make("tsv", method_plan("tsv"), "nesterov", 0.6, 0.8),
      make("ties", method_plan("ties"), "nesterov", 0.7, 0.8),
      make("dare", method_plan("dare"), "nesterov", 1.5, 0.8),
      // MuLoCo (Thérien et al., 2025): DiLoCo's averaging and Nesterov outer step (DiLoCo's 0.7 / 0.9, where the
      // paper's sweeps start) over learners that train with Muon.
      with_inner(make("muloco", MergePlan::preset("diloco"), "nesterov", 0.7, 0.9), "muon"),
  };
  return table;
}

const AlgorithmPreset& algorithm_preset(const std::string& name) {
  std::string known;
  for (const auto& p : algorithm_presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw ConfigError("merge.preset '" + name + "' is not a preset (known: " + known + ")");
}

void resolve_inner_optimizer(TrainConfig& train, const std::string& preset) {
  if (train.optimizer == "auto") train.optimizer = algorithm_preset(preset).inner;
}

OuterOptions AlgorithmConfig::unresolved_outer() {
  OuterOptions o;
  o.kind = "";
  o.lr = std::numeric_limits<double>::quiet_NaN();
  o.momentum = std::numeric_limits<double>::quiet_NaN();
  return o;
}

void AlgorithmConfig::resolve() {
  const AlgorithmPreset& p = algorithm_preset(merge.preset);
  if (outer.kind.empty()) outer.kind = p.outer.kind;
  if (std::isnan(outer.lr)) outer.lr = p.outer.lr;
  if (std::isnan(outer.momentum)) outer.momentum = p.outer.momentum;
}

void AlgorithmConfig::bind(ConfigSchema& s) {
  sync.bind(s);
  merge.bind(s, MergeConfig::Use::kTraining);
  // outer.kind's check resolves the preset's outer optimizer first (merge.preset's check has named a bad preset by
  // then), so the checks of outer.* see final values.
  auto outer_check = [this] {
    try {
      resolve();
    } catch (const ConfigError&) {
      return std::string();
    }
    try {
      outer.validate();
      return std::string();
    } catch (const OuterError& e) {
      return "outer: " + std::string(e.what());
    }
  };
  s.bind("outer.kind", &outer.kind,
         "sgd | nesterov | delayed_nesterov (Liu et al.: g/N per merge, the momentum once every N) | "
         "delayed_nesterov_whole (the whole g per merge) (default: the preset's)",
         outer_check);
  s.bind("outer.delay", &outer.delay, "N of the delayed kinds: the momentum changes once every N merges of a tensor");
  s.bind("outer.delay_momentum", &outer.delay_momentum,
         "c of the delayed kinds: the share of the momentum each merge in between applies (delayed_nesterov: "
         "[0, 1/N]; delayed_nesterov_whole: [0, 1])");
  s.bind("outer.lr", &outer.lr, "outer learning rate eta (default: the preset's)");
  s.bind("outer.momentum", &outer.momentum, "outer momentum mu (default: the preset's)");
  // The names a user writes: a dense float encoding, topk (its values' code from net.topk_bits / net.topk_values, its
  // density and chunks from net.topk_density / net.topk_chunk) or auto. The wire's own names of the sparse codes
  // (topk8, topk4, topk2, topk2b) and raw are not settings: they would skip those options (and, for the broadcast,
  // the delta against the learner's version, sending whole fragments with ~97 % of their entries zero).
  auto float_encoding = [](const std::string* v, const char* key) {
    return [v, key] {
      const std::string want = std::string(key) + " must be fp32, bf16, int8, int4, int2, topk or auto (got '" + *v + "')";
      if (*v == "topk" || *v == "auto") return std::string();
      Encoding e = Encoding::kRaw;
      try {
        e = parse_encoding(*v);
      } catch (const std::exception&) {
        return want;
      }
      if (is_sparse(e)) return want + ": a sparse code is chosen by " + key + " = \"topk\" and net.topk_bits / net.topk_values";
      if (e == Encoding::kRaw) return want;
      return std::string();
    };
  };
  s.bind("net.encoding", &encoding,
         "fragment push (outer gradient) encoding: fp32 | bf16 | int8 | int4 | int2 | topk | auto (per learner, "
         "fitted to its link's measured rate: docs/runtime.md)",
         float_encoding(&encoding, "net.encoding"));
  s.bind("net.broadcast_encoding", &broadcast_encoding,
         "merged fragment encoding: fp32 | bf16 | int8 | int4 | int2 | topk (a sparse delta against the learner's version) "
         "| auto (a delta, its codec fitted to the slowest learner link: docs/runtime.md)",
         float_encoding(&broadcast_encoding, "net.broadcast_encoding"));
  s.bind("net.error_feedback", &error_feedback, "carry the quantization residual to the next push");
  s.bind("net.error_feedback_decay", &error_feedback_decay,
         "beta in (0, 1]: the carried residual is scaled by it before it joins the next push (e <- beta*e + delta, "
         "SparseLoCo's accumulator, which takes the outer momentum's place; 1: classic error feedback)",
         [this] {
           return error_feedback_decay > 0 && error_feedback_decay <= 1
                      ? std::string()
                      : "net.error_feedback_decay must be in (0, 1] (got " + std::to_string(error_feedback_decay) + ")";
         });
  s.bind("net.topk_bits", &topk_bits, "bits per kept value of a topk payload: 2 | 4 | 8", [this] {
    return topk_bits == 2 || topk_bits == 4 || topk_bits == 8
               ? std::string()
               : "net.topk_bits must be 2, 4 or 8 (got " + std::to_string(topk_bits) + ")";
  });
  s.bind("net.topk_values", &topk_values,
         "how a topk payload's 2-bit values are coded: absmax (-s, 0, +s per 64 values, s the largest magnitude) | "
         "bins (SparseLoCo's: four bins over +-3 sigma of each block of 1024 kept values, each decoded as the mean of "
         "its values; needs net.topk_bits = 2)",
         [this] {
           return topk_values == "absmax" || topk_values == "bins"
                      ? std::string()
                      : "net.topk_values must be absmax or bins (got '" + topk_values + "')";
         });
  s.bind("net.topk_density", &topk_density, "fraction of a topk push's entries kept, in (0, 1]", [this] {
    return topk_density > 0 && topk_density <= 1
               ? std::string()
               : "net.topk_density must be in (0, 1] (got " + std::to_string(topk_density) + ")";
  });
  s.bind("net.topk_chunk", &topk_chunk, "top-k per chunk of this many elements (0: over the whole fragment)", [this] {
    return topk_chunk >= 0 ? std::string()
                           : "net.topk_chunk must be >= 0 (got " + std::to_string(topk_chunk) + ")";
  });
  s.bind("net.broadcast_delta", &broadcast_delta,
         "send each merged fragment as its change against the version the learner holds, in "
         "net.broadcast_encoding, with the residual carried to the next merge (topk: always)");
  s.bind("net.broadcast_topk_bits", &broadcast_topk_bits,
         "bits per kept value of a topk broadcast: 2 | 4 | 8 (0: net.topk_bits). SparseLoCo's exchange, where every "
         "learner gets the others' sparse pushes whole, is a topk broadcast that keeps every entry the merge changed "
         "(net.broadcast_topk_density = learners x net.topk_density) at 8 bits, its rest carried to the next merge",
         [this] {
           return broadcast_topk_bits == 0 || broadcast_topk_bits == 2 || broadcast_topk_bits == 4 ||
                          broadcast_topk_bits == 8
                      ? std::string()
                      : "net.broadcast_topk_bits must be 0, 2, 4 or 8 (got " + std::to_string(broadcast_topk_bits) + ")";
         });
  s.bind("net.auto_coarsest", &auto_coarsest,
         "the coarsest codec net.encoding / net.broadcast_encoding = auto may fit before the sync period stretches: "
         "int4 | int2 | topk (then int2 too; top-k with the net.topk_* / net.broadcast_topk_* options): "
         "docs/runtime.md",
         [this] {
           return auto_coarsest == "int4" || auto_coarsest == "int2" || auto_coarsest == "topk"
                      ? std::string()
                      : "net.auto_coarsest must be int4, int2 or topk (got '" + auto_coarsest + "')";
         });
  s.bind("net.broadcast_topk_density", &broadcast_topk_density,
         "fraction of a topk broadcast's entries kept, in (0, 1] (0: net.topk_density)", [this] {
           return broadcast_topk_density >= 0 && broadcast_topk_density <= 1
                      ? std::string()
                      : "net.broadcast_topk_density must be in [0, 1] (got " +
                            std::to_string(broadcast_topk_density) + ")";
         });
}

namespace {
Codec codec_of(const std::string& name, int64_t bits, double density, int64_t chunk, bool bins) {
  // auto (sync/codec_fit.h): int4 until the link is measured (kAutoStart there).
  if (name == "auto") return Codec(Encoding::kInt4);
  if (name != "topk") return Codec(parse_encoding(name));
  if (bits != 2 && bits != 4 && bits != 8)
    throw ConfigError("net.topk_bits must be 2, 4 or 8 (got " + std::to_string(bits) + ")");
  TopkOptions t;
  t.density = density;
  t.chunk = chunk;
  try {
    validate_topk(t);
  } catch (const WireError& e) {
    throw ConfigError(e.what());
  }
  return Codec(bits == 2 ? (bins ? Encoding::kTopk2b : Encoding::kTopk2) : bits == 4 ? Encoding::kTopk4 : Encoding::kTopk8,
               t);
}
}  // namespace

namespace {
// A push codec named `name` with the net.topk_* options; a broadcast one with net.broadcast_topk_* (0: net.topk_*).
Codec push_codec_named(const AlgorithmConfig& c, const std::string& name) {
  return codec_of(name, c.topk_bits, c.topk_density, c.topk_chunk, c.topk_values == "bins");
}
Codec answer_codec_named(const AlgorithmConfig& c, const std::string& name) {
  return codec_of(name, c.broadcast_topk_bits > 0 ? c.broadcast_topk_bits : c.topk_bits,
                  c.broadcast_topk_density > 0 ? c.broadcast_topk_density : c.topk_density, c.topk_chunk,
                  c.topk_values == "bins");
}
}  // namespace

Codec AlgorithmConfig::push_codec() const { return push_codec_named(*this, encoding); }
Codec AlgorithmConfig::answer_codec() const { return answer_codec_named(*this, broadcast_encoding); }
Codec AlgorithmConfig::push_topk_codec() const { return push_codec_named(*this, "topk"); }
Codec AlgorithmConfig::answer_topk_codec() const { return answer_codec_named(*this, "topk"); }

void AlgorithmConfig::validate() const {
  try {
    sync.validate();
  } catch (const SyncError& e) {
    throw ConfigError(e.what());
  }
  algorithm_preset(merge.preset);
  if (outer.kind.empty() || std::isnan(outer.lr) || std::isnan(outer.momentum))
    throw ConfigError("outer optimizer not resolved: call AlgorithmConfig::resolve() (or validate the schema) first");
  if (topk_values == "bins" && topk_bits != 2)
    throw ConfigError("net.topk_values = bins is SparseLoCo's 2-bit code: it needs net.topk_bits = 2 (got " +
                      std::to_string(topk_bits) + ")");
  try {
    outer.validate();
    MergeSelector sel(merge_plan());
    push_codec();
    answer_codec();
  } catch (const std::exception& e) {
    throw ConfigError(e.what());
  }
}

LearnerBudget learner_budget(const Workload& workload, int64_t learner, int64_t learners, int64_t total_steps,
                             int64_t ranks) {
  LearnerBudget b;
  b.tokens_per_step = workload.step_tokens(learner, learners) * ranks;
  b.total_steps = total_steps;
  return b;
}

}  // namespace deloco
