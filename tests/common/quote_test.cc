// Quote (src/common/quote.h): the one helper that quotes outside text inside error messages.
#include "common/quote.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera {
namespace {

TEST(QuoteTest, ShortTextIsKeptWithLineBreaksAsSpaces) {
  EXPECT_EQ(Quote(""), "");
  EXPECT_EQ(Quote("{\"kind\":\"Status\"}"), "{\"kind\":\"Status\"}");
  EXPECT_EQ(Quote("line one\r\nline two\n"), "line one  line two ");
}

TEST(QuoteTest, TextIsCutAtTheCap) {
  EXPECT_EQ(kQuoteCap, 200u);  // the documented cap (quote.h)
  const std::string at_cap(kQuoteCap, 'x');
  EXPECT_EQ(Quote(at_cap), at_cap);  // nothing cut, no "..."
  const std::string over = at_cap + "y";
  EXPECT_EQ(Quote(over), at_cap + "...");
  // A peer's megabyte of reply still makes a short message.
  const std::string huge(1 << 20, '\n');
  EXPECT_EQ(Quote(huge), std::string(kQuoteCap, ' ') + "...");
}

}  // namespace
}  // namespace tessera
