// A test library of ops outside ATen, standing in for a vendor's fused
// kernels (torch_npu's npu_swiglu): fakenpu::npu_swiglu, whose forward is
// correct, and fakenpu::npu_swiglu_backward, whose gradient of the gate half
// is deliberately twice the true one; and npu::npu_fusion_attention,
// correct, under torch_npu's own name and 7.1.0's schema (older than the
// shipped reference's, and returning ints beside its tensors), and its
// gradient npu::npu_fusion_attention_grad (7.1.0: four outputs, 26.0.0 has
// five), which the shipped references serve by name. The schemas are
// torch_npu's. Loaded only by the process that records (record_fake_npu), so
// the replaying process does not have these ops.
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

// Attention of BNSD query, key and value (one key head per query head),
// atten_mask (True: masked) as given; the rest of the arguments are not read.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, int64_t> FusionAttention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t /*head_num*/,
    c10::string_view input_layout, const c10::optional<at::Tensor>& /*pse*/,
    const c10::optional<at::Tensor>& /*padding_mask*/, const c10::optional<at::Tensor>& atten_mask, double scale,
    double /*keep_prob*/, int64_t /*pre_tockens*/, int64_t /*next_tockens*/, int64_t /*inner_precise*/,
    at::OptionalIntArrayRef /*prefix*/, at::OptionalIntArrayRef /*actual_seq_qlen*/,
    at::OptionalIntArrayRef /*actual_seq_kvlen*/, int64_t /*sparse_mode*/, bool /*gen_mask_parallel*/,
    bool /*sync*/) {
  TORCH_CHECK(input_layout == "BNSD", "npu::npu_fusion_attention takes BNSD only");
  at::Tensor s = at::matmul(query, key.transpose(-1, -2)) * scale;
  if (atten_mask.has_value() && atten_mask->defined()) s = s.masked_fill(*atten_mask, -INFINITY);
  const at::Tensor max = std::get<0>(s.max(-1, /*keepdim=*/true));
  const at::Tensor e = (s - max).exp();
  const at::Tensor sum = e.sum(-1, /*keepdim=*/true);
  const std::vector<int64_t> stats{query.size(0), query.size(1), query.size(2), 8};  // [B, N, Sq, 8]
  return {at::matmul(e / sum, value), max.expand(stats).contiguous(), sum.expand(stats).contiguous(),
          at::empty({0}, query.options()), 0, 0, 0};
}

// The gradients of the above at query, key and value for `dy`, from its 27
// arguments on the stack (boxed: the schema is long); dpse is empty.
void FusionAttentionGrad(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack) {
  constexpr size_t kArgs = 27;
  const auto args = torch::jit::last(*stack, kArgs);
  const at::Tensor q = args[0].toTensor(), k = args[1].toTensor(), v = args[2].toTensor(), dy = args[3].toTensor();
  TORCH_CHECK(args[5].toStringRef() == "BNSD", "npu::npu_fusion_attention_grad takes BNSD only");
  const double scale = args[13].toDouble();
  at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * scale;
  if (args[8].isTensor()) s = s.masked_fill(args[8].toTensor(), -INFINITY);
  const at::Tensor p = at::softmax(s, -1);
  const at::Tensor dp = at::matmul(dy, v.transpose(-1, -2));
  const at::Tensor ds = p * (dp - (p * dp).sum(-1, /*keepdim=*/true));
  const at::Tensor dq = at::matmul(ds, k) * scale, dk = at::matmul(ds.transpose(-1, -2), q) * scale;
  const at::Tensor dv = at::matmul(p.transpose(-1, -2), dy);
  torch::jit::drop(*stack, kArgs);
  torch::jit::push(*stack, dq, dk, dv, at::empty({0}, q.options()));
}

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

TORCH_LIBRARY(npu, m) {
  m.def("npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
        "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
        "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? prefix=None, "
        "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
        "bool gen_mask_parallel=True, bool sync=False) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)");
  m.def("npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, "
        "str input_layout, *, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, "
        "Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, Tensor? attention_in=None, "
        "float scale_value=1., float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, "
        "int inner_precise=0, int seed=0, int offset=0, int numels=0, int[]? prefix=None, "
        "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
        "bool gen_mask_parallel=True, bool sync=False) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(npu, CPU, m) {
  m.impl("npu_fusion_attention", FusionAttention);
  m.impl("npu_fusion_attention_grad", torch::CppFunction::makeFromBoxedFunction<&FusionAttentionGrad>());
}
