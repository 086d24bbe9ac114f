// Precision of a training step. bf16 and fp16 run natively under CPU
// autocast: matmuls and the ops autocast lists compute in the low dtype, and
// an fp16 overflow inside an op gives +-Inf as the op computes it. fp16-emu
// computes in fp32 and rounds to fp16 at every module boundary, forward and
// (for gradients) backward; an overflow there gives +-Inf, or saturates to
// +-65504 as NPUs can be told to, which no native CPU op does. The fp16
// faults run under fp16-emu: their numbers are set on its boundaries.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/status/statusor.h"

namespace moerr::moe {

enum class Precision { kFp32, kBf16, kFp16, kFp16Emu };
absl::StatusOr<Precision> ParsePrecision(const std::string& name);  // fp32, bf16, fp16, fp16-emu
std::string PrecisionName(Precision p);
// fp16 or fp16-emu: the step needs loss scaling.
inline bool IsFp16(Precision p) { return p == Precision::kFp16 || p == Precision::kFp16Emu; }

// fp16's largest finite value.
inline constexpr double kFp16Max = 65504.0;

// Rounds to fp16 and back to the input dtype; out-of-range values become
// +-Inf, or +-65504 when `saturate`. Not differentiable (a plain op).
at::Tensor RoundToFp16(const at::Tensor& x, bool saturate);

// The numerics in force on this thread; set by NumericsScope.
struct Numerics {
  Precision precision = Precision::kFp32;
  bool saturate = false;  // fp16 overflow saturates instead of giving Inf
  // > 0: the experts' activation act(gate) * up is held in a format whose
  // largest finite value this is (as FP6 E2M3's 7.5 without block
  // scaling); a value past it becomes +-Inf (ExpertActivationRange). 0: none.
  double expert_activation_max = 0;
};
const Numerics& CurrentNumerics();

// Sets the thread's numerics (and CPU autocast to bf16 or fp16 for kBf16 and
// kFp16) for its life.
class NumericsScope {
 public:
  explicit NumericsScope(Numerics numerics);
  ~NumericsScope();
  NumericsScope(const NumericsScope&) = delete;
  NumericsScope& operator=(const NumericsScope&) = delete;

 private:
  Numerics previous_;
  bool previous_autocast_;
  at::ScalarType previous_autocast_dtype_;
};

// The current numerics' expert_activation_max applied to `act` (identity when
// 0): values past it +-Inf, made by an op of finite inputs so that a trace's
// first overflow is that op, in the expert's module.
at::Tensor ExpertActivationRange(const at::Tensor& act);

// A module boundary: identity except under fp16 emulation, where the value is
// rounded to fp16 forward and its gradient rounded to fp16 backward.
at::Tensor Boundary(const at::Tensor& x);

}  // namespace moerr::moe
