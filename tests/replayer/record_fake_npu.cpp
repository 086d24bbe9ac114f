// Test helper: records one training step (forward and backward) of a small
// model whose activation is fakenpu::npu_swiglu, an op of a library this
// process loads (fake_npu_ops.cpp) and the replaying process does not.
//
//   record_fake_npu OUT.moerr MODE
#include <dlfcn.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>

#include "recorder/recorder.h"

int main(int argc, char** argv) {
  using namespace moerr;
  if (argc != 3) {
    std::fprintf(stderr, "usage: record_fake_npu OUT.moerr MODE\n");
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
