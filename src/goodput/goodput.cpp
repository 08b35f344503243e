// The chip-scale goodput simulator (see src/goodput/goodput.h for the model and the contract).
#include "goodput/goodput.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <queue>
#include <sstream>
#include <thread>
#include <variant>

#include "deloco/config.h"

namespace deloco {
namespace {

constexpr double kHoursPerYear = 8766.0;  // 365.25 days
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxChips = 100000000;
constexpr int64_t kMaxSlices = 1000000;
constexpr int64_t kMaxLearners = 1024;
constexpr double kMaxExpectedFailures = 2e8;

// ---- portable random numbers: splitmix64 seeding, xoshiro256**, own distributions ------------------------
uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t sm = seed;
    for (auto& w : s_) w = splitmix64(&sm);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in the open interval (0, 1).
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (multiply-shift; the bias is below 2^-40 for n < 2^24).
  int64_t below(int64_t n) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(next()) * static_cast<uint64_t>(n)) >> 64);
  }
  double exponential(double mean) { return -mean * std::log(uniform()); }
  // Standard normal by the Box–Muller transform (one value per call; the second is discarded for simplicity).
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

uint64_t run_seed(int64_t base, int64_t index) {
  uint64_t st = static_cast<uint64_t>(base) * 0xD1B54A32D192ED03ULL + static_cast<uint64_t>(index);
  splitmix64(&st);
  return splitmix64(&st);
}

// ---- straggler efficiency ------------------------------------------------------------------------------
// E[max of k standard normals] for k = 0..kmax, by the trapezoid rule on x·k·φ(x)·Φ(x)^(k-1) over [-9, 9],
// advancing Φ^(k-1) incrementally so the whole table costs kmax × grid multiplications.
std::vector<double> expected_max_table(int64_t kmax) {
  constexpr double lo = -9.0, hi = 9.0, h = 0.01;
  const int n = static_cast<int>((hi - lo) / h) + 1;
  std::vector<double> xs(n), w(n), cdf(n), pw(n, 1.0);
  for (int j = 0; j < n; ++j) {
    const double x = lo + h * j;
    const double pdf = std::exp(-0.5 * x * x) * 0.3989422804014327;
    xs[j] = x;
    w[j] = x * pdf * h * ((j == 0 || j == n - 1) ? 0.5 : 1.0);
    cdf[j] = 0.5 * std::erfc(-x * 0.7071067811865476);
  }
  std::vector<double> table(static_cast<size_t>(std::max<int64_t>(kmax, 1)) + 1, 0.0);
  for (int64_t k = 1; k <= kmax; ++k) {
    double sum = 0;
    for (int j = 0; j < n; ++j) {
      sum += w[j] * pw[j];
      pw[j] *= cdf[j];
    }
    table[k] = k <= 1 ? 0.0 : static_cast<double>(k) * sum;
  }
  return table;
}

// expected_max_table(kmax), computed once per process for the largest kmax asked so far (a fit asks for it at
// every evaluation; the table does not depend on the straggler cv).
std::vector<double> cached_expected_max(int64_t kmax) {
  static std::mutex mu;
  static std::vector<double> table;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int64_t>(table.size()) <= kmax) table = expected_max_table(kmax);
  return std::vector<double>(table.begin(), table.begin() + std::max<int64_t>(kmax, 1) + 1);
}

std::vector<double> efficiency_table(int64_t kmax, double cv) {
  std::vector<double> eff(static_cast<size_t>(std::max<int64_t>(kmax, 1)) + 1, 1.0);
  if (cv <= 0) return eff;
  const std::vector<double> em = cached_expected_max(kmax);
  for (int64_t k = 2; k <= kmax; ++k) eff[k] = 1.0 / (1.0 + cv * em[k]);
  return eff;
}

// ---- one run -------------------------------------------------------------------------------------------
struct Group {
  int64_t positions = 0;  // slice positions this group is sized for
  int64_t healthy = 0;    // healthy slices it holds
  int64_t incoming = 0;   // spares on their way to it (swap time)
  double busy_until = 0;  // end of the current restart / reconfiguration / catch-up
};

int64_t quorum_for(const GoodputParams& p, int64_t m) {
  if (p.quorum_learners > 0) return std::min(p.quorum_learners, m);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(p.quorum * static_cast<double>(m) - 1e-9)));
}

int64_t spares_for(const GoodputParams& p, int64_t slices) {
  return static_cast<int64_t>(std::ceil(p.spare_fraction * static_cast<double>(slices) - 1e-9));
}

// Independent generator streams of one run (common random numbers across parameter values).
uint64_t stream_seed(uint64_t seed, uint64_t stream) { return seed ^ (0x9E3779B97F4A7C15ULL * (stream + 1)); }

RunResult simulate(const GoodputParams& p, const RunSpec& spec, uint64_t seed, const std::vector<double>& eff) {
  const bool elastic = spec.scheme != Scheme::kDataParallel;
  const bool diloco = spec.scheme == Scheme::kDecoupledDiLoCo;
  const int64_t m = diloco ? spec.learners : 1;
  const int64_t quorum = diloco ? quorum_for(p, m) : 1;
  const int64_t slices = spec.chips / p.slice_chips;
  const int64_t spares = spares_for(p, slices);
  const double s_chips = static_cast<double>(p.slice_chips);
  const double slice_rate = s_chips / (p.mtbi_chip_years * kHoursPerYear);  // failures per hour per slice
  const double restart = p.restart_minutes / 60.0;
  const double down = p.downscale_seconds / 3600.0;
  const double up = p.upscale_seconds / 3600.0;
  const double swap = p.swap_minutes / 60.0;
  const double reset = p.reset_minutes / 60.0;
  const double catchup = diloco ? p.catchup_minutes / 60.0 : 0.0;
  const double t0 = p.warmup_hours;
  const double t_end = p.warmup_hours + p.days * 24.0;
  const bool domains = p.domain_slices > 0 && p.domain_mtbf_days > 0;
  const double domain_rate =  // domain failures per hour, for the whole allocation
      domains ? std::ceil(static_cast<double>(slices + spares) / static_cast<double>(p.domain_slices)) /
                    (p.domain_mtbf_days * 24.0)
              : 0.0;
  const bool syncer_fails = diloco && p.syncer_mtbf_hours > 0;

  // Repair-time sampler (hours).
  const double mean_repair = p.repair_hours;
  double ln_mu = 0, ln_sigma = 0;
  int dist = 0;  // 0 exponential, 1 lognormal, 2 fixed
  if (p.repair_dist == "lognormal") {
    dist = 1;
    ln_sigma = std::sqrt(std::log(1.0 + p.repair_cv * p.repair_cv));
    ln_mu = std::log(mean_repair) - 0.5 * ln_sigma * ln_sigma;
  } else if (p.repair_dist == "fixed") {
    dist = 2;
  }

  Rng rng(stream_seed(seed, 0));         // chip interrupts: times and which slice
  Rng rng_repair(stream_seed(seed, 1));  // reset or repair, and its duration
  Rng rng_domain(stream_seed(seed, 2));  // correlated failures
  Rng rng_syncer(stream_seed(seed, 3));  // syncer failures
  auto draw_repair = [&](Rng& r) {
    if (dist == 0) return r.exponential(mean_repair);
    if (dist == 1) return std::exp(ln_mu + ln_sigma * r.normal());
    return mean_repair;
  };

  std::vector<Group> groups(static_cast<size_t>(m));
  for (auto& g : groups) g.positions = g.healthy = slices / m;
  int64_t pool = spares;              // idle healthy spare slices
  int64_t healthy = slices + spares;  // healthy slices that can fail: the pool and the groups' (not in transit)
  // Repairs and resets ending: (time, the group the slice failed from; −1: the spare pool).
  using Return = std::pair<double, int64_t>;
  std::priority_queue<Return, std::vector<Return>, std::greater<Return>> returns;
  using Arrival = std::pair<double, size_t>;                                        // a spare reaching a group
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<Arrival>> arrivals;

  auto draw_next_failure = [&](double now) {
    return healthy > 0 ? now + rng.exponential(1.0 / (static_cast<double>(healthy) * slice_rate)) : kInf;
  };

  double t = 0, next_fail = draw_next_failure(0.0);
  double next_domain = domains ? rng_domain.exponential(1.0 / domain_rate) : kInf;
  double next_syncer_fail = syncer_fails ? rng_syncer.exponential(p.syncer_mtbf_hours) : kInf;
  double syncer_up_at = 0;  // the syncer is down while t < syncer_up_at
  double useful = 0, up_time = 0;
  int64_t failures = 0;

  // A slice of group g is lost (it fails, or its domain does); `hard` failures get a spare from the pool.
  auto lose_slice = [&](Group& g, size_t gi, bool hard) {
    --g.healthy;
    bool refilled = false;
    if (hard && pool > 0) {
      --pool;
      --healthy;  // in transit (or in place at once)
      if (swap <= 0) {
        ++g.healthy;
        ++healthy;
        refilled = true;
      } else {
        ++g.incoming;
        arrivals.push({t + swap, gi});
      }
    }
    if (elastic) g.busy_until = std::max(g.busy_until, t + down);  // drop the slice (or swap a spare in at once)
    else if (refilled && g.healthy == g.positions) g.busy_until = t + restart;  // whole again thanks to a spare
  };
  // A slice joins group g (back from repair or reset, or a spare arriving).
  auto gain_slice = [&](Group& g) {
    const bool was_empty = g.healthy == 0;
    ++g.healthy;
    if (elastic) g.busy_until = std::max(g.busy_until, t + up + (was_empty ? catchup : 0.0));
    else if (g.healthy == g.positions) g.busy_until = t + restart;
  };
  // Picks a failing healthy slice uniformly: the pool's (returns -1) or a group's index.
  auto pick = [&](Rng& r) -> int64_t {
    int64_t k = r.below(healthy);
    if (k < pool) return -1;
    k -= pool;
    size_t gi = 0;
    while (k >= groups[gi].healthy) k -= groups[gi++].healthy;
    return static_cast<int64_t>(gi);
  };

  while (t < t_end) {
    // State is constant until the next event: compute the rates of this interval.
    double rate = 0;
    int64_t running = 0;
    double next_busy_end = kInf;
    for (const auto& g : groups) {
      if (g.busy_until > t) {
        next_busy_end = std::min(next_busy_end, g.busy_until);
        continue;
      }
      if (elastic ? g.healthy >= 1 : g.healthy == g.positions) {
        ++running;
        rate += static_cast<double>(g.healthy) * s_chips * eff[static_cast<size_t>(g.healthy)];
      }
    }
    const bool syncer_up = t >= syncer_up_at;
    const double next_return = returns.empty() ? kInf : returns.top().first;
    const double next_arrival = arrivals.empty() ? kInf : arrivals.top().first;
    const double next_syncer_up = syncer_up ? kInf : syncer_up_at;
    const double t_next = std::min({next_fail, next_return, next_arrival, next_busy_end, next_domain,
                                    next_syncer_fail, next_syncer_up, t_end});
    const double a = std::max(t, t0), b = std::min(t_next, t_end);
    if (b > a && running >= quorum && syncer_up) {
      useful += rate * (b - a);
      up_time += b - a;
    }
    t = t_next;
    if (t >= t_end) break;

    if (t == next_fail) {
      if (t >= t0) ++failures;
      const bool is_reset = p.reset_fraction > 0 && rng_repair.uniform() < p.reset_fraction;
      const double out = is_reset ? reset : draw_repair(rng_repair);
      const int64_t gi = pick(rng);
      --healthy;
      if (gi < 0) --pool;  // an idle spare failed
      else lose_slice(groups[static_cast<size_t>(gi)], static_cast<size_t>(gi), !is_reset);
      returns.push({t + out, gi});
      next_fail = draw_next_failure(t);
    } else if (t == next_domain) {
      // A domain of domain_slices slices: one learner's slices first (learners are placed on whole domains),
      // then the pool, then the other groups.
      int64_t k = std::min(p.domain_slices, healthy);
      const double out = draw_repair(rng_domain);
      const int64_t first = healthy > 0 ? pick(rng_domain) : -1;
      // Counted as they go to repair: a spare swapped in at once uses up the pool, so fewer than k may be taken.
      auto take_group = [&](size_t gi) {  // the slices it holds now (not a spare swapped in at once)
        for (int64_t n = std::min(k, groups[gi].healthy); n > 0; --n) {
          --healthy;
          lose_slice(groups[gi], gi, true);
          returns.push({t + out, static_cast<int64_t>(gi)});
          --k;
          if (t >= t0) ++failures;
        }
      };
      if (first >= 0) take_group(static_cast<size_t>(first));
      const int64_t from_pool = std::min(k, pool);
      pool -= from_pool;
      healthy -= from_pool;
      k -= from_pool;
      if (t >= t0) failures += from_pool;
      for (int64_t i = 0; i < from_pool; ++i) returns.push({t + out, -1});
      for (size_t gi = 0; gi < groups.size() && k > 0; ++gi)
        if (static_cast<int64_t>(gi) != first) take_group(gi);
      next_fail = draw_next_failure(t);
      next_domain = t + rng_domain.exponential(1.0 / domain_rate);
    } else if (t == next_syncer_fail) {
      syncer_up_at = t + p.syncer_restart_minutes / 60.0;
      next_syncer_fail = syncer_up_at + rng_syncer.exponential(p.syncer_mtbf_hours);
    } else if (t == next_return) {
      const int64_t home = returns.top().second;
      returns.pop();
      ++healthy;
      // The slice fills the group with the most vacant positions (a spare on its way holds its position), else
      // joins the spare pool; under repair_home it goes back to the group it failed from while that has a vacant
      // position (learners in separate sites do not trade slices).
      Group* best = nullptr;
      auto vacant = [](const Group& g) { return g.positions - g.healthy - g.incoming; };
      if (p.repair_home && home >= 0 && vacant(groups[static_cast<size_t>(home)]) > 0)
        best = &groups[static_cast<size_t>(home)];
      for (auto& g : groups)
        if (!p.repair_home && vacant(g) > 0 && (!best || vacant(g) > vacant(*best))) best = &g;
      if (!best) ++pool;
      else gain_slice(*best);
      next_fail = draw_next_failure(t);  // the healthy count changed; exponential gaps are memoryless
    } else if (t == next_arrival) {
      Group& g = groups[arrivals.top().second];
      arrivals.pop();
      --g.incoming;
      ++healthy;
      if (g.healthy < g.positions) gain_slice(g);
      else ++pool;
      next_fail = draw_next_failure(t);
    }
    // Otherwise a restart, reconfiguration or syncer restart ended: the next iteration recomputes the rates.
  }

  RunResult res;
  const double wall = t_end - t0;
  res.goodput = useful / (static_cast<double>(slices + spares) * s_chips * wall);
  res.uptime = up_time / wall;
  res.failures = failures;
  return res;
}

double t975(int64_t df) {
  static const double table[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                 2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                 2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df <= 0) return 0;
  if (df <= 30) return table[df - 1];
  return 1.96 + 2.4 / static_cast<double>(df);
}

void mean_ci(const std::vector<double>& v, double* mean, double* ci) {
  const double n = static_cast<double>(v.size());
  double s = 0;
  for (double x : v) s += x;
  *mean = s / n;
  if (v.size() < 2) {
    *ci = 0;
    return;
  }
  double ss = 0;
  for (double x : v) ss += (x - *mean) * (x - *mean);
  *ci = t975(static_cast<int64_t>(v.size()) - 1) * std::sqrt(ss / (n - 1) / n);
}

std::string fmt(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}

// Per-key range checks; "" when valid.
std::string check_key(const GoodputParams& p, const std::string& key) {
  auto finite_pos = [](double x) { return std::isfinite(x) && x > 0; };
  auto finite_nonneg = [](double x) { return std::isfinite(x) && x >= 0; };
  if (key == "chips") {
    if (p.chips.empty()) return "needs at least one chip count";
    for (int64_t c : p.chips) {
      if (c <= 0) return "chip counts must be positive, got " + std::to_string(c);
      if (c > kMaxChips) return "chip count " + std::to_string(c) + " is absurd (the limit is 1e8)";
    }
  } else if (key == "learners") {
    if (p.learners.empty()) return "needs at least one learner count";
    for (int64_t m : p.learners)
      if (m <= 0 || m > kMaxLearners)
        return "learner counts must be between 1 and " + std::to_string(kMaxLearners) + ", got " + std::to_string(m);
  } else if (key == "slice_chips") {
    if (p.slice_chips <= 0) return "must be positive, got " + std::to_string(p.slice_chips);
    if (p.slice_chips > kMaxChips) return "is absurd (the limit is 1e8 chips)";
  } else if (key == "mtbi_chip_years") {
    if (!finite_pos(p.mtbi_chip_years)) return "must be a positive number of years, got " + fmt(p.mtbi_chip_years);
  } else if (key == "repair_hours") {
    if (!finite_pos(p.repair_hours) || p.repair_hours > 1e5)
      return "must be a positive number of hours up to 1e5, got " + fmt(p.repair_hours);
  } else if (key == "repair_dist") {
    if (p.repair_dist != "exponential" && p.repair_dist != "lognormal" && p.repair_dist != "fixed")
      return "must be exponential, lognormal or fixed, got '" + p.repair_dist + "'";
  } else if (key == "repair_cv") {
    if (!finite_pos(p.repair_cv) || p.repair_cv > 10) return "must be in (0, 10], got " + fmt(p.repair_cv);
  } else if (key == "restart_minutes" || key == "downscale_seconds" || key == "upscale_seconds" ||
             key == "warmup_hours") {
    const double v = key == "restart_minutes" ? p.restart_minutes
                     : key == "downscale_seconds" ? p.downscale_seconds
                     : key == "upscale_seconds" ? p.upscale_seconds : p.warmup_hours;
    const double limit = key == "restart_minutes" ? 1e5 : key == "warmup_hours" ? 87600 : 1e7;
    if (!finite_nonneg(v) || v > limit) return "must be a time between 0 and " + fmt(limit) + ", got " + fmt(v);
  } else if (key == "step_time_cv") {
    if (!finite_nonneg(p.step_time_cv) || p.step_time_cv > 0.5) return "must be in [0, 0.5], got " + fmt(p.step_time_cv);
  } else if (key == "quorum") {
    if (!(p.quorum > 0 && p.quorum <= 1)) return "must be a fraction in (0, 1], got " + fmt(p.quorum);
  } else if (key == "spare_fraction") {
    if (!(p.spare_fraction >= 0 && p.spare_fraction <= 1)) return "must be in [0, 1], got " + fmt(p.spare_fraction);
  } else if (key == "swap_minutes" || key == "reset_minutes" || key == "syncer_restart_minutes" ||
             key == "catchup_minutes") {
    const double v = key == "swap_minutes" ? p.swap_minutes
                     : key == "reset_minutes" ? p.reset_minutes
                     : key == "syncer_restart_minutes" ? p.syncer_restart_minutes : p.catchup_minutes;
    if (!finite_nonneg(v) || v > 1e5) return "must be a number of minutes between 0 and 1e5, got " + fmt(v);
  } else if (key == "reset_fraction") {
    if (!(p.reset_fraction >= 0 && p.reset_fraction <= 1)) return "must be in [0, 1], got " + fmt(p.reset_fraction);
  } else if (key == "domain_slices") {
    if (p.domain_slices < 0 || p.domain_slices > kMaxSlices)
      return "must be between 0 (no domains) and 1e6 slices, got " + std::to_string(p.domain_slices);
    if ((p.domain_slices > 0) != (p.domain_mtbf_days > 0))
      return "and goodput.domain_mtbf_days go together: set both (correlated failures) or neither";
  } else if (key == "domain_mtbf_days") {
    if (!finite_nonneg(p.domain_mtbf_days) || p.domain_mtbf_days > 1e6)
      return "must be a number of days between 0 (off) and 1e6, got " + fmt(p.domain_mtbf_days);
  } else if (key == "syncer_mtbf_hours") {
    if (!finite_nonneg(p.syncer_mtbf_hours) || (p.syncer_mtbf_hours > 0 && p.syncer_mtbf_hours < 1e-3) ||
        p.syncer_mtbf_hours > 1e8)
      return "must be 0 (never fails) or a number of hours in [0.001, 1e8], got " + fmt(p.syncer_mtbf_hours);
  } else if (key == "quorum_learners") {
    if (p.quorum_learners < 0 || p.quorum_learners > kMaxLearners)
      return "must be 0 (use goodput.quorum) or a learner count up to " + std::to_string(kMaxLearners) + ", got " +
             std::to_string(p.quorum_learners);
  } else if (key == "days") {
    if (!finite_pos(p.days) || p.days > 3650) return "must be a positive number of days up to 3650, got " + fmt(p.days);
  } else if (key == "seeds") {
    if (p.seeds <= 0 || p.seeds > 1000) return "must be between 1 and 1000, got " + std::to_string(p.seeds);
  } else if (key == "threads") {
    if (p.threads < 0 || p.threads > 256) return "must be between 0 (all cores) and 256, got " + std::to_string(p.threads);
  }
  return "";
}

// The goodput.* keys, declared once: the key's name (and the field of GoodputParams it sets), its help and the reason
// for its default. goodput_key_docs(), bind_goodput_config() and the flags of `deloco goodput` are made from it.
struct GoodputKey {
  const char* name;
  std::variant<std::vector<int64_t> GoodputParams::*, int64_t GoodputParams::*, double GoodputParams::*,
               bool GoodputParams::*, std::string GoodputParams::*>
      field;
  const char* help;
  const char* reason;
};

const std::vector<GoodputKey>& goodput_keys() {
  static const std::vector<GoodputKey> keys = {
      {"chips", &GoodputParams::chips, "chip counts N to simulate (one table row each)",
       "150k to 2.4M doubling: the scales at which synchronous training is claimed to break down"},
      {"learners", &GoodputParams::learners, "learner counts M for Decoupled DiLoCo",
       "1 to 16 doubling: from one elastic job to learners small enough to rarely be reconfiguring"},
      {"slice_chips", &GoodputParams::slice_chips,
       "chips per slice, the unit that fails, is repaired and is added or removed",
       "625 chips is of the order of a model-parallel group (a multi-host TPU slice or a few GPU racks) and "
       "makes every default chip count a whole number of slices divisible by 16 (150k = 240 slices)"},
      {"mtbi_chip_years", &GoodputParams::mtbi_chip_years, "mean time between interruptions of one chip, in years",
       "about one interruption per chip-year (hardware faults, host and network incidents, preemptions) is the "
       "order reported for large accelerator fleets; the design document fixes it as the default"},
      {"repair_hours", &GoodputParams::repair_hours, "mean time a failed slice is unavailable, in hours",
       "one hour: automated drain, reboot or host swap takes tens of minutes; hardware replacement takes longer "
       "but is rare, which the log-normal tail represents"},
      {"repair_dist", &GoodputParams::repair_dist, "repair-time distribution: exponential, lognormal or fixed",
       "log-normal: most repairs are quick, a few take many times the mean"},
      {"repair_cv", &GoodputParams::repair_cv, "coefficient of variation of the log-normal repair time",
       "1.0: a standard deviation equal to the mean, a moderately heavy tail"},
      {"restart_minutes", &GoodputParams::restart_minutes,
       "DP without elasticity: time to restart the whole job once every slice is back (reload a checkpoint, "
       "rebuild the collectives, recompute lost steps)",
       "10 minutes: a checkpoint reload and job re-launch at scale takes minutes, plus half a checkpoint "
       "interval of lost work"},
      {"downscale_seconds", &GoodputParams::downscale_seconds,
       "elastic schemes: reconfiguration time to drop a failed slice (or swap in a spare)",
       "30 s: rebuilding the communicators and re-sharding the data order without a restart"},
      {"upscale_seconds", &GoodputParams::upscale_seconds,
       "elastic schemes: reconfiguration time to admit a repaired slice",
       "30 s: the same work as a down-scale, plus copying the current parameters to the new slice, overlapped"},
      {"step_time_cv", &GoodputParams::step_time_cv,
       "coefficient of variation of per-step step time across slices (stragglers)",
       "2%: typical jitter of a well-tuned step; a synchronous step waits for the slowest of its slices"},
      {"quorum", &GoodputParams::quorum,
       "Decoupled DiLoCo: the syncer advances while at least ceil(quorum*M) learners run",
       "one half: a majority-style quorum that tolerates half the learners being down"},
      {"spare_fraction", &GoodputParams::spare_fraction,
       "spare slices as a fraction of the job's slices (allocated, so they count in goodput)",
       "0: compare the schemes on the same allocation; try 0.05 to see what spares buy"},
      {"swap_minutes", &GoodputParams::swap_minutes,
       "time to swap a spare slice from the hot-spare pool in for a failed one, in minutes",
       "0: the first model's instant swap; a fleet that swaps hot spares by software takes minutes"},
      {"reset_fraction", &GoodputParams::reset_fraction,
       "share of chip interrupts that are a short host reset (the slice is out for reset_minutes) rather than a "
       "repair",
       "0: every interrupt is a repair, as in the first model; fleets report most interrupts cleared by a reset"},
      {"reset_minutes", &GoodputParams::reset_minutes, "how long a host reset takes its slice out, in minutes",
       "5: reboot a host and rejoin it to its slice"},
      {"domain_slices", &GoodputParams::domain_slices,
       "slices per correlated-failure domain (rack, power domain); 0 = none",
       "0: no correlated failures, as in the first model"},
      {"domain_mtbf_days", &GoodputParams::domain_mtbf_days,
       "mean days between failures of one domain (all its slices at once)",
       "0 (off); with domains on, a power or network domain failing a few times a year is a common order"},
      {"syncer_mtbf_hours", &GoodputParams::syncer_mtbf_hours,
       "Decoupled DiLoCo: mean hours between syncer failures (0 = never); global training stops until it is back",
       "0: the first model's perfect syncer; a few CPU hosts fail far more rarely than a chip fleet"},
      {"syncer_restart_minutes", &GoodputParams::syncer_restart_minutes,
       "Decoupled DiLoCo: time for a failed syncer to be back from its checkpoint",
       "5: restart the process and load the checkpoint of the last merge"},
      {"catchup_minutes", &GoodputParams::catchup_minutes,
       "Decoupled DiLoCo: extra time a learner that lost every slice spends downloading the global model when it "
       "has one again",
       "0: the first model; the download is a few seconds per GB on a data-centre link"},
      {"quorum_learners", &GoodputParams::quorum_learners,
       "Decoupled DiLoCo: a fixed quorum of min(K, M) learners when K > 0 (overrides quorum)",
       "0: use the quorum fraction; set 1 for the papers' main setting K = 1"},
      {"days", &GoodputParams::days, "simulated days measured per run", "30: a month-long pre-training run"},
      {"warmup_hours", &GoodputParams::warmup_hours,
       "simulated hours discarded before measuring (the job starts with every slice healthy)",
       "12 h: many mean repair times, so the number of slices in repair has reached its steady state"},
      {"seeds", &GoodputParams::seeds, "independent runs per row, for the confidence intervals",
       "5: intervals of a few tenths of a percent at the default month; the default table stays under 10 s"},
      {"seed", &GoodputParams::seed, "base random seed", "1: any fixed value makes runs reproducible"},
      {"threads", &GoodputParams::threads, "worker threads (0 = all hardware threads); results do not depend on it",
       "0: the runs are independent, so every core helps"},
      {"repair_home", &GoodputParams::repair_home,
       "a repaired slice returns to the learner it failed from (while that learner has a vacant position), "
       "not to the learner with the most vacant positions",
       "false: the first model's pooled repairs, where any learner of the site can take a repaired slice; true "
       "for learners in separate sites"},
      {"dp", &GoodputParams::dp, "include DP without elasticity", "true"},
      {"elastic_dp", &GoodputParams::elastic_dp, "include elastic DP", "true"},
      {"diloco", &GoodputParams::diloco, "include Decoupled DiLoCo (one row per learner count)", "true"},
  };
  return keys;
}
}  // namespace

const std::vector<GoodputKeyDoc>& goodput_key_docs() {
  static const std::vector<GoodputKeyDoc> docs = [] {
    std::vector<GoodputKeyDoc> d;
    for (const auto& k : goodput_keys()) d.push_back({std::string("goodput.") + k.name, k.help, k.reason});
    return d;
  }();
  return docs;
}

void bind_goodput_config(ConfigSchema& schema, GoodputParams& p) {
  for (const auto& k : goodput_keys()) {
    GoodputParams* pp = &p;
    const std::string name = k.name;
    std::visit(
        [&](auto member) {
          schema.bind("goodput." + name, &(p.*member), k.help, [pp, name]() { return check_key(*pp, name); });
        },
        k.field);
  }
}

void validate_goodput(const GoodputParams& p) {
  for (const auto& d : goodput_key_docs()) {
    const std::string name = d.key.substr(8);
    const std::string err = check_key(p, name);
    if (!err.empty()) throw ConfigError("config key '" + d.key + "': " + err);
  }
  if (!p.dp && !p.elastic_dp && !p.diloco)
    throw ConfigError("config keys goodput.dp, goodput.elastic_dp and goodput.diloco are all false: nothing to simulate");
  for (int64_t c : p.chips) {
    if (c % p.slice_chips != 0)
      throw ConfigError("config key 'goodput.chips': " + std::to_string(c) + " chips is not a whole number of " +
                        std::to_string(p.slice_chips) + "-chip slices (goodput.slice_chips)");
    const int64_t slices = c / p.slice_chips;
    if (slices + spares_for(p, slices) > kMaxSlices)
      throw ConfigError("config key 'goodput.chips': " + std::to_string(c) + " chips make " + std::to_string(slices) +
                        " slices (plus spares), over the limit of 1e6; use larger slices (goodput.slice_chips)");
    if (p.diloco)
      for (int64_t m : p.learners)
        if (slices % m != 0)
          throw ConfigError("config key 'goodput.learners': " + std::to_string(m) + " learners do not divide the " +
                            std::to_string(slices) + " slices of " + std::to_string(c) + " chips");
    const double expected = static_cast<double>(c) * (1.0 + p.spare_fraction) * (p.days * 24.0 + p.warmup_hours) /
                            (p.mtbi_chip_years * kHoursPerYear);
    if (expected > kMaxExpectedFailures)
      throw ConfigError("goodput: " + std::to_string(c) + " chips over " + fmt(p.days) + " days with a " +
                        fmt(p.mtbi_chip_years) + "-year MTBI means about " + fmt(expected) +
                        " failures per run, over the limit of 2e8; shorten goodput.days or raise goodput.mtbi_chip_years");
  }
}

const char* scheme_name(Scheme s) {
  switch (s) {
    case Scheme::kDataParallel: return "dp";
    case Scheme::kElasticDP: return "elastic_dp";
    default: return "diloco";
  }
}

double expected_max_normal(int64_t k) {
  if (k <= 1) return 0.0;
  return expected_max_table(k)[static_cast<size_t>(k)];
}

double straggler_efficiency(int64_t k, double cv) {
  if (k <= 1 || cv <= 0) return 1.0;
  return 1.0 / (1.0 + cv * expected_max_normal(k));
}

std::string goodput_warnings(const GoodputParams& p) {
  if (p.warmup_hours >= 3 * p.repair_hours) return {};
  std::ostringstream o;
  o << "goodput.warmup_hours = " << p.warmup_hours << " is under three mean repair times (goodput.repair_hours = "
    << p.repair_hours << "): the slices out for repair have not reached their steady number when measuring starts, "
    << "so goodput reads high; set goodput.warmup_hours to at least " << 3 * p.repair_hours;
  return o.str();
}

GoodputParams params_for_spec(const GoodputParams& p, const RunSpec& spec) {
  GoodputParams q = p;
  q.chips = {spec.chips};
  q.learners = {spec.scheme == Scheme::kDecoupledDiLoCo ? spec.learners : 1};
  q.dp = spec.scheme == Scheme::kDataParallel;
  q.elastic_dp = spec.scheme == Scheme::kElasticDP;
  q.diloco = spec.scheme == Scheme::kDecoupledDiLoCo;
  return q;
}

RunResult simulate_once(const GoodputParams& p, const RunSpec& spec, uint64_t seed) {
  validate_goodput(params_for_spec(p, spec));
  const int64_t m = spec.scheme == Scheme::kDecoupledDiLoCo ? spec.learners : 1;
  return simulate(p, spec, seed, efficiency_table(spec.chips / p.slice_chips / m, p.step_time_cv));
}

namespace {
std::atomic<int64_t> g_runs_simulated{0};
}  // namespace

int64_t goodput_runs_simulated() { return g_runs_simulated.load(); }

std::vector<std::vector<RunResult>> simulate_specs(const GoodputParams& p, const std::vector<RunSpec>& specs) {
  for (const RunSpec& spec : specs) validate_goodput(params_for_spec(p, spec));  // a grid the simulator can index
  int64_t kmax = 1;
  for (const auto& spec : specs) kmax = std::max(kmax, spec.chips / p.slice_chips);
  const std::vector<double> eff = efficiency_table(kmax, p.step_time_cv);
  const size_t seeds = static_cast<size_t>(p.seeds);
  const size_t n_runs = specs.size() * seeds;
  std::vector<RunResult> results(n_runs);
  // Largest runs first so the threads finish together.
  std::vector<size_t> order(n_runs);
  for (size_t i = 0; i < n_runs; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return specs[a / seeds].chips > specs[b / seeds].chips; });
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    for (;;) {
      const size_t k = next.fetch_add(1);
      if (k >= n_runs) return;
      const size_t i = order[k];
      results[i] = simulate(p, specs[i / seeds], run_seed(p.seed, static_cast<int64_t>(i % seeds)), eff);
      g_runs_simulated.fetch_add(1, std::memory_order_relaxed);
    }
  };
  size_t n_threads = p.threads > 0 ? static_cast<size_t>(p.threads) : std::max(1u, std::thread::hardware_concurrency());
  n_threads = std::min(n_threads, n_runs);
  std::vector<std::thread> pool;
  for (size_t i = 1; i < n_threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  std::vector<std::vector<RunResult>> out(specs.size());
  for (size_t r = 0; r < specs.size(); ++r) out[r].assign(results.begin() + r * seeds, results.begin() + (r + 1) * seeds);
  return out;
}

std::vector<GoodputRow> run_goodput(const GoodputParams& p) {
  validate_goodput(p);
  std::vector<RunSpec> specs;
  for (int64_t c : p.chips) {
    if (p.dp) specs.push_back({Scheme::kDataParallel, c, 1});
    if (p.elastic_dp) specs.push_back({Scheme::kElasticDP, c, 1});
    if (p.diloco)
      for (int64_t m : p.learners) specs.push_back({Scheme::kDecoupledDiLoCo, c, m});
  }
  const std::vector<std::vector<RunResult>> runs = simulate_specs(p, specs);

  std::vector<GoodputRow> rows;
  for (size_t r = 0; r < specs.size(); ++r) {
    const RunSpec& spec = specs[r];
    GoodputRow row;
    row.scheme = scheme_name(spec.scheme);
    row.chips = spec.chips;
    row.slices = spec.chips / p.slice_chips;
    row.spare_slices = spares_for(p, row.slices);
    row.learners = spec.scheme == Scheme::kDecoupledDiLoCo ? spec.learners : 1;
    row.quorum = spec.scheme == Scheme::kDecoupledDiLoCo ? quorum_for(p, spec.learners) : 1;
    row.seeds = p.seeds;
    std::vector<double> g, u;
    double f = 0;
    for (int64_t s = 0; s < p.seeds; ++s) {
      const RunResult& res = runs[r][static_cast<size_t>(s)];
      g.push_back(res.goodput);
      u.push_back(res.uptime);
      f += static_cast<double>(res.failures);
    }
    mean_ci(g, &row.goodput, &row.goodput_ci95);
    mean_ci(u, &row.uptime, &row.uptime_ci95);
    row.failures = f / static_cast<double>(p.seeds);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace deloco
