// One table per enum gives both directions, name -> value and value -> name,
// so the two can never disagree. A table is a constexpr array:
//
//   constexpr EnumName<Precision> kPrecisions[] = {
//       {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}};
//   ParseEnum(kPrecisions, "precision", "fp16")  // InvalidArgument: unknown precision "fp16" (fp32, bf16)
//   EnumNameOf(kPrecisions, Precision::kBf16)    // "bf16"
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace moerr {

template <class E>
struct EnumName {
  E value;
  absl::string_view name;
};

// The value named `text`, or InvalidArgument naming `what` and every accepted name.
template <class E, size_t N>
absl::StatusOr<E> ParseEnum(const EnumName<E> (&table)[N], absl::string_view what, absl::string_view text) {
  std::string accepted;
  for (const EnumName<E>& entry : table) {
    if (entry.name == text) return entry.value;
    absl::StrAppend(&accepted, accepted.empty() ? "" : ", ", entry.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown ", what, " \"", text, "\" (", accepted, ")"));
}

// The name of `value`, or `fallback` for a value the table does not list
// (a corrupt or newer file's number cast to the enum).
template <class E, size_t N>
constexpr absl::string_view EnumNameOf(const EnumName<E> (&table)[N], E value,
                                       absl::string_view fallback = "unknown") {
  for (const EnumName<E>& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return fallback;
}

}  // namespace moerr
