// clip_utf8: untrusted text is cut at character boundaries and made valid UTF-8 before it reaches a record.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "util/text.h"

namespace deloco {
namespace text_cases {

TEST(Text, ShortValidTextIsUnchanged) {
  EXPECT_EQ(clip_utf8("done", 40), "done");
  EXPECT_EQ(clip_utf8("", 0), "");
  EXPECT_EQ(clip_utf8("h\xc3\xa9llo", 6), "h\xc3\xa9llo");  // "héllo" is 6 bytes: fits exactly
}

TEST(Text, CutNeverSplitsACharacter) {
  // 39 ASCII bytes then "é" (2 bytes): a plain 40-byte cut would keep half of the é.
  const std::string s = std::string(39, 'x') + "\xc3\xa9" + "tail";
  const std::string c = clip_utf8(s, 40);
  EXPECT_LE(c.size(), 40u);
  EXPECT_TRUE(is_valid_utf8(c));
  EXPECT_EQ(c, std::string(37, 'x') + "...");
  // Every cut length of a text of 2-, 3- and 4-byte characters stays valid and within the limit.
  const std::string wide = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80" "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  for (size_t n = 0; n <= wide.size() + 2; ++n) {
    const std::string w = clip_utf8(wide, n);
    EXPECT_LE(w.size(), n);
    EXPECT_TRUE(is_valid_utf8(w)) << n;
    EXPECT_NO_THROW((void)nlohmann::json(w).dump()) << n;
  }
}

TEST(Text, InvalidBytesAreReplaced) {
  EXPECT_FALSE(is_valid_utf8("\xc3"));
  EXPECT_FALSE(is_valid_utf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));      // a UTF-16 surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_TRUE(is_valid_utf8("\xf4\x8f\xbf\xbf"));   // U+10FFFF
  const std::string c = clip_utf8("a\xff" "b\xc3", 100);
  EXPECT_EQ(c, "a\xef\xbf\xbd" "b\xef\xbf\xbd");
  EXPECT_NO_THROW((void)nlohmann::json(c).dump());
  // Without the helper the same text makes nlohmann::json throw when dumped: the failure the helper prevents.
  EXPECT_THROW((void)nlohmann::json(std::string(39, 'x') + "\xc3").dump(), nlohmann::json::type_error);
}

}  // namespace
}  // namespace deloco
