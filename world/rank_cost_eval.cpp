#include "world/rank_cost_eval.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "distributed/launcher.h"
#include "llvm/Support/FormatVariadic.h"
#include "moe/faults/fault_table.h"
#include "support/filesystem.h"
#include "support/status.h"

namespace moerr::world {
namespace {

// How a child command ended.
struct ChildExit {
  int code = 0;     // its exit status, when it exited
  int signal = 0;   // the signal that ended it, else 0
  bool timed_out = false;
  std::string Describe() const {
    std::string s = signal != 0 ? absl::StrFormat("was killed by signal %d (%s)", signal, ::strsignal(signal))
                                : absl::StrFormat("exited %d", code);
    return timed_out ? "ran past its limit and " + s : s;
  }
};

// This executable with `args` (distributed::Launch, one plain process),
// stdout to `out` and stderr to `err`, killed after `limit_s` seconds and
// with this process.
absl::StatusOr<ChildExit> RunSelf(const std::vector<std::string>& args, const std::string& out, const std::string& err,
                                  double limit_s) {
  distributed::LaunchOptions options;
  options.argv = {"moerr"};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.rank_env = false;
  options.stdout_path = out;
  options.stderr_path = err;
  options.deadline_s = limit_s;
  MOERR_ASSIGN_OR_RETURN(const distributed::LaunchResult launched, distributed::Launch(options));
  const distributed::RankOutcome& o = launched.ranks.at(0);
  ChildExit exit;
  switch (o.kind) {
    case distributed::RankOutcome::Kind::kOk:
    case distributed::RankOutcome::Kind::kExited:
      exit.code = o.code;
      break;
    case distributed::RankOutcome::Kind::kSignaled:
      exit.signal = o.code;
      break;
    case distributed::RankOutcome::Kind::kStopped:  // one process: no other rank stops it
    case distributed::RankOutcome::Kind::kHung:
      exit.timed_out = true;
      exit.signal = SIGKILL;
      break;
  }
  return exit;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The last `n` lines of `text`.
std::string Tail(const std::string& text, int n) {
  size_t at = text.size();
  if (at > 0 && text[at - 1] == '\n') --at;
  for (int i = 0; i < n && at != std::string::npos && at > 0; ++i) at = text.rfind('\n', at - 1);
  return at == std::string::npos || at == 0 ? text : text.substr(at + 1);
}

// `moerr ARGS` in `dir` (its output in dir/NAME.out and .err), accepting
// exit statuses 0 and 1 (a finding): the command's stdout.
absl::StatusOr<std::string> Moerr(const std::vector<std::string>& args, const std::string& dir, const std::string& name,
                                  double limit_s) {
  const std::string out = dir + "/" + name + ".out", err = dir + "/" + name + ".err";
  MOERR_ASSIGN_OR_RETURN(const ChildExit exit, RunSelf(args, out, err, limit_s));
  if (exit.timed_out || exit.signal != 0 || (exit.code != 0 && exit.code != 1)) {
    return absl::AbortedError(absl::StrFormat("moerr %s %s%s; the last lines of %s:\n%s", absl::StrJoin(args, " "),
                                              exit.Describe(),
                                              exit.timed_out ? absl::StrFormat(" (%g s)", limit_s) : "", err,
                                              Tail(Slurp(err), 20)));
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
  const auto ranks = o->getInteger("ranks");
  const auto device = cost->getNumber("device_seconds"), per_rank = cost->getNumber("step_seconds_per_rank");
  if (!ranks || !device || !per_rank) {
    return absl::DataLossError(absl::StrFormat("%s: its --json has no %s", what,
                                               !ranks ? "\"ranks\"" : !device ? "cost.device_seconds"
                                                                               : "cost.step_seconds_per_rank"));
  }
  row.ranks = *ranks;
  row.device_seconds = *device;
  row.step_seconds_per_rank = *per_rank;
  if (const llvm::json::Object* f = o->getObject("failure")) {
    const llvm::json::Array* ranks = f->getArray("ranks");
    row.failure = f->getString("kind").getValueOr("").str();
    row.shown = ranks != nullptr && !ranks->empty() && f->getInteger("judged").getValueOr(0) > 0;
    row.reproduced = row.shown && f->getBoolean("reproduced").getValueOr(false);
    row.localised = row.shown && f->getBoolean("localised").getValueOr(false);
  }
  return absl::OkStatus();
}

// The median of each cost over `rounds` (of an even count, the mean of the
// two middle ones), the other fields from the first.
RankCostRow Median(const std::vector<RankCostRow>& rounds) {
  RankCostRow out = rounds.front();
  const auto median = [&rounds](double RankCostRow::*field) {
    std::vector<double> v;
    for (const RankCostRow& r : rounds) v.push_back(r.*field);
    std::sort(v.begin(), v.end());
    const size_t mid = v.size() / 2;
    return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
  };
  out.device_seconds = median(&RankCostRow::device_seconds);
  out.step_seconds_per_rank = median(&RankCostRow::step_seconds_per_rank);
  return out;
}

// A replay is deterministic: its failure verdict is the same every round.
absl::Status SameVerdicts(const std::vector<RankCostRow>& rounds) {
  const RankCostRow& first = rounds.front();
  for (const RankCostRow& r : rounds) {
    if (r.failure != first.failure || r.shown != first.shown || r.reproduced != first.reproduced ||
        r.localised != first.localised || r.ranks != first.ranks) {
      return absl::InternalError(absl::StrFormat(
          "%s at keep %s: the replay's failure verdict differs between rounds (a replay is deterministic)", r.fault,
          r.keep));
    }
  }
  return absl::OkStatus();
}

// The fault's run trained, and its proxies built, in OUT/<fault>/: the
// directories to replay, the original's first (keep "1"). A proxy that
// cannot be built ends the list there, its error in `failed`.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TrainAndBuild(const RankCostOptions& o,
                                                                                const std::string& fault,
                                                                                const RankCostProgress& progress,
                                                                                absl::Status& failed) {
  const std::string dir = o.out_dir + "/" + fault, run = dir + "/run", n = std::to_string(o.ranks);
  MOERR_RETURN_IF_ERROR(MakeDirectory(dir));
  std::vector<std::string> train = {"train", "--preset", o.preset, "--ranks", n, "--ep", n, "--warmup-steps",
                                    std::to_string(o.warmup_steps), "--steps", "1", "--fault", fault, "--record",
                                    "replayable", "--collective-timeout", absl::StrFormat("%g", o.collective_timeout_s),
                                    "--deadline", absl::StrFormat("%g", o.child_timeout_s), "--force", "-o", dir};
  if (const moe::FaultRow* row = moe::FindFault(fault, moe::FaultScope::kProcess); row && row->in_weights) {
    train.insert(train.end(), {"--fault-rank", std::to_string(std::max<int64_t>(0, o.ranks - 3))});
  }
  if (progress) progress(fault + ": training on " + n + " ranks");
  MOERR_RETURN_IF_ERROR(Moerr(train, dir, "train", o.child_timeout_s).status());
  std::vector<std::pair<std::string, std::string>> replays = {{"1", run}};
  for (const std::string& keep : o.keeps) {
    const std::string proxy = dir + "/proxy-" + keep.substr(0, 1) + "of" + keep.substr(keep.find('/') + 1);
    if (progress) progress(fault + ": the proxy at " + keep);
    failed = Moerr({"proxy", run, "--keep", keep, "--force", "-o", proxy}, dir, "proxy-" + keep.substr(2),
                   o.child_timeout_s)
                 .status();
    if (!failed.ok()) break;
    replays.emplace_back(keep, proxy);
  }
  return replays;
}

// One fault: the run and its proxies, then `rounds` times the original's
// replay on its ranks and each proxy's (interleaved, so that load on the
// machine falls on both), each cost the median of its rounds. The rows of
// the replays that finished a round stay when a later one fails.
absl::Status EvaluateFault(const RankCostOptions& o, const std::string& fault, const RankCostProgress& progress,
                           RankCostReport& report) {
  absl::Status failed;
  MOERR_ASSIGN_OR_RETURN(const auto replays, TrainAndBuild(o, fault, progress, failed));
  const std::string dir = o.out_dir + "/" + fault, timeout = absl::StrFormat("%g", o.collective_timeout_s);
  std::vector<std::vector<RankCostRow>> rounds(replays.size());
  for (int64_t round = 0; failed.ok() && round < o.rounds; ++round) {
    for (size_t i = 0; failed.ok() && i < replays.size(); ++i) {
      const auto& [keep, path] = replays[i];
      const std::string what = keep == "1" ? "the original's replay" : "the proxy at " + keep;
      if (progress) progress(absl::StrFormat("%s: %s, round %d of %d", fault, what, round + 1, o.rounds));
      std::vector<std::string> args = {"replay", path, "--json", "--collective-timeout", timeout};
      if (keep == "1") args.insert(args.end(), {"--ranks", std::to_string(o.ranks)});
      const absl::StatusOr<std::string> text =
          Moerr(args, dir, keep == "1" ? "replay-original" : "replay-proxy-" + keep.substr(2), o.child_timeout_s);
      RankCostRow row;
      row.fault = fault;
      row.keep = keep;
      failed = text.ok() ? ReadReplay(*text, fault + ", " + what, row) : text.status();
      if (failed.ok()) rounds[i].push_back(row);
    }
  }
  const size_t original = report.rows.size();  // the fault's first row
  for (const std::vector<RankCostRow>& r : rounds) {
    if (r.empty()) break;
    if (failed.ok()) failed = SameVerdicts(r);
    report.rows.push_back(Median(r));
  }
  for (size_t i = original; i < report.rows.size(); ++i) {
    RankCostRow& row = report.rows[i];
    row.lower_by = row.device_seconds > 0 ? report.rows[original].device_seconds / row.device_seconds : 0;
  }
  return failed;
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
  if (!(o.child_timeout_s > 0)) return absl::InvalidArgumentError("proxy-eval --ranks: --child-timeout must be positive");
  if (o.rounds < 1) return absl::InvalidArgumentError("proxy-eval --ranks: --rounds must be at least 1");
  MOERR_RETURN_IF_ERROR(MakeDirectory(o.out_dir));
  RankCostReport report;
  report.preset = o.preset;
  report.ranks = o.ranks;
  for (const std::string& fault : o.faults) {
    // A fault that fails keeps the rows it finished; the others still run.
    if (absl::Status s = EvaluateFault(o, fault, progress, report); !s.ok()) {
      report.errors.push_back(fault + ": " + std::string(s.message()));
      if (progress) progress(fault + ": FAILED: " + std::string(s.message()));
    }
  }
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
  llvm::json::Array errors;
  for (const std::string& e : report.errors) errors.push_back(e);
  const RankCostProjection p;
  return llvm::json::Object{
      {"preset", report.preset},
      {"ranks", report.ranks},
      {"rows", std::move(rows)},
      {"errors", std::move(errors)},
      {"projection", llvm::json::Object{{"experts", p.experts},
                                        {"ep", p.ep},
                                        {"proxy_experts", p.proxy_experts},
                                        {"proxy_devices", p.proxy_devices},
                                        {"device_time_ratio", p.device_time_ratio()},
                                        {"measured", false}}}};
}

ExitOr RunRankCost(const RankCostOptions& options, const std::string& json_path) {
  auto report = EvaluateRankCost(options, [](const std::string& what) { std::fprintf(stderr, "%s\n", what.c_str()); });
  if (!report.ok()) return report.status();
  PrintRankCost(*report);
  if (!json_path.empty()) {
    std::ofstream out(json_path, std::ios::trunc);
    out << llvm::formatv("{0:2}", llvm::json::Value(RankCostJson(*report))).str() << "\n";
    if (!out.good()) return absl::UnavailableError("cannot write " + json_path);
  }
  if (!report->errors.empty()) {
    return absl::AbortedError(absl::StrFormat("%d fault(s) failed (their rows above are partial):\n%s",
                                              report->errors.size(), absl::StrJoin(report->errors, "\n")));
  }
  return kExitOk;
}

}  // namespace moerr::world
