#include "importers/torch_import.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "formats/annotations.h"
#include "formats/json_number.h"
#include "importers/tensor_files.h"
#include "importers/torch_save_file.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/filesystem.h"
#include "support/status.h"

namespace moerr::importers {
namespace {

namespace fs = std::filesystem;
using Kind = PickleValue::Kind;

// Deeper nesting than a checkpoint has; bounds the recursion.
constexpr int kMaxDepth = 32;
// Values visited in one file: bounds a pickle whose memo repeats a container
// inside itself (2^32 paths from 32 levels of two references).
constexpr size_t kMaxVisits = size_t{1} << 22;
// What the annotations keep: values and skipped entries by path, at most
// this many; a string value cut to this many characters.
constexpr size_t kMaxKept = 10000;
constexpr size_t kMaxValueChars = 256;

// What one file holds, by path ("" for the file itself), in pickle order.
struct FileEntries {
  std::vector<std::pair<std::string, const PickleValue*>> tensors;
  std::vector<std::pair<std::string, llvm::json::Value>> values;
  std::vector<std::pair<std::string, std::string>> skipped;  // path, why
  size_t visits = 0;
};

// A dict key as a path component; nullopt for one that is not a scalar.
std::optional<std::string> KeyText(const PickleValue& key) {
  switch (key.kind) {
    case Kind::kString:
    case Kind::kBytes: return key.text;
    case Kind::kInt: return std::to_string(key.integer);
    case Kind::kBool: return key.boolean ? "True" : "False";
    case Kind::kNone: return "None";
    case Kind::kFloat: return absl::StrCat(key.number);
    default: return std::nullopt;
  }
}

// A value that is not a tensor as JSON: None, bools, ints, floats ("nan",
// "inf" for the non-finite), strings (cut to kMaxValueChars), a class or
// function by name, empty containers; nullopt for anything else.
std::optional<llvm::json::Value> ValueJson(const PickleValue& v) {
  switch (v.kind) {
    case Kind::kNone: return llvm::json::Value(nullptr);
    case Kind::kBool: return llvm::json::Value(v.boolean);
    case Kind::kInt: return llvm::json::Value(v.integer);
    case Kind::kFloat: return formats::JsonNumberOrName(v.number);
    case Kind::kString:
      if (v.text.size() <= kMaxValueChars) return llvm::json::Value(llvm::json::fixUTF8(v.text));
      return llvm::json::Value(llvm::json::fixUTF8(absl::StrCat(v.text.substr(0, kMaxValueChars), "...")));
    case Kind::kBytes: return llvm::json::Value(absl::StrCat("<", v.text.size(), " bytes>"));
    case Kind::kGlobal: return llvm::json::Value(v.text);
    case Kind::kDict: return llvm::json::Value(llvm::json::Object{});
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kSet: return llvm::json::Value(llvm::json::Array{});
    default: return std::nullopt;
  }
}

// Sorts a file's values into `out` by path: tensors that can be read,
// values, skipped entries. Error (naming the entry) only for a damaged file:
// a storage missing or too small for its tensor.
class Walker {
 public:
  Walker(TorchSaveFile& file, FileEntries& out) : file_(file), out_(out) {}

  absl::Status Walk(const PickleValue& v, const std::string& path, int depth) {
    const std::string& where = path.empty() ? std::string("the saved object") : path;
    if (++out_.visits > kMaxVisits) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": more than ", kMaxVisits, " entries"));
    }
    if (depth > kMaxDepth) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": nested deeper than ", kMaxDepth, " levels"));
    }
    const bool container =
        v.kind == Kind::kDict || v.kind == Kind::kList || v.kind == Kind::kTuple || v.kind == Kind::kSet;
    if (v.kind == Kind::kTensor) return Tensor(v, path, where);
    if (!container || v.items.empty()) {
      if (std::optional<llvm::json::Value> json = ValueJson(v)) {
        out_.values.emplace_back(path, std::move(*json));
      } else {
        out_.skipped.emplace_back(path, DescribeValue(v));
      }
      return absl::OkStatus();
    }
    auto child = [&](const std::string& key) { return path.empty() ? key : absl::StrCat(path, ".", key); };
    if (v.kind != Kind::kDict) {
      for (size_t i = 0; i < v.items.size(); ++i) {
        MOERR_RETURN_IF_ERROR(Walk(*v.items[i], child(std::to_string(i)), depth + 1));
      }
      return absl::OkStatus();
    }
    for (size_t i = 0; i + 1 < v.items.size(); i += 2) {
      const std::optional<std::string> key = KeyText(*v.items[i]);
      if (!key) {
        out_.skipped.emplace_back(child("?"), absl::StrCat("an entry whose key is ", DescribeValue(*v.items[i]),
                                                          " (keys are read when strings, numbers, booleans or None)"));
        continue;
      }
      MOERR_RETURN_IF_ERROR(Walk(*v.items[i + 1], child(*key), depth + 1));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Tensor(const PickleValue& v, const std::string& path, const std::string& where) {
    MOERR_RETURN_IF_ERROR(Annotate(file_.Check(v), where));
    MOERR_ASSIGN_OR_RETURN(const c10::ScalarType type, TorchSaveFile::ElementType(*v.items[0]));
    if (!recorder::ToDType(type).ok()) {
      out_.skipped.emplace_back(path,
                                absl::StrCat("a tensor of dtype ", c10::toString(type), ", which moerr does not store"));
    } else {
      out_.tensors.emplace_back(path, &v);
    }
    return absl::OkStatus();
  }

  TorchSaveFile& file_;
  FileEntries& out_;
};

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


// One import: each file is read and checked whole before its tensors are
// written; the bundle is made when the first file has been read, and
// removed again (Abandon) when a later one fails.
class TorchImport {
 public:
  TorchImport(std::string path, std::string run_dir, const ImportOptions& options, bool directory)
      : path_(std::move(path)), run_dir_(std::move(run_dir)), options_(options), directory_(directory) {}
  ~TorchImport() {
    if (writer_ != nullptr && !closed_) writer_->Abandon();
  }

  absl::Status AddFile(const std::string& file) {
    MOERR_ASSIGN_OR_RETURN(std::unique_ptr<TorchSaveFile> saved, TorchSaveFile::Open(file));
    const PickleValue& root = saved->root();
    if (root.kind != Kind::kTensor && root.kind != Kind::kDict && root.kind != Kind::kList &&
        root.kind != Kind::kTuple) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": holds ", DescribeValue(root),
                                                     ", not a tensor or a dict, list or tuple holding tensors"));
    }
    FileEntries entries;
    MOERR_RETURN_IF_ERROR(Annotate(Walker(*saved, entries).Walk(root, "", 0), file));
    if (!entries.tensors.empty()) MOERR_RETURN_IF_ERROR(OpenWriter());
    const std::string stem = fs::path(file).stem().string();
    for (auto& [path, tensor] : entries.tensors) {
      MOERR_RETURN_IF_ERROR(WriteTensor(*saved, file, Name(stem, path), *tensor));
    }
    for (auto& [path, value] : entries.values) {
      if (values_.size() < kMaxKept) values_[Name(stem, path)] = std::move(value);
      ++result_.values;
    }
    for (auto& [path, why] : entries.skipped) result_.skipped.emplace_back(Name(stem, path), std::move(why));
    return absl::OkStatus();
  }

  absl::StatusOr<ImportResult> Finish() {
    if (names_.empty()) return absl::InvalidArgumentError(absl::StrCat(path_, ": no tensor to import"));
    // Counts of what the annotations hold (at most kMaxKept of each).
    MOERR_RETURN_IF_ERROR(writer_->EndStep(llvm::json::Object{{"source", path_},
                                                              {"entries", std::move(names_)},
                                                              {"values", result_.values},
                                                              {"values_kept", values_.size()},
                                                              {"skipped", result_.skipped.size()}}));
    if (!values_.empty()) {
      MOERR_RETURN_IF_ERROR(writer_->Annotate(formats::kImportedValuesAnnotation, std::move(values_)));
    }
    if (!result_.skipped.empty()) {
      llvm::json::Object skipped;
      for (size_t i = 0; i < result_.skipped.size() && i < kMaxKept; ++i) {
        skipped[result_.skipped[i].first] = result_.skipped[i].second;
      }
      MOERR_RETURN_IF_ERROR(writer_->Annotate(formats::kImportedSkippedAnnotation, std::move(skipped)));
    }
    MOERR_RETURN_IF_ERROR(writer_->Close());
    closed_ = true;
    result_.task = "tensor";
    result_.stats = writer_->stats();
    result_.bundles.push_back(bundle_);
    return std::move(result_);
  }

 private:
  // A directory's names are "stem/path" ("stem" for a file of one tensor).
  std::string Name(const std::string& stem, const std::string& path) const {
    if (directory_) return path.empty() ? stem : absl::StrCat(stem, "/", path);
    return path.empty() ? "tensor" : path;
  }

  absl::Status OpenWriter() {
    if (writer_ != nullptr) return absl::OkStatus();
    MOERR_RETURN_IF_ERROR(MakeDirectory(run_dir_));
    bundle_ = (fs::path(run_dir_) / "rank0.moerr").string();
    MOERR_ASSIGN_OR_RETURN(writer_, ImportWriter::Create(bundle_, options_.overwrite, true,
                                                         llvm::json::Object{{"from", "torch.save"}, {"path", path_}}));
    return writer_->BeginStep(0);
  }

  // One op per tensor, named by its path, with the part before the last "."
  // (or "/") as its module: "model.0.weight" is in module "model.0".
  absl::Status WriteTensor(TorchSaveFile& saved, const std::string& file, const std::string& name,
                           const PickleValue& tensor) {
    absl::StatusOr<at::Tensor> t = saved.Read(tensor);
    if (!t.ok()) return Annotate(t.status(), absl::StrCat(file, ": ", name));
    MOERR_ASSIGN_OR_RETURN(const formats::DType dtype, recorder::ToDType(t->scalar_type()));
    MOERR_ASSIGN_OR_RETURN(const uint64_t id,
                           writer_->Output(dtype, t->sizes().vec(), recorder::ComputeFingerprint(*t), *t));
    formats::OpEvent op;
    op.name = name;
    const size_t dot = name.find_last_of("./");
    op.module = dot == std::string::npos ? "" : name.substr(0, dot);
    op.outputs = {id};
    MOERR_RETURN_IF_ERROR(writer_->AddOp(std::move(op)));
    names_.push_back(name);
    return absl::OkStatus();
  }

  const std::string path_, run_dir_;
  const ImportOptions& options_;
  const bool directory_;
  std::string bundle_;
  std::unique_ptr<ImportWriter> writer_;
  bool closed_ = false;
  llvm::json::Array names_;
  llvm::json::Object values_;
  ImportResult result_;
};

}  // namespace

absl::StatusOr<ImportResult> ImportTorch(const std::string& path, const std::string& run_dir,
                                         const ImportOptions& options) {
  MOERR_ASSIGN_OR_RETURN(const std::vector<std::string> files, PtFiles(path));
  TorchImport import(path, run_dir, options, files.size() > 1 || files[0] != path);
  for (size_t f = 0; f < files.size(); ++f) {
    MOERR_RETURN_IF_ERROR(import.AddFile(files[f]));
    if (options.progress) options.progress("torch", static_cast<int64_t>(f + 1), static_cast<int64_t>(files.size()));
  }
  return import.Finish();
}

}  // namespace moerr::importers
