#include "replayer/policy_casts.h"

#include <ATen/ATen.h>

#include "moe/numerics.h"
#include "recorder/hooks/tensor_adapter.h"

namespace moerr::replayer {
namespace {

at::ScalarType UpcastType(PolicyRule::Action action) {
  return action == PolicyRule::Action::kFp64 ? at::kDouble : at::kFloat;
}

// Bits of precision of a floating type, to tell which of two is lower.
int Precision(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return 53;
    case at::kFloat: return 24;
    case at::kHalf: return 11;
    case at::kBFloat16: return 8;
    default: return 0;
  }
}

bool IsScalarTypeArgument(const c10::Argument& arg) {
  c10::TypePtr type = arg.real_type();  // type() says int: ScalarType travels as one
  if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
  return type->kind() == c10::TypeKind::ScalarTypeType;
}

}  // namespace

at::Tensor CoerceInput(const at::Tensor& t, const formats::TensorMeta* meta, const PolicyRule* rule) {
  if (!t.defined() || !t.is_floating_point()) return t;
  const at::ScalarType want = rule != nullptr && rule->Upcast()
                                  ? UpcastType(rule->action)
                                  : (meta != nullptr ? recorder::ToScalarType(meta->dtype) : t.scalar_type());
  return t.scalar_type() == want ? t : t.to(want);
}

at::Tensor RoundOutput(const at::Tensor& t, PolicyRule::Action action) {
  if (!t.defined() || !t.is_floating_point()) return t;
  switch (action) {
    case PolicyRule::Action::kRoundFp16: return moe::RoundToFp16(t, /*saturate=*/false);
    case PolicyRule::Action::kRoundFp16Saturate: return moe::RoundToFp16(t, /*saturate=*/true);
    case PolicyRule::Action::kRoundBf16: return t.to(at::kBFloat16).to(t.scalar_type());
    default: return t;
  }
}

int64_t CoerceIntArgument(int64_t value, const c10::Argument* schema_arg, const PolicyRule* rule) {
  if (rule != nullptr && rule->Upcast() && schema_arg != nullptr && IsScalarTypeArgument(*schema_arg) &&
      value >= 0 && value < static_cast<int64_t>(c10::ScalarType::NumOptions)) {
    const auto type = static_cast<at::ScalarType>(value);
    const at::ScalarType upcast = UpcastType(rule->action);
    if (at::isFloatingType(type) && Precision(type) < Precision(upcast)) return static_cast<int64_t>(upcast);
  }
  return value;
}

}  // namespace moerr::replayer
