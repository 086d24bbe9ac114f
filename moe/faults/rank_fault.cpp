#include "moe/faults/rank_fault.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "support/check.h"
#include "support/status.h"

namespace moerr::moe {
namespace {

// kill and stall: `stop` does not return (it ends the process, or waits for
// good).
class StopFault : public RankFaultObserver {
 public:
  StopFault(const RankFaultSpec& spec, Parallel* parallel, void (*stop)())
      : RankFaultObserver(spec, parallel, /*early=*/false), stop_(stop) {}
  absl::Status BeforeStep(int64_t step) override {
    MOERR_RETURN_IF_ERROR(RankFaultObserver::BeforeStep(step));
    if (in_step0() && spec().at < 0) stop_();
    return absl::OkStatus();
  }
  void OnCollectiveStart(const recorder::CollectiveCall&, const std::vector<at::Tensor>&, bool) override {
    if (InStep0Training() && collectives_++ == spec().at) stop_();
  }

 private:
  void (*stop_)();
  int64_t collectives_ = 0;  // step 0's training collectives started so far
};

// "kill:K, stall:K or corrupt:K": the forms --rank-fault takes.
std::string Forms() {
  std::string out;
  const std::vector<FaultKind> kinds = AllFaults(FaultScope::kRanks);
  for (size_t i = 0; i < kinds.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : i + 1 == kinds.size() ? " or " : ", ", FaultName(kinds[i]), ":K");
  }
  return out;
}

}  // namespace

RankFaultObserver::RankFaultObserver(const RankFaultSpec& spec, Parallel* parallel, bool early)
    : spec_(spec), parallel_(parallel), early_(early) {
  if (early_) parallel_->AddObserver(this);
}

RankFaultObserver::~RankFaultObserver() { parallel_->RemoveObserver(this); }

absl::Status RankFaultObserver::OnStart(GrpoTrainer&) {
  if (!early_) parallel_->AddObserver(this);
  return absl::OkStatus();
}

absl::Status RankFaultObserver::BeforeStep(int64_t step) {
  in_step0_ = step == 0;
  return absl::OkStatus();
}

absl::Status RankFaultObserver::AfterStep(const StepMetrics&, double) {
  in_step0_ = false;
  return absl::OkStatus();
}

absl::StatusOr<RankFaultSpec> ParseRankFault(const std::string& text, int64_t ranks) {
  RankFaultSpec spec;
  const size_t colon = text.find(':'), at = text.find('@');
  const std::string name = text.substr(0, colon);
  const std::string rank =
      colon == std::string::npos ? "" : text.substr(colon + 1, at == std::string::npos ? at : at - colon - 1);
  const FaultRow* row = FindFault(name, FaultScope::kRanks);
  const bool ok = row != nullptr && absl::SimpleAtoi(rank, &spec.rank) && spec.rank >= 0 && spec.rank < ranks &&
                  (at == std::string::npos || (absl::SimpleAtoi(text.substr(at + 1), &spec.at) && spec.at >= 0));
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--rank-fault must be %s, optionally @N, with K a rank below %d, not \"%s\"", Forms(), ranks, text));
  }
  spec.kind = row->kind;
  return spec;
}

std::unique_ptr<TrainObserver> MakeRankFault(const RankFaultSpec& spec, Parallel* parallel) {
  const FaultRow& row = FaultRowOf(spec.kind);
  MOERR_CHECK(row.scope == FaultScope::kRanks) << row.name << " is not a rank fault";
  MOERR_CHECK(parallel != nullptr && parallel->layout().rank == spec.rank) << row.name << " is rank " << spec.rank << "'s";
  return row.observe(spec, parallel);
}

std::unique_ptr<TrainObserver> MakeStopFault(const RankFaultSpec& spec, Parallel* parallel, void (*stop)()) {
  return std::make_unique<StopFault>(spec, parallel, stop);
}

}  // namespace moerr::moe
