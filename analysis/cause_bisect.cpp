#include "analysis/cause_bisect.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/annotations.h"
#include "formats/json_number.h"
#include "support/status.h"

namespace moerr::analysis {
namespace {

// One op of the chain as JSON (rises that are not numbers print as null).
llvm::json::Object LinkJson(const CauseLink& link) {
  return llvm::json::Object{{"op_index", static_cast<int64_t>(link.op_index)},
                            {"op", link.op->name},
                            {"module", link.op->module},
                            {"phase", std::string(formats::PhaseName(link.op->phase))},
                            {"output", static_cast<int64_t>(link.output)},
                            {"abs_max", formats::JsonNumber(link.abs_max)},
                            {"input_rise_bits", formats::JsonNumber(link.input_rise_bits)},
                            {"peer_rise_bits", formats::JsonNumber(link.peer_rise_bits)},
                            {"peers", static_cast<int64_t>(link.peers)},
                            {"outside_input_abs_max", formats::JsonNumber(link.outside_abs_max)},
                            {"exploded", link.exploded}};
}

// "+18.4 bits over its computed inputs, +17.9 over 95 peers" (the parts known).
std::string Rises(const CauseLink& link) {
  std::vector<std::string> parts;
  if (std::isfinite(link.input_rise_bits)) {
    parts.push_back(absl::StrFormat("%+.1f bits over its computed inputs", link.input_rise_bits));
  }
  if (std::isfinite(link.peer_rise_bits)) {
    parts.push_back(absl::StrFormat("%+.1f bits over the median of %d peers", link.peer_rise_bits, link.peers));
  }
  return parts.empty() ? "no computed input, no peers" : absl::StrJoin(parts, ", ");
}

}  // namespace

// The cause and the chain from it to the first overflow, as text. A long
// chain shows its first and last ops.
void PrintCause(const OverflowCause& found, size_t ops, int64_t step, bool ends_in_overflow) {
  const CauseLink& cause = found.cause;
  auto where = [](const formats::OpEvent& op) {
    return absl::StrFormat("%s in %s (%s phase)", op.name, op.module.empty() ? "(no module)" : op.module,
                           formats::PhaseName(op.phase));
  };
  if (!found.found_explosion && !ends_in_overflow) {
    std::printf("step %lld: no op on the way to the value it sent exploded; op %zu of %zu, %s, made that value\n",
                static_cast<long long>(step), cause.op_index, ops, where(*cause.op).c_str());
    return;
  }
  if (!found.found_explosion) {
    std::printf("step %lld: no op before the first overflow exploded; op %zu of %zu, %s, is its own cause\n",
                static_cast<long long>(step), cause.op_index, ops, where(*cause.op).c_str());
    return;
  }
  std::printf("step %lld: overflow caused by op %zu of %zu: %s\n", static_cast<long long>(step), cause.op_index, ops,
              where(*cause.op).c_str());
  std::printf("  its output's abs-max %.6g is %s\n", cause.abs_max, Rises(cause).c_str());
  if (cause.outside_abs_max * std::exp2(kInputRiseBits) >= cause.abs_max) {
    // As large as the output: the value may have been made before this op.
    std::printf("  its input of abs-max %.6g was computed by no op of the step: a parameter, the batch, or in an "
                "imported dump a call the dump does not hold, which may be where the value was made\n",
                cause.outside_abs_max);
  }
  std::printf("  chain from the cause to %s (%zu ops):\n",
              ends_in_overflow ? "the first overflow" : "the value it sent", found.chain.size());
  constexpr size_t kShown = 5;
  for (size_t k = 0; k < found.chain.size(); ++k) {
    if (found.chain.size() > 2 * kShown + 1 && k == kShown) {
      std::printf("    ... %zu more ops ...\n", found.chain.size() - 2 * kShown);
      k = found.chain.size() - kShown - 1;
      continue;
    }
    const CauseLink& link = found.chain[k];
    const bool last = ends_in_overflow && k + 1 == found.chain.size();
    std::printf("    op %6zu %-24s %-22s %s, %s\n", link.op_index, link.op->name.c_str(),
                last ? "first overflow" : absl::StrFormat("abs-max %.6g", link.abs_max).c_str(),
                link.op->module.empty() ? "(no module)" : link.op->module.c_str(),
                std::string(formats::PhaseName(link.op->phase)).c_str());
  }
  for (const UncertainLink& u : found.uncertain) {
    if (u.how == "extreme") {
      std::printf("  op %zu -> op %zu is linked by the largest value alone: op %zu reads a part of op %zu's output or "
                  "a tensor that holds it (the dump names no tensor)\n",
                  u.producer, u.consumer, u.consumer, u.producer);
    } else {
      std::printf("  op %zu -> op %zu is ambiguous: ops %s output equal statistics; the walk took the latest\n",
                  u.producer, u.consumer, absl::StrJoin(u.candidates, ", ").c_str());
    }
  }
}

void PrintFirstOverflow(const FirstOverflow& found, size_t ops, int64_t step) {
  const formats::OpEvent& op = *found.op;
  const formats::Fingerprint& f = found.fingerprint;
  std::printf("step %lld: first overflowing op %zu of %zu: %s\n", static_cast<long long>(step), found.op_index, ops,
              op.name.c_str());
  std::printf("  module %s, %s phase%s\n", op.module.empty() ? "(none)" : op.module.c_str(),
              std::string(formats::PhaseName(op.phase)).c_str(),
              found.forward_op ? absl::StrFormat(", backward of %s", found.forward_op->name).c_str() : "");
  // An imported dump's count may be a lower bound only (Fingerprint::unknown).
  auto count = [&f](uint64_t n, uint32_t field) { return absl::StrFormat("%s%d", f.Known(field) ? "" : ">=", n); };
  std::printf("  output: %llu values, %s +Inf, %s -Inf, %s NaN, finite abs-max %.6g (limit %.6g)\n",
              static_cast<unsigned long long>(f.numel), count(f.pos_inf, formats::Fingerprint::kPosInf).c_str(),
              count(f.neg_inf, formats::Fingerprint::kNegInf).c_str(), count(f.nan, formats::Fingerprint::kNan).c_str(),
              f.abs_max, found.limit);
  if (!found.trend.empty()) std::printf("  headroom before it (log2 of limit / abs-max):\n");
  for (const auto& p : found.trend) {
    std::printf("    op %6zu %-24s abs-max %-12.6g %6.1f bits%s\n", p.op_index, p.op->name.c_str(), p.abs_max,
                p.headroom_bits, p.op->module == op.module ? "" : ("  (" + p.op->module + ")").c_str());
  }
}

// The JSON of one step's result: the first overflow's keys (those of
// FindFirstOverflow), then "cause" and "chain".
llvm::json::Object CauseJson(const OverflowCause& found, int64_t step) {
  const formats::OpEvent& op = *found.first.op;
  const formats::Fingerprint& f = found.first.fingerprint;
  llvm::json::Array trend, chain;
  for (const auto& p : found.first.trend) {
    trend.push_back(llvm::json::Object{{"op_index", static_cast<int64_t>(p.op_index)}, {"op", p.op->name},
                                       {"module", p.op->module}, {"abs_max", formats::JsonNumber(p.abs_max)},
                                       {"headroom_bits", formats::JsonNumber(p.headroom_bits)}});
  }
  for (const auto& link : found.chain) chain.push_back(LinkJson(link));
  llvm::json::Object cause = LinkJson(found.cause);
  cause["found_explosion"] = found.found_explosion;
  llvm::json::Array uncertain;
  for (const UncertainLink& u : found.uncertain) {
    uncertain.push_back(llvm::json::Object{{"producer", static_cast<int64_t>(u.producer)},
                                           {"consumer", static_cast<int64_t>(u.consumer)},
                                           {"how", u.how},
                                           {"candidates", llvm::json::Array(u.candidates)}});
  }
  return llvm::json::Object{
      {"step", step}, {"found", true}, {"op_index", static_cast<int64_t>(found.first.op_index)}, {"op", op.name},
      {"module", op.module}, {"phase", std::string(formats::PhaseName(op.phase))},
      {"forward_op",
       found.first.forward_op ? llvm::json::Value(found.first.forward_op->name) : llvm::json::Value(nullptr)},
      {"pos_inf", f.pos_inf}, {"neg_inf", f.neg_inf}, {"nan", f.nan}, {"numel", f.numel},
      {"abs_max", formats::JsonNumber(f.abs_max)}, {"limit", found.first.limit}, {"trend", std::move(trend)},
      {"cause", std::move(cause)}, {"chain", std::move(chain)}, {"uncertain_links", std::move(uncertain)}};
}

std::optional<llvm::json::Object> OverflowCheckCrossCheck(const formats::BundleReader& reader, int64_t step,
                                                          int64_t rank, size_t first_op) {
  // Either absent or not an object: no cross-check (the errors, which would
  // name the bundle, are dropped, so none is named).
  absl::StatusOr<llvm::json::Object> check =
      formats::ReadObjectAnnotation(reader, formats::kMsprobeOverflowCheckAnnotation, -1, "");
  absl::StatusOr<llvm::json::Object> imported =
      formats::ReadObjectAnnotation(reader, formats::kImportedStepAnnotation, step, "");
  if (!check.ok() || !imported.ok()) return std::nullopt;
  const llvm::json::Object* first = check->getObject("first");
  const llvm::json::Array* entries = imported->getArray("entries");
  const auto theirs = first ? first->getString(std::to_string(rank)) : llvm::None;
  const auto ours = entries && first_op < entries->size() ? (*entries)[first_op].getAsString() : llvm::None;
  llvm::json::Object out{{"entry", theirs ? llvm::json::Value(theirs->str()) : llvm::json::Value(nullptr)},
                         {"moerr_entry", ours ? llvm::json::Value(ours->str()) : llvm::json::Value(nullptr)},
                         {"agrees", theirs && ours && *theirs == *ours}};
  if (const auto file = check->getString("file")) out["file"] = file->str();
  return out;
}

void PrintOverflowCheck(const llvm::json::Object& check, int64_t rank) {
  const auto theirs = check.getString("entry");
  const auto ours = check.getString("moerr_entry");
  if (check.getBoolean("agrees").getValueOr(false)) {
    std::printf("  msprobe's overflow_check names the same first anomaly on rank %lld: %s\n",
                static_cast<long long>(rank), theirs->str().c_str());
  } else {
    std::printf("  msprobe's overflow_check names %s on rank %lld, where bisect's first overflow is entry %s\n",
                theirs ? theirs->str().c_str() : "no anomaly", static_cast<long long>(rank),
                ours ? ours->str().c_str() : "(unknown)");
  }
}

// The default bisect of one step: the first overflow and its cause. The
// step before it, when the bundle holds it, adds peers.
ExitOr RunCauseBisect(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                             const OverflowOptions& options, bool json, llvm::json::Array& results) {
  std::optional<formats::Trace> before;
  const std::vector<int64_t> complete = reader.CompleteSteps();
  if (std::find(complete.begin(), complete.end(), step - 1) != complete.end()) {
    MOERR_ASSIGN_OR_RETURN(before, formats::ReadTrace(reader, step - 1));
  }
  auto found = FindOverflowCause(trace, options, {before ? &*before : nullptr});
  if (absl::StatusOr<llvm::json::Object> imported =
          formats::ReadObjectAnnotation(reader, formats::kImportedStepAnnotation, step, "");
      found && imported.ok()) {
    AddUncertainLinks(llvm::json::Value(*std::move(imported)), trace, *found);
  }
  // An imported dump without statistics (msprobe's xor summary, which
  // writes only a 0-d tensor's value) says of no other value whether it is
  // finite.
  const bool blind = !trace.tensors.empty() && std::none_of(trace.tensors.begin(), trace.tensors.end(), [](const auto& t) {
    return t.fingerprint.numel > 1 && t.fingerprint.Known(formats::Fingerprint::kMax | formats::Fingerprint::kNan);
  });
  if (!found) {
    if (json) {
      llvm::json::Object result{{"step", step}, {"found", false}, {"ops", static_cast<int64_t>(trace.ops.size())}};
      if (blind) result["statistics"] = false;
      results.push_back(std::move(result));
    } else if (blind) {
      std::printf("step %lld: its %zu ops carry no statistics (an imported dump's checksums only): whether a value "
                  "overflowed cannot be told; diff compares the checksums\n",
                  static_cast<long long>(step), trace.ops.size());
    } else if (trace.ops.empty()) {
      // A proxy's step, or a crashed one whose ops were lost.
      std::printf("step %lld: records no ops, nothing to search\n", static_cast<long long>(step));
    } else {
      std::printf("step %lld: no overflowing op in %zu ops\n", static_cast<long long>(step), trace.ops.size());
    }
    return kExitOk;
  }
  // An import's rank (msprobe's overflow_check names ranks).
  const std::optional<formats::Recording> recording = formats::RecordingOf(reader);
  const int64_t rank =
      recording && recording->imported ? recording->imported->getInteger("rank").getValueOr(0) : 0;
  std::optional<llvm::json::Object> check = OverflowCheckCrossCheck(reader, step, rank, found->first.op_index);
  if (json) {
    llvm::json::Object result = CauseJson(*found, step);
    if (check) result["msprobe_overflow_check"] = std::move(*check);
    results.push_back(std::move(result));
  } else {
    PrintCause(*found, trace.ops.size(), step);
    PrintFirstOverflow(found->first, trace.ops.size(), step);
    if (check) PrintOverflowCheck(*check, rank);
  }
  return kExitFinding;
}

}  // namespace moerr::analysis
