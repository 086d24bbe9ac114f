#include "diff/trace_alignment.h"

#include <gtest/gtest.h>

#include <random>

namespace moerr::diff {
namespace {

// Length of the longest common subsequence, by dynamic programming.
size_t Lcs(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  std::vector<std::vector<size_t>> t(a.size() + 1, std::vector<size_t>(b.size() + 1, 0));
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      t[i][j] = a[i - 1] == b[j - 1] ? t[i - 1][j - 1] + 1 : std::max(t[i - 1][j], t[i][j - 1]);
    }
  }
  return t[a.size()][b.size()];
}

// Every op appears once, in order; matched pairs have equal keys.
void ExpectValid(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b, const std::vector<AlignedPair>& al) {
  int64_t next_a = 0, next_b = 0;
  for (const AlignedPair& p : al) {
    if (p.a >= 0) {
      EXPECT_EQ(p.a, next_a++);
    }
    if (p.b >= 0) {
      EXPECT_EQ(p.b, next_b++);
    }
    if (p.a >= 0 && p.b >= 0) {
      EXPECT_EQ(a[p.a], b[p.b]);
    }
    EXPECT_TRUE(p.a >= 0 || p.b >= 0);
  }
  EXPECT_EQ(next_a, static_cast<int64_t>(a.size()));
  EXPECT_EQ(next_b, static_cast<int64_t>(b.size()));
}

TEST(TraceAlignmentTest, MatchesAsManyOpsAsTheLongestCommonSubsequence) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint64_t> a(rng() % 40), b;
    for (auto& k : a) k = rng() % 4;
    b = a;
    // Random insertions, deletions and substitutions.
    for (int e = rng() % 6; e > 0; --e) {
      const size_t at = b.empty() ? 0 : rng() % (b.size() + 1);
      switch (rng() % 3) {
        case 0: b.insert(b.begin() + at, rng() % 4); break;
        case 1: if (at < b.size()) b.erase(b.begin() + at); break;
        default: if (at < b.size()) b[at] = rng() % 4;
      }
    }
    const std::vector<AlignedPair> al = AlignKeys(a, b).value();
    ExpectValid(a, b, al);
    size_t matched = 0;
    for (const AlignedPair& p : al) matched += p.a >= 0 && p.b >= 0;
    EXPECT_EQ(matched, Lcs(a, b)) << trial;
  }
}

TEST(TraceAlignmentTest, AnInsertedOpLeavesTheRestPaired) {
  std::vector<uint64_t> a(1000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = i % 17;
  std::vector<uint64_t> b = a;
  b.insert(b.begin() + 400, 99);
  const std::vector<AlignedPair> al = AlignKeys(a, b).value();
  ASSERT_EQ(al.size(), 1001u);
  EXPECT_EQ(al[400].a, -1);
  EXPECT_EQ(al[400].b, 400);
  for (size_t i = 0; i < al.size(); ++i) {
    if (i == 400) continue;
    EXPECT_EQ(al[i].a, static_cast<int64_t>(i < 400 ? i : i - 1));
    EXPECT_EQ(al[i].b, static_cast<int64_t>(i));
  }
}

TEST(TraceAlignmentTest, RefusesUnrelatedTraces) {
  std::vector<uint64_t> a(100, 1), b(100, 2);
  auto al = AlignKeys(a, b, /*max_edits=*/50);
  ASSERT_FALSE(al.ok());
  EXPECT_NE(al.status().message().find("not recordings of the same program"), std::string::npos);
  EXPECT_EQ(AlignKeys(a, b, /*max_edits=*/200)->size(), 200u);
  EXPECT_TRUE(AlignKeys({}, {})->empty());
}

}  // namespace
}  // namespace moerr::diff

namespace moerr::diff {
namespace {

// An in-place op aligns with its out-of-place form; a dunder op keeps its name.
TEST(TraceAlignmentTest, InPlaceOpsAlignWithTheirOutOfPlaceForm) {
  EXPECT_EQ(OutOfPlaceName("aten::add_"), "aten::add");
  EXPECT_EQ(OutOfPlaceName("aten::add"), "aten::add");
  EXPECT_EQ(OutOfPlaceName("aten::__and__"), "aten::__and__");
  EXPECT_EQ(OutOfPlaceName(""), "");
  formats::OpEvent a, b;
  a.name = "aten::add", b.name = "aten::add_";
  EXPECT_EQ(AlignmentKey(a), AlignmentKey(b));
  b.name = "aten::mul_";
  EXPECT_NE(AlignmentKey(a), AlignmentKey(b));
}

}  // namespace
}  // namespace moerr::diff
