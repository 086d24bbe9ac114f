// Test helper: records GRPO steps of the tiny model into a bundle, as a
// training job would, so tests can kill it (SIGKILL) or crash it (SIGSEGV).
//
//   record_child OUT.moerr STEPS MODE [SEGV_AFTER_STEP [ring]]
//
// With `ring`: records under trigger=anomaly (a ring of 2 steps) and
// SIGKILLs itself inside step SEGV_AFTER_STEP, a second after its trainer
// step and before its end, as the OOM killer would (the second lets the
// recorder's worker, which writes behind the training thread, reach what it
// was handed however loaded the machine is).
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "moe/grpo_trainer.h"
#include "recorder/recorder.h"

int main(int argc, char** argv) {
  using namespace moerr;
  if (argc < 4) {
    std::fprintf(stderr, "usage: record_child OUT.moerr STEPS MODE [SEGV_AFTER_STEP]\n");
    return 2;
  }
  const int steps = std::atoi(argv[2]);
  const int segv_after = argc > 4 ? std::atoi(argv[4]) : -1;
  const bool ring = argc > 5 && std::string(argv[5]) == "ring";
  torch::manual_seed(0);
  at::set_num_threads(1);
  const moe::MoeConfig config = moe::Preset("tiny").value();
  moe::MoeTransformer policy(config), reference(config);
  recorder::RecordOptions options(argv[1]);
  options.set_mode(recorder::ParseCaptureMode(argv[3]).value()).set_overwrite(true);
  if (ring) options.set_anomaly(2, 10.0);
  auto rec = recorder::Recorder::Start(options);
  if (!rec.ok()) {
    std::fprintf(stderr, "%s\n", rec.status().ToString().c_str());
    return 2;
  }
  policy->SetRoutingObserver(rec->get());
  moe::GrpoTrainer trainer(policy, reference, moe::AdditionTask(), moe::GrpoOptions(), 0);
  for (int step = 0; step < steps; ++step) {
    if (!(*rec)->StepBegin(step).ok()) return 3;
    const moe::StepMetrics m = trainer.Step();
    if (ring && step == segv_after) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      ::raise(SIGKILL);
    }
    if (!(*rec)->StepEnd(step, {m.loss, m.grad_norm}).ok()) return 3;
    std::printf("step %d\n", step);
    std::fflush(stdout);
    if (!ring && step == segv_after) ::raise(SIGSEGV);
  }
  return (*rec)->Stop().ok() ? 0 : 3;
}
