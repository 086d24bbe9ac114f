#include "formats/collective_op.h"

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
