#include "report/verdict.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/held_dtypes.h"
#include "analysis/overflow_cause.h"

namespace moerr::report {
namespace {

// Links of the chain named in the verdict; longer chains show their ends.
constexpr size_t kChainShown = 8;

// "op 378 aten::to in model.layers.0.mlp.experts.10".
std::string Place(size_t index, const formats::OpEvent& op) {
  return absl::StrFormat("op %zu %s in %s", index, op.name, op.module.empty() ? "(no module)" : op.module);
}

// The cause line: where the magnitude exploded, by how much.
std::string CauseText(const analysis::OverflowCause& c) {
  const analysis::CauseLink& l = c.cause;
  if (!c.found_explosion) {
    return absl::StrFormat("%s itself (%s): no op before it on the chain of its inputs grew its magnitude by %.0f "
                           "bits or more",
                           Place(l.op_index, *l.op), formats::PhaseName(l.op->phase), analysis::kInputRiseBits);
  }
  std::vector<std::string> rises;
  if (!std::isnan(l.input_rise_bits)) {
    rises.push_back(absl::StrFormat("%.1f bits above its largest computed input", l.input_rise_bits));
  }
  if (!std::isnan(l.peer_rise_bits)) {
    rises.push_back(absl::StrFormat("%.1f bits above the median of %zu peers (the same op in other experts, layers "
                                    "or steps)",
                                    l.peer_rise_bits, l.peers));
  }
  return absl::StrFormat("%s (%s): its output's magnitude exploded to |max| %.4g, %s", Place(l.op_index, *l.op),
                         formats::PhaseName(l.op->phase), l.abs_max, absl::StrJoin(rises, " and "));
}

// "op 187 aten::mm -> op 188 aten::mul -> op 189 aten::to".
std::string ChainText(const std::vector<analysis::CauseLink>& chain) {
  std::vector<std::string> links;
  for (size_t i = 0; i < chain.size(); ++i) {
    if (chain.size() > kChainShown && i == kChainShown / 2) {
      links.push_back(absl::StrFormat("(%zu more)", chain.size() - kChainShown));
      i = chain.size() - kChainShown / 2;
    }
    links.push_back(absl::StrFormat("op %zu %s", chain[i].op_index, chain[i].op->name));
  }
  return absl::StrJoin(links, " -> ");
}

}  // namespace

void AddOverflowVerdict(HtmlPage& page, const std::string& path, int64_t step, const formats::Trace& trace,
                        const analysis::OverflowCause& found, bool replayable) {
  if (page.has_verdict()) return;
  const analysis::FirstOverflow& first = found.first;
  const formats::OpEvent& op = *first.op;
  const formats::Fingerprint& f = first.fingerprint;
  std::vector<HtmlPage::VerdictLine> lines;
  lines.push_back({"Cause", CauseText(found)});
  lines.push_back({"First non-finite op",
                   absl::StrFormat("%s: %d of %d values +Inf, %d -Inf, %d NaN", Place(first.op_index, op), f.pos_inf,
                                   f.numel, f.neg_inf, f.nan)});
  if (found.chain.size() > 1) lines.push_back({"Chain", ChainText(found.chain)});
  lines.push_back({"Phase", absl::StrCat(formats::PhaseName(op.phase),
                                         first.forward_op ? absl::StrFormat(" (the backward of %s in %s)",
                                                                            first.forward_op->name,
                                                                            first.forward_op->module)
                                                          : std::string())});
  const bool precision = replayable && analysis::Holds16Bit(trace);
  lines.push_back({"Run next",
                   precision ? absl::StrFormat("moerr bisect %s --step %d --precision", path, step)
                             : absl::StrFormat("moerr bisect %s --step %d", path, step),
                   true});
  lines.push_back({"", precision ? "finds a set of modules whose upcast to fp32 removes the overflow, none of which can be "
                                   "dropped, and writes it as a policy for moerr replay --policy"
                     : replayable ? "prints the cause, the chain and the headroom of each op on it"
                                  : "prints the cause, the chain and the headroom of each op on it (precision bisect "
                                    "needs a replayable recording, not a stats bundle or an imported dump)"});
  const formats::OpEvent& cause = *found.cause.op;
  page.Verdict(absl::StrFormat("Verdict: step %d overflows; the cause is in %s (%s)", step,
                               cause.module.empty() ? cause.name : cause.module, formats::PhaseName(cause.phase)),
               lines, true);
}

void AddFiniteVerdict(HtmlPage& page, const std::string& path, const std::vector<int64_t>& steps) {
  page.Verdict(absl::StrFormat("Verdict: every output is finite (step%s %s)", steps.size() == 1 ? "" : "s",
                               absl::StrJoin(steps, ", ")),
               {{"Run next", absl::StrFormat("moerr lint %s", path), true},
                {"", "flags values close to their dtype's range, and ones that would overflow in fp16 or bf16"}},
               false);
}

}  // namespace moerr::report
