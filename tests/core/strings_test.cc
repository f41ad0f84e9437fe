#include "core/strings.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(StringsTest, StrCatMixesTypes) {
  EXPECT_EQ(StrCat("GPU ", 3, " has ", int64_t{2048}, " MiB", '!'), "GPU 3 has 2048 MiB!");
  EXPECT_EQ(StrCat(-5, std::string_view("x")), "-5x");
}

TEST(StringsTest, SplitKeepsEmptyPieces) {
  std::vector<std::string_view> p = StrSplit("a,b,,c", ',');
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[2], "");
  EXPECT_EQ(StrSplit("", ',').size(), 1u);
}

TEST(StringsTest, SplitAnyDropsEmptyPieces) {
  std::vector<std::string_view> p = SplitAny("  GPU0\t X \tNV12  ", " \t");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1], "X");
}

TEST(StringsTest, ParseIntIsStrict) {
  int n = 0;
  EXPECT_TRUE(ParseInt("42", &n));
  EXPECT_EQ(n, 42);
  EXPECT_TRUE(ParseInt("-3", &n));
  EXPECT_EQ(n, -3);
  EXPECT_FALSE(ParseInt(" 4", &n));
  EXPECT_FALSE(ParseInt("4x", &n));
  EXPECT_FALSE(ParseInt("", &n));
  EXPECT_FALSE(ParseInt("99999999999", &n));
}

TEST(StringsTest, JoinAndStrip) {
  std::vector<std::string> v = {"a", "b"};
  EXPECT_EQ(StrJoin(v, ", "), "a, b");
  EXPECT_EQ(StripWhitespace("  x y \n"), "x y");
  EXPECT_EQ(AsciiLower("HiGh"), "high");
}

}  // namespace
}  // namespace tessera
