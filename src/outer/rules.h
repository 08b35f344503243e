// src/outer/rules.h — internal: the outer update rules, one per file.
#pragma once

#include <memory>

#include "deloco/outer.h"

namespace deloco::outer_detail {
std::unique_ptr<OuterOptimizer> make_sgd(const OuterOptions& o);
std::unique_ptr<OuterOptimizer> make_nesterov(const OuterOptions& o);
std::unique_ptr<OuterOptimizer> make_delayed_nesterov(const OuterOptions& o);
}  // namespace deloco::outer_detail
