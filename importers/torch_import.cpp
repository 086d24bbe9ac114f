#include "importers/torch_import.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "importers/tensor_files.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/filesystem.h"
#include "support/status.h"

namespace moerr::importers {
namespace {

namespace fs = std::filesystem;

// Deeper nesting than a tensor dict has; bounds the recursion.
constexpr int kMaxDepth = 32;

struct Named {
  std::string name;
  at::Tensor tensor;
};

// Appends the tensors of `v` under `name` ("" at the top): dicts' keys and
// lists' indices joined with "."; values that are not tensors are counted
// in `skipped`.
absl::Status Flatten(const c10::IValue& v, const std::string& name, int depth, std::vector<Named>& out,
                     uint64_t& skipped) {
  if (depth > kMaxDepth) return absl::InvalidArgumentError(absl::StrCat(name, ": nested too deeply"));
  auto child = [&](const std::string& key) { return name.empty() ? key : absl::StrCat(name, ".", key); };
  if (v.isTensor()) {
    out.push_back(Named{name, v.toTensor().detach().cpu().contiguous()});
  } else if (v.isGenericDict()) {
    for (const auto& item : v.toGenericDict()) {
      const c10::IValue& key = item.key();
      const std::string k = key.isString() ? key.toStringRef() : key.isInt() ? std::to_string(key.toInt()) : "";
      if (k.empty()) return absl::InvalidArgumentError(absl::StrCat(name.empty() ? "the dict" : name,
                                                                    ": a key that is not a string or an integer"));
      MOERR_RETURN_IF_ERROR(Flatten(item.value(), child(k), depth + 1, out, skipped));
    }
  } else if (v.isList() || v.isTuple()) {
    const std::vector<c10::IValue> items =
        v.isList() ? v.toList().vec() : std::vector<c10::IValue>(v.toTupleRef().elements().begin(),
                                                                  v.toTupleRef().elements().end());
    for (size_t i = 0; i < items.size(); ++i) MOERR_RETURN_IF_ERROR(Flatten(items[i], child(std::to_string(i)), depth + 1, out, skipped));
  } else {
    ++skipped;  // a number, a string, None: not a tensor to compare
  }
  return absl::OkStatus();
}

// "layer10" after "layer2": digit runs compare as numbers.
bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string x = a.substr(i, ie - i), y = b.substr(j, je - j);
      const size_t xs = x.find_first_not_of('0'), ys = y.find_first_not_of('0');
      const std::string xn = xs == std::string::npos ? "" : x.substr(xs), yn = ys == std::string::npos ? "" : y.substr(ys);
      if (xn.size() != yn.size()) return xn.size() < yn.size();
      if (xn != yn) return xn < yn;
      i = ie, j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i, ++j;
  }
  return a.size() - i < b.size() - j;
}

absl::StatusOr<std::vector<std::string>> PtFiles(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
    return std::vector<std::string>{path};
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file(ec) && (ext == ".pt" || ext == ".pth")) files.push_back(e.path().filename().string());
  }
  if (files.empty()) return absl::NotFoundError(absl::StrCat(path, ": no .pt or .pth file in the directory"));
  std::sort(files.begin(), files.end(), NaturalLess);
  for (std::string& f : files) f = (fs::path(path) / f).string();
  return files;
}

}  // namespace

absl::StatusOr<ImportResult> ImportTorch(const std::string& path, const std::string& run_dir,
                                         const ImportOptions& options) {
  MOERR_ASSIGN_OR_RETURN(const std::vector<std::string> files, PtFiles(path));
  const bool directory = files.size() > 1 || files[0] != path;
  MOERR_RETURN_IF_ERROR(MakeDirectory(run_dir));
  ImportResult result;
  result.task = "tensor";
  const std::string bundle = (fs::path(run_dir) / "rank0.moerr").string();
  MOERR_ASSIGN_OR_RETURN(std::unique_ptr<ImportWriter> writer,
                         ImportWriter::Create(bundle, options.overwrite, true,
                                              llvm::json::Object{{"from", "torch.save"}, {"path", path}}));
  MOERR_RETURN_IF_ERROR(writer->BeginStep(0));
  llvm::json::Array names;
  uint64_t skipped = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    MOERR_ASSIGN_OR_RETURN(const c10::IValue value, LoadPickle(files[f]));
    if (!value.isTensor() && !value.isGenericDict()) {
      return absl::InvalidArgumentError(absl::StrCat(files[f], ": holds a ", value.tagKind(),
                                                     ", not a tensor or a dict of names to tensors"));
    }
    std::vector<Named> tensors;
    MOERR_RETURN_IF_ERROR(Annotate(Flatten(value, "", 0, tensors, skipped), files[f]));
    // A directory's names are "stem/key" ("stem" for a file of one tensor).
    const std::string stem = fs::path(files[f]).stem().string();
    for (Named& t : tensors) {
      const absl::StatusOr<formats::DType> dtype = recorder::ToDType(t.tensor.scalar_type());
      if (!dtype.ok()) {
        ++result.unsupported;
        continue;
      }
      if (directory) t.name = t.name.empty() ? stem : absl::StrCat(stem, "/", t.name);
      if (t.name.empty()) t.name = "tensor";
      MOERR_ASSIGN_OR_RETURN(const uint64_t id, writer->Output(*dtype, t.tensor.sizes().vec(),
                                                               recorder::ComputeFingerprint(t.tensor), t.tensor));
      formats::OpEvent op;
      op.name = t.name;
      const size_t dot = t.name.find_last_of("./");
      op.module = dot == std::string::npos ? "" : t.name.substr(0, dot);
      op.outputs = {id};
      MOERR_RETURN_IF_ERROR(writer->AddOp(std::move(op)));
      names.push_back(t.name);
    }
    if (options.progress) options.progress("torch", static_cast<int64_t>(f + 1), static_cast<int64_t>(files.size()));
  }
  if (names.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no tensor to import"));
  MOERR_RETURN_IF_ERROR(writer->EndStep(llvm::json::Object{{"source", path},
                                                           {"entries", std::move(names)},
                                                           {"non_tensors_skipped", skipped}}));
  MOERR_RETURN_IF_ERROR(writer->Close());
  result.stats = writer->stats();
  result.bundles.push_back(bundle);
  return result;
}

}  // namespace moerr::importers
