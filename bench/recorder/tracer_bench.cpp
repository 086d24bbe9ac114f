// The op tracer's cost per recorded op on the training thread, where the
// tensors are too small for their fingerprints or copies to matter: a
// forward and backward pass of small element-wise ops and matmuls on
// [16, 16] tensors, untraced and traced in each capture mode, in the same
// process. (traced - untraced) / ops per pass is the tracer's bookkeeping
// per op; recorder_bench measures whole steps.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/autograd.h>

#include "recorder/op_tracer.h"

namespace {

using moerr::recorder::CaptureMode;
using moerr::recorder::OpTracer;

// Keeps nothing: the bench measures the traced thread, not the writer.
class DiscardSink : public moerr::recorder::TraceSink {
 public:
  void OnOps(moerr::formats::OpBatch&) override {}
  void OnTensorBytes(std::string, moerr::formats::Role, at::Tensor) override {}
  void OnError(absl::Status) override {}
};

void Pass(const at::Tensor& w, const at::Tensor& x) {
  at::Tensor h = at::matmul(x, w);
  for (int i = 0; i < 4; ++i) h = at::tanh(h * 1.5 + x);
  const at::Tensor loss = at::matmul(h, w).sum();
  torch::autograd::backward({loss});
}

// range(0): -1 untraced, else a CaptureMode.
void BM_TracedPass(benchmark::State& state) {
  DiscardSink sink;
  std::unique_ptr<OpTracer> tracer;
  if (state.range(0) >= 0) tracer = std::make_unique<OpTracer>(static_cast<CaptureMode>(state.range(0)), &sink);
  at::Tensor w = at::randn({16, 16}).requires_grad_(true);
  const at::Tensor x = at::randn({16, 16});
  int64_t passes = 0;
  for (auto _ : state) {
    if (tracer && passes % 64 == 0) tracer->NewStep();  // a "step" of 64 passes
    Pass(w, x);
    w.mutable_grad().reset();
    ++passes;
  }
  if (tracer) {
    tracer->Flush();
    state.counters["ops_per_pass"] = static_cast<double>(tracer->ops_recorded()) / static_cast<double>(passes);
  }
}
BENCHMARK(BM_TracedPass)
    ->ArgName("mode")
    ->Arg(-1)
    ->Arg(static_cast<int>(CaptureMode::kStats))
    ->Arg(static_cast<int>(CaptureMode::kReplayable))
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
