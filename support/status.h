// Status helpers: the bad-input tier of the house error model (DESIGN.md,
// "Rules of the house" 1). Bugs use MOERR_CHECK (check.h) instead.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace moerr {

// Returns `status` with "context: " prepended to its message, keeping the code.
// Each layer an error passes through adds where it was ("layer 3: ...").
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace moerr

#define MOERR_STATUS_CONCAT_INNER_(a, b) a##b
#define MOERR_STATUS_CONCAT_(a, b) MOERR_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not ok.
#define MOERR_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::absl::Status moerr_status_ = (expr);          \
    if (!moerr_status_.ok()) return moerr_status_;  \
  } while (0)

// `lhs = value of expr` for an absl::StatusOr<T> expr, or returns its status.
#define MOERR_ASSIGN_OR_RETURN(lhs, expr) \
  MOERR_ASSIGN_OR_RETURN_IMPL_(MOERR_STATUS_CONCAT_(moerr_statusor_, __LINE__), lhs, expr)
#define MOERR_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()
