#include "analysis/cross_rank.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/first_overflow.h"
#include "formats/annotations.h"
#include "formats/dtype.h"

namespace moerr::analysis {
namespace {

struct Recorded {
  formats::CollectiveOp c;
  const formats::OpEvent* op = nullptr;
};
// A rank's collectives of the step by (group, seq).
using Collectives = std::map<std::pair<std::string, int64_t>, Recorded>;

// A rank's collectives; a record that is not a collective's layout is a
// mismatch of its own (it cannot be checked against its peers).
Collectives CollectivesOf(const formats::Trace& trace, int64_t rank, std::vector<CollectiveMismatch>& bad) {
  Collectives out;
  for (const formats::OpEvent& op : trace.ops) {
    if (!formats::IsCollective(op)) continue;
    absl::StatusOr<formats::CollectiveOp> c = formats::CollectiveOf(op);
    if (!c.ok()) {
      CollectiveMismatch m;
      m.collective.kind = op.name;
      m.module = op.module;
      m.receiver = rank;
      m.what = std::string(c.status().message());
      bad.push_back(std::move(m));
      continue;
    }
    auto key = std::make_pair(c->group, c->seq);
    out[std::move(key)] = Recorded{*std::move(c), &op};
  }
  return out;
}

// Sender `from` (its record `sent`) against receiver `to` (`got`).
void CheckAllToAll(int64_t from, const Recorded& sent, int64_t to, const Recorded& got,
                   std::vector<CollectiveMismatch>& out) {
  const int64_t j = got.c.group_rank, i = sent.c.group_rank;
  auto mismatch = [&](std::string what) {
    CollectiveMismatch m{got.c, got.op->module, from, to, 0, 0, std::move(what)};
    if (i >= 0 && i < static_cast<int64_t>(got.c.recv_rows.size())) {
      m.first_row = formats::RowsBefore(got.c.recv_rows, i);
      m.rows = got.c.recv_rows[i];
    }
    out.push_back(std::move(m));
  };
  if (sent.c.kind != got.c.kind) {
    return mismatch(absl::StrFormat("rank %d ran %s there, rank %d %s", from, sent.c.kind, to, got.c.kind));
  }
  // An imported dump (msprobe) has no split sizes: only the kinds compare.
  if (sent.c.send_rows.empty() && got.c.recv_rows.empty()) return;
  const size_t si = static_cast<size_t>(j), ri = static_cast<size_t>(i);
  if (si >= sent.c.send_rows.size() || ri >= got.c.recv_rows.size()) {
    return mismatch("the group sizes disagree");
  }
  if (sent.c.send_rows[si] != got.c.recv_rows[ri]) {
    return mismatch(absl::StrFormat("rank %d sent %d rows, rank %d expected %d", from, sent.c.send_rows[si], to,
                                    got.c.recv_rows[ri]));
  }
  if (si < sent.c.send_hashes.size() && ri < got.c.recv_hashes.size() &&
      sent.c.send_hashes[si] != got.c.recv_hashes[ri]) {
    mismatch(absl::StrFormat("the bytes differ: rank %d sent hash %016x, rank %d received %016x", from,
                             sent.c.send_hashes[si], to, got.c.recv_hashes[ri]));
  }
}

// Every rank of an all_reduce holds the same sum; of a broadcast, the root's
// tensor; a recv, what its sender sent.
void CheckSameResult(int64_t rank, const Recorded& mine, int64_t peer, const Recorded& theirs,
                     std::vector<CollectiveMismatch>& out) {
  const bool broadcast = mine.c.kind == "broadcast", recv = mine.c.kind == "recv";
  // broadcast and recv: `peer` is the sender; what it sent is what this rank holds.
  const std::vector<uint64_t>& expected = broadcast || recv ? theirs.c.send_hashes : theirs.c.recv_hashes;
  if (expected.empty() || mine.c.recv_hashes.empty() || expected[0] == mine.c.recv_hashes[0]) return;
  out.push_back(CollectiveMismatch{
      mine.c, mine.op->module, peer, rank, 0, 0,
      recv        ? absl::StrFormat("the bytes differ: rank %d sent hash %016x, rank %d received %016x", peer,
                                    expected[0], rank, mine.c.recv_hashes[0])
      : broadcast ? absl::StrFormat("rank %d holds other bytes than root rank %d sent", rank, peer)
                  : absl::StrFormat("ranks %d and %d hold different sums", peer, rank)});
}

// The world rank of group rank `group_rank` of a point-to-point pair's group,
// "p2p:<lo>,<hi>" (python/moerr/_distributed.py), whose group rank 0 is the
// lower; -1 for another group or rank.
int64_t PairRank(const std::string& group, int64_t group_rank) {
  if (!absl::StartsWith(group, "p2p:") || group_rank < 0 || group_rank > 1) return -1;
  const std::vector<std::string> pair = absl::StrSplit(group.substr(4), ',');
  int64_t lo = -1, hi = -1;
  if (pair.size() != 2 || !absl::SimpleAtoi(pair[0], &lo) || !absl::SimpleAtoi(pair[1], &hi) || lo < 0 || lo >= hi) {
    return -1;
  }
  return group_rank == 0 ? lo : hi;
}

bool IsFlightRecorderImport(const formats::BundleReader& reader) {
  const std::optional<formats::Recording> recording = formats::RecordingOf(reader);
  return recording && recording->imported &&
         recording->imported->getString("tool").getValueOr("") == "flight_recorder";
}

std::string DescribeOp(size_t index, const formats::OpEvent& op) {
  return absl::StrFormat("op %d: %s in %s (%s)", index, op.name, op.module.empty() ? "-" : op.module,
                         formats::PhaseName(op.phase));
}

}  // namespace

std::vector<CollectiveMismatch> CheckCollectives(const formats::WorldStep& world) {
  std::vector<Collectives> by_rank(world.ranks.size());
  std::vector<CollectiveMismatch> out;
  for (size_t r = 0; r < world.ranks.size(); ++r) {
    if (world.ranks[r].trace) by_rank[r] = CollectivesOf(*world.ranks[r].trace, static_cast<int64_t>(r), out);
  }
  for (size_t to = 0; to < world.ranks.size(); ++to) {
    for (const auto& [key, got] : by_rank[to]) {
      const int64_t receiver = static_cast<int64_t>(to);
      if (got.c.kind == "recv") {  // against its sender's send (root: the sender's group rank)
        const int64_t from = PairRank(key.first, got.c.root);
        if (from < 0 || from == receiver || from >= static_cast<int64_t>(by_rank.size())) continue;
        auto it = by_rank[static_cast<size_t>(from)].find(key);
        if (it != by_rank[static_cast<size_t>(from)].end()) CheckSameResult(receiver, got, from, it->second, out);
        continue;
      }
      const bool sums = got.c.kind == "all_reduce" || got.c.kind == "all_gather";
      // The manifest's group bounds the trace's group_size (untrusted).
      const int64_t members = std::min(got.c.group_size, world.manifest.GroupSizeOf(key.first, receiver));
      for (int64_t g = 0; g < members; ++g) {
        const int64_t from = world.manifest.WorldRankOf(key.first, receiver, g);
        if (from < 0 || from == receiver || from >= static_cast<int64_t>(by_rank.size())) continue;
        if (got.c.kind == "broadcast" && g != got.c.root) continue;
        if (sums && from < receiver) continue;  // each pair once
        auto it = by_rank[static_cast<size_t>(from)].find(key);
        if (it == by_rank[static_cast<size_t>(from)].end()) continue;  // a rank that never got there
        if (got.c.kind == "all_to_all") {
          CheckAllToAll(from, it->second, receiver, got, out);
        } else if (got.c.kind == "all_reduce" || got.c.kind == "broadcast" || got.c.kind == "all_gather") {
          CheckSameResult(receiver, got, from, it->second, out);
        }
      }
    }
  }
  return out;
}

const char* FateName(RankFate::Kind kind) {
  switch (kind) {
    case RankFate::Kind::kFinished: return "finished";
    case RankFate::Kind::kDied: return "died";
    case RankFate::Kind::kWaited: return "waited";
    case RankFate::Kind::kUnreadable: return "unreadable";
    case RankFate::Kind::kDumped: return "dumped";
  }
  return "?";
}

std::vector<RankFate> RankFates(const formats::WorldStep& world) {
  std::vector<RankFate> out;
  for (const formats::RankStep& r : world.ranks) {
    RankFate f;
    f.rank = r.rank;
    if (r.trace && !r.trace->ops.empty()) {
      f.ops = r.trace->ops.size();
      f.last_op = DescribeOp(f.ops - 1, r.trace->ops.back());
    }
    // Absent or malformed: the rank was not seen waiting in a collective.
    std::optional<formats::CollectiveFailed> failed;
    if (r.reader) {
      absl::StatusOr<formats::CollectiveFailed> c = formats::ReadCollectiveFailed(*r.reader, r.path);
      if (c.ok() && c->step == world.step) failed = *std::move(c);  // else another step's
    }
    if (!r.reader) {
      f.kind = RankFate::Kind::kUnreadable;
      f.detail = std::string(r.error.message());
    } else if (IsFlightRecorderImport(*r.reader)) {
      f.kind = RankFate::Kind::kDumped;
    } else if (r.step_complete) {
      f.kind = RankFate::Kind::kFinished;
    } else if (failed) {
      f.kind = RankFate::Kind::kWaited;
      formats::CollectiveOp c;
      c.kind = failed->kind;
      c.group = failed->group;
      c.seq = failed->seq;
      f.waited_in = formats::DescribeCollective(c, failed->module);
      f.detail = failed->error;
    } else {
      f.kind = RankFate::Kind::kDied;
      if (r.partial) {
        f.detail = "its bundle was never finished";
        if (!r.salvage.stop_reason.empty()) f.detail += " (salvaged up to: " + r.salvage.stop_reason + ")";
        if (!r.ring_steps.empty()) {
          f.detail += absl::StrFormat("; its anomaly ring kept step%s %s", r.ring_steps.size() == 1 ? "" : "s",
                                      absl::StrJoin(r.ring_steps, ", "));
        }
      }
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<RankLoad> RankLoads(const formats::WorldStep& world) {
  std::map<std::pair<std::string, int64_t>, RankLoad> loads;
  const size_t ranks = world.ranks.size();
  for (size_t r = 0; r < ranks; ++r) {
    if (!world.ranks[r].trace) continue;
    const formats::Trace& trace = *world.ranks[r].trace;
    std::map<std::string, int64_t> passes;  // per module
    for (const formats::OpEvent& op : trace.ops) {
      if (op.phase != formats::Phase::kForward || !formats::IsCollective(op) || op.outputs.empty()) continue;
      const formats::TensorMeta* out = trace.Find(op.outputs[0]);
      absl::StatusOr<formats::CollectiveOp> c = formats::CollectiveOf(op);
      if (out == nullptr || !formats::IsFloating(out->dtype) || !c.ok() || c->kind != "all_to_all") continue;
      RankLoad& load = loads[{op.module, passes[op.module]++}];
      if (load.rows.empty()) load.rows.assign(ranks, -1);
      load.rows[r] = std::accumulate(c->recv_rows.begin(), c->recv_rows.end(), int64_t{0});
    }
  }
  std::vector<RankLoad> out;
  for (auto& [key, load] : loads) {
    load.module = key.first;
    load.pass = key.second;
    int64_t sum = 0, n = 0, most = 0;
    for (int64_t rows : load.rows) {
      if (rows < 0) continue;
      sum += rows, ++n, most = std::max(most, rows);
    }
    load.imbalance = sum > 0 ? static_cast<double>(most) * static_cast<double>(n) / static_cast<double>(sum) : 1;
    out.push_back(std::move(load));
  }
  return out;
}

std::vector<Finding> CheckRankBalance(const formats::WorldStep& world, double warn_ratio) {
  const std::vector<RankLoad> loads = RankLoads(world);
  if (loads.empty()) return {};
  const RankLoad& worst = *std::max_element(loads.begin(), loads.end(), [](const RankLoad& a, const RankLoad& b) {
    return a.imbalance < b.imbalance;
  });
  const size_t busiest = static_cast<size_t>(std::max_element(worst.rows.begin(), worst.rows.end()) - worst.rows.begin());
  Finding f;
  f.check = "rank-imbalance";
  f.severity = worst.imbalance >= warn_ratio ? Severity::kWarning : Severity::kInfo;
  f.step = world.step;
  f.where = worst.module;
  f.rank = static_cast<int64_t>(busiest);
  f.message = absl::StrFormat(
      "rows each rank received in all_to_all %d of %s (forward): %s; rank %d gets %.2fx the mean, and the slowest "
      "rank sets the step time",
      worst.pass, worst.module, absl::StrJoin(worst.rows, ", "), busiest, worst.imbalance);
  f.numbers["imbalance"] = worst.imbalance;
  f.numbers["rows"] = llvm::json::Array(worst.rows);
  f.numbers["pass"] = worst.pass;
  return {f};
}

}  // namespace moerr::analysis
