#include "replayer/boxed_call.h"

#include <ATen/ATen.h>

#include "recorder/hooks/torch_boundary.h"
#include "support/status.h"

namespace moerr::replayer {

absl::StatusOr<std::vector<at::Tensor>> CallBoxed(const c10::OperatorHandle& handle, std::vector<c10::IValue> stack) {
  const std::vector<c10::Argument>& schema_args = handle.schema().arguments();
  std::vector<c10::IValue> written;
  if (handle.schema().returns().empty()) {
    for (size_t i = 0; i < stack.size() && i < schema_args.size(); ++i) {
      const c10::AliasInfo* alias = schema_args[i].alias_info();
      if (alias != nullptr && alias->isWrite()) written.push_back(stack[i]);
    }
  }
  MOERR_RETURN_IF_ERROR(CatchTorch("dispatch", [&] {
    handle.callBoxed(&stack);
    return absl::OkStatus();
  }));
  if (!written.empty()) stack = std::move(written);
  std::vector<at::Tensor> outputs;
  for (const c10::IValue& v : stack) {
    if (v.isTensor()) {
      outputs.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& element : v.toTensorVector()) outputs.push_back(element);
    } else {
      outputs.emplace_back();
    }
  }
  return outputs;
}

c10::IValue CopyTensors(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined() ? c10::IValue(v.toTensor().clone()) : v;
  if (v.isTensorList()) {
    std::vector<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorVector()) list.push_back(t.defined() ? t.clone() : t);
    return c10::IValue(list);
  }
  return v;
}

}  // namespace moerr::replayer
