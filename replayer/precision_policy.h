// Precision policies (DESIGN.md, "Replay"): run chosen ops or modules of a
// replay in higher precision, or emulate a lower-precision device by rounding
// their outputs.
//
// Text form, one rule per line ('#' starts a comment):
//
//   module:model.layers.0.mlp.experts.3   fp32     the ops of exactly this module
//   tree:model.layers.1                    fp64     this module and every submodule
//   op:aten::softmax                       round-fp16-sat
//
// Actions: fp32, fp64 (upcast), round-fp16 (overflow gives +-Inf),
// round-fp16-sat (overflow saturates at +-65504, as NPUs can), round-bf16.
// When several rules match an op, the last one wins.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/trace.h"

namespace moerr::replayer {

struct PolicyRule {
  enum class Selector { kModule, kTree, kOp };
  enum class Action { kFp32, kFp64, kRoundFp16, kRoundFp16Saturate, kRoundBf16 };
  Selector selector = Selector::kModule;
  std::string pattern;
  Action action = Action::kFp32;

  bool Matches(const formats::OpEvent& op) const;
  bool Upcast() const { return action == Action::kFp32 || action == Action::kFp64; }
};

absl::StatusOr<PolicyRule::Action> ParsePolicyAction(absl::string_view name);
absl::string_view PolicyActionName(PolicyRule::Action action);

class PrecisionPolicy {
 public:
  PrecisionPolicy() = default;
  explicit PrecisionPolicy(std::vector<PolicyRule> rules) : rules_(std::move(rules)) {}

  // Parses the text form; errors name the line.
  static absl::StatusOr<PrecisionPolicy> Parse(absl::string_view text);
  static absl::StatusOr<PrecisionPolicy> Load(const std::string& path);
  // The text form, which Parse reads back.
  std::string ToText() const;

  // The rule in force for `op`, or nullptr.
  const PolicyRule* Match(const formats::OpEvent& op) const;
  const std::vector<PolicyRule>& rules() const { return rules_; }
  bool empty() const { return rules_.empty(); }

 private:
  std::vector<PolicyRule> rules_;
};

}  // namespace moerr::replayer
