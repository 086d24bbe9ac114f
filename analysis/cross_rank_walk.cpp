#include "analysis/cross_rank_walk.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/dtype.h"
#include "formats/json_number.h"

namespace moerr::analysis {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The largest finite abs-max of `ids` in `trace` and whether all are finite.
std::pair<double, bool> Magnitude(const formats::Trace& trace, const std::vector<uint64_t>& ids) {
  double abs_max = 0;
  bool finite = true;
  for (uint64_t id : ids) {
    const formats::TensorMeta* meta = trace.Find(id);
    if (meta == nullptr) continue;
    if (std::isfinite(meta->fingerprint.abs_max)) abs_max = std::max(abs_max, meta->fingerprint.abs_max);
    finite = finite && meta->fingerprint.Finite();
  }
  return {abs_max, finite};
}

// Per group rank, the finite abs-max and finiteness of the rows
// [first, +rows) of the received all_to_all output `meta` of `rank`, read
// from its bundle; nullopt when its values are not stored or do not split
// by `recv_rows`.
std::optional<std::vector<std::pair<double, bool>>> BlockValues(const formats::RankStep& rank, int64_t step,
                                                                 const formats::TensorMeta& meta,
                                                                 const std::vector<int64_t>& recv_rows) {
  if (!rank.reader || meta.leaf.empty() || meta.shape.empty()) return std::nullopt;
  absl::StatusOr<formats::OwnedTensor> t = rank.reader->ReadTensor(meta.leaf, step);
  if (!t.ok() || t->shape.empty() || !formats::IsFloating(t->dtype)) return std::nullopt;
  int64_t numel = 1;
  for (int64_t d : t->shape) numel *= d;
  const int64_t rows = t->shape[0];
  // Every count in [0, rows], checked before summing: a block then lies in the tensor.
  if (rows <= 0 || !formats::SplitsRows(recv_rows, rows)) return std::nullopt;
  const int64_t row_elems = numel / rows;
  std::vector<std::pair<double, bool>> out;
  for (size_t j = 0; j < recv_rows.size(); ++j) {
    double abs_max = 0;
    bool finite = true;
    const int64_t begin = formats::RowsBefore(recv_rows, static_cast<int64_t>(j)) * row_elems;
    for (int64_t e = begin; e < begin + recv_rows[j] * row_elems; ++e) {
      const double v = formats::LoadElement(t->dtype, t->bytes.data(), e);
      if (std::isfinite(v)) abs_max = std::max(abs_max, std::abs(v));
      else finite = false;
    }
    out.emplace_back(abs_max, finite);
  }
  return out;
}

// Whether rank `walk` ended at a collective that received what went wrong:
// its cause is a collective that rose over what the rank sent, or one whose
// output is not finite (nothing before it exploded).
bool EndsAtReceipt(const formats::Trace& trace, const OverflowCause& walk) {
  if (!formats::IsCollective(*walk.cause.op)) return false;
  if (walk.found_explosion) return true;
  const formats::TensorMeta* out = trace.Find(walk.cause.output);
  return out != nullptr && !out->fingerprint.Finite();
}

// The senders whose rows carried what rank `receiver`'s collective at
// `op_index` delivered in its output `output` (cross_rank_walk.h).
// Nullopt when the op's arguments are not a collective's.
std::optional<Crossing> FindCarriers(const formats::WorldStep& world, int64_t receiver, size_t op_index,
                                     uint64_t output) {
  const formats::RankStep& mine = world.ranks[static_cast<size_t>(receiver)];
  const formats::OpEvent& op = mine.trace->ops[op_index];
  absl::StatusOr<formats::CollectiveOp> collective = formats::CollectiveOf(op);
  if (!collective.ok()) return std::nullopt;
  Crossing x;
  x.collective = *std::move(collective);
  x.module = op.module;
  x.receiver = receiver;
  x.receiver_op = op_index;
  const formats::CollectiveOp& c = x.collective;
  const formats::TensorMeta* got = mine.trace->Find(output);
  x.not_finite = got != nullptr && !got->fingerprint.Finite();
  const double sent_bits = std::log2(Magnitude(*mine.trace, c.inputs).first);
  std::optional<std::vector<std::pair<double, bool>>> blocks;
  if (c.kind == "all_to_all" && got != nullptr) blocks = BlockValues(mine, world.step, *got, c.recv_rows);
  x.evidence = blocks                                               ? "values"
               : c.kind == "all_gather" || c.kind == "broadcast" ? "inputs"
                                                                 : "whole inputs";
  // An all_gather into a list: the output the walk came through is one sender's.
  int64_t only = c.kind == "broadcast" ? c.root : -1;
  const auto listed = std::find(op.outputs.begin(), op.outputs.end(), output);
  if (c.kind == "all_gather" && static_cast<int64_t>(op.outputs.size()) == c.group_size && listed != op.outputs.end()) {
    only = listed - op.outputs.begin();
  }
  std::vector<Carrier> all;
  const int64_t members = GroupMembers(world, c, receiver);
  for (int64_t g = 0; g < members; ++g) {
    if (g == c.group_rank || (only >= 0 && g != only)) continue;
    const int64_t peer = world.manifest.WorldRankOf(c.group, receiver, g);
    if (peer < 0 || peer >= static_cast<int64_t>(world.ranks.size())) continue;
    const formats::RankStep& theirs = world.ranks[static_cast<size_t>(peer)];
    const std::optional<size_t> at = theirs.trace ? formats::FindCollective(*theirs.trace, c) : std::nullopt;
    if (!at) continue;
    const absl::StatusOr<formats::CollectiveOp> sent = formats::CollectiveOf(theirs.trace->ops[*at]);
    if (!sent.ok()) continue;
    Carrier k;
    k.rank = peer;
    k.op_index = *at;
    std::tie(k.abs_max, k.finite) = Magnitude(*theirs.trace, sent->inputs);
    // An all_to_all without its splits (an import that has none): whole
    // inputs only. CollectiveOf's splits are counts >= 0 that sum within int64.
    if (c.kind == "all_to_all" && g < static_cast<int64_t>(c.recv_rows.size()) && c.group_rank >= 0 &&
        c.group_rank < static_cast<int64_t>(sent->send_rows.size())) {
      k.rows = c.recv_rows[static_cast<size_t>(g)];
      k.sent_row = formats::RowsBefore(sent->send_rows, c.group_rank);
      k.received_row = formats::RowsBefore(c.recv_rows, g);
      if (k.rows == 0) continue;  // it sent this rank nothing
      if (blocks) std::tie(k.abs_max, k.finite) = (*blocks)[static_cast<size_t>(g)];
    }
    all.push_back(k);
  }
  double largest = 0;
  for (const Carrier& k : all) largest = std::max(largest, k.abs_max);
  // A large block stands kInputRiseBits above what this rank sent, and
  // within kInputRiseBits of the largest block (this rank may have sent nothing).
  const double bar = std::max(std::isfinite(sent_bits) ? sent_bits + kInputRiseBits : -kInf,
                              std::log2(largest) - kInputRiseBits);
  for (const Carrier& k : all) {
    const bool carried = x.not_finite ? !k.finite : k.abs_max > 0 && std::log2(k.abs_max) >= bar;
    if (carried) x.carriers.push_back(k);
  }
  x.ambiguous = x.evidence == "whole inputs" && x.carriers.size() > 1;
  return x;
}

// The op index of the producer of tensor `id` in `trace`, before `before`.
std::optional<size_t> ProducerOf(const formats::Trace& trace, uint64_t id, size_t before) {
  const formats::TensorMeta* meta = trace.Find(id);
  if (meta == nullptr || meta->producer < 0) return std::nullopt;
  for (size_t i = before; i-- > 0;) {
    if (trace.ops[i].seq == static_cast<uint64_t>(meta->producer)) return i;
  }
  return std::nullopt;
}

}  // namespace

int64_t GroupMembers(const formats::WorldStep& world, const formats::CollectiveOp& c, int64_t rank) {
  return std::min(c.group_size, world.manifest.GroupSizeOf(c.group, rank));
}

CrossRankPath WalkAcrossRanks(const formats::WorldStep& world, int64_t start, const OverflowCause& start_cause) {
  CrossRankPath path;
  path.walks.push_back({start, start_cause, true});
  std::set<std::pair<int64_t, size_t>> crossed;  // (receiver, op index): no collective is crossed twice
  while (true) {
    const RankWalk& at = path.walks.back();
    const formats::Trace& trace = *world.ranks[static_cast<size_t>(at.rank)].trace;
    if (!EndsAtReceipt(trace, at.walk) || !crossed.insert({at.rank, at.walk.cause.op_index}).second) break;
    std::optional<Crossing> found = FindCarriers(world, at.rank, at.walk.cause.op_index, at.walk.cause.output);
    // No sender sent it: the collective made it (a sum past the range).
    if (!found || found->carriers.empty()) break;
    Crossing x = *std::move(found);
    const bool ambiguous = x.ambiguous;
    const Carrier next = x.carriers.front();
    path.crossings.push_back(std::move(x));
    if (ambiguous) {
      path.stopped = true;
      break;
    }
    const formats::Trace& theirs = *world.ranks[static_cast<size_t>(next.rank)].trace;
    const formats::CollectiveOp sent = *formats::CollectiveOf(theirs.ops[next.op_index]);
    const uint64_t value = sent.inputs.empty() ? 0 : sent.inputs.front();
    const std::optional<size_t> producer = ProducerOf(theirs, value, next.op_index);
    std::optional<OverflowCause> walk = producer ? FindCauseOf(theirs, *producer, value) : std::nullopt;
    if (!walk) {
      // A value no op of its step made (a parameter, the batch): its one sender is known.
      path.stopped = true;
      const formats::TensorMeta* meta = value != 0 ? theirs.Find(value) : nullptr;
      path.leaf = SentLeaf{next.rank, next.op_index, &theirs.ops[next.op_index], value,
                           meta != nullptr ? meta->leaf : ""};
      break;
    }
    path.walks.push_back({next.rank, *std::move(walk), false});
  }
  return path;
}

namespace {

std::string Node(const RankWalk& w, bool origin) {
  const formats::OpEvent& op = origin ? *w.walk.cause.op : *w.walk.first.op;
  return absl::StrFormat("rank %d %s in %s", w.rank, op.name, op.module.empty() ? "(no module)" : op.module);
}

std::string LeafText(const SentLeaf& leaf) {
  if (leaf.tensor == 0) return absl::StrFormat("rank %d (what it sent is not recorded)", leaf.rank);
  return absl::StrFormat("rank %d input tensor %d%s", leaf.rank, leaf.tensor,
                         leaf.name.empty() ? "" : absl::StrCat(" (", leaf.name, ")"));
}

std::string CrossingText(const Crossing& x) {
  const Carrier& k = x.carriers.front();
  std::string rows = k.sent_row >= 0 ? absl::StrFormat("rows %d-%d ", k.sent_row, k.sent_row + k.rows - 1) : "";
  std::string out = absl::StrFormat("%s #%d in %s (%sto rank %d", x.collective.kind, x.collective.seq,
                                    x.collective.group, rows, x.receiver);
  if (x.carriers.size() > 1) {
    std::vector<int64_t> others;
    for (size_t i = 1; i < x.carriers.size(); ++i) others.push_back(x.carriers[i].rank);
    absl::StrAppend(&out, x.ambiguous ? "; or from rank " : "; also from rank ", absl::StrJoin(others, ", "));
  }
  return out + ")";
}

}  // namespace

std::string DescribePath(const CrossRankPath& path) {
  std::string out;
  if (path.stopped) {
    const Crossing& x = path.crossings.back();
    out = absl::StrCat(path.leaf ? LeafText(*path.leaf) : x.ambiguous ? "rank ? (ambiguous)" : "rank ?", " -> ",
                       CrossingText(x), " -> ");
  }
  for (size_t k = path.walks.size(); k-- > 0;) {
    absl::StrAppend(&out, Node(path.walks[k], k + 1 == path.walks.size() && !path.stopped));
    if (k > 0) absl::StrAppend(&out, " -> ", CrossingText(path.crossings[k - 1]), " -> ");
  }
  return out;
}

llvm::json::Array PathJson(const CrossRankPath& path) {
  llvm::json::Array out;
  auto node = [&](const RankWalk& w, bool origin) {
    const CauseLink& link = origin ? w.walk.cause : w.walk.chain.back();
    out.push_back(llvm::json::Object{{"rank", w.rank}, {"op_index", static_cast<int64_t>(link.op_index)},
                                     {"op", link.op->name}, {"module", link.op->module},
                                     {"phase", std::string(formats::PhaseName(link.op->phase))}});
  };
  auto crossing = [&](const Crossing& x) {
    llvm::json::Array carriers;
    for (const Carrier& k : x.carriers) {
      llvm::json::Object c{{"rank", k.rank}, {"abs_max", formats::JsonNumber(k.abs_max)}, {"finite", k.finite}};
      if (k.sent_row >= 0) {
        c["sent_rows"] = llvm::json::Array{k.sent_row, k.sent_row + k.rows};
        c["received_rows"] = llvm::json::Array{k.received_row, k.received_row + k.rows};
      }
      carriers.push_back(std::move(c));
    }
    llvm::json::Value from = nullptr;  // unknown past an ambiguous crossing
    if (!x.ambiguous) from = x.carriers.front().rank;
    out.push_back(llvm::json::Object{{"collective", x.collective.kind}, {"group", x.collective.group},
                                     {"seq", x.collective.seq}, {"module", x.module}, {"from", std::move(from)},
                                     {"to", x.receiver}, {"evidence", x.evidence}, {"not_finite", x.not_finite},
                                     {"ambiguous", x.ambiguous}, {"carriers", std::move(carriers)}});
  };
  if (const std::optional<SentLeaf>& leaf = path.leaf) {
    // The sender's record of the collective, with the input it sent.
    out.push_back(llvm::json::Object{
        {"rank", leaf->rank}, {"op_index", static_cast<int64_t>(leaf->op_index)}, {"op", leaf->op->name},
        {"module", leaf->op->module}, {"phase", std::string(formats::PhaseName(leaf->op->phase))},
        {"leaf", llvm::json::Object{{"tensor", static_cast<int64_t>(leaf->tensor)}, {"name", leaf->name}}}});
  }
  for (size_t k = path.walks.size(); k-- > 0;) {
    if (k + 1 == path.walks.size() && path.stopped) crossing(path.crossings.back());
    node(path.walks[k], k + 1 == path.walks.size() && !path.stopped);
    if (k > 0) crossing(path.crossings[k - 1]);
  }
  return out;
}

}  // namespace moerr::analysis
