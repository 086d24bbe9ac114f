// The Cap'n Proto exception boundary: the only place kj::Exception is caught.
// In formats/, the only library that links Cap'n Proto.
#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kj/exception.h"

namespace moerr {

// Runs `fn` (returning absl::Status); a kj::Exception it throws becomes
// kDataLoss naming `what`. Cap'n Proto throws on malformed messages (segment
// table, traversal and nesting limits), so this wraps every decode.
template <typename Fn>
absl::Status CatchKj(absl::string_view what, Fn&& fn) {
  try {
    return fn();
  } catch (const kj::Exception& e) {
    return absl::DataLossError(
        absl::StrCat(what, ": Cap'n Proto: ", e.getDescription().cStr()));
  }
}

}  // namespace moerr
