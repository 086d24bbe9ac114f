// The cause walk across ranks on a synthetic three-rank step (no bundle, so
// only fingerprints: the "whole inputs" evidence of cross_rank_walk.h).
// Rank 2's linear makes values of abs-max 1e30 and sends rows [0, 2) of them
// to rank 0 in an all_to_all; rank 0's layer_norm on what it received is not
// finite. Rank 2 itself never overflows, so no rank-level order can name it.
#include "analysis/cross_rank_walk.h"

#include <gtest/gtest.h>

#include "analysis/world_overflow.h"
#include "formats/collective_op.h"

namespace moerr::analysis {
namespace {

constexpr double kLarge = 1e30;

formats::TensorMeta Value(uint64_t id, int64_t producer, double abs_max, uint64_t nan = 0) {
  formats::TensorMeta t;
  t.id = id;
  t.shape = {4, 2};
  t.producer = producer;
  t.fingerprint.numel = 8;
  t.fingerprint.abs_max = abs_max;
  t.fingerprint.nan = nan;
  return t;
}

formats::OpEvent Op(uint64_t seq, const std::string& name, std::vector<int64_t> inputs, uint64_t output) {
  formats::OpEvent op;
  op.seq = seq;
  op.name = name;
  op.module = "moe";
  for (int64_t id : inputs) {
    formats::OpArg a;
    a.kind = formats::OpArg::Kind::kTensor;
    a.i = id;
    op.args.push_back(a);
  }
  op.outputs = {output};
  return op;
}

// An all_to_all of `rank` in a group of three: it sends tensor `sent` by
// `send_rows` and receives tensor `got` by `recv_rows`.
formats::OpEvent AllToAll(uint64_t seq, int64_t rank, uint64_t sent, uint64_t got, std::vector<int64_t> send_rows,
                          std::vector<int64_t> recv_rows, const std::string& kind = "all_to_all", int64_t root = -1) {
  formats::CollectiveOp c;
  c.kind = kind;
  c.group = "world";
  c.group_rank = rank;
  c.group_size = 3;
  c.root = root;
  c.send_rows = std::move(send_rows);
  c.recv_rows = std::move(recv_rows);
  c.inputs = {sent};
  formats::OpEvent op;
  op.seq = seq;
  op.module = "moe";
  formats::ToOpEvent(c, op);
  op.outputs = {got};
  return op;
}

// Every rank: relu of a step input (1, abs-max 1) into 10. Rank 2: a linear
// of 10 and a weight into 3 (abs-max 1e30), sent. Rank 0: the received 11
// (1e30) normalised into 12 (not finite). `rank1_sent`: the abs-max of what
// rank 1 sends (its rows to rank 0 are small whatever it is: the walk sees
// only its whole input). `kind`/`root`: the collective's.
formats::WorldStep Step(double rank1_sent, const std::string& kind = "all_to_all", int64_t root = -1) {
  formats::WorldStep world;
  world.step = 0;
  world.manifest.world_size = 3;
  world.manifest.groups["world"] = {{0, 1, 2}};
  const bool rows = kind == "all_to_all";
  for (int64_t r = 0; r < 3; ++r) {
    formats::RankStep rank;
    rank.rank = r;
    formats::Trace t;
    t.tensors = {Value(1, -1, 1), Value(10, 0, 1)};
    t.ops = {Op(0, "aten::relu", {1}, 10)};
    if (r == 0) {
      t.tensors.push_back(Value(11, 1, kLarge));
      t.tensors.push_back(Value(12, 2, 0, /*nan=*/8));
      t.ops.push_back(AllToAll(1, 0, 10, 11, rows ? std::vector<int64_t>{0, 2, 2} : std::vector<int64_t>{},
                               rows ? std::vector<int64_t>{0, 2, 2} : std::vector<int64_t>{}, kind, root));
      t.ops.push_back(Op(2, "aten::layer_norm", {11}, 12));
    } else if (r == 1) {
      t.tensors.back().fingerprint.abs_max = rank1_sent;
      t.tensors.push_back(Value(11, 1, 1));
      t.ops.push_back(AllToAll(1, 1, 10, 11, rows ? std::vector<int64_t>{2, 0, 2} : std::vector<int64_t>{},
                               rows ? std::vector<int64_t>{2, 0, 2} : std::vector<int64_t>{}, kind, root));
    } else {
      t.tensors.push_back(Value(2, -1, 1));
      t.tensors.push_back(Value(3, 1, kLarge));
      t.tensors.push_back(Value(11, 2, 1));
      t.ops.push_back(Op(1, "aten::linear", {10, 2}, 3));
      t.ops.back().module = "moe.experts.5";
      t.ops.push_back(AllToAll(2, 2, 3, 11, rows ? std::vector<int64_t>{2, 2, 0} : std::vector<int64_t>{},
                               rows ? std::vector<int64_t>{2, 2, 0} : std::vector<int64_t>{}, kind, root));
    }
    t.Index();
    rank.trace = std::move(t);
    world.ranks.push_back(std::move(rank));
  }
  return world;
}

TEST(CrossRankWalk, NamesTheSenderRowsAndTheOpThatMadeThem) {
  const formats::WorldStep world = Step(/*rank1_sent=*/1);
  const std::optional<WorldOverflow> found = FindWorldOverflow(world);
  ASSERT_TRUE(found.has_value());
  ASSERT_EQ(found->ranks.size(), 1u);  // only rank 0 overflows
  EXPECT_TRUE(found->ranks[0].received);
  EXPECT_EQ(found->rank, 2);
  EXPECT_TRUE(found->cause.found_explosion);
  EXPECT_EQ(found->cause.cause.op->name, "aten::linear");
  const CrossRankPath& path = found->path;
  ASSERT_EQ(path.walks.size(), 2u);
  ASSERT_EQ(path.crossings.size(), 1u);
  EXPECT_FALSE(path.stopped);
  const Crossing& x = path.crossings[0];
  EXPECT_EQ(x.evidence, "whole inputs");
  EXPECT_FALSE(x.ambiguous);
  ASSERT_EQ(x.carriers.size(), 1u);
  EXPECT_EQ(x.carriers[0].rank, 2);
  EXPECT_EQ(x.carriers[0].sent_row, 0);
  EXPECT_EQ(x.carriers[0].received_row, 2);
  EXPECT_EQ(x.carriers[0].rows, 2);
  EXPECT_EQ(DescribePath(path),
            "rank 2 aten::linear in moe.experts.5 -> all_to_all #0 in world (rows 0-1 to rank 0) -> rank 0 "
            "aten::layer_norm in moe");
  ASSERT_TRUE(found->carried.has_value());
  EXPECT_EQ(found->carried->kind, "all_to_all");
}

TEST(CrossRankWalk, TwoLargeWholeInputsAreAmbiguousAndTheWalkStops) {
  // Rank 1's input is as large, though its rows to rank 0 are not: from
  // fingerprints alone either may have sent them.
  const formats::WorldStep world = Step(/*rank1_sent=*/kLarge);
  const std::optional<WorldOverflow> found = FindWorldOverflow(world);
  ASSERT_TRUE(found.has_value());
  EXPECT_TRUE(found->path.stopped);
  ASSERT_EQ(found->path.crossings.size(), 1u);
  const Crossing& x = found->path.crossings[0];
  EXPECT_TRUE(x.ambiguous);
  ASSERT_EQ(x.carriers.size(), 2u);
  EXPECT_EQ(x.carriers[0].rank, 1);
  EXPECT_EQ(x.carriers[1].rank, 2);
  EXPECT_EQ(found->rank, 0);  // not guessed: the rank it started on, its walk ending at the collective
  EXPECT_EQ(found->cause.cause.op->name, "c10d::all_to_all");
  EXPECT_FALSE(found->carried.has_value());
  EXPECT_EQ(DescribePath(found->path),
            "rank ? (ambiguous) -> all_to_all #0 in world (rows 0-1 to rank 0; or from rank 2) -> rank 0 "
            "aten::layer_norm in moe");
}

TEST(CrossRankWalk, ABroadcastCrossesToItsRootOnly) {
  // Rank 1's input is large too, but a broadcast delivers the root's.
  const formats::WorldStep world = Step(/*rank1_sent=*/kLarge, "broadcast", /*root=*/2);
  const std::optional<WorldOverflow> found = FindWorldOverflow(world);
  ASSERT_TRUE(found.has_value());
  ASSERT_EQ(found->path.crossings.size(), 1u);
  const Crossing& x = found->path.crossings[0];
  EXPECT_EQ(x.evidence, "inputs");
  ASSERT_EQ(x.carriers.size(), 1u);
  EXPECT_EQ(x.carriers[0].rank, 2);
  EXPECT_EQ(x.carriers[0].sent_row, -1);
  EXPECT_EQ(found->rank, 2);
  EXPECT_EQ(found->cause.cause.op->name, "aten::linear");
}

TEST(CrossRankWalk, AllGatherBlocksAreWholeInputsSoSeveralLargeOnesAllCarriedThem) {
  const formats::WorldStep world = Step(/*rank1_sent=*/kLarge, "all_gather");
  const std::optional<WorldOverflow> found = FindWorldOverflow(world);
  ASSERT_TRUE(found.has_value());
  ASSERT_FALSE(found->path.crossings.empty());
  const Crossing& x = found->path.crossings[0];
  EXPECT_EQ(x.evidence, "inputs");
  EXPECT_FALSE(x.ambiguous);
  ASSERT_EQ(x.carriers.size(), 2u);
  // Both sent large values (rank 1's relu of a unit step input made them):
  // the walk follows the first and lists the other.
  EXPECT_EQ(x.carriers[0].rank, 1);
  EXPECT_EQ(x.carriers[1].rank, 2);
  EXPECT_EQ(found->rank, 1);
  EXPECT_EQ(DescribePath(found->path),
            "rank 1 aten::relu in moe -> all_gather #0 in world (to rank 0; also from rank 2) -> rank 0 "
            "aten::layer_norm in moe");
}

TEST(CrossRankWalk, AnAllGatherIntoAListCrossesToTheSenderOfTheOutputWalked) {
  // Rank 0 gathers into three tensors; the layer_norm reads the third, rank 2's.
  formats::WorldStep world = Step(/*rank1_sent=*/kLarge, "all_gather");
  formats::Trace& t = *world.ranks[0].trace;
  t.tensors.push_back(Value(20, 1, 1));
  t.tensors.push_back(Value(21, 1, kLarge));
  t.ops[1].outputs = {20, 21, 11};
  t.Index();
  const std::optional<WorldOverflow> found = FindWorldOverflow(world);
  ASSERT_TRUE(found.has_value());
  ASSERT_EQ(found->path.crossings.size(), 1u);
  const Crossing& x = found->path.crossings[0];
  ASSERT_EQ(x.carriers.size(), 1u);
  EXPECT_EQ(x.carriers[0].rank, 2);
  EXPECT_EQ(found->rank, 2);
  EXPECT_EQ(found->cause.cause.op->name, "aten::linear");
}

}  // namespace
}  // namespace moerr::analysis
