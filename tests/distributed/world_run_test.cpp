// Recording, inspecting, replaying and bisecting a multi-rank step through
// the `moerr` command, as a user does: `moerr train --ranks N --record`
// starts N real rank processes with real c10d Gloo collectives (tiny model,
// three warm-up steps), then the run directory is read back.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "llvm/Support/JSON.h"
#include "support/seconds_since.h"
#include "tests/tools/moerr_runner.h"

#include <chrono>

namespace moerr::tools::testing {
namespace {

// A fresh run: `moerr train -o DIR/NAME --record MODE ...`; the run directory is DIR/NAME/run.
struct TrainedRun {
  fs::path dir;
  Result train;
  std::string run() const { return (dir / "run").string(); }
};

TrainedRun Train(const std::string& name, const std::string& mode, const std::vector<std::string>& extra) {
  TrainedRun r;
  r.dir = fs::path(::testing::TempDir()) / ("moerr_world_" + name);
  fs::remove_all(r.dir);
  std::vector<std::string> args = {"train",    "--preset", "tiny", "--warmup-steps", "3", "--steps", "1",
                                   "--record", mode,       "-o",   r.dir.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  r.train = Moerr(fs::path(::testing::TempDir()), args);
  return r;
}

llvm::json::Value Json(const Result& r) {
  llvm::Expected<llvm::json::Value> v = llvm::json::parse(r.out);
  if (!v) {
    ADD_FAILURE() << llvm::toString(v.takeError()) << "\n" << r.out << r.err;
    return nullptr;
  }
  return *v;
}

const llvm::json::Object& RankEntry(const llvm::json::Value& inspect, int64_t rank) {
  static const llvm::json::Object kNone;
  const llvm::json::Array* ranks = inspect.getAsObject() ? inspect.getAsObject()->getArray("ranks") : nullptr;
  if (ranks == nullptr || rank >= static_cast<int64_t>(ranks->size())) return kNone;
  return *(*ranks)[static_cast<size_t>(rank)].getAsObject();
}

// Every rank recorded, replays alone bitwise, and received what the others sent.
void ExpectRecordsAndReplays(int64_t ranks, int64_t ep) {
  const TrainedRun r = Train("ok" + std::to_string(ranks) + std::to_string(ep), "replayable",
                             {"--ranks", std::to_string(ranks), "--ep", std::to_string(ep)});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  ASSERT_TRUE(fs::exists(r.run() + "/world.json"));
  const Result inspect = Moerr(r.dir, {"inspect", r.run(), "--json"});
  EXPECT_EQ(inspect.code, 0) << inspect.out << inspect.err;
  const llvm::json::Value world = Json(inspect);
  for (int64_t k = 0; k < ranks; ++k) {
    EXPECT_EQ(RankEntry(world, k).getString("state").getValueOr(""), "finished") << inspect.out;
    EXPECT_GT(RankEntry(world, k).getInteger("collectives").getValueOr(0), 0) << inspect.out;
  }
  const Result one = Moerr(r.dir, {"replay", r.run(), "--rank", std::to_string(ranks - 1)});
  EXPECT_EQ(one.code, 0) << one.out << one.err;
  EXPECT_NE(one.out.find(", 0 differ"), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("c10d::all_to_all"), std::string::npos) << "collectives come from the record: " << one.out;
  const Result all = Moerr(r.dir, {"replay", r.run()});
  EXPECT_EQ(all.code, 0) << all.out << all.err;
  EXPECT_NE(all.out.find("every rank received what was sent"), std::string::npos) << all.out;
  // The same run against itself: rank by rank, no divergence.
  const Result diff = Moerr(r.dir, {"diff", r.run(), r.run(), "--json"});
  EXPECT_EQ(diff.code, 0) << diff.out << diff.err;
  const llvm::json::Value parts = Json(diff);
  ASSERT_TRUE(parts.getAsObject() && parts.getAsObject()->getArray("parts")) << diff.out;
  EXPECT_EQ(parts.getAsObject()->getArray("parts")->size(), static_cast<size_t>(ranks));
  // One finding across ranks: the rows each rank's experts received.
  const Result lint = Moerr(r.dir, {"lint", r.run(), "--only", "rank-imbalance", "--json"});
  const llvm::json::Value findings = Json(lint);
  ASSERT_TRUE(findings.getAsArray() && findings.getAsArray()->size() == 1) << lint.out << lint.err;
  const llvm::json::Array* rows = (*findings.getAsArray())[0].getAsObject()->getObject("numbers")->getArray("rows");
  ASSERT_NE(rows, nullptr) << lint.out;
  EXPECT_EQ(rows->size(), static_cast<size_t>(ranks)) << lint.out;
  // One rank's bundle has no ranks to compare: the check is refused, not silent.
  const Result bundle = Moerr(r.dir, {"lint", r.run() + "/rank0.moerr", "--only", "rank-imbalance"});
  EXPECT_EQ(bundle.code, 2) << bundle.out << bundle.err;
  EXPECT_NE(bundle.err.find("--only rank-imbalance reads a run directory"), std::string::npos) << bundle.err;
}

TEST(WorldRun, TwoRanksRecordAndReplayEachRankBitwise) { ExpectRecordsAndReplays(2, 2); }
TEST(WorldRun, FourRanksInTwoGroupsRecordAndReplayEachRankBitwise) { ExpectRecordsAndReplays(4, 2); }

TEST(WorldRun, CrossRankCheckNamesTheSenderAndReceiverOfACorruptTransfer) {
  const TrainedRun r = Train("corrupt", "stats", {"--ranks", "2", "--ep", "2", "--rank-fault", "corrupt:1"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  const Result verify = Moerr(r.dir, {"verify", r.run(), "--json"});
  EXPECT_EQ(verify.code, 1) << verify.out << verify.err;
  const llvm::json::Value v = Json(verify);
  const llvm::json::Array* checks = v.getAsObject() ? v.getAsObject()->getArray("cross_rank") : nullptr;
  ASSERT_TRUE(checks != nullptr && !checks->empty()) << verify.out;
  const llvm::json::Array* found = (*checks)[0].getAsObject()->getArray("mismatches");
  ASSERT_TRUE(found != nullptr && found->size() == 1) << verify.out;
  const llvm::json::Object& m = *(*found)[0].getAsObject();
  EXPECT_EQ(m.getString("kind").getValueOr(""), "all_to_all");
  EXPECT_EQ(m.getInteger("sender").getValueOr(-1), 0);
  EXPECT_EQ(m.getInteger("receiver").getValueOr(-1), 1);
  EXPECT_GT(m.getInteger("rows").getValueOr(0), 0);
}

TEST(WorldRun, BisectNamesTheRankAndTheExpertOfAOneRankFault) {
  const TrainedRun r =
      Train("bisect", "stats", {"--ranks", "2", "--ep", "2", "--fault", "expert-overflow", "--fault-rank", "1"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  const Result bisect = Moerr(r.dir, {"bisect", r.run(), "--json"});
  EXPECT_EQ(bisect.code, 1) << bisect.out << bisect.err;
  const llvm::json::Value v = Json(bisect);
  const llvm::json::Object* step =
      v.getAsArray() && !v.getAsArray()->empty() ? (*v.getAsArray())[0].getAsObject() : nullptr;
  ASSERT_NE(step, nullptr) << bisect.out;
  EXPECT_EQ(step->getInteger("rank").getValueOr(-1), 1) << bisect.out;
  // The tiny preset has 8 experts: rank 1 of EP 2 hosts 4 to 7.
  const std::string module = step->getObject("cause")->getString("module").getValueOr("").str();
  const size_t at = module.rfind("experts.");
  ASSERT_NE(at, std::string::npos) << bisect.out;
  EXPECT_GE(std::stoi(module.substr(at + 8)), 4) << module;
  const llvm::json::Object* spread = step->getObject("spread");
  ASSERT_NE(spread, nullptr) << bisect.out;
  EXPECT_EQ(spread->getString("kind").getValueOr(""), "all_to_all");
  EXPECT_EQ((*spread->getArray("to"))[0].getAsInteger().getValueOr(-1), 0) << bisect.out;
  // The report of the run: the rank x op strip, and where the overflow began.
  const Result report = Moerr(r.dir, {"report", r.run(), "-o", (r.dir / "run.html").string()});
  EXPECT_EQ(report.code, 0) << report.out << report.err;
  const std::string html = Slurp(r.dir / "run.html");
  EXPECT_NE(html.find("class=\"rank-strip\""), std::string::npos);
  EXPECT_NE(html.find("The overflow began on rank 1"), std::string::npos);
}

// `replay RUN --ranks M --json` of a run: the comparison's object.
llvm::json::Object ReplayOnRanks(const TrainedRun& r, int64_t ranks, int expected_code) {
  const Result replay = Moerr(r.dir, {"replay", r.run(), "--ranks", std::to_string(ranks), "--json"});
  EXPECT_EQ(replay.code, expected_code) << replay.out << replay.err;
  const llvm::json::Value v = Json(replay);
  if (!v.getAsObject()) return {};
  EXPECT_EQ(v.getAsObject()->getInteger("ranks").getValueOr(-1), ranks) << replay.out;
  return *v.getAsObject();
}

// Every expert's ops on the rank hosting it in each world: how many, and how many diverged.
std::pair<int64_t, int64_t> ExpertOps(const llvm::json::Object& replay, int64_t experts) {
  const llvm::json::Array* parts = replay.getArray("parts");
  EXPECT_TRUE(parts != nullptr && static_cast<int64_t>(parts->size()) == experts);
  int64_t ops = 0, diverged = 0;
  for (size_t i = 0; parts != nullptr && i < parts->size(); ++i) {
    const llvm::json::Object& part = *(*parts)[i].getAsObject();
    ops += part.getInteger("ops").getValueOr(0);
    diverged += part.getInteger("diverged").getValueOr(0) + part.getInteger("unmatched").getValueOr(0);
  }
  return {ops, diverged};
}

// The step's world totals, recorded and replayed: equal numbers (to fp32
// rounding: the sums run in another order) or the same non-finite value.
void ExpectSameMetrics(const llvm::json::Object& replay) {
  const llvm::json::Object* metrics = replay.getObject("metrics");
  ASSERT_NE(metrics, nullptr);
  for (const char* name : {"loss", "grad_norm", "reward", "kl"}) {
    const llvm::json::Object* m = metrics->getObject(name);
    ASSERT_NE(m, nullptr) << name;
    const auto a = m->getNumber("recorded"), b = m->getNumber("replayed");
    if (a && b) {
      EXPECT_NEAR(*b, *a, 1e-5 * std::abs(*a) + 1e-7) << name;
    } else {
      EXPECT_EQ(m->getString("recorded").getValueOr("recorded"), m->getString("replayed").getValueOr("replayed"))
          << name;
    }
  }
}

// A step of 4 ranks (one expert-parallel group of 4: rank 1 hosts experts 2
// and 3 of the tiny preset's 8), replayed live on 2 ranks and in one
// process: every expert's ops match the record, the loss is the same, and
// the overflow rank 1's broken expert caused is the same op of the same
// expert, now on the replay rank that stands for rank 1.
TEST(WorldRun, FourRanksReplayOnTwoAndOnOneWithTheFaultOnTheSameExpert) {
  const TrainedRun r =
      Train("fewer", "replayable", {"--ranks", "4", "--ep", "4", "--fault", "expert-overflow", "--fault-rank", "1"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  for (const int64_t ranks : {2, 1}) {
    SCOPED_TRACE("--ranks " + std::to_string(ranks));
    const llvm::json::Object replay = ReplayOnRanks(r, ranks, 0);
    EXPECT_EQ(replay.getInteger("ep_size").getValueOr(-1), ranks);
    const auto [ops, diverged] = ExpertOps(replay, 8);
    EXPECT_GT(ops, 8 * 10);
    EXPECT_EQ(diverged, 0);
    // Each replay rank's dense ops against the ranks it stands for.
    const llvm::json::Array* dense = replay.getArray("dense");
    ASSERT_TRUE(dense != nullptr && static_cast<int64_t>(dense->size()) == ranks);
    for (const llvm::json::Value& d : *dense) {
      EXPECT_GT(d.getAsObject()->getInteger("outputs").getValueOr(0), 500);
      EXPECT_EQ(d.getAsObject()->getInteger("diverged").getValueOr(-1), 0);
    }
    ExpectSameMetrics(replay);
    const llvm::json::Object* overflow = replay.getObject("first_overflow");
    ASSERT_NE(overflow, nullptr);
    EXPECT_TRUE(overflow->getBoolean("reproduced").getValueOr(false));
    const llvm::json::Object* was = overflow->getObject("recorded");
    const llvm::json::Object* now = overflow->getObject("replayed");
    ASSERT_TRUE(was != nullptr && now != nullptr);
    EXPECT_EQ(was->getInteger("rank").getValueOr(-1), 1);
    const int64_t expert = now->getInteger("expert").getValueOr(-1);
    EXPECT_TRUE(expert == 2 || expert == 3) << "rank 1 hosted experts 2 and 3, not " << expert;
    EXPECT_EQ(now->getInteger("rank").getValueOr(-1), 1 / (4 / ranks));
    // The failure verdict rank by rank: the overflow began on rank 1 only.
    const llvm::json::Object* failure = replay.getObject("failure");
    ASSERT_NE(failure, nullptr);
    EXPECT_EQ(failure->getString("kind").getValueOr(""), "overflow");
    ASSERT_EQ(failure->getArray("ranks")->size(), 1u);
    const llvm::json::Object& row = *failure->getArray("ranks")->front().getAsObject();
    EXPECT_EQ(row.getInteger("rank").getValueOr(-1), 1);
    EXPECT_TRUE(row.getBoolean("localised").getValueOr(false));
  }
}

// A healthy 2-rank run replayed in one process agrees and exits 0. Its two
// ranks sum their own rows to equal values (the tokens each holds), which the
// replay's sum over both ranks' rows doubles: no counterpart, not a divergence.
TEST(WorldRun, AHealthyRunReplayedOnOneRankAgrees) {
  // The default warm-up: a trained router, whose two ranks hold equal token counts.
  TrainedRun r;
  r.dir = fs::path(::testing::TempDir()) / "moerr_world_healthy";
  fs::remove_all(r.dir);
  r.train = Moerr(fs::path(::testing::TempDir()), {"train", "--preset", "tiny", "--steps", "1", "--record", "replayable",
                                                    "-o", r.dir.string(), "--ranks", "2", "--ep", "2"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  const llvm::json::Object replay = ReplayOnRanks(r, 1, 0);
  const llvm::json::Array* dense = replay.getArray("dense");
  ASSERT_TRUE(dense != nullptr && dense->size() == 1u);
  EXPECT_EQ(dense->front().getAsObject()->getInteger("diverged").getValueOr(-1), 0);
  ExpectSameMetrics(replay);
}

// The device time of a replay (the ranks' CPU seconds in the step) is
// measured: the same step costs more on 4 ranks than on 1 (each rank holds
// the dense weights and runs their update).
TEST(WorldRun, ReplayOnRanksMeasuresEachRanksStepTime) {
  const TrainedRun r = Train("cost", "replayable", {"--ranks", "4", "--ep", "4"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  double device[2] = {0, 0};
  for (const int64_t ranks : {4, 1}) {
    const llvm::json::Object replay = ReplayOnRanks(r, ranks, 0);
    const llvm::json::Object* cost = replay.getObject("cost");
    ASSERT_NE(cost, nullptr);
    const llvm::json::Array* per_rank = cost->getArray("rank_cpu_seconds");
    ASSERT_TRUE(per_rank != nullptr && static_cast<int64_t>(per_rank->size()) == ranks);
    double sum = 0;
    for (const llvm::json::Value& v : *per_rank) {
      EXPECT_GT(v.getAsNumber().getValueOr(0), 0);
      sum += v.getAsNumber().getValueOr(0);
    }
    device[ranks == 1] = cost->getNumber("device_seconds").getValueOr(0);
    EXPECT_NEAR(device[ranks == 1], sum, 1e-9);
  }
  EXPECT_GT(device[0], device[1]);
}

// A proxy of the 4-rank step with a quarter of the experts on one rank: the
// implicated expert is kept, the proxy trains on the failing rank's batch,
// and its replay and bisect name the original's expert and rank 1.
TEST(WorldRun, AProxyOnOneRankReproducesAOneRankFaultAndNamesItsRank) {
  const TrainedRun r =
      Train("proxy", "replayable", {"--ranks", "4", "--ep", "4", "--fault", "expert-overflow", "--fault-rank", "1"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  const std::string proxy = (r.dir / "proxy").string();
  const Result made = Moerr(r.dir, {"proxy", r.run(), "--keep", "1/4", "--ranks", "1", "-o", proxy});
  ASSERT_EQ(made.code, 0) << made.out << made.err;
  EXPECT_NE(made.out.find("it trains on the batch of original rank(s) 1"), std::string::npos) << made.out;
  llvm::Expected<llvm::json::Value> clusters = llvm::json::parse(Slurp(fs::path(proxy) / "clusters.json"));
  ASSERT_TRUE(static_cast<bool>(clusters)) << llvm::toString(clusters.takeError());
  const llvm::json::Object& info = *clusters->getAsObject();
  const llvm::json::Object* failure = info.getObject("failure");
  ASSERT_NE(failure, nullptr);
  EXPECT_EQ(failure->getInteger("rank").getValueOr(-1), 1);
  const int64_t failed = failure->getInteger("expert").getValueOr(-1),
                layer = failure->getInteger("layer").getValueOr(-1);
  EXPECT_TRUE(failed == 2 || failed == 3) << "rank 1 hosts experts 2 and 3";
  bool kept = false;  // the placement keeps the implicated expert
  for (const llvm::json::Value& l : *info.getArray("placement")->front().getAsObject()->getArray("layers")) {
    if (l.getAsObject()->getInteger("layer") != layer) continue;
    for (const llvm::json::Value& e : *l.getAsObject()->getArray("original_experts"))
      kept |= e.getAsInteger() == failed;
  }
  EXPECT_TRUE(kept) << made.out;

  const Result replay = Moerr(r.dir, {"replay", proxy, "--json"});
  EXPECT_EQ(replay.code, 1) << replay.out << replay.err;  // the proxy overflows: a finding
  const llvm::json::Value v = Json(replay);
  const llvm::json::Object* overflow = v.getAsObject() ? v.getAsObject()->getObject("first_overflow") : nullptr;
  ASSERT_NE(overflow, nullptr) << replay.out;
  EXPECT_TRUE(overflow->getBoolean("reproduced").getValueOr(false)) << replay.out;
  EXPECT_EQ(overflow->getObject("replayed")->getInteger("original_rank").getValueOr(-1), 1) << replay.out;
  EXPECT_EQ(overflow->getObject("replayed")->getInteger("original_expert").getValueOr(-1), failed) << replay.out;
  const llvm::json::Object* verdict = v.getAsObject()->getObject("failure");
  ASSERT_NE(verdict, nullptr) << replay.out;
  EXPECT_TRUE(verdict->getBoolean("localised").getValueOr(false)) << replay.out;
  const llvm::json::Object* shown = verdict->getArray("ranks")->front().getAsObject()->getObject("shown");
  ASSERT_NE(shown, nullptr) << replay.out;
  EXPECT_EQ(shown->getInteger("original_rank").getValueOr(-1), 1) << replay.out;
  EXPECT_EQ(shown->getInteger("original_expert").getValueOr(-1), failed) << replay.out;

  const Result bisect = Moerr(r.dir, {"bisect", proxy, "--json"});
  EXPECT_EQ(bisect.code, 1) << bisect.out << bisect.err;
  const llvm::json::Value b = Json(bisect);
  const llvm::json::Object* step =
      b.getAsArray() && !b.getAsArray()->empty() ? (*b.getAsArray())[0].getAsObject() : nullptr;
  ASSERT_NE(step, nullptr) << bisect.out;
  EXPECT_EQ(step->getInteger("proxy_rank").getValueOr(-1), 0);
  EXPECT_EQ(step->getInteger("original_rank").getValueOr(-1), 1);
  EXPECT_EQ(step->getInteger("original_expert").getValueOr(-1), failed);
}

// Two expert-parallel groups of 2 (experts are replicated across them) with
// the fault on rank 3: replayed on 2 ranks (each a whole group), and a proxy
// whose verdict names rank 3, not its replica in the first group.
TEST(WorldRun, ReplicatedExpertsReplayOnFewerRanksAndTheProxyNamesTheFailingRank) {
  const TrainedRun r =
      Train("replicas", "replayable", {"--ranks", "4", "--ep", "2", "--fault", "expert-overflow", "--fault-rank", "3"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  const llvm::json::Object replay = ReplayOnRanks(r, 2, 0);
  EXPECT_EQ(replay.getInteger("ep_size").getValueOr(-1), 1);
  ExpectSameMetrics(replay);
  EXPECT_TRUE(replay.getObject("first_overflow")->getBoolean("reproduced").getValueOr(false));
  const std::string proxy = (r.dir / "proxy").string();
  const Result made = Moerr(r.dir, {"proxy", r.run(), "--keep", "1/2", "--ranks", "2", "-o", proxy});
  ASSERT_EQ(made.code, 0) << made.out << made.err;
  EXPECT_NE(made.out.find("it trains on the batch of original rank(s) 2, 3"), std::string::npos) << made.out;
  const Result run = Moerr(r.dir, {"replay", proxy, "--json"});
  EXPECT_EQ(run.code, 1) << run.out << run.err;
  const llvm::json::Value v = Json(run);
  const llvm::json::Object* overflow = v.getAsObject() ? v.getAsObject()->getObject("first_overflow") : nullptr;
  ASSERT_NE(overflow, nullptr) << run.out;
  EXPECT_TRUE(overflow->getBoolean("reproduced").getValueOr(false)) << run.out;
  EXPECT_EQ(overflow->getObject("replayed")->getInteger("original_rank").getValueOr(-1), 3) << run.out;
  EXPECT_GE(overflow->getObject("replayed")->getInteger("original_expert").getValueOr(-1), 4) << run.out;
}

// The failure verdict of `replay --json` (rank by rank), checked present.
llvm::json::Object FailureOf(const llvm::json::Value& replay) {
  const llvm::json::Object* f = replay.getAsObject() ? replay.getAsObject()->getObject("failure") : nullptr;
  EXPECT_NE(f, nullptr);
  return f ? *f : llvm::json::Object{};
}

// The row of original rank `rank` in a failure verdict.
const llvm::json::Object* RowOf(const llvm::json::Object& failure, int64_t rank) {
  const llvm::json::Array* rows = failure.getArray("ranks");
  for (size_t i = 0; rows != nullptr && i < rows->size(); ++i) {
    const llvm::json::Object* row = (*rows)[i].getAsObject();
    if (row != nullptr && row->getInteger("rank") == rank) return row;
  }
  return nullptr;
}

// A fault that leaves no overflow (the update skipped on every rank): the
// check that names it (optimizer-hazards) warns on each of the 4 recorded
// ranks, and on the replay rank standing for each of them on 2 ranks; a
// proxy on one rank shows it for the rank whose shard it trains on.
TEST(WorldRun, AFaultWithoutAnOverflowReproducesOnFewerRanksRankByRank) {
  const TrainedRun r = Train("skip", "replayable", {"--ranks", "4", "--ep", "4", "--fault", "skip-update"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  const Result replay = Moerr(r.dir, {"replay", r.run(), "--ranks", "2", "--json"});
  EXPECT_EQ(replay.code, 0) << replay.out << replay.err;
  const llvm::json::Object failure = FailureOf(Json(replay));
  EXPECT_EQ(failure.getString("kind").getValueOr(""), "optimizer-hazards") << replay.out;
  for (int64_t rank = 0; rank < 4; ++rank) {
    const llvm::json::Object* row = RowOf(failure, rank);
    ASSERT_NE(row, nullptr) << "rank " << rank << ": " << replay.out;
    EXPECT_TRUE(row->getBoolean("reproduced").getValueOr(false)) << replay.out;
    EXPECT_TRUE(row->getBoolean("localised").getValueOr(false)) << replay.out;
    EXPECT_EQ((*row->getArray("looked_at"))[0].getAsInteger().getValueOr(-1), rank / 2) << replay.out;
    EXPECT_EQ(row->getObject("shown")->getInteger("rank").getValueOr(-1), rank / 2) << replay.out;
    // The fault's own warning, not another of the check's (Adam's eps, a
    // loss-scaler skip): only it reproduces skip-update.
    EXPECT_EQ(row->getString("rule").getValueOr(""), "lost-update") << replay.out;
  }
  EXPECT_TRUE(failure.getBoolean("reproduced").getValueOr(false)) << replay.out;

  const std::string proxy = (r.dir / "proxy").string();
  const Result made = Moerr(r.dir, {"proxy", r.run(), "--keep", "1/4", "--ranks", "1", "-o", proxy});
  ASSERT_EQ(made.code, 0) << made.out << made.err;
  const Result run = Moerr(r.dir, {"replay", proxy, "--json"});
  EXPECT_EQ(run.code, 1) << run.out << run.err;  // the proxy shows the failure: a finding
  const llvm::json::Object shown = FailureOf(Json(run));
  EXPECT_EQ(shown.getInteger("judged").getValueOr(-1), 1) << run.out;  // rank 0's shard only
  EXPECT_TRUE(shown.getBoolean("reproduced").getValueOr(false)) << run.out;
  EXPECT_TRUE(shown.getBoolean("localised").getValueOr(false)) << run.out;
}

// A router collapsed on rank 1 alone: a proxy on one rank with half the
// experts trains on rank 1's shard with rank 1's router and shows the
// collapse in the layer rank 1 showed it, named as rank 1's; with a quarter
// (2 experts, both chosen by every token at top-2) no load can be
// imbalanced, and the verdict says the failure is not reproduced.
TEST(WorldRun, AOneRankRouterCollapseIsNamedOnItsRankOrReportedLost) {
  const TrainedRun r = Train("collapse", "replayable",
                             {"--ranks", "4", "--ep", "4", "--fault", "router-collapse", "--fault-rank", "1"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  // Every rank warns of load; rank 1 alone is judged, and its busiest
  // expert's share passes every healthy rank's.
  const Result replay = Moerr(r.dir, {"replay", r.run(), "--ranks", "2", "--json"});
  EXPECT_NE(replay.code, 2) << replay.out << replay.err;  // 1: the collapsed router's dense ops diverge
  const llvm::json::Object judged = FailureOf(Json(replay));
  const llvm::json::Array* rows = judged.getArray("ranks");
  ASSERT_TRUE(rows != nullptr && rows->size() == 1) << replay.out;
  EXPECT_NE(RowOf(judged, 1), nullptr) << replay.out;
  const double healthy = judged.getNumber("healthy_measure").getValueOr(1);
  EXPECT_GT(RowOf(judged, 1)->getNumber("measure").getValueOr(0), healthy) << replay.out;
  EXPECT_TRUE(RowOf(judged, 1)->getBoolean("discriminating").getValueOr(false)) << replay.out;
  EXPECT_TRUE(judged.getBoolean("reproduced").getValueOr(false)) << replay.out;
  for (const char* keep : {"1/2", "1/4"}) {
    SCOPED_TRACE(std::string("--keep ") + keep);
    const std::string proxy = (r.dir / (std::string("proxy") + keep[2])).string();
    const Result made = Moerr(r.dir, {"proxy", r.run(), "--keep", keep, "--ranks", "1", "-o", proxy});
    ASSERT_EQ(made.code, 0) << made.out << made.err;
    EXPECT_NE(made.out.find("it trains on the batch of original rank(s) 1"), std::string::npos) << made.out;
    const Result run = Moerr(r.dir, {"replay", proxy, "--json"});
    EXPECT_EQ(run.code, 1) << run.out << run.err;
    const llvm::json::Object failure = FailureOf(Json(run));
    EXPECT_EQ(failure.getString("kind").getValueOr(""), "load-imbalance") << run.out;
    EXPECT_EQ(failure.getInteger("judged").getValueOr(-1), 1) << run.out;
    const llvm::json::Object* row = RowOf(failure, 1);
    ASSERT_NE(row, nullptr) << run.out;
    const bool half = std::string(keep) == "1/2";
    EXPECT_EQ(row->getBoolean("reproduced").getValueOr(!half), half) << run.out;
    EXPECT_EQ(failure.getBoolean("reproduced").getValueOr(!half), half) << run.out;
    if (half) EXPECT_TRUE(row->getBoolean("localised").getValueOr(false)) << run.out;
    if (half) EXPECT_GT(row->getObject("shown")->getNumber("measure").getValueOr(0), healthy) << run.out;
  }
}

// bad-kernel on rank 1 alone: every rank runs the naive fp16 softmax, and
// rank 1's logits alone were raised past its range (tiny's three warm-up
// steps leave them below ln(65504)), so only rank 1's step warns of its exp
// (exp-range) and only rank 1 is judged. A proxy on one rank trains on rank
// 1's shard with its dense state and shows the exp in the same module.
TEST(WorldRun, AOneRankBadKernelWarnsOnItsRankAndReproducesInAProxy) {
  const TrainedRun r =
      Train("badkernel", "replayable", {"--ranks", "4", "--ep", "4", "--fault", "bad-kernel", "--fault-rank", "1"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  const Result lint = Moerr(r.dir, {"lint", r.run(), "--only", "hazardous-patterns", "--json"});
  const llvm::json::Value findings = Json(lint);
  ASSERT_NE(findings.getAsArray(), nullptr) << lint.out << lint.err;
  std::vector<int64_t> exp_ranks;
  for (const llvm::json::Value& f : *findings.getAsArray()) {
    const llvm::json::Object& o = *f.getAsObject();
    if (o.getString("op").getValueOr("") == "aten::exp" && o.getString("where").getValueOr("") == "lm_head.log_softmax") {
      exp_ranks.push_back(o.getInteger("rank").getValueOr(-1));
    }
  }
  EXPECT_EQ(exp_ranks, std::vector<int64_t>{1}) << lint.out;

  const std::string proxy = (r.dir / "proxy").string();
  const Result made = Moerr(r.dir, {"proxy", r.run(), "--keep", "1/4", "--ranks", "1", "-o", proxy});
  ASSERT_EQ(made.code, 0) << made.out << made.err;
  EXPECT_NE(made.out.find("it trains on the batch of original rank(s) 1"), std::string::npos) << made.out;
  const Result run = Moerr(r.dir, {"replay", proxy, "--json"});
  EXPECT_EQ(run.code, 1) << run.out << run.err;
  const llvm::json::Object failure = FailureOf(Json(run));
  EXPECT_EQ(failure.getString("kind").getValueOr(""), "hazardous-patterns") << run.out;
  EXPECT_EQ(failure.getInteger("judged").getValueOr(-1), 1) << run.out;
  const llvm::json::Object* row = RowOf(failure, 1);
  ASSERT_NE(row, nullptr) << run.out;
  EXPECT_EQ(row->getString("rule").getValueOr(""), "exp-range") << run.out;
  EXPECT_TRUE(row->getBoolean("discriminating").getValueOr(false)) << run.out;
  EXPECT_TRUE(row->getBoolean("reproduced").getValueOr(false)) << run.out;
  EXPECT_TRUE(row->getBoolean("localised").getValueOr(false)) << run.out;
}

// `proxy-eval --ranks 2 --rounds 2 --json FILE` of one fault at 1/2: its rows.
llvm::json::Array RankCost(const std::string& name, const std::string& preset) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("moerr_rank_cost_" + name);
  fs::remove_all(dir);
  const std::string json = (dir.string() + ".json");
  const Result r = Moerr(fs::path(::testing::TempDir()),
                         {"proxy-eval", "--ranks", "2", "--preset", preset, "--warmup-steps", "3", "--faults",
                          "skip-update", "--keep", "1/2", "--rounds", "2", "-o", dir.string(), "--json", json});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  // Each replay runs twice, the original's and the proxy's interleaved.
  EXPECT_NE(r.err.find("the original's replay, round 2 of 2"), std::string::npos) << r.err;
  EXPECT_LT(r.err.find("the original's replay, round 1 of 2"), r.err.find("the proxy at 1/2, round 1 of 2")) << r.err;
  EXPECT_LT(r.err.find("the proxy at 1/2, round 1 of 2"), r.err.find("the original's replay, round 2 of 2")) << r.err;
  EXPECT_NE(r.out.find("Projection (computed, not measured)"), std::string::npos) << r.out;
  llvm::Expected<llvm::json::Value> v = llvm::json::parse(Slurp(json));
  if (!v) {
    ADD_FAILURE() << llvm::toString(v.takeError());
    return {};
  }
  const llvm::json::Array* rows = v->getAsObject() ? v->getAsObject()->getArray("rows") : nullptr;
  EXPECT_TRUE(rows != nullptr && rows->size() == 2) << r.out;
  return rows ? *rows : llvm::json::Array{};
}

// The cost columns come from the replays' measurements: the same fault on a
// larger model (small: 4 layers of width 96 and 32 experts, against tiny's 2
// of width 32 and 8) costs more device time per step, on the original's 2
// ranks and on the proxy's 1; the ratio is the two measured device times'.
TEST(WorldRun, ProxyEvalOnRanksMeasuresTheCostOfTheWorkload) {
  // A proxy on a fraction of a rank is refused before anything runs.
  const Result refused = Moerr(fs::path(::testing::TempDir()),
                               {"proxy-eval", "--ranks", "4", "--keep", "1/8", "-o",
                                (fs::path(::testing::TempDir()) / "moerr_rank_cost_refused").string()});
  EXPECT_EQ(refused.code, 2) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("--keep 1/8 is not 1/K with K dividing the ranks"), std::string::npos) << refused.err;
  // An option --ranks does not use is refused by name.
  const Result unused = Moerr(fs::path(::testing::TempDir()),
                              {"proxy-eval", "--ranks", "2", "--family", "mixtral", "-o",
                               (fs::path(::testing::TempDir()) / "moerr_rank_cost_unused").string()});
  EXPECT_EQ(unused.code, 2) << unused.out << unused.err;
  EXPECT_NE(unused.err.find("does not use --family"), std::string::npos) << unused.err;
  // A child past --child-timeout is stopped and reported, and the table and
  // --json still come out with the fault's error.
  const fs::path slow = fs::path(::testing::TempDir()) / "moerr_rank_cost_slow";
  fs::remove_all(slow);
  const Result stopped =
      Moerr(fs::path(::testing::TempDir()), {"proxy-eval", "--ranks", "2", "--preset", "tiny", "--faults", "skip-update",
                                             "--keep", "1/2", "--child-timeout", "1", "-o", slow.string(), "--json",
                                             slow.string() + ".json"});
  EXPECT_NE(stopped.code, 0) << stopped.out << stopped.err;
  EXPECT_NE(stopped.err.find("skip-update: moerr train"), std::string::npos) << stopped.err;
  EXPECT_NE(stopped.err.find("train.err"), std::string::npos) << stopped.err;
  llvm::Expected<llvm::json::Value> partial = llvm::json::parse(Slurp(slow.string() + ".json"));
  ASSERT_TRUE(bool(partial)) << llvm::toString(partial.takeError());
  EXPECT_EQ(partial->getAsObject()->getArray("errors")->size(), 1u) << stopped.err;
  const llvm::json::Array tiny = RankCost("tiny", "tiny"), small = RankCost("small", "small");
  ASSERT_TRUE(tiny.size() == 2 && small.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const llvm::json::Object &a = *tiny[i].getAsObject(), &b = *small[i].getAsObject();
    EXPECT_EQ(a.getInteger("ranks").getValueOr(-1), i == 0 ? 2 : 1);
    EXPECT_GT(a.getNumber("device_seconds").getValueOr(0), 0);
    EXPECT_GT(b.getNumber("device_seconds").getValueOr(0), 1.5 * a.getNumber("device_seconds").getValueOr(0));
    EXPECT_TRUE(b.getBoolean("reproduced").getValueOr(false));
  }
  for (const llvm::json::Array* rows : {&tiny, &small}) {
    const double original = (*rows)[0].getAsObject()->getNumber("device_seconds").getValueOr(0);
    const double proxy = (*rows)[1].getAsObject()->getNumber("device_seconds").getValueOr(1);
    EXPECT_NEAR((*rows)[1].getAsObject()->getNumber("lower_by").getValueOr(0), original / proxy, 1e-9);
  }
}

TEST(WorldRun, ReplayOnRanksRefusesWhatItCannotDo) {
  const TrainedRun r = Train("fewer_stats", "stats", {"--ranks", "2", "--ep", "2"});
  ASSERT_EQ(r.train.code, 0) << r.train.out << r.train.err;
  const Result three = Moerr(r.dir, {"replay", r.run(), "--ranks", "3"});
  EXPECT_EQ(three.code, 2) << three.out << three.err;
  EXPECT_NE(three.err.find("--ranks 3 must divide the run's 2 ranks"), std::string::npos) << three.err;
  const Result stats = Moerr(r.dir, {"replay", r.run(), "--ranks", "1"});
  EXPECT_EQ(stats.code, 2) << stats.out << stats.err;
  EXPECT_NE(stats.err.find("replayable or full"), std::string::npos) << stats.err;
  const Result bundle = Moerr(r.dir, {"replay", r.run() + "/rank0.moerr", "--ranks", "1"});
  EXPECT_EQ(bundle.code, 2) << bundle.out << bundle.err;
  EXPECT_NE(bundle.err.find("not one"), std::string::npos) << bundle.err;
}

TEST(WorldRun, AKilledRankIsNamedAndItsBundleSalvaged) {
  const TrainedRun r =
      Train("kill", "stats", {"--ranks", "2", "--ep", "2", "--rank-fault", "kill:1@4", "--collective-timeout", "3"});
  EXPECT_EQ(r.train.code, 3) << r.train.out << r.train.err;
  EXPECT_TRUE(fs::exists(r.run() + "/rank1.moerr.partial"));
  const Result inspect = Moerr(r.dir, {"inspect", r.run(), "--json"});
  EXPECT_EQ(inspect.code, 1) << inspect.out << inspect.err;
  const llvm::json::Value world = Json(inspect);
  const llvm::json::Object& dead = RankEntry(world, 1);
  EXPECT_EQ(dead.getString("state").getValueOr(""), "died") << inspect.out;
  EXPECT_EQ(dead.getBoolean("partial").getValueOr(false), true) << inspect.out;
  // Its ops up to the collective it died at reached the file: 4 collectives
  // after the rollout, and the ops after the last of them.
  EXPECT_EQ(dead.getInteger("collectives").getValueOr(-1), 4) << inspect.out;
  EXPECT_EQ(dead.getString("last_op").getValueOr("").find("c10d::"), llvm::StringRef::npos) << inspect.out;
  const llvm::json::Object& survivor = RankEntry(world, 0);
  EXPECT_EQ(survivor.getString("state").getValueOr(""), "waited") << inspect.out;
  EXPECT_NE(survivor.getString("waited_in").getValueOr("").find(" #"), llvm::StringRef::npos) << inspect.out;
  const Result text = Moerr(r.dir, {"inspect", r.run()});
  EXPECT_NE(text.out.find("rank 1 died after op"), std::string::npos) << text.out;
  const Result salvage = Moerr(r.dir, {"salvage", r.run()});
  EXPECT_EQ(salvage.code, 0) << salvage.out << salvage.err;
  EXPECT_TRUE(fs::exists(r.run() + "/rank1.moerr")) << salvage.out;
  EXPECT_EQ(Moerr(r.dir, {"verify", r.run() + "/rank1.moerr"}).code, 0);
}

// trigger=anomaly on every rank, rank 1's expert overflowing and rank 1
// killed inside that step: its ring (rank1.moerr.ring) holds the step up to
// the collective it died at, inspect reads it with the rank's bundle, and
// bisect names the expert; the survivor, stopped inside the step by the
// failed collective, kept its ring in its bundle.
TEST(WorldRun, AKilledRanksAnomalyRingIsRecoveredAndShown) {
  const TrainedRun r = Train("ring", "stats",
                             {"--ranks", "2", "--ep", "2", "--fault", "expert-overflow", "--fault-rank", "1", "--trigger",
                              "anomaly:2", "--rank-fault", "kill:1@4", "--collective-timeout", "3"});
  EXPECT_EQ(r.train.code, 3) << r.train.out << r.train.err;
  ASSERT_TRUE(fs::exists(r.run() + "/rank1.moerr.ring")) << r.train.out << r.train.err;
  const Result inspect = Moerr(r.dir, {"inspect", r.run(), "--json"});
  EXPECT_EQ(inspect.code, 1) << inspect.out << inspect.err;
  const llvm::json::Value world = Json(inspect);
  const llvm::json::Object& dead = RankEntry(world, 1);
  EXPECT_EQ(dead.getString("state").getValueOr(""), "died") << inspect.out;
  EXPECT_NE(dead.getString("detail").getValueOr("").find("its anomaly ring kept step 0"), llvm::StringRef::npos)
      << inspect.out;
  EXPECT_EQ(dead.getInteger("collectives").getValueOr(-1), 4) << inspect.out;  // up to where it died
  EXPECT_GT(dead.getInteger("ops").getValueOr(0), 100) << inspect.out;
  EXPECT_EQ(RankEntry(world, 0).getString("state").getValueOr(""), "waited") << inspect.out;
  EXPECT_FALSE(fs::exists(r.run() + "/rank0.moerr.ring"));  // kept in its bundle, not left beside it
  const Result salvage = Moerr(r.dir, {"salvage", r.run()});
  EXPECT_EQ(salvage.code, 0) << salvage.out << salvage.err;
  EXPECT_NE(salvage.out.find("step 0: cut off inside the step"), std::string::npos) << salvage.out;
  const Result bisect = Moerr(r.dir, {"bisect", r.run() + "/rank1.moerr", "--step", "0"});
  EXPECT_EQ(bisect.code, 1) << bisect.out << bisect.err;
  EXPECT_NE(bisect.out.find("overflow caused by op"), std::string::npos) << bisect.out;
  EXPECT_NE(bisect.out.find("model.layers.0.mlp.experts."), std::string::npos) << bisect.out;
}

TEST(WorldRun, AStalledRankIsReportedWithoutHanging) {
  const auto start = std::chrono::steady_clock::now();
  const TrainedRun r =
      Train("stall", "stats", {"--ranks", "2", "--ep", "2", "--rank-fault", "stall:0@2", "--collective-timeout", "3"});
  EXPECT_LT(moerr::SecondsSince(start), 60);
  EXPECT_EQ(r.train.code, 3) << r.train.out << r.train.err;
  const Result inspect = Moerr(r.dir, {"inspect", r.run()});
  EXPECT_EQ(inspect.code, 1) << inspect.out << inspect.err;
  EXPECT_NE(inspect.out.find("rank 1 waited in"), std::string::npos) << inspect.out;
}

}  // namespace
}  // namespace moerr::tools::testing
