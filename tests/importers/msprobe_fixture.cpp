#include "tests/importers/msprobe_fixture.h"

#include <torch/csrc/jit/serialization/pickle.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "support/check.h"

namespace moerr::importers::testing {
namespace {

namespace fs = std::filesystem;

// Python's json module writes non-finite floats as bare words; they go
// through llvm::json as marked strings and are unquoted at the end.
llvm::json::Value PyFloat(double v) {
  if (std::isnan(v)) return "@NaN@";
  if (std::isinf(v)) return v > 0 ? "@Infinity@" : "@-Infinity@";
  return v;
}

std::string PythonJson(llvm::json::Value v) {
  const std::string text = llvm::formatv("{0:1}", v).str();
  return absl::StrReplaceAll(text, {{"\"@NaN@\"", "NaN"}, {"\"@Infinity@\"", "Infinity"}, {"\"@-Infinity@\"", "-Infinity"}});
}

void Write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  MOERR_CHECK(out.good()) << p.string();
}

// msprobe's handle_tensor_extremum_nan_inf: the extreme of the finite
// values, NaN when every value is NaN.
double FiniteExtreme(const at::Tensor& t, bool max) {
  if (t.isnan().all().item<bool>()) return NAN;
  const at::Tensor finite = t.masked_select(t.isfinite());
  if (finite.numel() > 0) return (max ? finite.max() : finite.min()).item<double>();
  const at::Tensor no_nan = t.masked_select(~t.isnan());
  return (max ? no_nan.max() : no_nan.min()).item<double>();
}

}  // namespace

llvm::json::Object TensorJson(const at::Tensor& t, const std::string& data_name) {
  llvm::json::Array shape;
  for (int64_t d : t.sizes()) shape.push_back(d);
  const std::string dtype = t.scalar_type() == at::kFloat    ? "torch.float32"
                            : t.scalar_type() == at::kHalf   ? "torch.float16"
                            : t.scalar_type() == at::kBFloat16 ? "torch.bfloat16"
                            : t.scalar_type() == at::kLong   ? "torch.int64"
                                                             : "torch.float64";
  llvm::json::Object o{{"type", "torch.Tensor"}, {"dtype", dtype}, {"shape", std::move(shape)}};
  // msprobe's get_stat_info_sync: integers and float64 as float32.
  at::Tensor d = t.is_floating_point() && t.scalar_type() != at::kDouble ? t : t.to(at::kFloat);
  const double max = d.max().item<double>(), min = d.min().item<double>();
  o["Max"] = PyFloat(max);
  o["Min"] = PyFloat(min);
  o["Mean"] = PyFloat(d.mean().item<double>());
  o["Norm"] = PyFloat(d.norm().item<double>());
  o["requires_grad"] = false;
  if (!std::isfinite(max)) o["Max_except_inf_nan"] = PyFloat(FiniteExtreme(t, true));
  if (!std::isfinite(min)) o["Min_except_inf_nan"] = PyFloat(FiniteExtreme(t, false));
  if (!data_name.empty()) o["data_name"] = data_name;
  return o;
}

void WriteMsprobeDump(const std::string& dir, int64_t step, int64_t rank, const std::string& task,
                      const std::vector<FixtureEntry>& entries) {
  const fs::path root = fs::path(dir) / absl::StrCat("step", step) / absl::StrCat("rank", rank);
  const bool tensors = task == "tensor";
  fs::create_directories(tensors ? root / "dump_tensor_data" : root);
  llvm::json::Object data, construct, stack;
  for (size_t i = 0; i < entries.size(); ++i) {
    const FixtureEntry& e = entries[i];
    const bool backward = e.name.size() > 9 && e.name.substr(e.name.size() - 9) == ".backward";
    auto values = [&](const std::vector<at::Tensor>& ts, const std::string& kind) {
      llvm::json::Array out;
      for (size_t k = 0; k < ts.size(); ++k) {
        const std::string file = tensors ? absl::StrCat(e.name, ".", kind, ".", k, ".pt") : "";
        if (tensors) {
          const std::vector<char> bytes = torch::jit::pickle_save(ts[k].contiguous());
          Write(root / "dump_tensor_data" / file, std::string(bytes.begin(), bytes.end()));
        }
        out.push_back(TensorJson(ts[k], file));
      }
      return out;
    };
    llvm::json::Object body;
    if (backward) {
      body["input"] = values(e.inputs, "input");
    } else {
      body["input_args"] = values(e.inputs, "input");
      body["input_kwargs"] = llvm::json::Object{};
    }
    body["output"] = values(e.outputs, "output");
    data[e.name] = std::move(body);
    construct[e.name] = e.parent.empty() ? llvm::json::Value(nullptr) : llvm::json::Value(e.parent);
    stack[std::to_string(i)] = llvm::json::Array{llvm::json::Array{e.name},
                                                 llvm::json::Array{"File train.py, line 10, in step"}};
  }
  // dump.json keeps the calls' order; llvm::json::Object does not, so the
  // "data" members are written one by one.
  std::string text = PythonJson(llvm::json::Object{{"task", task}, {"level", "L1"}, {"framework", "pytorch"},
                                                   {"dump_data_dir", tensors ? (root / "dump_tensor_data").string() : ""},
                                                   {"data", llvm::json::Object{}}});
  std::string body;
  for (size_t i = 0; i < entries.size(); ++i) {
    body += absl::StrCat(i ? ",\n" : "\n", "  \"", entries[i].name, "\": ",
                         PythonJson(std::move(*data.get(entries[i].name))));
  }
  const size_t at = text.find("\"data\": {}");
  MOERR_CHECK(at != std::string::npos) << text;
  text.replace(at, 10, absl::StrCat("\"data\": {", body, "\n }"));
  Write(root / "dump.json", text);
  Write(root / "construct.json", PythonJson(std::move(construct)));
  Write(root / "stack.json", PythonJson(std::move(stack)));
}

}  // namespace moerr::importers::testing
