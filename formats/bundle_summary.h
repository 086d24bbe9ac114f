// What `moerr inspect` reports: a bundle's contents by role, sizes, records
// and steps, computed from the index alone (no tensor bytes are read).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/bundle_index.h"
#include "formats/bundle_reader.h"
#include "formats/raised_step.h"
#include "llvm/Support/JSON.h"

namespace moerr::formats {

struct RoleSummary {
  uint64_t tensors = 0;
  uint64_t blobs = 0;         // distinct contents first stored under this role
  uint64_t raw_bytes = 0;     // of those blobs
  uint64_t stored_bytes = 0;  // of those blobs, as encoded in the file
};

struct BundleSummary {
  uint64_t file_bytes = 0;
  uint16_t major = 0, minor = 0;
  std::string writer;  // the moerr version that wrote the file; "" when not recorded
  uint64_t tensors = 0, blobs = 0, chunks = 0;
  uint64_t raw_bytes = 0, stored_bytes = 0;
  uint64_t logical_bytes = 0;  // as if every tensor were stored (no dedup)
  std::array<RoleSummary, kNumRoles> roles{};
  std::map<std::string, uint64_t> records;  // by kind name
  uint64_t ops = 0;                          // traced ops, over all steps
  std::vector<int64_t> complete_steps;
  std::map<int64_t, RaisedStep> raised;  // steps left by an exception
  // Per step, the loop's named metrics (the step annotation "outcome"),
  // in the order first given.
  std::map<int64_t, std::vector<std::pair<std::string, double>>> outcomes;
  std::map<std::string, llvm::json::Value> annotations;  // step-less ones
};

absl::StatusOr<BundleSummary> Summarize(const BundleReader& reader);
// The metrics of an "outcome" annotation: loss and grad_norm first, then by name.
std::vector<std::pair<std::string, double>> OutcomeMetrics(const llvm::json::Value& value);
// Every step's "outcome" metrics, reading the step annotations alone.
absl::StatusOr<std::map<int64_t, std::vector<std::pair<std::string, double>>>> ReadOutcomes(
    const BundleReader& reader);
std::string RenderText(const BundleSummary& s, const std::string& path);
llvm::json::Value ToJson(const BundleSummary& s);

// "1.5 MiB", "734 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace moerr::formats
