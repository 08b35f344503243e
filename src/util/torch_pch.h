// Precompiled header for every target that uses libtorch (see CMakeLists.txt). Keep it to stable third-party
// headers: editing it rebuilds everything.
#pragma once
#include <torch/torch.h>
#include <nlohmann/json.hpp>
