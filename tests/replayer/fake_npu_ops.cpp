// A test library of ops outside ATen, standing in for a vendor's fused
// kernels (torch_npu's npu_swiglu): fakenpu::npu_swiglu, whose forward is
// correct, and fakenpu::npu_swiglu_backward, whose gradient of the gate half
// is deliberately twice the true one. The schemas are torch_npu's. Loaded
// only by the process that records (record_fake_npu), so the replaying
// process does not have these ops.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/torch.h>

namespace {

at::Tensor Swiglu(const at::Tensor& x, int64_t dim) {
  const std::vector<at::Tensor> halves = x.chunk(2, dim);
  return at::silu(halves[0]) * halves[1];
}

// The true gradient, with the gate half's scaled by 2: the injected bug.
at::Tensor SwigluBackward(const at::Tensor& grad, const at::Tensor& x, int64_t dim) {
  const std::vector<at::Tensor> halves = x.chunk(2, dim);
  const at::Tensor& a = halves[0];
  const at::Tensor& b = halves[1];
  const at::Tensor s = at::sigmoid(a);
  const at::Tensor da = grad * b * s * (1 + a * (1 - s));
  const at::Tensor db = grad * a * s;
  return at::cat({da * 2, db}, dim);
}

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t dim) {
    ctx->save_for_backward({x});
    ctx->saved_data["dim"] = dim;
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("fakenpu::npu_swiglu", "")
                               .typed<at::Tensor(const at::Tensor&, int64_t)>();
    return op.call(x, dim);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("fakenpu::npu_swiglu_backward", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {op.call(grads[0], x, ctx->saved_data["dim"].toInt()), at::Tensor()};
  }
};

at::Tensor SwigluAutograd(const at::Tensor& x, int64_t dim) { return SwigluFunction::apply(x, dim); }

}  // namespace

TORCH_LIBRARY(fakenpu, m) {
  m.def("npu_swiglu(Tensor self, int dim=-1) -> Tensor");
  m.def("npu_swiglu_backward(Tensor grad_output, Tensor self, int dim=-1) -> Tensor");
}

TORCH_LIBRARY_IMPL(fakenpu, CPU, m) {
  m.impl("npu_swiglu", Swiglu);
  m.impl("npu_swiglu_backward", SwigluBackward);
}

TORCH_LIBRARY_IMPL(fakenpu, Autograd, m) { m.impl("npu_swiglu", SwigluAutograd); }
