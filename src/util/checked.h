// src/util/checked.h — overflow-checked size arithmetic for sizes that come from a file or the network
// (safetensors headers, wire frames). Header-only, no dependencies.
//
// Contract: checked_mul / checked_add store a * b or a + b in *out and return true, or return false (leaving *out
// unspecified) when the exact result does not fit in uint64_t. Never undefined behaviour, never a wrapped value.
#pragma once

#include <cstdint>

namespace deloco {

[[nodiscard]] inline bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }
[[nodiscard]] inline bool checked_add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

}  // namespace deloco
