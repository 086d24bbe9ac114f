// Numbers in the JSON moerr writes (reports, --json output, cluster maps).
#pragma once

#include <cmath>
#include <optional>

#include "llvm/Support/JSON.h"

namespace moerr::formats {

// JSON has no NaN or infinity: a non-finite `v` is written as null.
inline llvm::json::Value JsonNumber(double v) { return std::isfinite(v) ? llvm::json::Value(v) : llvm::json::Value(nullptr); }

// For values a bundle keeps (metrics, anomalies), where the kind matters: a
// non-finite `v` is written as the string "nan", "inf" or "-inf".
inline llvm::json::Value JsonNumberOrName(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

// What JsonNumberOrName wrote, read back; nullopt for anything else.
inline std::optional<double> NumberOrName(const llvm::json::Value& v) {
  if (const auto n = v.getAsNumber()) return *n;
  const auto name = v.getAsString();
  if (!name) return std::nullopt;
  if (*name == "nan") return std::nan("");
  if (*name == "inf") return HUGE_VAL;
  if (*name == "-inf") return -HUGE_VAL;
  return std::nullopt;
}

}  // namespace moerr::formats
