#include "replayer/precision_bisect.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/strings/str_format.h"
#include "replayer/program_replay.h"
#include "support/progress.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

// Splits `set` into `n` nearly equal, contiguous parts.
std::vector<std::vector<size_t>> Split(const std::vector<size_t>& set, size_t n) {
  std::vector<std::vector<size_t>> parts;
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t end = start + (set.size() - start) / (n - i);
    parts.emplace_back(set.begin() + start, set.begin() + end);
    start = end;
  }
  return parts;
}

std::vector<size_t> Without(const std::vector<size_t>& set, const std::vector<size_t>& part) {
  std::vector<size_t> out;
  std::set_difference(set.begin(), set.end(), part.begin(), part.end(), std::back_inserter(out));
  return out;
}

// The modules of the ops before `end`, in order of first appearance: the
// candidates to upcast.
std::vector<std::string> ModulesBefore(const formats::Trace& trace, size_t end) {
  std::vector<std::string> modules;
  for (size_t i = 0; i < end; ++i) {
    const std::string& m = trace.ops[i].module;
    if (!m.empty() && std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
  }
  return modules;
}

// One trial per distinct set of candidate indices: does the step still
// overflow with that set upcast? Each set is replayed once.
class Trials {
 public:
  Trials(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
         const PrecisionBisectOptions& options, PrecisionBisectResult& result, size_t end)
      : reader_(reader), step_(step), trace_(trace), options_(options), result_(result), end_(end) {}

  PrecisionPolicy PolicyOf(const std::vector<size_t>& set) const {
    std::vector<PolicyRule> rules;
    for (size_t i : set) rules.push_back({PolicyRule::Selector::kModule, result_.candidates[i], options_.upcast});
    return PrecisionPolicy(std::move(rules));
  }

  absl::StatusOr<bool> Fails(const std::vector<size_t>& set) {
    if (auto it = cache_.find(set); it != cache_.end()) return it->second;
    ReplayOptions replay;
    replay.device = options_.device;
    replay.policy = PolicyOf(set);
    replay.end_op = end_;
    ++result_.trials;
    if (options_.on_trial) options_.on_trial(result_.trials, set.size());
    MOERR_ASSIGN_OR_RETURN(ReplayReport report, ReplayTrace(reader_, step_, trace_, replay));
    const bool failed =
        analysis::FindFirstOverflow(ReplayedTrace(trace_, report, end_), options_.overflow).has_value();
    cache_[set] = failed;
    return failed;
  }

 private:
  const formats::BundleReader& reader_;
  int64_t step_;
  const formats::Trace& trace_;
  const PrecisionBisectOptions& options_;
  PrecisionBisectResult& result_;
  size_t end_;
  std::map<std::vector<size_t>, bool> cache_;
};

// ddmin over sets that make the failure disappear, from `set` (which does):
// try each part, then each complement; refine the split when neither helps.
// It stops at a split into single modules where no complement removes the
// failure, so the set is 1-minimal: dropping any one module brings the
// failure back. A set may hold a module and its submodule: a `module:` rule
// upcasts only that module's own ops, so the two cover disjoint ops.
absl::StatusOr<std::vector<size_t>> MinimalSet(std::vector<size_t> set, Trials& trials) {
  size_t n = 2;
  while (set.size() >= 2) {
    const std::vector<std::vector<size_t>> parts = Split(set, std::min(n, set.size()));
    bool reduced = false;
    for (const auto& part : parts) {
      MOERR_ASSIGN_OR_RETURN(const bool f, trials.Fails(part));
      if (!f) {
        set = part;
        n = 2;
        reduced = true;
        break;
      }
    }
    if (!reduced && parts.size() > 2) {
      for (const auto& part : parts) {
        const std::vector<size_t> rest = Without(set, part);
        MOERR_ASSIGN_OR_RETURN(const bool f, trials.Fails(rest));
        if (!f) {
          set = rest;
          n = std::max<size_t>(n - 1, 2);
          reduced = true;
          break;
        }
      }
    }
    if (reduced) continue;
    if (n >= set.size()) break;
    n = std::min(n * 2, set.size());
  }
  return set;
}

}  // namespace

absl::StatusOr<PrecisionBisectResult> PrecisionBisect(const formats::BundleReader& reader, int64_t step,
                                                      const formats::Trace& trace,
                                                      const PrecisionBisectOptions& options) {
  const auto recorded = analysis::FindFirstOverflow(trace, options.overflow);
  if (!recorded) return absl::NotFoundError(absl::StrFormat("step %d has no overflowing op to remove", step));
  PrecisionBisectResult result;
  result.op_index = recorded->op_index;
  result.op = recorded->op->name;
  result.module = recorded->op->module;
  result.phase = recorded->op->phase;

  // Trials replay up to the end of the failing op's phase: what comes later
  // cannot change whether that phase overflows.
  size_t end = recorded->op_index + 1;
  while (end < trace.ops.size() && trace.ops[end].phase == result.phase) ++end;
  result.candidates = ModulesBefore(trace, end);
  Trials trials(reader, step, trace, options, result, end);

  // The search needs the failure to reproduce with nothing upcast: else
  // every set would "remove" it and ddmin would name an arbitrary module.
  MOERR_ASSIGN_OR_RETURN(const bool reproduced, trials.Fails({}));
  if (!reproduced) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "step %d: replayed without a policy, the step does not overflow at op %d as recorded, so no set of modules "
        "can be said to remove it; `moerr replay --step %d --check` shows where the replay departs from the record",
        step, result.op_index, step));
  }
  std::vector<size_t> all(result.candidates.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  MOERR_ASSIGN_OR_RETURN(const bool all_fail, trials.Fails(all));
  if (all_fail) return result;  // removable = false
  result.removable = true;
  MOERR_ASSIGN_OR_RETURN(const std::vector<size_t> set, MinimalSet(std::move(all), trials));
  for (size_t i : set) result.modules.push_back(result.candidates[i]);
  result.policy = trials.PolicyOf(set);
  return result;
}

// --precision: replays the step under upcast sets until a 1-minimal one that
// removes the overflow is found (dropping any module brings it back);
// prints it and writes it as a policy.
void PrintPrecisionBisect(const PrecisionBisectResult& r, int64_t step, const std::string& upcast,
                          const std::string& policy_out) {
  std::printf("step %lld: overflow at op %zu (%s, %s, %s phase)\n", static_cast<long long>(step), r.op_index,
              r.op.c_str(), r.module.empty() ? "no module" : r.module.c_str(),
              std::string(formats::PhaseName(r.phase)).c_str());
  if (!r.removable) {
    std::printf("  upcasting all %zu modules that run before it to %s does not remove it: not a precision problem "
                "of these modules\n", r.candidates.size(), upcast.c_str());
    return;
  }
  std::printf("  upcasting these %zu of %zu modules to %s removes it; dropping any one brings it back (%zu replays).\n"
              "  Each is the module's own ops, not its submodules': a module and its submodule are both listed when "
              "both are needed:\n",
              r.modules.size(), r.candidates.size(), upcast.c_str(), r.trials);
  for (const auto& m : r.modules) std::printf("    %s\n", m.c_str());
  if (!policy_out.empty()) std::printf("  policy written to %s (moerr replay --policy %s)\n", policy_out.c_str(), policy_out.c_str());
}

ExitOr RunPrecisionBisect(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace,
                          const analysis::OverflowOptions& overflow, const std::string& upcast,
                          const std::string& policy_out, bool json, llvm::json::Array& results) {
  PrecisionBisectOptions options;
  options.overflow = overflow;
  MOERR_ASSIGN_OR_RETURN(options.upcast, ParsePolicyAction(upcast));
  Progress progress(absl::StrFormat("step %d: precision bisect", step), 0);
  options.on_trial = [&](size_t trial, size_t set) {
    progress.Update(static_cast<int64_t>(trial), absl::StrFormat("trial %d, %d modules upcast", trial, set));
  };
  auto result = PrecisionBisect(reader, step, trace, options);
  progress.Finish();
  if (!result.ok()) {
    if (result.status().code() != absl::StatusCode::kNotFound) return result.status();
    if (json) results.push_back(llvm::json::Object{{"step", step}, {"found", false}});
    else std::printf("step %lld: no overflowing op, nothing to bisect\n", static_cast<long long>(step));
    return kExitOk;
  }
  if (result->removable && !policy_out.empty()) {
    std::FILE* f = std::fopen(policy_out.c_str(), "w");
    const std::string text = absl::StrFormat("# moerr bisect --precision: upcasting these modules removes the overflow at "
                                             "op %d (%s, %s)\n# each line is a module's own ops, not its "
                                             "submodules'; dropping any one brings the overflow back\n%s",
                                             result->op_index, result->op, result->module, result->policy.ToText());
    const bool written = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const bool closed = f != nullptr && std::fclose(f) == 0;
    if (!written || !closed) return absl::UnavailableError("cannot write policy file " + policy_out);
  }
  if (json) {
    llvm::json::Array modules;
    for (const auto& m : result->modules) modules.push_back(m);
    results.push_back(llvm::json::Object{
        {"step", step}, {"found", true}, {"op_index", static_cast<int64_t>(result->op_index)}, {"op", result->op},
        {"module", result->module}, {"phase", std::string(formats::PhaseName(result->phase))},
        {"candidates", static_cast<int64_t>(result->candidates.size())}, {"removable", result->removable},
        {"upcast", upcast}, {"modules", std::move(modules)}, {"trials", static_cast<int64_t>(result->trials)},
        {"policy", policy_out.empty() || !result->removable ? llvm::json::Value(nullptr) : llvm::json::Value(policy_out)}});
    return kExitFinding;
  }
  PrintPrecisionBisect(*result, step, upcast, policy_out);
  return kExitFinding;
}

}  // namespace moerr::replayer
