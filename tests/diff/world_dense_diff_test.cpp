// Dense ops of a world replayed on fewer ranks against the combined
// fingerprints of the ranks each replay rank stands for, on traces built
// here: what combines, what is compared as a replicated value, what has no
// counterpart, and what diverges.
#include "diff/world_dense_diff.h"

#include <gtest/gtest.h>

#include <cmath>

namespace moerr::diff {
namespace {

// The fingerprint of `values`, as the recorder computes it: mean over the
// finite values, L2 and abs-max over them too, the hash given.
formats::Fingerprint Of(const std::vector<double>& values, uint64_t hash) {
  formats::Fingerprint f;
  double sum = 0, squares = 0, finite = 0;
  f.min = INFINITY, f.max = -INFINITY;
  for (double v : values) {
    ++f.numel;
    if (std::isinf(v)) {
      ++(v > 0 ? f.pos_inf : f.neg_inf);
      continue;
    }
    f.min = std::min(f.min, v), f.max = std::max(f.max, v), f.abs_max = std::max(f.abs_max, std::fabs(v));
    sum += v, squares += v * v, ++finite;
  }
  f.mean = finite > 0 ? sum / finite : 0;
  f.l2 = std::sqrt(squares);
  f.hash = hash;
  return f;
}

// A rank's step: one op per fingerprint, in module `module` (forward).
formats::RankStep Rank(int64_t rank, const std::vector<std::pair<std::string, formats::Fingerprint>>& ops) {
  formats::RankStep r;
  r.rank = rank;
  formats::Trace t;
  uint64_t id = 1;
  for (const auto& [module, f] : ops) {
    formats::OpEvent op;
    op.name = "aten::mul";
    op.module = module;
    op.outputs = {id};
    formats::TensorMeta meta;
    meta.id = id++;
    meta.fingerprint = f;
    t.tensors.push_back(meta);
    t.ops.push_back(op);
  }
  t.Index();
  r.trace = std::move(t);
  return r;
}

// A world of these ranks (RankStep moves: it may own a reader).
template <typename... Ranks>
formats::WorldStep World(Ranks... ranks) {
  formats::WorldStep w;
  w.dir = "world";
  w.manifest.world_size = sizeof...(Ranks);
  w.step = 0;
  (w.ranks.push_back(std::move(ranks)), ...);
  return w;
}

TEST(CombineFingerprintsTest, IsTheFingerprintOfTheConcatenation) {
  const std::vector<double> a = {1, -2, INFINITY}, b = {4, 0.5};
  std::vector<double> ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  const formats::Fingerprint whole = Of(ab, 0), combined = CombineFingerprints({Of(a, 1), Of(b, 2)});
  EXPECT_EQ(combined.numel, whole.numel);
  EXPECT_EQ(combined.min, whole.min);
  EXPECT_EQ(combined.max, whole.max);
  EXPECT_EQ(combined.abs_max, whole.abs_max);
  EXPECT_EQ(combined.pos_inf, 1u);
  EXPECT_DOUBLE_EQ(combined.mean, whole.mean);  // over the 4 finite values, not the 5
  EXPECT_DOUBLE_EQ(combined.l2, whole.l2);
  EXPECT_FALSE(combined.Known(formats::Fingerprint::kHash));
}

TEST(DiffMergedDenseTest, JudgesShardsCombinedReplicasAsOneAndSumsNot) {
  const std::string attn = "model.layers.0.self_attn", mlp = "model.layers.0.mlp";
  const std::vector<double> x0 = {1, 2, 3}, x1 = {-4, 5, 6};
  std::vector<double> x = x0;
  x.insert(x.end(), x1.begin(), x1.end());
  // Rank 0 and 1: a shard's activations, a replicated value, a partial sum,
  // and the MoE block's own dispatch (not dense) and an expert (not dense).
  formats::WorldStep recorded = World(Rank(0, {{attn, Of(x0, 10)},
                                               {attn, Of({7}, 20)},
                                               {attn, Of({6}, 30)},
                                               {mlp, Of({1}, 40)},
                                               {mlp + ".experts.1", Of({9}, 50)}}),
                                      Rank(1, {{attn, Of(x1, 11)},
                                               {attn, Of({7}, 20)},
                                               {attn, Of({7}, 31)},
                                               {mlp, Of({2}, 41)},
                                               {mlp + ".experts.1", Of({9}, 50)}}));
  formats::WorldStep replayed = World(Rank(0, {{attn, Of(x, 12)},
                                               {attn, Of({7}, 20)},
                                               {attn, Of({13}, 32)},
                                               {mlp, Of({1, 2}, 42)},
                                               {mlp + ".experts.1", Of({9}, 50)}}));
  Thresholds thresholds;
  absl::StatusOr<std::vector<DenseDiff>> d = DiffMergedDense(recorded, replayed, thresholds);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 1u);
  EXPECT_EQ((*d)[0].outputs, 2u);              // the shard's, and the replicated value
  EXPECT_EQ((*d)[0].without_counterpart, 1u);  // the sum over the rows
  EXPECT_EQ((*d)[0].diverged, 0u);
  EXPECT_EQ((*d)[0].unaligned, 0u);

  // A replayed activation 1% off in L2 diverges, and is named.
  formats::Fingerprint off = Of(x, 12);
  off.l2 *= 1.01;
  replayed.ranks[0].trace->tensors[0].fingerprint = off;
  replayed.ranks[0].trace->Index();
  d = DiffMergedDense(recorded, replayed, thresholds);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)[0].diverged, 1u);
  EXPECT_NEAR((*d)[0].max_error, 0.01, 1e-9);
  EXPECT_EQ((*d)[0].worst, "aten::mul (" + attn + ", forward)");

  // Worlds of the same size are compared rank by rank elsewhere.
  d = DiffMergedDense(recorded, recorded, thresholds);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->empty());
}

}  // namespace
}  // namespace moerr::diff
