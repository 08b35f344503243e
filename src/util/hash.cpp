// Content hashes (contract in src/util/hash.h).
#include "util/hash.h"

#include <sodium.h>

#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

#include "deloco/wire.h"

namespace deloco {
namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void init_sodium() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Picks the fastest BLAKE2b implementation for this CPU; -1 only when the system has no randomness source,
    // which BLAKE2b does not need (the portable implementation is then used; random_key checks on its own).
    if (sodium_init() < 0) {
    }
  });
}

}  // namespace

Digest blake2b256(const void* data, size_t n) {
  init_sodium();
  Digest out;
  crypto_generichash(out.data(), out.size(), static_cast<const unsigned char*>(data), n, nullptr, 0);
  return out;
}

Digest blake2b256_keyed(const void* key, size_t key_n, const void* data, size_t n) {
  if (key_n < crypto_generichash_KEYBYTES_MIN || key_n > crypto_generichash_KEYBYTES_MAX)
    throw std::invalid_argument("a BLAKE2b key must hold 16 to 64 bytes, not " + std::to_string(key_n));
  init_sodium();
  Digest out;
  crypto_generichash(out.data(), out.size(), static_cast<const unsigned char*>(data), n,
                     static_cast<const unsigned char*>(key), key_n);
  return out;
}

std::string digest_hex(const Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = digits[d[i] >> 4];
    s[2 * i + 1] = digits[d[i] & 0xf];
  }
  return s;
}

std::optional<Digest> parse_digest_hex(std::string_view hex) {
  if (hex.size() != 64) return std::nullopt;
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Digest d;
  for (size_t i = 0; i < d.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    d[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return d;
}

bool digests_equal(const Digest& a, const Digest& b) { return sodium_memcmp(a.data(), b.data(), a.size()) == 0; }

Digest random_key() {
  init_sodium();
  Digest k;
  randombytes_buf(k.data(), k.size());
  return k;
}

std::string blake2b256_hex(const void* data, size_t n) { return digest_hex(blake2b256(data, n)); }

std::string fnv1a64_hex(const void* data, size_t n) { return hex64(fnv1a64(data, n)); }

std::string fnv1a64_short_basis_hex(const void* data, size_t n) { return hex64(fnv1a64(data, n, kFnvShortBasis)); }

}  // namespace deloco
