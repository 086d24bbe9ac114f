// optimizer-hazards:
//   Adam's second moment below eps where the first moment is not: there
//     eps, not the gradient history, sets the step size. In exact arithmetic
//     |exp_avg| stays within about 3.2 sqrt(exp_avg_sq) (the EMAs' betas), so
//     |exp_avg| > 10 eps under sqrt(exp_avg_sq) < eps means the second moment
//     underflowed or was corrupted, and the update is |exp_avg| / eps times
//     the nominal one: a warning. How many moving elements are eps-dominated
//     at all is a note. (Recorded optimizer state: replayable and full.)
//   the loss scaler: a skipped step, a scale fallen below 1;
//   a finite, not skipped step in which the optimizer phase wrote none of the
//     tensors the forward pass read: the update was lost.
// The step outcome comes from the "metrics" annotation the reference trainer
// writes; without it the last two are not judged.
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "analysis/checks/common.h"
#include "formats/annotations.h"
#include "support/status.h"

namespace moerr::analysis {
namespace {

constexpr absl::string_view kName = "optimizer-hazards";
constexpr double kEps = 1e-8;         // AdamW's default eps
constexpr double kBlowUp = 10;       // |exp_avg| / eps past which an eps-dominated update is a hazard

class OptimizerHazards : public Check {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override {
    return "Adam's exp_avg_sq below eps, loss-scale trouble, a finite step whose update was lost";
  }

  absl::Status Run(const LintInput& input, std::vector<Finding>& out) const override {
    const StepView& s = input.bundle;
    MOERR_RETURN_IF_ERROR(SecondMoments(s, out));
    // Absent (or malformed): the step's outcome is not judged.
    absl::StatusOr<formats::StepMetricsNote> metrics = formats::ReadStepMetricsNote(*s.reader, s.step, s.path);
    if (!metrics.ok()) return absl::OkStatus();
    const bool skipped = metrics->skipped.value_or(false);
    const bool finite = metrics->finite.value_or(true);
    const double scale = metrics->loss_scale.value_or(1.0);
    if (skipped) {
      Finding f = checks::At(kName, Severity::kWarning, s, "step");
      f.message = absl::StrFormat("the update was skipped: gradients not finite at loss scale %g", scale);
      f.numbers = llvm::json::Object{{"loss_scale", scale}};
      f.next = absl::StrFormat("moerr bisect %s --step %d", s.path, s.step);
      out.push_back(std::move(f));
    } else if (scale < 1) {
      Finding f = checks::At(kName, Severity::kWarning, s, "step");
      f.message = absl::StrFormat("the loss scale has fallen to %g: gradients keep overflowing", scale);
      f.numbers = llvm::json::Object{{"loss_scale", scale}};
      out.push_back(std::move(f));
    }
    if (finite && !skipped) LostUpdate(s, out);
    return absl::OkStatus();
  }

 private:
  static absl::Status SecondMoments(const StepView& s, std::vector<Finding>& out) {
    const std::string prefix = "state/exp_avg_sq/";
    int64_t moving = 0, under = 0, blown = 0, tensors = 0;
    std::string worst;
    int64_t worst_blown = 0;
    for (const formats::TensorInfo& info : s.reader->index().tensors) {
      if (info.step != s.step || info.name.rfind(prefix, 0) != 0) continue;
      const std::string param = info.name.substr(prefix.size());
      const formats::TensorInfo* avg = s.reader->FindTensor("state/exp_avg/" + param, s.step);
      if (avg == nullptr) continue;
      MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor v, s.reader->ReadBlob(info.blob));
      MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor m, s.reader->ReadBlob(avg->blob));
      if (v.dtype != formats::DType::kF32 || m.dtype != formats::DType::kF32 || v.bytes.size() != m.bytes.size()) continue;
      const size_t n = v.bytes.size() / sizeof(float);
      const float* vs = reinterpret_cast<const float*>(v.bytes.data());
      const float* ms = reinterpret_cast<const float*>(m.bytes.data());
      int64_t here_blown = 0;
      for (size_t i = 0; i < n; ++i) {
        if (ms[i] == 0) continue;
        ++moving;
        if (std::sqrt(double(vs[i])) >= kEps) continue;
        ++under;
        here_blown += std::fabs(double(ms[i])) > kBlowUp * kEps;
      }
      ++tensors;
      blown += here_blown;
      if (here_blown > worst_blown) worst_blown = here_blown, worst = param;
    }
    if (tensors == 0) return absl::OkStatus();  // no state recorded (stats mode, or before the first update)
    const double share = moving ? double(under) / moving : 0;
    Finding f = checks::At(kName, blown > 0 ? Severity::kWarning : Severity::kInfo, s, worst.empty() ? "step" : worst);
    f.message = absl::StrFormat("%.3g%% of %d moving Adam elements are eps-dominated (sqrt(exp_avg_sq) < %g); %d of "
                                "them with |exp_avg| > %g eps%s",
                                100 * share, moving, kEps, blown, kBlowUp,
                                worst.empty() ? "" : absl::StrFormat(" (most in %s: %d)", worst, worst_blown));
    f.numbers = llvm::json::Object{
        {"tensors", tensors}, {"moving", moving}, {"eps_dominated", under}, {"share", share}, {"blown_up", blown}};
    out.push_back(std::move(f));
    return absl::OkStatus();
  }

  static void LostUpdate(const StepView& s, std::vector<Finding>& out) {
    const formats::Trace& trace = *s.trace;
    absl::flat_hash_set<uint64_t> forward_leaves;
    for (const formats::OpEvent& op : trace.ops) {
      if (op.phase != formats::Phase::kForward) continue;
      for (const formats::OpArg& a : op.args) {
        if (a.kind != formats::OpArg::Kind::kTensor) continue;
        const formats::TensorMeta* meta = trace.Find(a.i);
        if (meta != nullptr && meta->producer < 0 && meta->view_of == 0) forward_leaves.insert(a.i);
      }
    }
    int64_t written = 0, optimizer_ops = 0;
    for (const formats::OpEvent& op : trace.ops) {
      if (op.phase != formats::Phase::kOptimizer) continue;
      ++optimizer_ops;
      if (!absl::EndsWith(op.name, "_")) continue;  // in place
      // The first tensor argument, or each tensor of a first tensor list
      // (`_foreach_*_`), is what an in-place op writes.
      for (const formats::OpArg& a : op.args) {
        if (a.kind == formats::OpArg::Kind::kTensor) {
          written += forward_leaves.contains(a.i);
          break;
        }
        if (a.kind == formats::OpArg::Kind::kTensors) {
          for (int64_t id : a.ints) written += forward_leaves.contains(static_cast<uint64_t>(id));
          break;
        }
      }
    }
    if (written > 0 || forward_leaves.empty()) return;
    Finding f = checks::At(kName, Severity::kWarning, s, "optimizer");
    f.message = absl::StrFormat("a finite step, yet its %d optimizer ops wrote none of the %d tensors the forward pass "
                                "read: the update was lost",
                                optimizer_ops, forward_leaves.size());
    f.numbers = llvm::json::Object{{"optimizer_ops", optimizer_ops},
                                   {"forward_leaves", static_cast<int64_t>(forward_leaves.size())}};
    out.push_back(std::move(f));
  }
};

}  // namespace

std::unique_ptr<Check> MakeOptimizerHazardsCheck() { return std::make_unique<OptimizerHazards>(); }

}  // namespace moerr::analysis
