// The LibTorch exception boundary of library code: where a c10::Error from
// LibTorch becomes an absl::Status (tools/ main reports one that escapes).
// In recorder/ beside the LibTorch hooks, the lowest library that links
// LibTorch; every library that uses it links moerr_recorder_hooks.
#pragma once

#include "absl/strings/string_view.h"

#include <c10/util/Exception.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moerr {

// Runs `fn` (returning absl::Status); a c10::Error it throws becomes
// kInvalidArgument naming `what`, with LibTorch's message without backtrace.
template <typename Fn>
absl::Status CatchTorch(absl::string_view what, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": LibTorch: ", e.what_without_backtrace()));
  }
}

}  // namespace moerr
