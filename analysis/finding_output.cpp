#include "analysis/finding_output.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"

namespace moerr::analysis {

llvm::json::Object FindingJson(const Finding& f) {
  llvm::json::Object o{{"check", f.check},
                       {"severity", std::string(SeverityName(f.severity))},
                       {"step", f.step},
                       {"where", f.where},
                       {"message", f.message},
                       {"numbers", llvm::json::Object(f.numbers)}};
  if (f.op_index >= 0) {
    o["op_index"] = f.op_index;
    o["op"] = f.op;
    o["phase"] = f.phase;
  }
  if (!f.next.empty()) o["next"] = f.next;
  if (f.rank >= 0) o["rank"] = f.rank;
  return o;
}

void PrintFinding(const Finding& f) {
  std::string where = f.op_index >= 0 ? absl::StrFormat("op %d %s in %s (%s)", f.op_index, f.op, f.where, f.phase)
                                      : f.where;
  if (f.rank >= 0) where = absl::StrFormat("rank %d, %s", f.rank, where);
  std::printf("  %-7s %-18s %s\n          %s\n", std::string(SeverityName(f.severity)).c_str(), f.check.c_str(),
              where.c_str(), f.message.c_str());
  if (!f.next.empty()) std::printf("          next: %s\n", f.next.c_str());
}

void PrintFindings(const std::vector<Finding>& all) {
  int counts[3] = {0, 0, 0};  // by Severity
  for (const Finding& f : all) ++counts[static_cast<int>(f.severity)];
  int64_t step = -2;
  for (const Finding& f : all) {
    if (f.step != step) std::printf("step %lld:\n", static_cast<long long>(step = f.step));
    PrintFinding(f);
  }
  std::printf("%zu findings: %d error%s, %d warning%s, %d note%s\n", all.size(), counts[2], counts[2] == 1 ? "" : "s",
              counts[1], counts[1] == 1 ? "" : "s", counts[0], counts[0] == 1 ? "" : "s");
}

}  // namespace moerr::analysis
