// The fault catalogue (moe/faults/faults.def): every row complete, the names,
// help and errors the command line shows, the rank faults parsed.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "moe/fault.h"
#include "moe/faults/fault_table.h"
#include "moe/faults/rank_fault.h"
#include "moe/moe_transformer.h"

namespace moerr::moe {
namespace {

TEST(FaultTable, EveryRowIsComplete) {
  std::set<std::string> names;
  for (const FaultRow* row : FaultTable()) {
    SCOPED_TRACE(row->name);
    EXPECT_TRUE(names.insert(row->name).second) << "a name used twice";
    EXPECT_EQ(&FaultRowOf(row->kind), row);
    EXPECT_EQ(FaultName(row->kind), row->name);
    EXPECT_NE(std::string(row->description), "");
    EXPECT_NE(std::string(row->verdict), "");
    const bool process = row->scope == FaultScope::kProcess;
    // A process fault is judged by a failure; no failure verdict judges a rank fault.
    EXPECT_EQ(std::string(row->failure).empty(), !process);
    EXPECT_EQ(std::string(row->rule).empty(), !process);
    EXPECT_EQ(FindFault(row->name, row->scope), row);
    EXPECT_EQ(FindFault(row->name, process ? FaultScope::kRanks : FaultScope::kProcess), nullptr);
  }
  EXPECT_EQ(AllFaults().size() + AllFaults(FaultScope::kRanks).size(), FaultTable().size());
}

TEST(FaultTable, TheDynamicsFaultsComeLast) {
  bool dynamics = false;
  for (FaultKind kind : AllFaults()) {
    EXPECT_TRUE(OnsetFromDynamics(kind) || !dynamics) << FaultName(kind) << " after a dynamics fault";
    dynamics = OnsetFromDynamics(kind);
  }
  EXPECT_FALSE(OnsetFromDynamics(FaultKind::kNone));
}

TEST(FaultTable, ParsesTheProcessFaultsOnly) {
  EXPECT_EQ(ParseFault("none").value(), FaultKind::kNone);
  EXPECT_EQ(ParseFault("bad-kernel").value(), FaultKind::kBadKernel);
  EXPECT_EQ(FaultName(FaultKind::kNone), "none");
  const std::string listed =
      " (none, expert-overflow, grad-overflow, logprob-precision, bad-kernel, router-collapse, skip-update, "
      "lr-divergence, router-collapse-free, loss-scale-growth, trained-precision)";
  EXPECT_EQ(ParseFault("kill").status().message(), "unknown fault \"kill\"" + listed);
  EXPECT_EQ(ParseFault("typo").status().message(), "unknown fault \"typo\"" + listed);
}

TEST(FaultTable, HelpListsTheTable) {
  EXPECT_EQ(FaultHelp(FaultScope::kProcess),
            "Fault to inject: none, expert-overflow, grad-overflow, logprob-precision, bad-kernel, "
            "router-collapse, skip-update, and the dynamics faults (failing steps later) lr-divergence, "
            "router-collapse-free, loss-scale-growth, trained-precision");
  EXPECT_EQ(FaultHelp(FaultScope::kRanks),
            "A multi-rank fault in step 0: kill:K (rank K is killed by SIGKILL as the step starts), stall:K "
            "(rank K stops there, the others time out in their collective), corrupt:K (rank K's first "
            "all_to_all of rows delivers another rank's rows scaled by 2^16, as a bad link would); @N: at "
            "rank K's N-th collective after the rollout (N-th all_to_all of rows for corrupt), from 0");
}

TEST(FaultTable, ParsesRankFaults) {
  const RankFaultSpec kill = ParseRankFault("kill:1", 2).value();
  EXPECT_EQ(kill.kind, FaultKind::kKill);
  EXPECT_EQ(kill.rank, 1);
  EXPECT_EQ(kill.at, -1);
  const RankFaultSpec corrupt = ParseRankFault("corrupt:0@3", 2).value();
  EXPECT_EQ(corrupt.kind, FaultKind::kCorrupt);
  EXPECT_EQ(corrupt.at, 3);
  EXPECT_EQ(ParseRankFault("stall:1@0", 4).value().kind, FaultKind::kStall);
  for (const char* bad : {"stall:2", "kill", "kill:-1", "corrupt:0@-1", "expert-overflow:0", "kill:x@1"}) {
    EXPECT_EQ(ParseRankFault(bad, 2).status().message(),
              "--rank-fault must be kill:K, stall:K or corrupt:K, optionally @N, with K a rank below 2, not \"" +
                  std::string(bad) + "\"");
  }
}

TEST(FaultTable, ARankFaultIsNotInjectedIntoOneProcess) {
  MoeTransformer policy(Preset("tiny").value());
  GrpoOptions options;
  const absl::StatusOr<InjectedFault> injected = InjectFault(FaultKind::kStall, policy, options, at::Tensor());
  EXPECT_EQ(injected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InjectFault(FaultKind::kNone, policy, options, at::Tensor()).value().kind, FaultKind::kNone);
}

}  // namespace
}  // namespace moerr::moe
