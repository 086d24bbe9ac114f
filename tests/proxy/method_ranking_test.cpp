// The rule that picks the default proxy method (method_ranking.h) on
// hand-built proxy-eval reports: faults count only against random pruning,
// then the dynamics goal, then logit KL, then accuracy; and the rankings of
// several reports pooled (ranking_merge.h).
#include "proxy/method_ranking.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "formats/json_file.h"
#include "llvm/Support/FormatVariadic.h"

#include "proxy/clustering.h"
#include "proxy/proxy_eval.h"
#include "proxy/ranking_merge.h"
#include "tests/testing/test_util.h"

namespace moerr::proxy {
namespace {

constexpr int64_t kEnd = 10;  // one past both runs' last step

// The original's response to the fault: onset at step 4, a 5x grad spike.
FaultResponse OriginalResponse() {
  FaultResponse r;
  r.onset = 4;
  r.grad_spike = 5;
  r.outcome = FaultResponse::Outcome::kRecovered;
  return r;
}

FaultResponse NoResponse() { return FaultResponse{}; }

FaultResponse Spike(int64_t onset, double grad_spike) {
  FaultResponse r = OriginalResponse();
  r.onset = onset;
  r.grad_spike = grad_spike;
  return r;
}

FaultResponseRow Case(const FaultResponse& proxy, uint64_t seed = kFirstTrainerSeed) {
  FaultResponseRow r;
  r.fault = moe::FaultKind::kNone;
  r.original = OriginalResponse();
  r.proxy = proxy;
  r.comparison = CompareResponse(r.original, r.proxy);
  r.end = kEnd;
  r.seed = seed;
  return r;
}

EvalRow Row(const std::string& method, double keep, double kl, double accuracy,
            std::vector<FaultResponseRow> responses = {}) {
  EvalRow row;
  row.method = method;
  row.keep = keep;
  row.logit_kl = kl;
  row.accuracy = accuracy;
  row.responses = std::move(responses);
  return row;
}

// A report with dynamics runs but a single trainer seed (no dynamics goal),
// so that only faults, KL and accuracy decide.
EvalReport FaultReport(std::vector<EvalRow> rows) {
  EvalReport report;
  report.options.trainer_seeds = 1;
  report.rows = std::move(rows);
  return report;
}

TEST(MethodRankingTest, AFaultRandomReproducesEquallyEarnsNoCredit) {
  // cluster answers the fault exactly as the original does, but so does
  // random: no credit, and reap's lower KL wins.
  const auto ranking = RankMethods(FaultReport({Row("cluster", 0.5, 0.20, 0.9, {Case(Spike(4, 5))}),
                                                Row("reap", 0.5, 0.10, 0.9, {Case(NoResponse())}),
                                                Row("random", 0.5, 0.30, 0.9, {Case(Spike(4, 5))})}));
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  ASSERT_EQ(ranking->groups.size(), 1u);
  const GroupRanking& g = ranking->groups[0];
  EXPECT_TRUE(g.faults_judged);
  EXPECT_FALSE(g.dynamics_judged);
  EXPECT_EQ(g.winner, "reap");
  EXPECT_NE(g.reason.find("logit KL"), std::string::npos) << g.reason;
  for (const MethodScore& s : g.order) EXPECT_EQ(s.fault_score, 0) << s.method;
  EXPECT_NE(ranking->notes.size(), 0u);  // no dynamics goal, said
  bool unforced = false;  // a baseline won: measured unforced, said
  for (const std::string& n : ranking->notes) unforced |= n.find("unforced") != std::string::npos;
  EXPECT_TRUE(unforced);
}

TEST(MethodRankingTest, ReproducingWhereRandomFailsWinsBeforeKl) {
  const auto ranking = RankMethods(FaultReport({Row("reap", 0.5, 0.05, 0.95, {Case(NoResponse())}),
                                                Row("cluster", 0.5, 0.40, 0.50, {Case(Spike(5, 5))}),
                                                Row("random", 0.5, 0.30, 0.9, {Case(NoResponse())})}));
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  const GroupRanking& g = ranking->groups[0];
  EXPECT_EQ(g.winner, "cluster");
  EXPECT_EQ(g.order[0].fault_score, 1);
  EXPECT_EQ(g.order[0].discriminating_cases, 1);
  EXPECT_EQ(g.order[0].response_cases, 1);
  EXPECT_NE(g.reason.find("by faults"), std::string::npos) << g.reason;
  EXPECT_EQ(ranking->winner, "cluster");
}

// Against random alone, the reason quotes random as the baseline it is, not
// as a method with cases of its own.
TEST(MethodRankingTest, RandomAsTheRunnerUpIsQuotedAsTheBaseline) {
  const auto ranking = RankMethods(FaultReport({Row("cluster", 0.5, 0.40, 0.50, {Case(Spike(5, 5))}),
                                                Row("random", 0.5, 0.30, 0.9, {Case(NoResponse())})}));
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  const GroupRanking& g = ranking->groups[0];
  EXPECT_EQ(g.winner, "cluster");
  EXPECT_NE(g.reason.find("1 (1 of 1 response cases) vs random's 0 (the baseline)"), std::string::npos) << g.reason;
}

TEST(MethodRankingTest, ReproducingBetterThanRandomCounts) {
  // Random reproduces too, but 3 steps late (onset) or with a 4x larger
  // spike (magnitude); the method on time and at the original's size counts.
  for (const FaultResponse& random : {Spike(7, 5), Spike(4, 20)}) {
    const auto ranking = RankMethods(FaultReport({Row("reap", 0.5, 0.05, 0.95, {Case(NoResponse())}),
                                                  Row("cluster", 0.5, 0.40, 0.5, {Case(Spike(4, 5))}),
                                                  Row("random", 0.5, 0.30, 0.9, {Case(random)})}));
    ASSERT_TRUE(ranking.ok()) << ranking.status();
    EXPECT_EQ(ranking->groups[0].winner, "cluster");
    EXPECT_EQ(ranking->groups[0].order[0].fault_score, 1);
  }
}

TEST(MethodRankingTest, ReplayedReproductionsCountOnlyAboveRandoms) {
  std::vector<EvalRow> rows = {Row("reap", 0.5, 0.05, 0.9), Row("cluster", 0.5, 0.40, 0.9),
                               Row("random", 0.5, 0.30, 0.9)};
  rows[0].reproduced = 2, rows[1].reproduced = 3, rows[2].reproduced = 2;
  const auto ranking = RankMethods(FaultReport(rows));
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  const GroupRanking& g = ranking->groups[0];
  EXPECT_EQ(g.winner, "cluster");
  EXPECT_EQ(g.order[0].fault_score, 1);  // 3 - 2
  EXPECT_EQ(g.order[1].method, "reap");  // 0 above random, then the lower KL
  EXPECT_EQ(g.order[1].fault_score, 0);
}

TEST(MethodRankingTest, TiesFallToKlThenAccuracy) {
  // Equal faults (both reproduce where random fails): KL decides.
  auto ranking = RankMethods(FaultReport({Row("cluster", 0.5, 0.20, 0.9, {Case(Spike(4, 5))}),
                                          Row("reap", 0.5, 0.10, 0.5, {Case(Spike(4, 5))}),
                                          Row("random", 0.5, 0.30, 0.9, {Case(NoResponse())})}));
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  EXPECT_EQ(ranking->groups[0].winner, "reap");
  EXPECT_NE(ranking->groups[0].reason.find("by logit KL"), std::string::npos) << ranking->groups[0].reason;
  // Equal faults and KL: accuracy decides.
  ranking = RankMethods(FaultReport({Row("cluster", 0.5, 0.10, 0.9, {Case(Spike(4, 5))}),
                                     Row("reap", 0.5, 0.10, 0.5, {Case(Spike(4, 5))}),
                                     Row("random", 0.5, 0.30, 0.9, {Case(NoResponse())})}));
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  EXPECT_EQ(ranking->groups[0].winner, "cluster");
  EXPECT_NE(ranking->groups[0].reason.find("by accuracy"), std::string::npos) << ranking->groups[0].reason;
}

TEST(MethodRankingTest, WithoutARandomRowTheFaultCriterionIsSkippedAndSaid) {
  // cluster reproduces, reap does not, but without random nothing
  // discriminates: KL decides.
  const auto ranking = RankMethods(FaultReport({Row("cluster", 0.5, 0.20, 0.9, {Case(Spike(4, 5))}),
                                                Row("reap", 0.5, 0.10, 0.9, {Case(NoResponse())})}));
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  EXPECT_FALSE(ranking->groups[0].faults_judged);
  EXPECT_EQ(ranking->groups[0].winner, "reap");
  bool said = false;
  for (const std::string& n : ranking->notes) said |= n.find("no random row") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(MethodRankingTest, StaticOnlyRanksByKlAndSaysSo) {
  EvalReport report;
  report.options.static_only = true;
  report.rows = {Row("cluster", 0.5, 0.30, 0.9), Row("reap", 0.5, 0.10, 0.8), Row("random", 0.5, 0.50, 0.9),
                 Row("cluster", 0.25, 0.40, 0.8), Row("reap", 0.25, 0.50, 0.8), Row("random", 0.25, 0.90, 0.7)};
  const auto ranking = RankMethods(report);
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  ASSERT_EQ(ranking->groups.size(), 2u);
  EXPECT_FALSE(ranking->groups[0].faults_judged);
  EXPECT_EQ(ranking->groups[0].winner, "reap");
  EXPECT_EQ(ranking->groups[1].winner, "cluster");
  // One keep each: the lower mean KL decides (reap 0.30, cluster 0.35).
  EXPECT_EQ(ranking->winner, "reap");
  ASSERT_FALSE(ranking->notes.empty());
  EXPECT_NE(ranking->notes[0].find("static only"), std::string::npos);
}

TEST(MethodRankingTest, OverallTieGoesToTheLowerMeanKlAndNamesTheDefault) {
  EvalReport report;
  report.options.static_only = true;
  report.rows = {Row("cluster", 0.5, 0.30, 0.9), Row("reap", 0.5, 0.10, 0.8),
                 Row("cluster", 0.25, 0.40, 0.8), Row("reap", 0.25, 0.90, 0.8)};
  const auto ranking = RankMethods(report);
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  EXPECT_EQ(ranking->winner, "cluster");  // 1 keep each; mean KL 0.35 vs 0.50
  EXPECT_NE(ranking->reason.find("mean logit KL"), std::string::npos) << ranking->reason;
  EXPECT_EQ(ranking->current_default, MethodName(ClusterOptions{}.method));
  const std::vector<std::string> lines = RankingLines(*ranking);
  ASSERT_EQ(lines.size(), 2u + ranking->notes.size() + 1u);
  EXPECT_NE(lines.back().find("it is the current default"), std::string::npos) << lines.back();
}

TEST(MethodRankingTest, AnEarlyResponseIsNotAReproduction) {
  // cluster answers at step 2, before the original's onset at 4: early, so
  // it does not reproduce the fault and earns nothing where random fails.
  // An early random does not reproduce either: reap on time counts.
  const auto ranking = RankMethods(FaultReport({Row("cluster", 0.5, 0.05, 0.9, {Case(Spike(2, 5))}),
                                                Row("reap", 0.5, 0.40, 0.5, {Case(Spike(4, 5))}),
                                                Row("random", 0.5, 0.30, 0.9, {Case(Spike(3, 5))})}));
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  const GroupRanking& g = ranking->groups[0];
  ASSERT_TRUE(Case(Spike(2, 5)).comparison.early);
  EXPECT_EQ(g.winner, "reap");
  EXPECT_EQ(g.order[0].fault_score, 1);
  EXPECT_EQ(g.order[1].method, "cluster");
  EXPECT_EQ(g.order[1].fault_score, 0);
  EXPECT_EQ(g.order[1].response_cases, 1);
  EXPECT_NE(g.reason.find("by faults"), std::string::npos) << g.reason;
}

// A seed band that meets the goal (in band on every step, r_proxy at one
// more seed's), or misses it on the share in band.
SeedBand Band(bool meets) {
  SeedBand b;
  b.in_band = meets ? 1.0 : 0.5;
  b.r_proxy = 0.9;
  b.r_extra_seed = 0.8;
  b.seeds = 3;
  b.steps = 10;
  return b;
}

TEST(MethodRankingTest, TheDynamicsGoalDecidesAfterFaultsBeforeKl) {
  // Equal faults (none, no random responses); cluster meets the goal on
  // reward, KL and grad norm, reap on reward alone: cluster wins despite
  // its higher KL. The loss band is not judged.
  std::vector<EvalRow> rows = {Row("reap", 0.5, 0.05, 0.9), Row("cluster", 0.5, 0.40, 0.5),
                               Row("random", 0.5, 0.30, 0.9)};
  rows[0].seed_band = SeedBands{Band(true), Band(true), Band(false), Band(false)};
  rows[1].seed_band = SeedBands{Band(false), Band(true), Band(true), Band(true)};
  rows[2].seed_band = SeedBands{Band(false), Band(false), Band(false), Band(false)};
  EvalReport report = FaultReport(rows);
  report.options.trainer_seeds = 3;
  const auto ranking = RankMethods(report);
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  const GroupRanking& g = ranking->groups[0];
  EXPECT_TRUE(g.dynamics_judged);
  EXPECT_EQ(g.winner, "cluster");
  EXPECT_EQ(g.order[0].dynamics_goal_met, 3);
  EXPECT_EQ(g.order[1].method, "reap");
  EXPECT_EQ(g.order[1].dynamics_goal_met, 1);
  EXPECT_EQ(g.order[2].dynamics_goal_met, 0);
  EXPECT_NE(g.reason.find("by dynamics goal: 3 of 3 metrics vs reap's 1 of 3"), std::string::npos) << g.reason;
  for (const std::string& n : ranking->notes) EXPECT_EQ(n.find("trainer seeds"), std::string::npos) << n;
}

TEST(MethodRankingTest, JsonNamesResponseCasesAndWritesNanKlAsNull) {
  const auto ranking = RankMethods(FaultReport({Row("cluster", 0.5, std::nan(""), 0.9, {Case(Spike(4, 5))}),
                                                Row("random", 0.5, 0.30, 0.9, {Case(NoResponse())})}));
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  const std::string json = llvm::formatv("{0}", llvm::json::Value(ToJson(*ranking))).str();
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(json);
  EXPECT_TRUE(static_cast<bool>(parsed)) << json;
  if (!parsed) llvm::consumeError(parsed.takeError());
  EXPECT_NE(json.find("\"response_cases\":1"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"fault_cases\""), std::string::npos) << json;
  EXPECT_EQ(json.find("nan"), std::string::npos) << json;
  for (const std::string& n : ranking->notes) EXPECT_EQ(n.find("unforced"), std::string::npos) << n;
}

TEST(MethodRankingTest, AnEmptyReportIsAnError) {
  EXPECT_FALSE(RankMethods(EvalReport{}).ok());
}


// Rankings pooled from several reports (ranking_merge.h).

// A report of `rows` with dynamics over one trainer seed, written as
// proxy-eval writes it (ToJson) to `path`; `options` as the run's, but for
// the trainer seeds.
std::string WriteReport(const std::string& path, std::vector<EvalRow> rows, double original_accuracy = 0.9,
                        EvalOptions options = EvalOptions()) {
  EvalReport report = FaultReport(std::move(rows));
  options.trainer_seeds = report.options.trainer_seeds;
  report.options = std::move(options);
  report.preset = "fine";
  report.family = "qwen2_moe";
  report.experts = 64;
  report.original_accuracy = original_accuracy;
  report.ranking = *RankMethods(report);
  std::ofstream(path) << llvm::formatv("{0:2}", llvm::json::Value(ToJson(report))).str();
  return path;
}

std::vector<RankingPart> ReadParts(const std::vector<std::string>& paths) {
  std::vector<RankingPart> parts;
  for (const std::string& path : paths) {
    absl::StatusOr<RankingPart> part = ReadRankingPart(path);
    EXPECT_TRUE(part.ok()) << part.status();
    if (part.ok()) parts.push_back(*std::move(part));
  }
  return parts;
}

// The rows of one table: random, cluster and reap at two keeps. cluster
// wins 1/2 by KL; reap wins 1/4 by a fault random misses.
std::vector<EvalRow> RandomRows() {
  return {Row("random", 0.5, 0.30, 0.9, {Case(NoResponse())}), Row("random", 0.25, 0.60, 0.7, {Case(NoResponse())})};
}
std::vector<EvalRow> ClusterRows() {
  return {Row("cluster", 0.5, 0.05, 0.9, {Case(NoResponse())}), Row("cluster", 0.25, 0.10, 0.8, {Case(NoResponse())})};
}
std::vector<EvalRow> ReapRows() {
  return {Row("reap", 0.5, 0.07, 0.9, {Case(NoResponse())}), Row("reap", 0.25, 0.30, 0.7, {Case(Spike(4, 5))})};
}

std::vector<EvalRow> Concat(std::vector<std::vector<EvalRow>> parts) {
  std::vector<EvalRow> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(RankingMergeTest, TwoRunsPooledRankAsTheirRowsInOneReport) {
  const formats::testing::TempDir dir;
  const std::vector<RankingPart> parts =
      ReadParts({WriteReport(dir.File("a.json"), Concat({ClusterRows(), RandomRows()})),
                 WriteReport(dir.File("b.json"), Concat({ReapRows(), RandomRows()}))});
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].ranking.winner, "reap");  // alone, each run's own method wins
  const absl::StatusOr<MethodRanking> merged = MergeRankings(parts);
  ASSERT_TRUE(merged.ok()) << merged.status();
  const absl::StatusOr<MethodRanking> whole =
      RankMethods(FaultReport(Concat({ClusterRows(), RandomRows(), ReapRows()})));
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(merged->groups.size(), whole->groups.size());
  for (size_t i = 0; i < whole->groups.size(); ++i) {
    const GroupRanking &m = merged->groups[i], &w = whole->groups[i];
    EXPECT_EQ(m.keep, w.keep);
    EXPECT_EQ(m.winner, w.winner);
    EXPECT_EQ(m.reason, w.reason);
    ASSERT_EQ(m.order.size(), 3u);
    for (size_t j = 0; j < w.order.size(); ++j) {
      EXPECT_EQ(m.order[j].method, w.order[j].method);
      EXPECT_EQ(m.order[j].fault_score, w.order[j].fault_score);
      EXPECT_EQ(m.order[j].logit_kl, w.order[j].logit_kl);  // exact through JSON
    }
  }
  EXPECT_EQ(merged->groups[0].winner, "cluster");
  EXPECT_EQ(merged->groups[1].winner, "reap");
  EXPECT_EQ(merged->winner, whole->winner);
  EXPECT_EQ(merged->reason, whole->reason);
  EXPECT_EQ(merged->winner, "cluster");  // 1 keep each; mean KL 0.075 vs 0.185
  EXPECT_NE(merged->notes.back().find("pooled from 2 reports"), std::string::npos) << merged->notes.back();
  const llvm::json::Object json = MergedRankingJson(parts, *merged);
  EXPECT_EQ(json.getArray("reports")->size(), 2u);
}

TEST(RankingMergeTest, TheRankingReadsBackAsWritten) {
  const auto ranking = RankMethods(FaultReport({Row("cluster", 0.5, std::nan(""), 0.9, {Case(Spike(4, 5))}),
                                                Row("random", 0.5, 0.30, 0.9, {Case(NoResponse())})}));
  ASSERT_TRUE(ranking.ok()) << ranking.status();
  const absl::StatusOr<MethodRanking> back = MethodRankingFromJson(llvm::json::Value(ToJson(*ranking)));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->groups.size(), 1u);
  const MethodScore& s = back->groups[0].order[0];
  ASSERT_EQ(s.method, "cluster");  // by the fault random misses, whatever its KL
  EXPECT_EQ(s.fault_score, 1);
  EXPECT_TRUE(std::isnan(s.logit_kl));
  EXPECT_EQ(back->groups[0].order[1].logit_kl, 0.30);
  EXPECT_EQ(back->winner, ranking->winner);
  EXPECT_EQ(back->notes, ranking->notes);
  const absl::StatusOr<MethodRanking> bad = MethodRankingFromJson(llvm::json::Object{{"groups", "x"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ranking.groups"), std::string::npos) << bad.status();
  // A score without its KL is an error, not a NaN.
  llvm::json::Object missing = ToJson(*ranking);
  missing.getArray("groups")->front().getAsObject()->getArray("order")->front().getAsObject()->erase("logit_kl");
  const absl::Status no_kl = MethodRankingFromJson(llvm::json::Value(std::move(missing))).status();
  EXPECT_NE(no_kl.message().find("missing value at ranking.groups[0].order[0].logit_kl"), std::string::npos) << no_kl;
}

TEST(RankingMergeTest, RunsOfAnotherTableAreRefusedSayingHow) {
  const formats::testing::TempDir dir;
  std::vector<EvalRow> other_random = RandomRows();
  other_random[0].logit_kl = 0.31;  // another sample seed, say
  EvalOptions fault_seeds;
  fault_seeds.seeds = 1;
  const std::string a = WriteReport(dir.File("a.json"), Concat({ClusterRows(), RandomRows()}));
  const std::string b = WriteReport(dir.File("b.json"), Concat({ReapRows(), other_random}));
  const std::string c = WriteReport(dir.File("c.json"), Concat({ReapRows(), RandomRows()}), 0.8);
  const std::string d = WriteReport(dir.File("d.json"), Concat({ReapRows(), RandomRows()}), 0.9, fault_seeds);
  const absl::Status random_differs = MergeRankings(ReadParts({a, b})).status();
  EXPECT_FALSE(random_differs.ok());
  // b's number first, as the message names b first.
  for (const std::string& part : {"random at keep 1/2 is another measurement in " + b + " than in " + a,
                                  std::string("logit KL 0.31 vs 0.3)")}) {
    EXPECT_NE(random_differs.message().find(part), std::string::npos) << random_differs;
  }
  const absl::Status other_model = MergeRankings(ReadParts({a, c})).status();
  EXPECT_NE(other_model.message().find("the original's accuracy"), std::string::npos) << other_model;
  const absl::Status other_seeds = MergeRankings(ReadParts({a, d})).status();
  EXPECT_NE(other_seeds.message().find("--seeds 3 vs 1"), std::string::npos) << other_seeds;
  // The faults are a set: a report that lists them in another order (as
  // one written before they were sorted) pools; another set does not.
  const std::string e = WriteReport(dir.File("e.json"), Concat({ReapRows(), RandomRows()}));
  absl::StatusOr<llvm::json::Value> unsorted = formats::ReadJsonFile(e);
  ASSERT_TRUE(unsorted.ok()) << unsorted.status();
  llvm::json::Object* written = unsorted->getAsObject()->getObject("options");
  llvm::json::Array* listed = written != nullptr ? written->getArray("faults") : nullptr;
  ASSERT_TRUE(listed != nullptr && listed->size() >= 2);
  std::reverse(listed->begin(), listed->end());
  ASSERT_TRUE(formats::WriteJsonFile(e, *unsorted, /*overwrite=*/true).ok());
  const absl::Status same_set = MergeRankings(ReadParts({a, e})).status();
  EXPECT_TRUE(same_set.ok()) << same_set;
  EvalOptions fewer;
  fewer.faults.erase(fewer.faults.begin());
  const std::string f = WriteReport(dir.File("f.json"), Concat({ReapRows(), RandomRows()}), 0.9, fewer);
  const absl::Status other_faults = MergeRankings(ReadParts({a, f})).status();
  EXPECT_NE(other_faults.message().find("they ran with --faults"), std::string::npos) << other_faults;
  // An option one report has and the other lacks differs, whichever comes first.
  std::vector<RankingPart> lacking = ReadParts({a, c});
  lacking[1].original_accuracy = lacking[0].original_accuracy;
  lacking[1].options->erase("seeds");
  EXPECT_NE(MergeRankings(lacking).status().message().find("--seeds 3 vs (not recorded)"), std::string::npos)
      << MergeRankings(lacking).status();
  std::swap(lacking[0], lacking[1]);
  EXPECT_NE(MergeRankings(lacking).status().message().find("--seeds (not recorded) vs 3"), std::string::npos)
      << MergeRankings(lacking).status();
  std::vector<RankingPart> static_one = ReadParts({a, a});
  static_one[1].static_only = true;
  EXPECT_NE(MergeRankings(static_one).status().message().find("with dynamics vs static only"), std::string::npos);
  std::swap(static_one[0], static_one[1]);
  EXPECT_NE(MergeRankings(static_one).status().message().find("static only vs with dynamics"), std::string::npos);
  EXPECT_FALSE(MergeRankings({}).ok());
}

TEST(RankingMergeTest, AReportWithoutOptionsIsPooledAndSaidUnchecked) {
  const formats::testing::TempDir dir;
  std::vector<RankingPart> parts = ReadParts({WriteReport(dir.File("a.json"), Concat({ClusterRows(), RandomRows()})),
                                              WriteReport(dir.File("b.json"), Concat({ReapRows(), RandomRows()}))});
  ASSERT_EQ(parts.size(), 2u);
  ASSERT_TRUE(parts[0].options.has_value());
  parts[0].options.reset();  // as an earlier proxy-eval wrote it
  const absl::StatusOr<MethodRanking> merged = MergeRankings(parts);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_NE(merged->notes.back().find(parts[0].path + ": no run options recorded"), std::string::npos)
      << merged->notes.back();
  // The reports that have options are still checked against each other.
  EvalOptions fault_seeds;
  fault_seeds.seeds = 1;
  std::vector<RankingPart> three = parts;
  three.push_back(ReadParts({WriteReport(dir.File("c.json"), Concat({ReapRows(), RandomRows()}), 0.9, fault_seeds)})
                      .at(0));
  const absl::Status refused = MergeRankings(three).status();
  EXPECT_NE(refused.message().find(parts[1].path + " and " + three[2].path + " are not of one table: they ran with "
                                   "--seeds 3 vs 1"),
            std::string::npos)
      << refused;
}

TEST(RankingMergeTest, AFileThatIsNotAReportIsNamed) {
  const formats::testing::TempDir dir;
  std::ofstream(dir.File("not_json.json")) << "{";
  std::ofstream(dir.File("not_report.json")) << R"({"rows": []})";
  std::ofstream(dir.File("no_ranking.json"))
      << R"({"preset": "fine", "family": "qwen2_moe", "experts": 64, "static_only": true, "original_accuracy": 0.9})";
  for (const std::string name : {"missing.json", "not_json.json", "not_report.json", "no_ranking.json"}) {
    const absl::Status status = ReadRankingPart(dir.File(name)).status();
    EXPECT_FALSE(status.ok()) << name;
    EXPECT_NE(status.message().find(dir.File(name)), std::string::npos) << status;
  }
  EXPECT_NE(ReadRankingPart(dir.File("no_ranking.json")).status().message().find("no ranking"), std::string::npos);
  const absl::Status not_report = ReadRankingPart(dir.File("not_report.json")).status();
  EXPECT_NE(not_report.message().find("missing value at report.preset"), std::string::npos) << not_report;
}

}  // namespace
}  // namespace moerr::proxy
