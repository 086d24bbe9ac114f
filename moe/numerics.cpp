#include "moe/numerics.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>

#include "absl/strings/str_format.h"
#include "support/enum_table.h"

namespace moerr::moe {
namespace {

thread_local Numerics current_numerics;

// Rounds forward values and backward gradients to fp16.
struct Fp16RoundFunction : public torch::autograd::Function<Fp16RoundFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, bool saturate) {
    ctx->saved_data["saturate"] = saturate;
    return RoundToFp16(x, saturate);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const bool saturate = ctx->saved_data["saturate"].toBool();
    return {RoundToFp16(grads[0], saturate), at::Tensor()};
  }
};

}  // namespace

constexpr EnumName<Precision> kPrecisions[] = {
    {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}, {Precision::kFp16, "fp16"},
    {Precision::kFp16Emu, "fp16-emu"}};

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  return ParseEnum(kPrecisions, "precision", name);
}

std::string PrecisionName(Precision p) { return std::string(EnumNameOf(kPrecisions, p)); }

at::Tensor RoundToFp16(const at::Tensor& x, bool saturate) {
  if (!x.is_floating_point()) return x;
  at::Tensor y = saturate ? x.clamp(-kFp16Max, kFp16Max) : x;
  return y.to(at::kHalf).to(x.scalar_type());
}

const Numerics& CurrentNumerics() { return current_numerics; }

NumericsScope::NumericsScope(Numerics numerics)
    : previous_(current_numerics),
      previous_autocast_(at::autocast::is_autocast_enabled(at::kCPU)),
      previous_autocast_dtype_(at::autocast::get_autocast_dtype(at::kCPU)) {
  current_numerics = numerics;
  const bool bf16 = numerics.precision == Precision::kBf16, fp16 = numerics.precision == Precision::kFp16;
  at::autocast::set_autocast_enabled(at::kCPU, bf16 || fp16);
  if (bf16 || fp16) at::autocast::set_autocast_dtype(at::kCPU, bf16 ? at::kBFloat16 : at::kHalf);
}

NumericsScope::~NumericsScope() {
  current_numerics = previous_;
  at::autocast::set_autocast_enabled(at::kCPU, previous_autocast_);
  at::autocast::set_autocast_dtype(at::kCPU, previous_autocast_dtype_);
  at::autocast::clear_cache();
}

at::Tensor ExpertActivationRange(const at::Tensor& act) {
  const double max = current_numerics.expert_activation_max;
  if (max <= 0) return act;
  // Past the range: +-Inf forward, as an overflow from finite inputs (a
  // value out of range times the largest value of act's dtype), so a
  // trace's first overflow is the op that left the range; values inside it
  // are unchanged. The factor is the dtype's own largest: float's would
  // round to Inf in bf16 or fp16 (autocast) and make 0 * Inf = NaN of
  // every value in range.
  const at::ScalarType dtype = act.scalar_type();
  const double largest = dtype == at::kBFloat16 ? static_cast<float>(std::numeric_limits<c10::BFloat16>::max())
                         : dtype == at::kHalf   ? static_cast<float>(std::numeric_limits<c10::Half>::max())
                         : dtype == at::kDouble ? std::numeric_limits<double>::max()
                                                : std::numeric_limits<float>::max();
  const at::Tensor out_of_range = act.abs().gt(max).to(dtype);
  return act + act * out_of_range * largest;
}

at::Tensor Boundary(const at::Tensor& x) {
  const Numerics& n = current_numerics;
  if (n.precision != Precision::kFp16Emu) return x;
  if (!x.requires_grad()) return RoundToFp16(x, n.saturate);
  return Fp16RoundFunction::apply(x, n.saturate);
}

}  // namespace moerr::moe
