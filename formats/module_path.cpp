#include "formats/module_path.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace moerr::formats {
namespace {

bool IsIndex(absl::string_view part) {
  return !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return absl::ascii_isdigit(c); });
}

bool IsWord(absl::string_view part) {
  return !part.empty() &&
         std::all_of(part.begin(), part.end(), [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
}

std::optional<int64_t> Index(absl::string_view part) {
  int64_t value = 0;
  if (!IsIndex(part) || !absl::SimpleAtoi(part, &value)) return std::nullopt;  // too long for int64
  return value;
}

}  // namespace

ModulePath ParseModulePath(absl::string_view module) {
  ModulePath out;
  out.module_class = ModuleClass(module);
  const std::vector<absl::string_view> parts = absl::StrSplit(module, '.');
  if (parts.size() < 3 || parts[0] != "model" || parts[1] != "layers") return out;
  out.layer = Index(parts[2]);
  if (out.layer && parts.size() >= 6 && IsWord(parts[3]) && parts[4] == "experts") out.expert = Index(parts[5]);
  return out;
}

std::optional<std::pair<int64_t, int64_t>> ExpertOf(absl::string_view module) {
  const ModulePath path = ParseModulePath(module);
  if (!path.layer || !path.expert) return std::nullopt;
  return std::make_pair(*path.layer, *path.expert);
}

std::string ModuleClass(absl::string_view module) {
  std::vector<absl::string_view> kept;
  for (absl::string_view part : absl::StrSplit(module, absl::ByAnyChar(". "))) {
    if (!part.empty() && !IsIndex(part)) kept.push_back(part);
  }
  return absl::StrJoin(kept, ".");
}

}  // namespace moerr::formats
