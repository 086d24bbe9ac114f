#include "replayer/world_failure.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "analysis/world_overflow.h"
#include "formats/annotations.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

absl::StatusOr<const formats::RankStep*> Readable(const formats::WorldStep& world, int64_t rank) {
  const formats::RankStep& r = world.ranks.at(static_cast<size_t>(rank));
  if (!r.reader || !r.trace) {
    return absl::FailedPreconditionError(absl::StrFormat("%s, rank %d: step %d cannot be read%s", world.dir, rank,
                                                         world.step,
                                                         r.error.ok() ? "" : ": " + std::string(r.error.message())));
  }
  return &r;
}

llvm::json::Array Strings(const std::vector<std::string>& v) {
  llvm::json::Array out;
  for (const std::string& s : v) out.push_back(s);
  return out;
}

}  // namespace

std::string FailureKindOfFault(moe::FaultKind kind) {
  return kind == moe::FaultKind::kNone ? "" : moe::FaultRowOf(kind).failure;
}

std::string FailureRuleOfFault(moe::FaultKind kind) {
  return kind == moe::FaultKind::kNone ? "" : moe::FaultRowOf(kind).rule;
}

llvm::json::Object FaultAnnotation(moe::FaultKind kind, int64_t rank) {
  return formats::ToJson(formats::FaultNote{moe::FaultName(kind), rank});
}

absl::StatusOr<std::optional<RecordedFault>> ReadFaultOfRun(const formats::WorldStep& run) {
  if (run.ranks.empty() || !run.ranks[0].reader) return std::optional<RecordedFault>();
  const std::string bundle = absl::StrFormat("%s, rank 0", run.dir);
  const absl::StatusOr<formats::FaultNote> note = formats::ReadFaultNote(*run.ranks[0].reader, bundle);
  if (absl::IsNotFound(note.status())) return std::optional<RecordedFault>();
  if (!note.ok()) return note.status();
  const absl::StatusOr<moe::FaultKind> kind = moe::ParseFault(note->kind);
  if (!kind.ok()) return Annotate(kind.status(), formats::AnnotationWhere(bundle, formats::kFaultAnnotation));
  if (*kind == moe::FaultKind::kNone) return std::optional<RecordedFault>();
  return std::optional<RecordedFault>(RecordedFault{*kind, note->rank.value_or(-1)});
}

std::optional<RecordedFault> FaultOfRun(const formats::WorldStep& run) {
  absl::StatusOr<std::optional<RecordedFault>> fault = ReadFaultOfRun(run);
  return fault.ok() ? *fault : std::nullopt;
}

std::string FailureKindOfRun(const formats::WorldStep& run) {
  const std::optional<RecordedFault> fault = FaultOfRun(run);
  return fault ? FailureKindOfFault(fault->kind) : "";
}

absl::StatusOr<WorldFailure> FindWorldFailure(const formats::WorldStep& world, const std::string& kind) {
  MOERR_RETURN_IF_ERROR(ReadFaultOfRun(world).status());  // a corrupt annotation is an error, not "no fault"
  WorldFailure out;
  out.kind = kind;
  if (kind.empty() || kind == "overflow") {
    if (const std::optional<analysis::WorldOverflow> w = analysis::FindWorldOverflow(world)) {
      out.ranks.push_back({w->rank, OverflowFailure(w->cause.first)});
      return out;
    }
    if (!kind.empty()) return out;
  }
  // The fault's rule, when the run's fault is judged by this check.
  std::string rule;
  if (const std::optional<RecordedFault> fault = FaultOfRun(world); fault && FailureKindOfFault(fault->kind) == kind) {
    rule = FailureRuleOfFault(fault->kind);
  }
  for (int64_t r = 0; r < static_cast<int64_t>(world.ranks.size()); ++r) {
    MOERR_ASSIGN_OR_RETURN(const formats::RankStep* rank, Readable(world, r));
    std::optional<Failure> f;
    if (kind.empty()) {
      MOERR_ASSIGN_OR_RETURN(f, FindFailure(*rank->reader, world.step, *rank->trace));
    } else {
      MOERR_ASSIGN_OR_RETURN(const std::vector<Failure> all, FailuresOf(*rank->reader, world.step, *rank->trace, kind));
      for (const Failure& a : all) {  // worst first: the first of the largest measure
        if (!rule.empty() && a.rule != rule) continue;
        if (!f || a.measure.value_or(0) > f->measure.value_or(0)) f = a;
      }
    }
    if (f) out.ranks.push_back({r, *std::move(f)});
  }
  return out;
}

llvm::json::Object WorldFailureJson(const WorldFailure& failure) {
  llvm::json::Array ranks;
  for (const RankFailure& r : failure.ranks) {
    const Failure& f = r.failure;
    ranks.push_back(llvm::json::Object{{"rank", r.rank},
                                       {"kind", f.kind},
                                       {"phase", f.phase},
                                       {"module_class", f.module_class},
                                       {"modules", Strings(f.modules)},
                                       {"description", f.description},
                                       {"rule", f.rule},
                                       {"measure", f.measure ? llvm::json::Value(*f.measure) : nullptr}});
  }
  return llvm::json::Object{{"kind", failure.kind}, {"ranks", std::move(ranks)}};
}

absl::StatusOr<WorldFailure> WorldFailureFromJson(const llvm::json::Object& json) {
  WorldFailure out;
  out.kind = json.getString("kind").getValueOr("").str();
  const llvm::json::Array* ranks = json.getArray("ranks");
  if (ranks == nullptr) return absl::InvalidArgumentError("the failure has no \"ranks\"");
  for (const llvm::json::Value& v : *ranks) {
    const llvm::json::Object* o = v.getAsObject();
    if (o == nullptr || !o->getInteger("rank") || !o->getString("kind")) {
      return absl::InvalidArgumentError("a failure's rank without \"rank\" or \"kind\"");
    }
    RankFailure r;
    r.rank = *o->getInteger("rank");
    r.failure.kind = o->getString("kind")->str();
    r.failure.phase = o->getString("phase").getValueOr("").str();
    r.failure.module_class = o->getString("module_class").getValueOr("").str();
    r.failure.description = o->getString("description").getValueOr("").str();
    r.failure.rule = o->getString("rule").getValueOr("").str();
    if (const auto m = o->getNumber("measure")) r.failure.measure = *m;
    if (const llvm::json::Array* modules = o->getArray("modules")) {
      for (const llvm::json::Value& m : *modules) r.failure.modules.push_back(m.getAsString().getValueOr("").str());
    }
    out.ranks.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<Shown> ShowFailure(const formats::RankStep& rank, int64_t step, const Failure& failure,
                                  const SameModule& same) {
  if (!rank.reader || !rank.trace) {
    return absl::FailedPreconditionError(absl::StrFormat("rank %d: step %d cannot be read", rank.rank, step));
  }
  MOERR_ASSIGN_OR_RETURN(const std::vector<Failure> all, FailuresOf(*rank.reader, step, *rank.trace, failure.kind));
  return ShowFailure(all, failure, same);
}

Shown ShowFailure(const std::vector<Failure>& all, const Failure& failure, const SameModule& same) {
  Shown best;
  for (const Failure& f : all) {
    Shown here;
    here.level = Compare(f, failure);
    for (const std::string& a : f.modules) {
      for (const std::string& b : failure.modules) here.localised |= same(a, b);
    }
    here.localised &= here.level == Reproduction::kSamePlace;
    here.failure = f;
    if (!best.failure || std::make_pair(here.localised, here.level) > std::make_pair(best.localised, best.level)) {
      best = std::move(here);
    }
  }
  return best;
}

}  // namespace moerr::replayer
