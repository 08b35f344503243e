// src/goodput/test_util.h — what the goodput tests share: a small, fast configuration and the slice MTBF knob.
#pragma once

#include "goodput/goodput.h"

namespace deloco::goodput_test {

constexpr double kHoursPerYear = 8766.0;

// Slices of 100 chips, 800 chips, one learner, no stragglers, no reconfiguration costs, a year after 50 hours of
// warm-up, 4 seeds on one thread. Tests change what they study.
inline GoodputParams small_params() {
  GoodputParams p;
  p.slice_chips = 100;
  p.chips = {800};
  p.learners = {1};
  p.step_time_cv = 0;
  p.restart_minutes = 0;
  p.downscale_seconds = 0;
  p.upscale_seconds = 0;
  p.warmup_hours = 50;
  p.days = 365;
  p.seeds = 4;
  p.threads = 1;
  return p;
}

// Sets the per-chip MTBI so that one slice fails on average every `slice_mtbf_hours`.
inline void set_slice_mtbf(GoodputParams* p, double slice_mtbf_hours) {
  p->mtbi_chip_years = slice_mtbf_hours * static_cast<double>(p->slice_chips) / kHoursPerYear;
}

}  // namespace deloco::goodput_test
