// Step time and peak memory of one GRPO step (rollout, forward, backward,
// optimizer) of the reference model, per preset. Each preset runs in its own
// child process so its peak RSS is its own. Prints a markdown table.
//
//   step_bench [--steps N] [PRESET...]      (default: small wide)
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "moe/grpo_trainer.h"
#include "support/seconds_since.h"

namespace {

double RssMiB() {
  std::ifstream statm("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return pages_resident * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

void RunPreset(const std::string& preset, int steps, int fd) {
  using namespace moerr::moe;
  const double rss_before = RssMiB();
  torch::manual_seed(0);
  const MoeConfig config = Preset(preset).value();
  MoeTransformer policy(config), reference(config);
  int64_t params = 0;
  for (const auto& p : policy->parameters()) params += p.numel();
  GrpoTrainer trainer(policy, reference, AdditionTask(), GrpoOptions(), 0);
  trainer.Step();  // first step allocates the optimizer state
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) trainer.Step();
  const double ms = 1e3 * moerr::SecondsSince(t0) / steps;
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  char line[256];
  std::snprintf(line, sizeof line, "| %s | %lld | %lld / %lld | %.1f M | %.1f | %.0f |\n", preset.c_str(),
                static_cast<long long>(config.num_layers), static_cast<long long>(config.top_k),
                static_cast<long long>(config.num_experts), params / 1e6, ms, usage.ru_maxrss / 1024.0 - rss_before);
  (void)!write(fd, line, std::strlen(line));
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5;
  std::vector<std::string> presets;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      presets.push_back(argv[i]);
    }
  }
  if (presets.empty()) presets = {"small", "wide"};
  std::printf("GRPO step (8 prompts x 4 responses, rollout + forward + backward + AdamW), mean of %d steps:\n\n", steps);
  std::printf("| preset | layers | top-k / experts | params | step ms | peak memory MiB |\n|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (const std::string& preset : presets) {
    int pipe_fd[2];
    if (pipe(pipe_fd) != 0) return 2;
    const pid_t child = fork();
    if (child == 0) {
      close(pipe_fd[0]);
      RunPreset(preset, steps, pipe_fd[1]);
      _exit(0);
    }
    close(pipe_fd[1]);
    char buf[512];
    ssize_t n;
    while ((n = read(pipe_fd[0], buf, sizeof buf)) > 0) fwrite(buf, 1, n, stdout);
    close(pipe_fd[0]);
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "preset %s failed\n", preset.c_str());
      return 2;
    }
  }
  std::printf("\nPeak memory: the child's peak RSS minus its RSS before building the models (policy, reference,\n"
              "AdamW state, activations); step ms is wall time on this machine.\n");
  return 0;
}
