#include "support/html_escape.h"

#include <gtest/gtest.h>

namespace moerr {
namespace {

TEST(HtmlEscape, ReplacesTheFourMarkupCharacters) {
  EXPECT_EQ(HtmlEscape("a<b> & \"c\" 'd'"), "a&lt;b&gt; &amp; &quot;c&quot; 'd'");
  EXPECT_EQ(HtmlEscape("&amp;"), "&amp;amp;");
  EXPECT_EQ(HtmlEscape(""), "");
}

}  // namespace
}  // namespace moerr
