// util/hash.h — content hashes of files on disk (checkpoint manifests) and of state that crosses a trust boundary
// (a joining learner's chunks from peers, tickets a donor checks).
//
// Contract
//  * blake2b256_hex: BLAKE2b with a 32-byte digest (libsodium's crypto_generichash, no key), 64 lowercase hex
//    digits. The hash of checkpoint files from manifest version 2 on ("blake2b-256" in the manifest).
//  * fnv1a64_hex: standard FNV-1a, 64 bit (offset basis 14695981039346656037 = 0xcbf29ce484222325, prime
//    1099511628211), the same function as fnv1a64() of deloco/wire.h, as 16 lowercase hex digits. Used for model
//    fingerprints (names, shapes, dtypes); not an integrity check of large data any more.
//  * fnv1a64_short_basis_hex: FNV-1a with the offset basis missing its last digit (1469598103934665603) that
//    deloco wrongly used for checkpoint hashes and model fingerprints until commit c2749d1. Kept only to verify
//    and recognise checkpoints written then (manifest version 1); never use it for anything new.
//  * Digest / blake2b256 / blake2b256_keyed: the same BLAKE2b-256 as raw bytes; keyed (a MAC) with a key of 16 to 64
//    bytes (throws std::invalid_argument otherwise). digest_hex / parse_digest_hex: 64 lowercase hex digits (parse
//    accepts either case, nullopt for anything else). digests_equal compares in constant time.
//  * random_key: 32 bytes from the system's randomness (libsodium randombytes_buf).
// All are pure (but random_key) and thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace deloco {

constexpr const char* kBlake2b256Name = "blake2b-256";
std::string blake2b256_hex(const void* data, size_t n);

using Digest = std::array<unsigned char, 32>;
Digest blake2b256(const void* data, size_t n);
Digest blake2b256_keyed(const void* key, size_t key_n, const void* data, size_t n);
std::string digest_hex(const Digest& d);
std::optional<Digest> parse_digest_hex(std::string_view hex);
bool digests_equal(const Digest& a, const Digest& b);
Digest random_key();

std::string fnv1a64_hex(const void* data, size_t n);

constexpr uint64_t kFnvShortBasis = 1469598103934665603ull;  // the wrong basis of old checkpoints, see above
std::string fnv1a64_short_basis_hex(const void* data, size_t n);

}  // namespace deloco
