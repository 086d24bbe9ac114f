// Numbers in the JSON moerr writes (reports, --json output, cluster maps).
#pragma once

#include <cmath>
#include <cstdio>
#include <optional>

#include "llvm/Support/FormatVariadic.h"
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

// Prints `value` as indented JSON on stdout: every --json output. Through
// stdio, as the commands' text is, so the two never interleave out of order.
inline void PrintJson(llvm::json::Value value) {
  std::printf("%s\n", llvm::formatv("{0:2}", std::move(value)).str().c_str());
}

}  // namespace moerr::formats
