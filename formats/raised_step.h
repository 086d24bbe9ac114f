// A step left by an exception (docs/TRACE.md, "A step that raises"): the
// step annotation "raised", written in place of the step's end. Its step is
// not complete; the ops recorded before the exception are in the bundle.
//
//   {"type": "RuntimeError", "message": "CUDA error: ...",
//    "traceback": "Traceback (most recent call last): ...",
//    "last_op": {"index": 412, "name": "aten::mm", "module": "model.layers.1.mlp"}}
//
// last_op is the op the recorder saw last (absent when it saw none).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "llvm/Support/JSON.h"

namespace moerr::formats {

inline constexpr char kRaisedAnnotation[] = "raised";

struct RaisedStep {
  std::string type, message, traceback;
  struct LastOp {
    int64_t index = 0;  // in the step's trace, as bisect and replay number ops
    std::string name, module;
  };
  std::optional<LastOp> last_op;

  // "RuntimeError: CUDA error ... (after op 412 aten::mm in model.layers.1.mlp)"
  std::string Headline() const;
};

llvm::json::Value toJSON(const RaisedStep& r);
bool fromJSON(const llvm::json::Value& v, RaisedStep& r, llvm::json::Path p);

// The "raised" annotation of `step`; nullopt when the step did not raise.
absl::StatusOr<std::optional<RaisedStep>> ReadRaisedStep(const BundleReader& reader, int64_t step);
// Every raised step of the bundle, by step.
absl::StatusOr<std::map<int64_t, RaisedStep>> ReadRaisedSteps(const BundleReader& reader);

}  // namespace moerr::formats
