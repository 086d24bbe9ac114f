// Healing a proxy (`moerr proxy --heal N`, off by default): a short
// distillation of the pruned policy towards the original's next-token
// distributions over calibration sequences, with the forced-keep experts
// (those the recorded failure implicates, and super experts) frozen so that
// the fault they carry is not trained away. What it buys (a proxy closer to
// the original) and what it risks (a failure that no longer reproduces)
// are measured by `moerr proxy-eval --heal N`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "moe/moe_transformer.h"
#include "proxy/proxy_builder.h"

namespace moerr::proxy {

struct HealOptions {
  int64_t steps = 0;     // distillation steps; 0: none
  int64_t batch = 32;    // addition-task sequences per step
  double lr = 1e-4;      // AdamW, no weight decay (the RL step's)
  uint64_t seed = 0;     // of the calibration sequences
};

struct HealReport {
  int64_t steps = 0;
  // KL(original || proxy) per token on 64 held-out sequences, nats.
  double kl_before = 0, kl_after = 0;
  std::vector<std::string> frozen;  // parameter names left untouched
};

// Distils `student` towards `teacher` for `options.steps` steps: loss is the
// KL(teacher || student) of the next-token distributions, per token, over
// whole task sequences (prompt and answer). Parameters whose names start
// in `frozen` are neither trained nor changed (bitwise).
HealReport Distil(moe::MoeTransformer& teacher, moe::MoeTransformer& student, const std::vector<std::string>& frozen,
                  const HealOptions& options);

// The parameter names of the proxy's forced-keep experts: those of expert J
// of layer L ("model.layers.L.mlp.experts.J.*", any family's block name)
// where J is the proxy's index of a forced expert of L's plan.
std::vector<std::string> ForcedKeepParameters(const moe::MoeTransformer& proxy, const std::vector<LayerPlan>& plans);

// Heals the proxy `built` (written by BuildProxy from `original`) in place:
// its bundle's policy weights (and the reference's tensors that were the
// policy's, bitwise) and its checkpoint; the bundle's "proxy" annotation
// gains "healing". The teacher is the original policy at the proxied step.
absl::StatusOr<HealReport> HealProxy(const formats::BundleReader& original, const ProxyReport& built,
                                     const HealOptions& options, const std::string& source = "the bundle");

llvm::json::Object ToJson(const HealReport& r);

}  // namespace moerr::proxy
