// Content hashes (contract in src/util/hash.h).
#include "util/hash.h"

#include <sodium.h>

#include <cstdio>
#include <mutex>
#include <stdexcept>

#include "deloco/wire.h"

namespace deloco {
namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string blake2b256_hex(const void* data, size_t n) {
  static std::once_flag once;
  std::call_once(once, [] {
    // Picks the fastest BLAKE2b implementation for this CPU; -1 only when the system has no randomness source,
    // which BLAKE2b does not need (the portable implementation is then used).
    if (sodium_init() < 0) {
    }
  });
  unsigned char out[32];
  crypto_generichash(out, sizeof(out), static_cast<const unsigned char*>(data), n, nullptr, 0);
  static const char* digits = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < sizeof(out); ++i) {
    s[2 * i] = digits[out[i] >> 4];
    s[2 * i + 1] = digits[out[i] & 0xf];
  }
  return s;
}

std::string fnv1a64_hex(const void* data, size_t n) { return hex64(fnv1a64(data, n)); }

std::string fnv1a64_short_basis_hex(const void* data, size_t n) { return hex64(fnv1a64(data, n, kFnvShortBasis)); }

}  // namespace deloco
