#include "proxy/token_file.h"

#include <ATen/ATen.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "formats/safetensors.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/status.h"

namespace moerr::proxy {
// Token ids separated by commas or white space.
absl::StatusOr<std::vector<int64_t>> ParseIds(absl::string_view text, const std::string& where) {
  std::vector<int64_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(", \t\r"), absl::SkipEmpty())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: \"%s\" is not an integer token id", where, piece));
    }
    ids.push_back(id);
  }
  return ids;
}

// Rows of equal, non-zero length as a [B, T] int64 tensor.
absl::StatusOr<at::Tensor> FromRows(const std::vector<std::vector<int64_t>>& rows, const std::string& where) {
  if (rows.empty() || rows[0].empty()) return absl::InvalidArgumentError(where + ": no token ids");
  for (size_t r = 1; r < rows.size(); ++r) {
    if (rows[r].size() != rows[0].size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: sequence %d has %d ids, sequence 0 has %d; every sequence needs the same length", where, r,
          rows[r].size(), rows[0].size()));
    }
  }
  at::Tensor out = at::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, at::kLong);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].begin(), rows[r].end(), out[r].data_ptr<int64_t>());
  }
  return out;
}

namespace {

// A text file: one sequence per non-blank line.
absl::StatusOr<at::Tensor> ReadIdsText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot open %s", path));
  std::vector<std::vector<int64_t>> rows;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    MOERR_ASSIGN_OR_RETURN(std::vector<int64_t> ids, ParseIds(line, absl::StrFormat("%s line %d", path, n)));
    if (!ids.empty()) rows.push_back(std::move(ids));
  }
  return FromRows(rows, path);
}

}  // namespace

// Tensor `name` of the safetensors file at `path`, copied out of the map.
absl::StatusOr<at::Tensor> ReadNamedTensor(const std::string& path, const std::string& name) {
  MOERR_ASSIGN_OR_RETURN(const formats::SafetensorsFile file, formats::ReadSafetensors(path));
  std::vector<std::string> names;
  for (const auto& [n, view] : file.tensors) {
    if (n == name) return recorder::ToTensor(view);
    names.push_back(n);
  }
  return absl::NotFoundError(absl::StrFormat("%s has no \"%s\" tensor (it holds: %s)", path, name,
                                             names.empty() ? "none" : absl::StrJoin(names, ", ")));
}

// input_ids [B, T] (or [T]) of an integer dtype, as int64 [B, T].
absl::StatusOr<at::Tensor> ReadInputIds(const std::string& path) {
  MOERR_ASSIGN_OR_RETURN(at::Tensor ids, ReadNamedTensor(path, "input_ids"));
  if (at::isFloatingType(ids.scalar_type()) || ids.scalar_type() == at::kBool) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: input_ids is %s, not an integer tensor", path, c10::toString(ids.scalar_type())));
  }
  if (ids.dim() == 1) ids = ids.unsqueeze(0);
  if (ids.dim() != 2 || ids.numel() == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: input_ids has shape %s; it needs [batch, positions], non-empty", path, recorder::ShapeText(ids)));
  }
  return ids.to(at::kLong);
}

absl::StatusOr<at::Tensor> ReadTokenFile(const std::string& path) {
  if (absl::EndsWith(path, ".safetensors")) return ReadInputIds(path);
  return ReadIdsText(path);
}

}  // namespace moerr::proxy
