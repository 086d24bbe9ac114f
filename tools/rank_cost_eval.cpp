#include "tools/rank_cost_eval.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "moe/fault.h"
#include "support/filesystem.h"
#include "support/status.h"
#include "llvm/Support/FormatVariadic.h"

namespace moerr::tools {
namespace {

// This executable (/proc/self/exe) with `args`, stdout to `out` and stderr
// to `err`; its exit status (a signal: 128 + the signal).
absl::StatusOr<int> RunSelf(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  std::vector<char*> argv;
  std::string self = "moerr";
  argv.push_back(self.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::UnavailableError("fork failed");
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(127);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) < 0) return absl::UnavailableError("waitpid failed");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `moerr ARGS` in `dir` (its output in dir/NAME.out and .err), accepting
// exit statuses 0 and 1 (a finding): the command's stdout.
absl::StatusOr<std::string> Moerr(const std::vector<std::string>& args, const std::string& dir, const std::string& name) {
  const std::string out = dir + "/" + name + ".out", err = dir + "/" + name + ".err";
  MOERR_ASSIGN_OR_RETURN(const int code, RunSelf(args, out, err));
  if (code != 0 && code != 1) {
    return absl::AbortedError(absl::StrFormat("moerr %s exited %d (its output: %s, %s): %s", absl::StrJoin(args, " "),
                                              code, out, err, Slurp(err)));
  }
  return Slurp(out);
}

// A replay's --json: its cost and failure verdict, into `row`.
absl::Status ReadReplay(const std::string& text, const std::string& what, RankCostRow& row) {
  llvm::Expected<llvm::json::Value> v = llvm::json::parse(text);
  if (!v) return absl::DataLossError(what + ": not JSON: " + llvm::toString(v.takeError()));
  const llvm::json::Object* o = v->getAsObject();
  const llvm::json::Object* cost = o ? o->getObject("cost") : nullptr;
  if (cost == nullptr) return absl::DataLossError(what + ": no \"cost\"");
  row.ranks = o->getInteger("ranks").getValueOr(0);
  row.device_seconds = cost->getNumber("device_seconds").getValueOr(0);
  row.step_seconds_per_rank = cost->getNumber("step_seconds_per_rank").getValueOr(0);
  if (const llvm::json::Object* f = o->getObject("failure")) {
    const llvm::json::Array* ranks = f->getArray("ranks");
    row.failure = f->getString("kind").getValueOr("").str();
    row.shown = ranks != nullptr && !ranks->empty() && f->getInteger("judged").getValueOr(0) > 0;
    row.reproduced = row.shown && f->getBoolean("reproduced").getValueOr(false);
    row.localised = row.shown && f->getBoolean("localised").getValueOr(false);
  }
  return absl::OkStatus();
}

// One fault: the run, the original's replay on its ranks, and each proxy's.
absl::Status EvaluateFault(const RankCostOptions& o, const std::string& fault, const RankCostProgress& progress,
                           RankCostReport& report) {
  const std::string dir = o.out_dir + "/" + fault, run = dir + "/run";
  MOERR_RETURN_IF_ERROR(MakeDirectory(dir));
  const std::string n = std::to_string(o.ranks), timeout = absl::StrFormat("%g", o.collective_timeout_s);
  std::vector<std::string> train = {"train", "--preset", o.preset, "--ranks", n, "--ep", n, "--warmup-steps",
                                    std::to_string(o.warmup_steps), "--steps", "1", "--fault", fault, "--record",
                                    "replayable", "--collective-timeout", timeout, "--force", "-o", dir};
  if (fault == "expert-overflow" || fault == "router-collapse") {
    train.insert(train.end(), {"--fault-rank", std::to_string(std::max<int64_t>(0, o.ranks - 3))});
  }
  if (progress) progress(fault + ": training on " + n + " ranks");
  MOERR_RETURN_IF_ERROR(Moerr(train, dir, "train").status());
  if (progress) progress(fault + ": the original's step on its " + n + " ranks");
  RankCostRow original;
  original.fault = fault;
  original.keep = "1";
  MOERR_ASSIGN_OR_RETURN(const std::string base, Moerr({"replay", run, "--ranks", n, "--json", "--collective-timeout",
                                                        timeout}, dir, "replay-original"));
  MOERR_RETURN_IF_ERROR(ReadReplay(base, fault + ", the original's replay", original));
  report.rows.push_back(original);
  for (const std::string& keep : o.keeps) {
    const std::string proxy = dir + "/proxy-" + keep.substr(0, 1) + "of" + keep.substr(keep.find('/') + 1);
    if (progress) progress(fault + ": the proxy at " + keep);
    MOERR_RETURN_IF_ERROR(
        Moerr({"proxy", run, "--keep", keep, "--force", "-o", proxy}, dir, "proxy-" + keep.substr(2)).status());
    MOERR_ASSIGN_OR_RETURN(const std::string text, Moerr({"replay", proxy, "--json", "--collective-timeout", timeout},
                                                         dir, "replay-proxy-" + keep.substr(2)));
    RankCostRow row;
    row.fault = fault;
    row.keep = keep;
    MOERR_RETURN_IF_ERROR(ReadReplay(text, fault + ", the proxy at " + keep, row));
    row.lower_by = row.device_seconds > 0 ? original.device_seconds / row.device_seconds : 0;
    report.rows.push_back(row);
  }
  return absl::OkStatus();
}

std::string Verdict(const RankCostRow& r, bool localised) {
  if (!r.shown) return r.failure.empty() ? "n/a (none recorded)" : "n/a (not shown)";
  return (localised ? r.localised : r.reproduced) ? "yes" : "NO";
}

}  // namespace

absl::StatusOr<RankCostReport> EvaluateRankCost(const RankCostOptions& o, const RankCostProgress& progress) {
  if (o.out_dir.empty()) return absl::InvalidArgumentError("proxy-eval --ranks needs an output directory (-o DIR)");
  if (o.ranks < 2) return absl::InvalidArgumentError("proxy-eval --ranks N: N is at least 2");
  for (const std::string& keep : o.keeps) {
    int64_t k = 0;
    if (keep.rfind("1/", 0) != 0 || !absl::SimpleAtoi(keep.substr(2), &k) || k < 2 || o.ranks % k != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "proxy-eval --ranks %d: --keep %s is not 1/K with K dividing the ranks (the proxy runs on N/K ranks)",
          o.ranks, keep));
    }
  }
  for (const std::string& fault : o.faults) {
    const absl::StatusOr<moe::FaultKind> f = moe::ParseFault(fault);
    if (!f.ok()) return f.status();
    if (*f == moe::FaultKind::kNone) return absl::InvalidArgumentError("proxy-eval --ranks: --faults none is no fault");
  }
  MOERR_RETURN_IF_ERROR(MakeDirectory(o.out_dir));
  RankCostReport report;
  report.preset = o.preset;
  report.ranks = o.ranks;
  for (const std::string& fault : o.faults) MOERR_RETURN_IF_ERROR(EvaluateFault(o, fault, progress, report));
  return report;
}

void PrintRankCost(const RankCostReport& report) {
  std::printf("%s at N = %lld ranks (EP %lld); step time = each rank's CPU seconds in the step (ranks share the "
              "machine's cores), device time = their sum\n",
              report.preset.c_str(), static_cast<long long>(report.ranks), static_cast<long long>(report.ranks));
  std::printf("| fault | keep | ranks | step time per rank (s CPU) | device time per step (s) | lower by | "
              "reproduced on M ranks | localised |\n|---|---|---|---|---|---|---|---|\n");
  for (const RankCostRow& r : report.rows) {
    std::printf("| %s | %s | %lld | %.3f | %.3f | %.1fx | %s%s | %s |\n", r.fault.c_str(),
                r.keep == "1" ? "1 (original)" : r.keep.c_str(), static_cast<long long>(r.ranks),
                r.step_seconds_per_rank, r.device_seconds, r.lower_by, Verdict(r, false).c_str(),
                r.failure.empty() ? "" : (" (" + r.failure + ")").c_str(), Verdict(r, true).c_str());
  }
  const RankCostProjection p;
  std::printf("Projection (computed, not measured): %lld experts at EP %lld proxied to %lld experts on %lld devices, "
              "the experts and tokens per device kept: %lld -> %lld devices at the same step time per device, "
              "%.0fx lower device time per step\n",
              static_cast<long long>(p.experts), static_cast<long long>(p.ep), static_cast<long long>(p.proxy_experts),
              static_cast<long long>(p.proxy_devices), static_cast<long long>(p.ep),
              static_cast<long long>(p.proxy_devices), p.device_time_ratio());
}

llvm::json::Object RankCostJson(const RankCostReport& report) {
  llvm::json::Array rows;
  for (const RankCostRow& r : report.rows) {
    rows.push_back(llvm::json::Object{{"fault", r.fault},
                                      {"keep", r.keep},
                                      {"ranks", r.ranks},
                                      {"step_seconds_per_rank", r.step_seconds_per_rank},
                                      {"device_seconds", r.device_seconds},
                                      {"lower_by", r.lower_by},
                                      {"failure", r.failure},
                                      {"shown", r.shown},
                                      {"reproduced", r.reproduced},
                                      {"localised", r.localised}});
  }
  const RankCostProjection p;
  return llvm::json::Object{
      {"preset", report.preset},
      {"ranks", report.ranks},
      {"rows", std::move(rows)},
      {"projection", llvm::json::Object{{"experts", p.experts},
                                        {"ep", p.ep},
                                        {"proxy_experts", p.proxy_experts},
                                        {"proxy_devices", p.proxy_devices},
                                        {"device_time_ratio", p.device_time_ratio()},
                                        {"measured", false}}}};
}

CommandResult RunRankCost(const RankCostOptions& options, const std::string& json_path) {
  auto report = EvaluateRankCost(options, [](const std::string& what) { std::fprintf(stderr, "%s\n", what.c_str()); });
  if (!report.ok()) return report.status();
  PrintRankCost(*report);
  if (!json_path.empty()) {
    std::ofstream out(json_path, std::ios::trunc);
    out << llvm::formatv("{0:2}", llvm::json::Value(RankCostJson(*report))).str() << "\n";
    if (!out.good()) return absl::UnavailableError("cannot write " + json_path);
  }
  return kExitOk;
}

}  // namespace moerr::tools
