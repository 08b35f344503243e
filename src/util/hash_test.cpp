// BLAKE2b-256 as raw digests, keyed, and their hex form, against Python's hashlib (an independent implementation
// of RFC 7693): /usr/bin/python3 -c "import hashlib; print(hashlib.blake2b(b'abc', digest_size=32).hexdigest())".
#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <stdexcept>
#include <string>

#include "util/hash.h"

namespace deloco {
namespace hash_cases {

TEST(Hash, Blake2b256MatchesAnIndependentImplementation) {
  EXPECT_EQ(digest_hex(blake2b256("", 0)), "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");
  EXPECT_EQ(digest_hex(blake2b256("abc", 3)), "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
  EXPECT_EQ(blake2b256_hex("abc", 3), digest_hex(blake2b256("abc", 3)));
  const std::string key(16, 'k');
  EXPECT_EQ(digest_hex(blake2b256_keyed(key.data(), key.size(), "abc", 3)),
            "71e070c3cfad95880653b4bcb41a0130b74482daa9696bbc81749e314c9a1a64");
  EXPECT_THROW(blake2b256_keyed(key.data(), 8, "abc", 3), std::invalid_argument);  // too short a key
}

TEST(Hash, DigestHexRoundTripsAndRefusesAnythingElse) {
  const Digest d = blake2b256("x", 1);
  const std::string hex = digest_hex(d);
  ASSERT_EQ(hex.size(), 64u);
  EXPECT_EQ(parse_digest_hex(hex), d);
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(parse_digest_hex(upper), d);
  EXPECT_FALSE(parse_digest_hex(hex.substr(1)));
  EXPECT_FALSE(parse_digest_hex(hex + "0"));
  EXPECT_FALSE(parse_digest_hex("00000000000000a5"));  // a 64-bit FNV value is no digest
  std::string bad = hex;
  bad[10] = 'g';
  EXPECT_FALSE(parse_digest_hex(bad));
  EXPECT_TRUE(digests_equal(d, *parse_digest_hex(hex)));
  Digest e = d;
  e[31] ^= 1;
  EXPECT_FALSE(digests_equal(d, e));
}

TEST(Hash, RandomKeysDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 16; ++i) seen.insert(digest_hex(random_key()));
  EXPECT_EQ(seen.size(), 16u);
}

}  // namespace
}  // namespace deloco
