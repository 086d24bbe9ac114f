#include "support/enum_table.h"

#include <gtest/gtest.h>

namespace moerr {
namespace {

enum class Color { kRed, kGreen, kBlue };
constexpr EnumName<Color> kColors[] = {{Color::kRed, "red"}, {Color::kGreen, "green"}};

TEST(EnumTable, ParsesEveryListedName) {
  for (const EnumName<Color>& entry : kColors) {
    absl::StatusOr<Color> parsed = ParseEnum(kColors, "color", entry.name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, entry.value);
    EXPECT_EQ(EnumNameOf(kColors, entry.value), entry.name);
  }
}

TEST(EnumTable, UnknownNameListsTheAcceptedOnes) {
  absl::StatusOr<Color> parsed = ParseEnum(kColors, "color", "blue");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(), "unknown color \"blue\" (red, green)");
}

TEST(EnumTable, UnlistedValueGetsTheFallback) {
  EXPECT_EQ(EnumNameOf(kColors, Color::kBlue), "unknown");
  EXPECT_EQ(EnumNameOf(kColors, Color::kBlue, "?"), "?");
  static_assert(EnumNameOf(kColors, Color::kGreen) == "green", "the lookup is constexpr");
}

}  // namespace
}  // namespace moerr
