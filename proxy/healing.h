// Healing a proxy (`moerr proxy --heal N`, off by default): a short
// distillation of the pruned policy towards the original's next-token
// distributions over calibration sequences, with the forced-keep experts
// (those the recorded failure implicates, and super experts) frozen so that
// the fault they carry is not trained away. What it buys (a proxy closer to
// the original) and what it risks (a failure that no longer reproduces)
// are measured by `moerr proxy-eval --heal N`.
#pragma once

#include <cstdint>
#include <map>
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

// What healing must leave bitwise: whole parameters by name, and rows of
// parameters (a router's weight rows [E, hidden] of the forced-keep
// experts, which decide the tokens those experts get).
struct Frozen {
  std::vector<std::string> tensors;
  std::map<std::string, std::vector<int64_t>> rows;  // parameter name -> row indices
};

struct HealReport {
  int64_t steps = 0;
  // KL(original || proxy) per token on 64 held-out sequences, nats.
  double kl_before = 0, kl_after = 0;
  Frozen frozen;  // left untouched
};

// Distils `student` towards `teacher` for `options.steps` steps: loss is the
// KL(teacher || student) of the next-token distributions, per token, over
// whole task sequences (prompt and answer). The parameters named in
// `frozen.tensors` get no gradient; the rows in `frozen.rows` get a zero
// gradient, which AdamW without weight decay turns into no change; both stay
// bitwise.
HealReport Distil(moe::MoeTransformer& teacher, moe::MoeTransformer& student, const Frozen& frozen,
                  const HealOptions& options);

// The proxy's forced-keep experts (J, the proxy's index of a forced expert
// of layer L's plan): every parameter of "model.layers.L.<block>.experts.J.*"
// (any family's block name), and row J of layer L's router weight.
Frozen ForcedKeepParameters(const moe::MoeTransformer& proxy, const std::vector<LayerPlan>& plans);

// Heals the proxy `built` (written by BuildProxy from `original`) in place:
// its bundle's policy weights (and the reference's tensors that were the
// policy's, bitwise) and its checkpoint; the bundle's "proxy" annotation
// gains "healing". The teacher is the original policy at the proxied step.
absl::StatusOr<HealReport> HealProxy(const formats::BundleReader& original, const ProxyReport& built,
                                     const HealOptions& options, const std::string& source = "the bundle");

llvm::json::Object ToJson(const HealReport& r);

}  // namespace moerr::proxy
