#include "formats/raised_step.h"

#include "absl/strings/str_format.h"
#include "support/status.h"

namespace moerr::formats {

std::string RaisedStep::Headline() const {
  std::string out = message.empty() ? type : absl::StrFormat("%s: %s", type, message);
  if (last_op) {
    absl::StrAppendFormat(&out, " (after op %d %s%s)", last_op->index, last_op->name,
                          last_op->module.empty() ? "" : " in " + last_op->module);
  } else {
    out += " (before any op was recorded)";
  }
  return out;
}

llvm::json::Value toJSON(const RaisedStep& r) {
  llvm::json::Object o{{"type", r.type}, {"message", r.message}, {"traceback", r.traceback}};
  if (r.last_op) {
    o["last_op"] = llvm::json::Object{
        {"index", r.last_op->index}, {"name", r.last_op->name}, {"module", r.last_op->module}};
  }
  return o;
}

bool fromJSON(const llvm::json::Value& v, RaisedStep& r, llvm::json::Path p) {
  llvm::json::ObjectMapper m(v, p);
  if (!m || !m.map("type", r.type) || !m.mapOptional("message", r.message) ||
      !m.mapOptional("traceback", r.traceback)) {
    return false;
  }
  const llvm::json::Object* o = v.getAsObject();
  if (const llvm::json::Value* last = o->get("last_op")) {
    llvm::json::ObjectMapper lm(*last, p.field("last_op"));
    RaisedStep::LastOp op;
    if (!lm || !lm.map("index", op.index) || !lm.map("name", op.name) || !lm.mapOptional("module", op.module)) {
      return false;
    }
    r.last_op = std::move(op);
  }
  return true;
}

absl::StatusOr<std::optional<RaisedStep>> ReadRaisedStep(const BundleReader& reader, int64_t step) {
  absl::StatusOr<llvm::json::Value> value = reader.ReadAnnotation(kRaisedAnnotation, step);
  if (absl::IsNotFound(value.status())) return std::nullopt;
  if (!value.ok()) return value.status();
  RaisedStep raised;
  llvm::json::Path::Root root;
  if (!fromJSON(*value, raised, root)) {
    return absl::DataLossError(absl::StrFormat("step %d: the \"raised\" annotation is malformed", step));
  }
  return raised;
}

absl::StatusOr<std::map<int64_t, RaisedStep>> ReadRaisedSteps(const BundleReader& reader) {
  std::map<int64_t, RaisedStep> out;
  const std::vector<int64_t> complete = reader.CompleteSteps();
  for (int64_t step : reader.Steps()) {
    // A complete step did not raise; an incomplete one without the
    // annotation was cut off by a crash (or is still being written).
    if (std::binary_search(complete.begin(), complete.end(), step)) continue;
    MOERR_ASSIGN_OR_RETURN(std::optional<RaisedStep> raised, ReadRaisedStep(reader, step));
    if (raised) out.emplace(step, *std::move(raised));
  }
  return out;
}

}  // namespace moerr::formats
