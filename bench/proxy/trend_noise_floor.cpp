// The noise floor of proxy-eval's trend fidelity (proxy/trend_fidelity.h):
// the original model's 30-step healthy RL trajectory (GRPO defaults,
// trainer seed 5, as `moerr proxy-eval` trains the original and each proxy)
// against itself under perturbations far smaller than any proxy's:
//   identity    the same weights again (checks the pipeline is deterministic);
//   noise REL   every parameter tensor p plus Gaussian noise of standard
//               deviation REL * rms(p) (generator seeds 0 .. N-1 of
//               --noise-seeds N, one row each);
//   matched K   noise whose logit KL is within 1.25x of K (--match-kl K,
//               proxy/weight_noise.h's MatchNoiseToKl, noise seed 0): the
//               original under any perturbation of a proxy's size; the row
//               names the rel and the KL reached;
//   seed S      the same weights, trainer seed S (other prompts and samples).
// Each row: the logit KL(original || variant) per token on proxy-eval's
// held-out batch (sample seed 0), the per-step Pearson r and the smoothed
// (EMA span 5) r of reward, loss, KL and grad norm. A proxy cannot be asked
// to track the original more closely than these variants do.
//
//   trend_noise_floor WARM_CHECKPOINT_DIR [--steps N] [--noise REL]... [--noise-seeds N] [--match-kl K]...
//                     [--seed S]...
//   trend_noise_floor --preset NAME [...]   (a fresh model of the preset, torch seed 0)
//   (WARM_CHECKPOINT_DIR: proxy-eval's OUT/warmup/PRESET-FAMILY-STEPS)
#include <torch/utils.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "moe/checkpoint.h"
#include "moe/grpo_trainer.h"
#include "proxy/proxy_eval.h"
#include "proxy/trend_fidelity.h"
#include "proxy/weight_noise.h"

namespace {

using moerr::moe::MoeTransformer;
using moerr::proxy::Trajectory;

void PrintRow(const std::string& name, double kl, const Trajectory& o, const Trajectory& t) {
  using moerr::proxy::CompareTrend;
  using moerr::proxy::Pearson;
  std::printf("| %s | %.2e | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", name.c_str(), kl,
              CompareTrend(o.reward, t.reward).smoothed_corr, CompareTrend(o.loss, t.loss).smoothed_corr,
              CompareTrend(o.kl, t.kl).smoothed_corr, CompareTrend(o.grad_norm, t.grad_norm).smoothed_corr,
              Pearson(o.reward, t.reward), Pearson(o.loss, t.loss), Pearson(o.kl, t.kl),
              Pearson(o.grad_norm, t.grad_norm));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const bool fresh = argc >= 3 && std::string(argv[1]) == "--preset";
  if (argc < 2 || (std::string(argv[1]) == "--preset" && !fresh)) {
    std::fprintf(stderr,
                 "usage: trend_noise_floor WARM_CHECKPOINT_DIR|--preset NAME [--steps N] [--noise REL]... "
                 "[--noise-seeds N] [--match-kl K]... [--seed S]...\n");
    return 2;
  }
  int64_t steps = 30, noise_seeds = 1;
  std::vector<double> noises, match_kls;
  std::vector<uint64_t> seeds;
  for (int i = fresh ? 3 : 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::atol(argv[i + 1]);
    else if (flag == "--noise") noises.push_back(std::atof(argv[i + 1]));
    else if (flag == "--noise-seeds") noise_seeds = std::atol(argv[i + 1]);
    else if (flag == "--match-kl") match_kls.push_back(std::atof(argv[i + 1]));
    else if (flag == "--seed") seeds.push_back(std::strtoull(argv[i + 1], nullptr, 10));
    else {
      std::fprintf(stderr, "unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  torch::manual_seed(0);
  absl::StatusOr<MoeTransformer> loaded = absl::InvalidArgumentError("unreachable");
  if (fresh) {
    const auto config = moerr::moe::Preset(argv[2]);
    loaded = config.ok() ? absl::StatusOr<MoeTransformer>(MoeTransformer(*config)) : config.status();
  } else {
    loaded = moerr::moe::LoadCheckpoint(argv[1]);
  }
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  MoeTransformer warm = *loaded;
  std::mt19937_64 rng(99);  // proxy-eval's held-out batch, sample seed 0
  const moerr::moe::AdditionTask::Batch held_out = moerr::moe::AdditionTask().Sample(64, rng);
  const at::Tensor tokens = at::cat({held_out.prompts, held_out.answers}, 1);
  std::fprintf(stderr, "original: %lld steps\n", static_cast<long long>(steps));
  const Trajectory original = moerr::proxy::Train(warm, steps, 5);
  std::printf("| variant | logit KL | smoothed r(reward) | smoothed r(loss) | smoothed r(KL) | smoothed r(grad norm) "
              "| r(reward) | r(loss) | r(KL) | r(grad norm) |\n|---|---|---|---|---|---|---|---|---|---|\n");
  std::fprintf(stderr, "identity\n");
  PrintRow("identity", 0.0, original, moerr::proxy::Train(warm, steps, 5));
  for (double rel : noises) {
    for (int64_t g = 0; g < noise_seeds; ++g) {
      std::fprintf(stderr, "noise %g, noise seed %lld\n", rel, static_cast<long long>(g));
      MoeTransformer v = moerr::proxy::Perturbed(warm, rel, g);
      char name[48];
      std::snprintf(name, sizeof name, "noise %g (seed %lld)", rel, static_cast<long long>(g));
      PrintRow(name, moerr::proxy::LogitKl(warm, v, tokens), original, moerr::proxy::Train(v, steps, 5));
    }
  }
  for (double target : match_kls) {
    std::fprintf(stderr, "noise matched to logit KL %g\n", target);
    absl::StatusOr<moerr::proxy::MatchedNoise> m = moerr::proxy::MatchNoiseToKl(warm, tokens, target, 0);
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", std::string(m.status().message()).c_str());
      return 1;
    }
    char name[80];
    std::snprintf(name, sizeof name, "matched KL %g: noise %.3g (%lld tries)", target, m->rel,
                  static_cast<long long>(m->tries));
    PrintRow(name, m->kl, original, moerr::proxy::Train(m->model, steps, 5));
  }
  for (uint64_t s : seeds) {
    std::fprintf(stderr, "seed %llu\n", static_cast<unsigned long long>(s));
    PrintRow("trainer seed " + std::to_string(s), 0.0, original, moerr::proxy::Train(warm, steps, s));
  }
  return 0;
}
