#include "replayer/op_references.h"

#include <torch/script.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "recorder/hooks/torch_boundary.h"
#include "support/status.h"

namespace moerr::replayer {

namespace fs = std::filesystem;

struct OpReferences::Module {
  torch::jit::Module module;
  size_t arity = 0;     // forward's arguments, `self` excluded
  size_t required = 0;  // of those, the ones before its trailing run of defaulted arguments
};

OpReferences::OpReferences() = default;
OpReferences::~OpReferences() = default;
OpReferences::OpReferences(OpReferences&&) noexcept = default;
OpReferences& OpReferences::operator=(OpReferences&&) noexcept = default;

namespace {

constexpr char kListName[] = "references.list";

bool HasList(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kListName, ec);
}

// Reads "OP FILE ULPS" lines ('#' starts a comment) into `out`, FILE
// relative to the list's folder.
absl::Status ReadList(const fs::path& dir, std::map<std::string, OpReferences::Info>& out) {
  const fs::path list = dir / kListName;
  std::ifstream in(list);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read %s", list.string()));
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view text = absl::StripAsciiWhitespace(absl::string_view(line).substr(0, line.find('#')));
    if (text.empty()) continue;
    const std::vector<std::string> fields = absl::StrSplit(text, ' ', absl::SkipWhitespace());
    uint64_t ulps = 0;
    if (fields.size() != 3 || !absl::SimpleAtoi(fields[2], &ulps)) {
      return absl::DataLossError(
          absl::StrFormat("%s:%d: expected \"OP FILE ULPS\", got \"%s\"", list.string(), number, text));
    }
    out[fields[0]] = OpReferences::Info{(dir / fields[1]).string(), ulps};
  }
  return absl::OkStatus();
}

}  // namespace

std::string OpReferences::ShippedDir() {
  if (const char* env = std::getenv("MOERR_REFERENCES"); env != nullptr && *env != '\0') {
    return HasList(env) ? std::string(env) : "";
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const fs::path dir = exe.parent_path().parent_path() / "share" / "moerr" / "references";
  return HasList(dir) ? dir.string() : "";
}

absl::StatusOr<OpReferences> OpReferences::Load(const std::vector<std::string>& specs, bool shipped) {
  OpReferences refs;
  if (shipped) {
    if (const std::string dir = ShippedDir(); !dir.empty()) MOERR_RETURN_IF_ERROR(ReadList(dir, refs.info_));
  }
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--reference %s: expected OP=FILE (e.g. npu::npu_swiglu=swiglu.pt)", spec));
    }
    const std::string op = spec.substr(0, eq), file = spec.substr(eq + 1);
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) {
      return absl::NotFoundError(absl::StrFormat("--reference %s: no such file: %s", op, file));
    }
    refs.info_[op] = Info{file, kDefaultReferenceUlps};
    refs.loaded_.erase(op);
  }
  return refs;
}

const OpReferences::Info* OpReferences::Find(absl::string_view op) const {
  auto it = info_.find(std::string(op));
  return it == info_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::vector<at::Tensor>> OpReferences::Run(absl::string_view op,
                                                          const std::vector<c10::IValue>& args) const {
  const Info* info = Find(op);
  if (info == nullptr) return absl::NotFoundError(absl::StrFormat("no reference for %s", op));
  std::shared_ptr<Module>& m = loaded_[std::string(op)];
  if (m == nullptr) {
    auto loaded = std::make_shared<Module>();
    MOERR_RETURN_IF_ERROR(CatchTorch(absl::StrFormat("reference of %s (%s)", op, info->file), [&] {
      loaded->module = torch::jit::load(info->file, c10::Device(c10::kCPU));
      loaded->module.eval();
      const std::vector<c10::Argument>& params =
          loaded->module.get_method("forward").function().getSchema().arguments();
      loaded->arity = loaded->required = params.size() - 1;
      while (loaded->required > 0 && params[loaded->required].default_value().has_value()) --loaded->required;
      return absl::OkStatus();
    }));
    m = std::move(loaded);
  }
  std::vector<c10::IValue> inputs;
  if (args.size() >= m->required && args.size() <= m->arity) {
    // Every argument; a call recorded with an older schema, which lacks
    // trailing arguments the reference takes with defaults, gets those.
    inputs = args;
  } else {
    for (const c10::IValue& v : args) {
      if (v.isTensor()) inputs.push_back(v);
    }
    if (inputs.size() != m->arity) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the reference of %s (%s) takes %d arguments; the op has %d, %d of them tensors", op, info->file,
          m->arity, args.size(), inputs.size()));
    }
  }
  std::vector<at::Tensor> out;
  MOERR_RETURN_IF_ERROR(CatchTorch(absl::StrFormat("reference of %s (%s)", op, info->file), [&] {
    c10::IValue result;
    try {
      result = m->module.forward(inputs);
    } catch (const c10::Error&) {
      throw;
    } catch (const std::exception& e) {
      // A `raise` in the reference (torch::jit::JITException, not a
      // c10::Error): it refuses the call; the message ends with its words.
      return absl::InvalidArgumentError(absl::StrFormat("reference of %s (%s) refused the call: %s", op, info->file,
                                                        e.what()));
    }
    if (result.isTensor()) {
      out.push_back(result.toTensor());
    } else if (result.isTuple()) {
      // A non-tensor output (npu_fusion_attention's seed, offset, numels)
      // keeps its place as an undefined tensor, as the recorder keeps it
      // with id 0.
      for (const c10::IValue& e : result.toTupleRef().elements()) {
        out.push_back(e.isTensor() ? e.toTensor() : at::Tensor());
      }
    } else if (result.isTensorList()) {
      out = result.toTensorVector();
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("the reference returned %s, not tensors", result.tagKind()));
    }
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace moerr::replayer
