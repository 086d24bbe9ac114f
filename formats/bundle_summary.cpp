#include "formats/bundle_summary.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/annotations.h"
#include "formats/json_number.h"
#include "support/status.h"

namespace moerr::formats {

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%d B", bytes) : absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

absl::StatusOr<BundleSummary> Summarize(const BundleReader& reader) {
  const IndexData& index = reader.index();
  BundleSummary s;
  s.file_bytes = reader.file_size();
  s.major = reader.superblock().major;
  s.minor = reader.superblock().minor;
  s.writer = index.writer;
  s.tensors = index.tensors.size();
  s.blobs = index.blobs.size();
  std::vector<bool> counted(index.blobs.size(), false);
  for (const TensorInfo& t : index.tensors) {
    RoleSummary& role = s.roles[static_cast<int>(t.role)];
    ++role.tensors;
    const BlobInfo& blob = index.blobs[t.blob];
    s.logical_bytes += blob.raw_size;
    if (counted[t.blob]) continue;
    counted[t.blob] = true;
    ++role.blobs;
    role.raw_bytes += blob.raw_size;
    role.stored_bytes += blob.StoredSize();
  }
  for (const BlobInfo& blob : index.blobs) {
    s.chunks += blob.chunks.size();
    s.raw_bytes += blob.raw_size;
    s.stored_bytes += blob.StoredSize();
  }
  for (const RecordRef& r : index.records) {
    ++s.records[std::string(RecordKindName(r.kind))];
    if (r.kind == static_cast<uint16_t>(RecordKind::kOps)) {
      MOERR_ASSIGN_OR_RETURN(Record record, reader.ReadRecord(r));
      s.ops += record.ops.ops.size();
    }
    if (r.kind == static_cast<uint16_t>(RecordKind::kAnnotation)) {
      MOERR_ASSIGN_OR_RETURN(Record record, reader.ReadRecord(r));
      if (r.step < 0) s.annotations.insert_or_assign(record.key, std::move(record.value));
    }
  }
  s.complete_steps = reader.CompleteSteps();
  MOERR_ASSIGN_OR_RETURN(s.raised, ReadRaisedSteps(reader));
  MOERR_ASSIGN_OR_RETURN(s.outcomes, ReadOutcomes(reader));
  return s;
}

absl::StatusOr<std::map<int64_t, std::vector<std::pair<std::string, double>>>> ReadOutcomes(
    const BundleReader& reader) {
  std::map<int64_t, std::vector<std::pair<std::string, double>>> out;
  for (const RecordRef& r : reader.index().records) {
    if (r.kind != static_cast<uint16_t>(RecordKind::kAnnotation) || r.step < 0) continue;
    MOERR_ASSIGN_OR_RETURN(Record record, reader.ReadRecord(r));
    if (record.key == kOutcomeAnnotation) out[r.step] = OutcomeMetrics(record.value);
  }
  return out;
}

std::vector<std::pair<std::string, double>> OutcomeMetrics(const llvm::json::Value& value) {
  std::vector<std::pair<std::string, double>> out;
  const llvm::json::Object* o = value.getAsObject();
  if (o == nullptr) return out;
  for (const auto& [key, v] : *o) {
    if (const std::optional<double> number = NumberOrName(v)) out.emplace_back(key.str(), *number);
  }
  // loss and grad_norm first, then by name (a JSON object keeps no order).
  auto rank = [](const std::string& name) { return name == "loss" ? 0 : name == "grad_norm" ? 1 : 2; };
  std::sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
    return std::make_pair(rank(a.first), a.first) < std::make_pair(rank(b.first), b.first);
  });
  return out;
}

namespace {

// The metrics table: a column per metric any step named, the last
// kMaxRows steps.
std::string RenderOutcomes(const std::map<int64_t, std::vector<std::pair<std::string, double>>>& outcomes) {
  constexpr size_t kMaxRows = 12;
  if (outcomes.empty()) return "";
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& [step, metrics] : outcomes) {
    for (const auto& [name, v] : metrics) {
      if (seen.insert(name).second) names.push_back(name);
    }
  }
  std::string out = absl::StrFormat("\n  %6s", "step");
  for (const std::string& name : names) absl::StrAppendFormat(&out, " %12s", name);
  out += "\n";
  size_t skip = outcomes.size() > kMaxRows ? outcomes.size() - kMaxRows : 0;
  if (skip > 0) absl::StrAppendFormat(&out, "  (%d earlier steps: --json has every one)\n", skip);
  for (const auto& [step, metrics] : outcomes) {
    if (skip > 0 && skip--) continue;
    absl::StrAppendFormat(&out, "  %6d", step);
    for (const std::string& name : names) {
      auto it = std::find_if(metrics.begin(), metrics.end(), [&](const auto& m) { return m.first == name; });
      absl::StrAppendFormat(&out, " %12s", it == metrics.end() ? "-" : absl::StrFormat("%.5g", it->second));
    }
    out += "\n";
  }
  return out;
}

// A value of an import's annotation as one line: numbers in the fewest
// digits that read back the same (0.9, not 0.90000000000000002).
std::string ImportedValueText(const llvm::json::Value& v) {
  const llvm::Optional<double> d = v.getAsNumber();
  if (d && !v.getAsInteger()) {
    std::string text;
    for (int digits = 6; digits <= 17; ++digits) {
      text = absl::StrFormat("%.*g", digits, *d);
      if (std::strtod(text.c_str(), nullptr) == *d) break;
    }
    return text;
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << v;
  os.flush();
  return text;
}

// An import's non-tensor values and skipped entries (the annotations
// "imported_values" and "imported_skipped", importers/torch_import.h): one
// per line, the first kMaxListed, shallow paths first ("step" before
// "optimizer.param_groups.0.lr").
std::string RenderImported(const std::string& key, const llvm::json::Object& entries) {
  constexpr size_t kMaxListed = 16;
  const bool values = key == kImportedValuesAnnotation;
  std::vector<std::pair<size_t, std::string>> paths;
  for (const auto& [path, v] : entries) paths.emplace_back(llvm::StringRef(path).count('.'), path.str());
  std::sort(paths.begin(), paths.end());
  const bool one = paths.size() == 1;
  std::string out = absl::StrFormat("  %s: %d %s\n", key, paths.size(),
                                    values ? (one ? "value that is not a tensor" : "values that are not tensors")
                                           : (one ? "entry not read" : "entries not read"));
  for (size_t i = 0; i < paths.size() && i < kMaxListed; ++i) {
    const std::string& path = paths[i].second;
    const llvm::json::Value& v = *entries.get(path);
    const llvm::Optional<llvm::StringRef> why = v.getAsString();
    absl::StrAppendFormat(&out, "    %s%s%s\n", path, values ? " = " : ": ",
                          !values && why ? why->str() : ImportedValueText(v));
  }
  if (paths.size() > kMaxListed) {
    absl::StrAppendFormat(&out, "    ... %d more: --json has every one\n", paths.size() - kMaxListed);
  }
  return out;
}

}  // namespace

std::string RenderText(const BundleSummary& s, const std::string& path) {
  std::string out = absl::StrFormat("%s: moerr bundle v%d.%d, %s, written by %s\n", path, s.major, s.minor,
                                    HumanBytes(s.file_bytes),
                                    s.writer.empty() ? std::string("an unrecorded moerr version") : "moerr " + s.writer);
  // A step left by an exception is the first fact to show.
  for (const auto& [step, raised] : s.raised) {
    absl::StrAppendFormat(&out, "  step %d RAISED %s\n", step, raised.Headline());
  }
  absl::StrAppendFormat(&out, "  %d tensors in %d distinct blobs (%d chunks)\n", s.tensors, s.blobs, s.chunks);
  absl::StrAppendFormat(&out, "  tensor bytes: %s logical, %s distinct, %s stored (%.3fx of distinct)\n",
                        HumanBytes(s.logical_bytes), HumanBytes(s.raw_bytes), HumanBytes(s.stored_bytes),
                        s.raw_bytes ? static_cast<double>(s.stored_bytes) / s.raw_bytes : 0.0);
  absl::StrAppendFormat(&out, "\n  %-16s %8s %8s %12s %12s\n", "role", "tensors", "blobs", "raw", "stored");
  for (int r = 0; r < kNumRoles; ++r) {
    const RoleSummary& role = s.roles[r];
    if (role.tensors == 0) continue;
    absl::StrAppendFormat(&out, "  %-16s %8d %8d %12s %12s\n", RoleName(static_cast<Role>(r)), role.tensors,
                          role.blobs, HumanBytes(role.raw_bytes), HumanBytes(role.stored_bytes));
  }
  std::vector<std::string> records;
  for (const auto& [kind, n] : s.records) records.push_back(absl::StrFormat("%s %d", kind, n));
  absl::StrAppendFormat(&out, "\n  traced ops: %d\n", s.ops);
  absl::StrAppendFormat(&out, "  records: %s\n", records.empty() ? "none" : absl::StrJoin(records, ", "));
  absl::StrAppendFormat(&out, "  complete steps: %s\n",
                        s.complete_steps.empty() ? "none" : absl::StrJoin(s.complete_steps, ", "));
  if (!s.raised.empty()) {
    std::vector<int64_t> raised;
    for (const auto& [step, r] : s.raised) raised.push_back(step);
    absl::StrAppendFormat(&out, "  raised steps: %s\n", absl::StrJoin(raised, ", "));
  }
  out += RenderOutcomes(s.outcomes);
  for (const auto& [key, value] : s.annotations) {
    if ((key == kImportedValuesAnnotation || key == kImportedSkippedAnnotation) && value.getAsObject() != nullptr) {
      out += RenderImported(key, *value.getAsObject());
      continue;
    }
    std::string text;
    llvm::raw_string_ostream os(text);
    os << value;
    os.flush();
    if (text.size() > 100) text = text.substr(0, 97) + "...";
    absl::StrAppendFormat(&out, "  %s: %s\n", key, text);
  }
  return out;
}

llvm::json::Value ToJson(const BundleSummary& s) {
  llvm::json::Object roles;
  for (int r = 0; r < kNumRoles; ++r) {
    const RoleSummary& role = s.roles[r];
    if (role.tensors == 0) continue;
    roles[std::string(RoleName(static_cast<Role>(r)))] = llvm::json::Object{
        {"tensors", role.tensors}, {"blobs", role.blobs}, {"raw_bytes", role.raw_bytes},
        {"stored_bytes", role.stored_bytes}};
  }
  llvm::json::Object records;
  for (const auto& [kind, n] : s.records) records[kind] = n;
  llvm::json::Object annotations;
  for (const auto& [key, value] : s.annotations) annotations[key] = llvm::json::Value(value);
  llvm::json::Array steps;
  for (int64_t step : s.complete_steps) steps.push_back(step);
  llvm::json::Object raised;
  for (const auto& [step, r] : s.raised) raised[std::to_string(step)] = toJSON(r);
  llvm::json::Object outcomes;
  for (const auto& [step, metrics] : s.outcomes) {
    llvm::json::Object o;
    for (const auto& [name, v] : metrics) o[name] = JsonNumberOrName(v);
    outcomes[std::to_string(step)] = std::move(o);
  }
  return llvm::json::Object{{"file_bytes", s.file_bytes},
                            {"version", absl::StrFormat("%d.%d", s.major, s.minor)},
                            {"writer", s.writer.empty() ? llvm::json::Value(nullptr) : llvm::json::Value(s.writer)},
                            {"tensors", s.tensors},
                            {"blobs", s.blobs},
                            {"chunks", s.chunks},
                            {"logical_bytes", s.logical_bytes},
                            {"raw_bytes", s.raw_bytes},
                            {"stored_bytes", s.stored_bytes},
                            {"roles", std::move(roles)},
                            {"records", std::move(records)},
                            {"ops", s.ops},
                            {"complete_steps", std::move(steps)},
                            {"raised_steps", std::move(raised)},
                            {"outcomes", std::move(outcomes)},
                            {"annotations", std::move(annotations)}};
}

}  // namespace moerr::formats
