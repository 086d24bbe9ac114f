#include "replayer/precision_policy.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "support/enum_table.h"

namespace moerr::replayer {
namespace {

constexpr EnumName<PolicyRule::Action> kActions[] = {
    {PolicyRule::Action::kFp32, "fp32"},
    {PolicyRule::Action::kFp64, "fp64"},
    {PolicyRule::Action::kRoundFp16, "round-fp16"},
    {PolicyRule::Action::kRoundFp16Saturate, "round-fp16-sat"},
    {PolicyRule::Action::kRoundBf16, "round-bf16"},
};

constexpr std::pair<PolicyRule::Selector, absl::string_view> kSelectors[] = {
    {PolicyRule::Selector::kModule, "module:"},
    {PolicyRule::Selector::kTree, "tree:"},
    {PolicyRule::Selector::kOp, "op:"},
};

}  // namespace

bool PolicyRule::Matches(const formats::OpEvent& op) const {
  switch (selector) {
    case Selector::kModule: return op.module == pattern;
    case Selector::kTree:
      return absl::StartsWith(op.module, pattern) &&
             (op.module.size() == pattern.size() || op.module[pattern.size()] == '.');
    case Selector::kOp: return op.name == pattern;
  }
  return false;
}

absl::StatusOr<PolicyRule::Action> ParsePolicyAction(absl::string_view name) {
  return ParseEnum(kActions, "precision action", name);
}

absl::string_view PolicyActionName(PolicyRule::Action action) { return EnumNameOf(kActions, action, "?"); }

absl::StatusOr<PrecisionPolicy> PrecisionPolicy::Parse(absl::string_view text) {
  std::vector<PolicyRule> rules;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    std::vector<absl::string_view> words = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    auto error = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrFormat("policy line %d: %s", line_number, what));
    };
    if (words.size() != 2) return error("expected \"SELECTOR ACTION\", e.g. \"tree:model.layers.0 fp32\"");
    PolicyRule rule;
    bool known = false;
    for (const auto& [selector, prefix] : kSelectors) {
      if (absl::StartsWith(words[0], prefix)) {
        rule.selector = selector;
        rule.pattern = std::string(words[0].substr(prefix.size()));
        known = true;
      }
    }
    if (!known) return error(absl::StrFormat("unknown selector \"%s\" (module:PATH, tree:PATH or op:NAME)", words[0]));
    if (rule.pattern.empty()) return error("empty selector pattern");
    auto action = ParsePolicyAction(words[1]);
    if (!action.ok()) return error(std::string(action.status().message()));
    rule.action = *action;
    rules.push_back(std::move(rule));
  }
  return PrecisionPolicy(std::move(rules));
}

absl::StatusOr<PrecisionPolicy> PrecisionPolicy::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read policy file %s", path));
  std::stringstream text;
  text << in.rdbuf();
  auto policy = Parse(text.str());
  if (!policy.ok()) return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, policy.status().message()));
  return policy;
}

std::string PrecisionPolicy::ToText() const {
  std::string out;
  for (const PolicyRule& r : rules_) {
    absl::string_view prefix;
    for (const auto& [selector, text] : kSelectors) {
      if (selector == r.selector) prefix = text;
    }
    absl::StrAppendFormat(&out, "%s%s %s\n", prefix, r.pattern, PolicyActionName(r.action));
  }
  return out;
}

const PolicyRule* PrecisionPolicy::Match(const formats::OpEvent& op) const {
  for (auto it = rules_.rbegin(); it != rules_.rend(); ++it) {
    if (it->Matches(op)) return &*it;
  }
  return nullptr;
}

}  // namespace moerr::replayer
