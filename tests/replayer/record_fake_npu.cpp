// Test helper: records one training step (forward and backward) of a small
// model whose activation is fakenpu::npu_swiglu, an op of a library this
// process loads (fake_npu_ops.cpp) and the replaying process does not; with
// `attention`, a step of one causal npu::npu_fusion_attention and its
// npu::npu_fusion_attention_grad instead (fake_npu_ops.cpp registers them
// under torch_npu's names); with `attention-sparse5`, the same calls with
// sparse_mode 5, which the fake ops ignore and the shipped references refuse.
//
//   record_fake_npu OUT.moerr MODE [attention|attention-sparse5]
#include <dlfcn.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "recorder/recorder.h"

namespace {

// One call of npu::npu_fusion_attention (torch_npu 7.1.0's 19 arguments)
// on BNSD [1, 2, 5, 8] inputs, causal: atten_mask masks the keys after each
// query, which pre_tockens 5 and next_tockens 0 say with sparse_mode 0; then
// of npu::npu_fusion_attention_grad (7.1.0's 27) for a random dy. The
// sum of dq's squares. `sparse_mode` is passed to both calls.
at::Tensor CausalAttention(int64_t sparse_mode) {
  const at::Tensor q = torch::randn({1, 2, 5, 8}), k = torch::randn({1, 2, 5, 8}), v = torch::randn({1, 2, 5, 8});
  const at::Tensor mask = torch::ones({5, 5}, torch::kBool).triu(1);
  const c10::IValue none;
  const auto forward = c10::Dispatcher::singleton().findSchemaOrThrow("npu::npu_fusion_attention", "");
  torch::jit::Stack stack{q, k, v, int64_t{2}, std::string("BNSD"), none, none, mask, 0.35, 1.0, int64_t{5},
                          int64_t{0}, int64_t{0}, none, none, none, sparse_mode, true, false};
  forward.callBoxed(&stack);
  const at::Tensor dy = torch::randn({1, 2, 5, 8});
  const auto grad = c10::Dispatcher::singleton().findSchemaOrThrow("npu::npu_fusion_attention_grad", "");
  torch::jit::Stack grad_stack{q, k, v, dy, int64_t{2}, std::string("BNSD"), none, none, mask, stack[1], stack[2],
                               stack[3], stack[0], 0.35, 1.0, int64_t{5}, int64_t{0}, int64_t{0}, int64_t{0},
                               int64_t{0}, int64_t{0}, none, none, none, sparse_mode, true, false};
  grad.callBoxed(&grad_stack);
  return grad_stack[0].toTensor().square().sum();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace moerr;
  const std::string what = argc == 4 ? argv[3] : "";
  if (argc != 3 && !(argc == 4 && (what == "attention" || what == "attention-sparse5"))) {
    std::fprintf(stderr, "usage: record_fake_npu OUT.moerr MODE [attention|attention-sparse5]\n");
    return 2;
  }
  if (::dlopen(FAKE_NPU_LIB, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", FAKE_NPU_LIB, ::dlerror());
    return 2;
  }
  const auto swiglu = c10::Dispatcher::singleton()
                          .findSchemaOrThrow("fakenpu::npu_swiglu", "")
                          .typed<at::Tensor(const at::Tensor&, int64_t)>();
  torch::manual_seed(0);
  at::set_num_threads(1);
  const at::Tensor w_up = torch::randn({8, 16}).requires_grad_(true);
  const at::Tensor w_down = torch::randn({8, 4}).requires_grad_(true);
  const at::Tensor x = torch::randn({6, 8});
  auto rec = recorder::Recorder::Start(
      recorder::RecordOptions(argv[1]).set_mode(recorder::ParseCaptureMode(argv[2]).value()).set_overwrite(true));
  if (!rec.ok()) {
    std::fprintf(stderr, "%s\n", rec.status().ToString().c_str());
    return 2;
  }
  (*rec)->NameTensors({{"mlp.up", w_up}, {"mlp.down", w_down}});
  if (!(*rec)->StepBegin(0).ok()) return 3;
  if (argc == 4) {
    at::Tensor out;
    {
      RECORD_USER_SCOPE("attn");
      out = CausalAttention(what == "attention-sparse5" ? 5 : 0);
    }
    if (!(*rec)->StepEnd(0, {out.item<double>(), 0.0}).ok()) return 3;
    return (*rec)->Stop().ok() ? 0 : 3;
  }
  at::Tensor loss;
  {
    RECORD_USER_SCOPE("mlp");
    loss = swiglu.call(x.mm(w_up), -1).mm(w_down).pow(2).mean();
  }
  loss.backward();
  const double norm = std::hypot(w_up.grad().norm().item<double>(), w_down.grad().norm().item<double>());
  if (!(*rec)->StepEnd(0, {loss.item<double>(), norm}).ok()) return 3;
  return (*rec)->Stop().ok() ? 0 : 3;
}
