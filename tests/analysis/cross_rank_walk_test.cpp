// The cause walk across ranks on a synthetic three-rank step (no bundle, so
// only fingerprints: the "whole inputs" evidence of cross_rank_walk.h).
// Rank 2's linear makes values of abs-max 1e30 and sends rows [0, 2) of them
// to rank 0 in an all_to_all; rank 0's layer_norm on what it received is not
// finite. Rank 2 itself never overflows, so no rank-level order can name it.
#include "analysis/cross_rank_walk.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>

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

// Bad input: a bundle's collective records are untrusted.

// Rank 0's record of the all_to_all (op 1) with other arguments.
void SetRankZeroCollective(formats::WorldStep& world, const std::function<void(formats::CollectiveOp&)>& edit) {
  formats::Trace& t = *world.ranks[0].trace;
  formats::CollectiveOp c = *formats::CollectiveOf(t.ops[1]);
  edit(c);
  formats::ToOpEvent(c, t.ops[1]);
}

TEST(CrossRankWalk, SplitSizesThatAreNotRowsAreRefusedWhereTheCollectiveIsRead) {
  // [-2, 6, 0] sums to the 4 rows of the output but reads before it.
  for (std::vector<int64_t> rows : {std::vector<int64_t>{-2, 6, 0}, std::vector<int64_t>{INT64_MAX, INT64_MAX, 2},
                                    std::vector<int64_t>{2, 2}}) {
    formats::WorldStep world = Step(/*rank1_sent=*/1);
    SetRankZeroCollective(world, [&](formats::CollectiveOp& c) { c.recv_rows = rows; });
    EXPECT_FALSE(formats::CollectiveOf(world.ranks[0].trace->ops[1]).ok());
    const std::optional<WorldOverflow> found = FindWorldOverflow(world);
    ASSERT_TRUE(found.has_value());
    // Not a collective's record: the walk cannot cross it and stays on rank 0.
    EXPECT_TRUE(found->path.crossings.empty());
    EXPECT_EQ(found->rank, 0);
  }
  EXPECT_FALSE(formats::SplitsRows({-2, 6}, 4));
  EXPECT_FALSE(formats::SplitsRows({INT64_MAX, INT64_MAX, 2}, 4));
  EXPECT_FALSE(formats::SplitsRows({5}, 4));
  EXPECT_TRUE(formats::SplitsRows({0, 4}, 4));
  EXPECT_EQ(formats::RowsBefore({1, 2, 3}, -1), 0);
  EXPECT_EQ(formats::RowsBefore({1, 2, 3}, 2), 3);
  EXPECT_EQ(formats::RowsBefore({1, 2, 3}, 99), 6);
}

TEST(CrossRankWalk, AHugeGroupSizeIsBoundedByTheManifestsGroup) {
  formats::WorldStep world = Step(/*rank1_sent=*/1, "broadcast", /*root=*/2);
  for (size_t r = 0; r < world.ranks.size(); ++r) {
    formats::Trace& t = *world.ranks[r].trace;
    for (formats::OpEvent& op : t.ops) {
      if (!formats::IsCollective(op)) continue;
      formats::CollectiveOp c = *formats::CollectiveOf(op);
      c.group_size = int64_t{1} << 62;  // a loop over it would not end
      formats::ToOpEvent(c, op);
    }
  }
  const std::optional<WorldOverflow> found = FindWorldOverflow(world);
  ASSERT_TRUE(found.has_value());
  // The manifest's three ranks are visited: the walk still crosses to the root.
  ASSERT_EQ(found->path.crossings.size(), 1u);
  EXPECT_EQ(found->rank, 2);
  EXPECT_EQ(world.manifest.GroupSizeOf("world", 0), 3);
  EXPECT_EQ(world.manifest.GroupSizeOf("expert-parallel", 0), 0);
}

TEST(CrossRankWalk, ASenderWhoseValueNoOpMadeIsNamedWithItsLeaf) {
  // Rank 2 broadcasts its step input 2 (a parameter, say) as it is, 1e30.
  formats::WorldStep world = Step(/*rank1_sent=*/1, "broadcast", /*root=*/2);
  formats::Trace& t = *world.ranks[2].trace;
  t.tensors[2].fingerprint.abs_max = kLarge;  // tensor 2, no producer
  t.tensors[2].leaf = "param/w";
  formats::CollectiveOp c = *formats::CollectiveOf(t.ops[2]);
  c.inputs = {2};
  formats::ToOpEvent(c, t.ops[2]);
  t.Index();
  const std::optional<WorldOverflow> found = FindWorldOverflow(world);
  ASSERT_TRUE(found.has_value());
  const CrossRankPath& path = found->path;
  EXPECT_TRUE(path.stopped);
  ASSERT_TRUE(path.leaf.has_value());
  EXPECT_EQ(path.leaf->rank, 2);
  EXPECT_EQ(path.leaf->tensor, 2u);
  EXPECT_EQ(path.leaf->name, "param/w");
  ASSERT_EQ(path.crossings.size(), 1u);
  EXPECT_FALSE(path.crossings[0].ambiguous);
  EXPECT_EQ(found->rank, 0);  // the rank it started on, with its own walk
  EXPECT_EQ(DescribePath(path),
            "rank 2 input tensor 2 (param/w) -> broadcast #0 in world (to rank 0) -> rank 0 aten::layer_norm in moe");
  const llvm::json::Array json = PathJson(path);
  ASSERT_EQ(json.size(), 3u);
  const llvm::json::Object* leaf = json[0].getAsObject()->getObject("leaf");
  ASSERT_NE(leaf, nullptr);
  EXPECT_EQ(leaf->getInteger("tensor").getValueOr(-1), 2);
  EXPECT_EQ(json[0].getAsObject()->getInteger("rank").getValueOr(-1), 2);
  EXPECT_EQ(json[1].getAsObject()->getInteger("from").getValueOr(-1), 2);
}

TEST(CrossRankWalk, AWalkToASenderWhoseWalkFoundNoExplosionNamesNoOrigin) {
  // Rank 2's linear makes 1e30 from inputs as large: nothing exploded on
  // rank 2, so the rank it crossed to is not known to be the origin.
  formats::WorldStep world = Step(/*rank1_sent=*/1, "broadcast", /*root=*/2);
  formats::Trace& t = *world.ranks[2].trace;
  t.tensors[2].fingerprint.abs_max = kLarge;  // the linear's weight
  t.Index();
  const std::optional<WorldOverflow> found = FindWorldOverflow(world);
  ASSERT_TRUE(found.has_value());
  ASSERT_EQ(found->path.walks.size(), 2u);
  EXPECT_FALSE(found->path.walks.back().walk.found_explosion);
  EXPECT_FALSE(found->path.stopped);
  EXPECT_TRUE(found->unexploded);
  EXPECT_FALSE(found->Crossed());
  EXPECT_EQ(found->rank, 0);  // the start rank, with its own walk
  EXPECT_EQ(found->cause.first.op->name, "aten::layer_norm");
  EXPECT_FALSE(found->carried.has_value());
}

}  // namespace
}  // namespace moerr::analysis
