// goodput/goodput.h — the chip-scale chaos simulator behind `deloco goodput` (docs/goodput.md).
//
// A discrete-event model, no tensors. N chips are grouped in slices of S chips. Every chip is interrupted as a
// Poisson process with mean time between interruptions MTBI_chip, so a healthy slice fails at rate S/MTBI_chip
// and the whole job at rate (healthy slices)·S/MTBI_chip; the simulator draws the next failure for the job and
// then picks the failing slice uniformly among the healthy ones, so its cost grows with the number of failures,
// not with the number of chips. A failed slice is out for a repair time (exponential, log-normal or fixed).
//
// Schemes (each row of the result is one scheme at one chip count and learner count):
//  * kDataParallel — synchronous DP without elasticity: every slice position must hold a healthy slice; after a
//    failure the job stalls until the position is refilled (by a spare, or by the repaired slice) and then pays
//    a restart. learners = 1.
//  * kElasticDP — continues on the healthy slices after a down-scale reconfiguration; a repaired slice rejoins
//    with an up-scale reconfiguration. learners = 1.
//  * kDecoupledDiLoCo — M learners, each an elastic DP job on slices/M slice positions; global training
//    advances while at least K = max(1, ceil(quorum·M)) learners are running (not reconfiguring, ≥ 1 slice).
// Spare slices (ceil(spare_fraction·slices), shared by the whole job, a hot-spare pool) replace a failed slice
// after swap_minutes (at once when 0); repaired slices refill the groups first, then the pool. Spares are allocated
// chips, so they count in the goodput denominator; a spare on its way cannot fail.
//
// Further failure modes (all off by default, so the default table is the first model's; docs/goodput.md):
//  * interrupt granularity: a fraction reset_fraction of chip interrupts is a host reset that takes the slice out
//    for reset_minutes, not a repair (no spare is swapped in for it);
//  * correlated failures: a power/rack domain of domain_slices slices fails as a whole, each domain once per
//    domain_mtbf_days on average; its healthy slices (one learner's first) go to repair together;
//  * syncer failures (DiLoCo): the syncer fails once per syncer_mtbf_hours and is back after
//    syncer_restart_minutes, from its checkpoint; global training does not advance meanwhile;
//  * catch-up (DiLoCo): a learner that had lost every slice pays catchup_minutes (downloading the global model)
//    on top of the up-scale when it has one again;
//  * quorum_learners = K fixes the quorum at min(K, M) learners (K = 1 is the paper's main setting).
// Each random process has its own generator stream (common random numbers: changing a duration moves events,
// it does not redraw them), which keeps a fit's objective smooth.
//
// Metrics: goodput = useful chip-time / allocated chip-time (allocated = (slices + spares)·S chips × wall time);
// a running group of k slices does useful work at k·S·eff(k) chips, where eff(k) = 1 / (1 + cv·E[max of k
// standard normals]) is the synchronous-step straggler efficiency (per-slice step times 1 + cv·Z). Useful work
// counts only while global training advances. uptime = fraction of wall time in which global training advances.
// Both are measured after a warm-up (the job starts with every slice healthy) and averaged over seeds.
//
// Contract
//  * Inputs: GoodputParams, checked by validate_goodput(), which throws deloco::ConfigError naming the key for
//    non-positive counts or times, learner counts that do not divide a chip count's slices, chip counts that are
//    not whole slices, and absurd sizes (over 1e8 chips or 1e6 slices, 1024 learners, 1000 seeds, 10 years, or
//    more than 2e8 expected failures in one run). run_goodput() and simulate_once() validate first.
//  * Determinism: results depend only on the parameters and the seed, not on the thread count or the C++
//    standard library (own xoshiro256** generator and own sampling; the only library calls are <cmath>'s log,
//    exp, sqrt, cos and erfc, whose last-bit accuracy may differ between math libraries).
//  * The core does no I/O and reads no clock. All functions are reentrant; run_goodput() may start `threads`
//    worker threads and joins them before returning. Distinct calls may run concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deloco {

class ConfigSchema;

struct GoodputParams {
  std::vector<int64_t> chips{150000, 300000, 600000, 1200000, 2400000};  // N values (one table row each)
  std::vector<int64_t> learners{1, 2, 4, 8, 16};                         // M values for Decoupled DiLoCo
  int64_t slice_chips = 625;          // S: chips per slice (the failure and reconfiguration unit)
  double mtbi_chip_years = 1.0;       // MTBI of one chip
  double repair_hours = 1.0;          // mean time a failed slice is out
  std::string repair_dist = "lognormal";  // exponential | lognormal | fixed
  double repair_cv = 1.0;             // coefficient of variation of the log-normal repair time
  double restart_minutes = 10.0;      // DP: reload + recompute after the job is whole again
  double downscale_seconds = 30.0;    // elastic: reconfigure to drop a failed slice (or swap in a spare)
  double upscale_seconds = 30.0;      // elastic: reconfigure to admit a repaired slice
  double step_time_cv = 0.02;         // per-step step-time variation across slices (stragglers)
  double quorum = 0.5;                // DiLoCo: K = max(1, ceil(quorum·M))
  double spare_fraction = 0.0;        // spare slices = ceil(spare_fraction · slices)
  double swap_minutes = 0.0;          // time to swap a spare in for a failed slice (0 = at once)
  double reset_fraction = 0.0;        // share of interrupts that are a short host reset, not a repair
  double reset_minutes = 5.0;         // how long a reset takes the slice out
  int64_t domain_slices = 0;          // slices per correlated-failure domain (0 = no correlated failures)
  double domain_mtbf_days = 0.0;      // mean days between failures of one domain
  double syncer_mtbf_hours = 0.0;     // DiLoCo: mean hours between syncer failures (0 = never)
  double syncer_restart_minutes = 5.0;  // DiLoCo: syncer back from its checkpoint after this
  double catchup_minutes = 0.0;       // DiLoCo: extra time for a learner that lost every slice to rejoin
  bool repair_home = false;           // a repaired slice returns to the learner it failed from (else: the emptiest)
  int64_t quorum_learners = 0;        // DiLoCo: K = min(this, M) learners when > 0 (overrides quorum)
  double days = 30.0;                 // simulated time measured
  double warmup_hours = 12.0;         // simulated time discarded first
  int64_t seeds = 5;                  // independent runs per row (confidence intervals)
  int64_t seed = 1;                   // base seed
  int64_t threads = 0;                // worker threads; 0 = all hardware threads
  bool dp = true;                     // include DP without elasticity
  bool elastic_dp = true;             // include elastic DP
  bool diloco = true;                 // include Decoupled DiLoCo (one row per M)
};

// One key of the `goodput` config section: its name, help text and the reason for its default.
struct GoodputKeyDoc {
  std::string key;     // "goodput.chips"
  std::string help;
  std::string reason;  // why the default is what it is
};
const std::vector<GoodputKeyDoc>& goodput_key_docs();

// Binds every goodput.* key to `p` (which must outlive the schema), with per-key range checks.
void bind_goodput_config(ConfigSchema& schema, GoodputParams& p);
// Cross-field and range checks; throws ConfigError with a sentence naming the offending key.
void validate_goodput(const GoodputParams& p);

// What a valid `p` may still get wrong, as one sentence per problem ("" when none): a warm-up shorter than three
// mean repair times measures while the number of slices out for repair is still below its steady state (goodput
// reads too high, by ~9% of the slices in repair with a 24 h repair after 12 h).
std::string goodput_warnings(const GoodputParams& p);

enum class Scheme { kDataParallel, kElasticDP, kDecoupledDiLoCo };
const char* scheme_name(Scheme s);  // "dp", "elastic_dp", "diloco"

// One simulated run.
struct RunSpec {
  Scheme scheme = Scheme::kDataParallel;
  int64_t chips = 0;
  int64_t learners = 1;
};
struct RunResult {
  double goodput = 0;   // useful chip-time / allocated chip-time
  double uptime = 0;    // fraction of wall time global training advances
  int64_t failures = 0; // slice failures during the measured window
};
// `p` with the one run `spec` as its whole grid (chips, learners and which scheme): what validate_goodput checks a
// single run against (the slices divide among its learners, its expected failures), whatever `p`'s own grid says.
GoodputParams params_for_spec(const GoodputParams& p, const RunSpec& spec);
// Simulates one run with `seed`. Uses every model parameter of `p` except chips/learners/seeds/threads; validates
// params_for_spec(p, spec) first (ConfigError).
RunResult simulate_once(const GoodputParams& p, const RunSpec& spec, uint64_t seed);

// Runs every spec over p.seeds seeds (seed index s uses the same seed in every spec and every call) on p.threads
// threads: per spec, its runs in seed order. run_goodput()'s building block, so a spec's runs equal its row's.
// Every spec is validated first (params_for_spec; ConfigError naming the key); `p`'s chips and learners lists are
// not used.
std::vector<std::vector<RunResult>> simulate_specs(const GoodputParams& p, const std::vector<RunSpec>& specs);
// How many runs simulate_specs() has simulated in this process so far, over every thread and call (one per spec
// and seed). A diagnostic: lets a test count a caller's simulations without trusting the caller's own count.
int64_t goodput_runs_simulated();

struct GoodputRow {
  std::string scheme;
  int64_t chips = 0;
  int64_t slices = 0;
  int64_t spare_slices = 0;
  int64_t learners = 1;
  int64_t quorum = 1;       // K
  double goodput = 0, goodput_ci95 = 0;  // mean over seeds and the half-width of its 95% t-interval
  double uptime = 0, uptime_ci95 = 0;
  double failures = 0;      // mean slice failures per run
  int64_t seeds = 0;
};
// Runs every (chip count × scheme × M) row over `p.seeds` seeds. Rows are ordered by chip count, then DP,
// elastic DP, DiLoCo by increasing M (the order of p.learners).
std::vector<GoodputRow> run_goodput(const GoodputParams& p);

// Straggler efficiency 1 / (1 + cv·E[max of k standard normals]) (1 for k ≤ 1 or cv = 0).
double straggler_efficiency(int64_t k, double cv);
// E[max of k independent standard normals] (0 for k ≤ 1).
double expected_max_normal(int64_t k);

}  // namespace deloco
