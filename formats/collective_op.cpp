#include "formats/collective_op.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace moerr::formats {
namespace {

// The argument layout: the sent tensors, the group's name, the sequence
// number, [group rank, group size, root], send rows, receive rows, send
// hashes, receive hashes.
enum Arg { kInputs, kGroup, kSeq, kPlace, kSendRows, kRecvRows, kSendHashes, kRecvHashes, kArgs };

std::vector<int64_t> AsInts(const std::vector<uint64_t>& v) { return std::vector<int64_t>(v.begin(), v.end()); }
std::vector<uint64_t> AsHashes(const std::vector<int64_t>& v) { return std::vector<uint64_t>(v.begin(), v.end()); }

// Why split sizes `rows` of a group of `group_size` are not rows; empty when they are.
std::string BadSplits(const std::vector<int64_t>& rows, int64_t group_size) {
  if (rows.empty()) return "";
  if (static_cast<int64_t>(rows.size()) != group_size) {
    return absl::StrFormat("%d split sizes for a group of %d", rows.size(), group_size);
  }
  int64_t sum = 0;
  for (int64_t n : rows) {
    if (n < 0) return absl::StrFormat("a split size of %d rows", n);
    if (n > std::numeric_limits<int64_t>::max() - sum) return "split sizes whose sum overflows";
    sum += n;
  }
  return "";
}

}  // namespace

bool IsCollectiveName(absl::string_view name) { return absl::StartsWith(name, kCollectivePrefix); }
bool IsCollective(const OpEvent& op) { return IsCollectiveName(op.name); }

size_t CountCollectives(const Trace& trace, size_t end) {
  size_t n = 0;
  for (size_t i = 0; i < trace.ops.size() && i < end; ++i) n += IsCollective(trace.ops[i]);
  return n;
}

absl::StatusOr<CollectiveOp> CollectiveOf(const OpEvent& op) {
  using K = OpArg::Kind;
  const std::vector<OpArg>& a = op.args;
  const bool shaped = IsCollective(op) && a.size() == kArgs && a[kInputs].kind == K::kTensors &&
                      a[kGroup].kind == K::kText && a[kSeq].kind == K::kInt && a[kPlace].kind == K::kInts &&
                      a[kPlace].ints.size() == 3 && a[kSendRows].kind == K::kInts && a[kRecvRows].kind == K::kInts &&
                      a[kSendHashes].kind == K::kInts && a[kRecvHashes].kind == K::kInts;
  if (!shaped) {
    return absl::DataLossError(absl::StrFormat("op %d (%s): not a collective's arguments", op.seq, op.name));
  }
  for (const auto& [rows, name] : {std::pair(&a[kSendRows].ints, "send"), std::pair(&a[kRecvRows].ints, "receive")}) {
    if (std::string bad = BadSplits(*rows, a[kPlace].ints[1]); !bad.empty()) {
      return absl::DataLossError(absl::StrFormat("op %d (%s): %s rows: %s", op.seq, op.name, name, bad));
    }
  }
  CollectiveOp c;
  c.kind = op.name.substr(kCollectivePrefix.size());
  c.group = a[kGroup].text;
  c.seq = a[kSeq].i;
  c.group_rank = a[kPlace].ints[0];
  c.group_size = a[kPlace].ints[1];
  c.root = a[kPlace].ints[2];
  c.send_rows = a[kSendRows].ints;
  c.recv_rows = a[kRecvRows].ints;
  c.send_hashes = AsHashes(a[kSendHashes].ints);
  c.recv_hashes = AsHashes(a[kRecvHashes].ints);
  c.inputs = AsHashes(a[kInputs].ints);
  return c;
}

int64_t RowsBefore(const std::vector<int64_t>& rows, int64_t slice) {
  const int64_t end = std::clamp<int64_t>(slice, 0, static_cast<int64_t>(rows.size()));
  int64_t n = 0;
  for (int64_t k = 0; k < end; ++k) n += rows[static_cast<size_t>(k)];
  return n;
}

bool SplitsRows(const std::vector<int64_t>& rows, int64_t total) {
  int64_t sum = 0;
  for (int64_t n : rows) {
    if (n < 0 || n > total - sum) return false;  // total - sum >= 0 here: no overflow
    sum += n;
  }
  return sum == total;
}

std::optional<size_t> FindCollective(const Trace& trace, const CollectiveOp& c) {
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    if (!IsCollective(trace.ops[i])) continue;
    absl::StatusOr<CollectiveOp> other = CollectiveOf(trace.ops[i]);
    if (other.ok() && other->group == c.group && other->seq == c.seq) return i;
  }
  return std::nullopt;
}

void ToOpEvent(const CollectiveOp& c, OpEvent& op) {
  using K = OpArg::Kind;
  op.name = absl::StrCat(kCollectivePrefix, c.kind);
  op.overload.clear();
  op.args.assign(kArgs, OpArg());
  op.args[kInputs].kind = K::kTensors;
  op.args[kInputs].ints = AsInts(c.inputs);
  op.args[kGroup].kind = K::kText;
  op.args[kGroup].text = c.group;
  op.args[kSeq].kind = K::kInt;
  op.args[kSeq].i = c.seq;
  op.args[kPlace].kind = K::kInts;
  op.args[kPlace].ints = {c.group_rank, c.group_size, c.root};
  op.args[kSendRows].kind = op.args[kRecvRows].kind = K::kInts;
  op.args[kSendRows].ints = c.send_rows;
  op.args[kRecvRows].ints = c.recv_rows;
  op.args[kSendHashes].kind = op.args[kRecvHashes].kind = K::kInts;
  op.args[kSendHashes].ints = AsInts(c.send_hashes);
  op.args[kRecvHashes].ints = AsInts(c.recv_hashes);
}

std::string DescribeCollective(const CollectiveOp& c, absl::string_view module) {
  std::string out = absl::StrFormat("%s #%d in %s", c.kind, c.seq, c.group);
  if (!module.empty()) absl::StrAppend(&out, " (", module, ")");
  return out;
}

}  // namespace moerr::formats
