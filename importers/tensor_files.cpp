#include "importers/tensor_files.h"

#include <ATen/ATen.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "importers/torch_save_file.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/status.h"

namespace moerr::importers {
namespace {

absl::Status Bad(const std::string& file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what));
}

// The value of 'key' in a .npy header, a Python dict literal:
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
absl::StatusOr<absl::string_view> HeaderField(absl::string_view header, absl::string_view key,
                                              const std::string& file) {
  const std::string quoted = absl::StrCat("'", key, "':");
  const size_t at = header.find(quoted);
  if (at == absl::string_view::npos) return Bad(file, absl::StrCat(".npy header has no '", key, "'"));
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(header.substr(at + quoted.size()));
  const char open = rest.empty() ? 0 : rest[0];
  const char close = open == '\'' ? '\'' : open == '(' ? ')' : ',';
  const size_t end = rest.find(close, open == '\'' || open == '(' ? 1 : 0);
  if (end == absl::string_view::npos) return Bad(file, absl::StrCat(".npy header: '", key, "' is cut short"));
  if (open == '\'' || open == '(') return rest.substr(1, end - 1);
  return absl::StripAsciiWhitespace(rest.substr(0, end));
}

absl::StatusOr<formats::DType> NpyDType(absl::string_view descr, const std::string& file) {
  static const std::pair<absl::string_view, formats::DType> kDescr[] = {
      {"<f8", formats::DType::kF64}, {"<f4", formats::DType::kF32}, {"<f2", formats::DType::kF16},
      {"<i8", formats::DType::kI64}, {"<i4", formats::DType::kI32}, {"<i2", formats::DType::kI16},
      {"|i1", formats::DType::kI8},  {"|u1", formats::DType::kU8},  {"|b1", formats::DType::kBool}};
  for (const auto& [d, dtype] : kDescr) {
    if (descr == d) return dtype;
  }
  return Bad(file, absl::StrCat(".npy dtype '", descr, "' is not one moerr stores (f8 f4 f2 i8 i4 i2 i1 u1 b1, little-endian)"));
}

}  // namespace

absl::StatusOr<std::string> ReadFileBytes(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  if (limit != SIZE_MAX) {
    std::string head(limit, '\0');
    in.read(head.data(), static_cast<std::streamsize>(limit));
    if (in.bad()) return Bad(path, "read failed");
    head.resize(static_cast<size_t>(in.gcount()));
    return head;
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return Bad(path, "read failed");
  return std::move(bytes).str();
}

absl::StatusOr<formats::OwnedTensor> ParseNpy(const std::string& bytes, const std::string& file) {
  static constexpr absl::string_view kMagic("\x93NUMPY", 6);
  if (bytes.size() < 10 || absl::string_view(bytes).substr(0, 6) != kMagic) return Bad(file, "not a .npy file");
  const uint8_t major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Bad(file, ".npy header is cut short");
    for (int i = 3; i >= 0; --i) header_len = header_len << 8 | static_cast<uint8_t>(bytes[8 + i]);
    start = 12;
  } else {
    return Bad(file, absl::StrCat(".npy version ", major, " is not 1, 2 or 3"));
  }
  if (header_len > bytes.size() - start) return Bad(file, ".npy header is cut short");
  const absl::string_view header(bytes.data() + start, header_len);
  MOERR_ASSIGN_OR_RETURN(absl::string_view descr, HeaderField(header, "descr", file));
  MOERR_ASSIGN_OR_RETURN(absl::string_view order, HeaderField(header, "fortran_order", file));
  MOERR_ASSIGN_OR_RETURN(absl::string_view shape_text, HeaderField(header, "shape", file));
  if (order != "False") return Bad(file, ".npy in Fortran order is not read; save it in C order");
  formats::OwnedTensor t;
  MOERR_ASSIGN_OR_RETURN(t.dtype, NpyDType(descr, file));
  for (absl::string_view d : absl::StrSplit(shape_text, ',', absl::SkipWhitespace())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &n) || n < 0) {
      return Bad(file, absl::StrCat(".npy shape (", shape_text, ") is not a tuple of sizes"));
    }
    t.shape.push_back(n);
  }
  auto numel = formats::CheckedNumel(t.shape, formats::ItemSize(t.dtype));
  if (!numel.ok()) return Bad(file, absl::StrCat(".npy shape: ", numel.status().message()));
  const size_t data_start = start + header_len;
  if (bytes.size() - data_start != static_cast<uint64_t>(*numel)) {
    return Bad(file, absl::StrCat(".npy holds ", bytes.size() - data_start, " data bytes, its header says ", *numel,
                                  " (cut short?)"));
  }
  t.bytes.resize(*numel);
  std::memcpy(t.bytes.data(), bytes.data() + data_start, *numel);
  return t;
}

absl::StatusOr<at::Tensor> LoadPtTensor(const std::string& path) {
  MOERR_ASSIGN_OR_RETURN(std::unique_ptr<TorchSaveFile> file, TorchSaveFile::Open(path));
  const PickleValue& root = file->root();
  if (root.kind != PickleValue::Kind::kTensor) return Bad(path, absl::StrCat("holds ", DescribeValue(root), ", not a tensor"));
  MOERR_RETURN_IF_ERROR(Annotate(file->Check(root), path));
  absl::StatusOr<at::Tensor> tensor = file->Read(root);
  if (!tensor.ok()) return Annotate(tensor.status(), path);
  return *std::move(tensor);
}

absl::StatusOr<at::Tensor> LoadTensorFile(const std::string& path) {
  if (absl::EndsWith(path, ".npy")) {
    MOERR_ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(path));
    MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor t, ParseNpy(bytes, path));
    return recorder::ToTensor(t.view());
  }
  return LoadPtTensor(path);
}

}  // namespace moerr::importers
