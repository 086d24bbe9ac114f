#include "formats/trace.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/annotations.h"
#include "formats/bundle_reader.h"
#include "support/enum_table.h"
#include "support/status.h"

namespace moerr::formats {

std::map<int64_t, std::vector<int64_t>> TokensPerExpert(const std::vector<RoutingRecord>& routing) {
  std::map<int64_t, std::vector<int64_t>> counts;
  for (const RoutingRecord& r : routing) {
    std::vector<int64_t>& c = counts[r.layer];
    if (c.size() < r.token_counts.size()) c.resize(r.token_counts.size(), 0);
    for (size_t e = 0; e < r.token_counts.size(); ++e) c[e] += r.token_counts[e];
  }
  return counts;
}
namespace {

// Bitwise equality of doubles, so NaN == NaN (a replay that reproduces a NaN
// reproduces the fingerprint).
bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

bool Fingerprint::operator==(const Fingerprint& o) const {
  return numel == o.numel && SameBits(min, o.min) && SameBits(max, o.max) && SameBits(mean, o.mean) &&
         SameBits(abs_max, o.abs_max) && SameBits(l2, o.l2) && nan == o.nan && pos_inf == o.pos_inf &&
         neg_inf == o.neg_inf && beyond_f16 == o.beyond_f16 && beyond_bf16 == o.beyond_bf16 && hash == o.hash &&
         unknown == o.unknown && checksum_kind == o.checksum_kind && checksum == o.checksum;
}

constexpr EnumName<Phase> kPhases[] = {{Phase::kForward, "forward"},
                                       {Phase::kBackward, "backward"},
                                       {Phase::kOptimizer, "optimizer"},
                                       {Phase::kOther, "other"}};

absl::string_view PhaseName(Phase p) { return EnumNameOf(kPhases, p); }

constexpr EnumName<OpArg::Kind> kArgKinds[] = {
    {OpArg::Kind::kNone, "none"},       {OpArg::Kind::kTensor, "tensor"},
    {OpArg::Kind::kTensors, "tensors"}, {OpArg::Kind::kInt, "int"},
    {OpArg::Kind::kFloat, "float"},     {OpArg::Kind::kBool, "bool"},
    {OpArg::Kind::kText, "text"},       {OpArg::Kind::kInts, "ints"},
    {OpArg::Kind::kFloats, "floats"},   {OpArg::Kind::kBools, "bools"},
    {OpArg::Kind::kDevice, "device"},   {OpArg::Kind::kUnsupported, "unsupported"},
    {OpArg::Kind::kOptionalTensors, "optional_tensors"},
    {OpArg::Kind::kWrappedFloat, "wrapped_float"},
    {OpArg::Kind::kWrappedInt, "wrapped_int"},
    {OpArg::Kind::kWrappedBool, "wrapped_bool"}};

absl::string_view ArgKindName(OpArg::Kind kind) { return EnumNameOf(kArgKinds, kind); }

std::vector<uint64_t> TensorsRead(const OpEvent& op) {
  std::vector<uint64_t> out;
  for (const OpArg& a : op.args) {
    if (a.kind == OpArg::Kind::kTensor) out.push_back(static_cast<uint64_t>(a.i));
    if (a.kind == OpArg::Kind::kTensors || a.kind == OpArg::Kind::kOptionalTensors) {
      for (int64_t id : a.ints) {
        if (id >= 0) out.push_back(static_cast<uint64_t>(id));
      }
    }
  }
  return out;
}

void Trace::Index() {
  by_id_.clear();
  by_id_.reserve(tensors.size());
  for (uint32_t i = 0; i < tensors.size(); ++i) by_id_.emplace_back(tensors[i].id, i);
  std::sort(by_id_.begin(), by_id_.end());
}

const TensorMeta* Trace::Find(uint64_t id) const {
  auto it = std::lower_bound(by_id_.begin(), by_id_.end(), std::make_pair(id, uint32_t{0}));
  return it != by_id_.end() && it->first == id ? &tensors[it->second] : nullptr;
}

bool HoldsOpOutputs(const BundleReader& reader, const Trace& trace) {
  const std::optional<Recording> recording = RecordingOf(reader);
  if (recording && recording->mode == "full") return true;
  return std::any_of(trace.tensors.begin(), trace.tensors.end(), [](const TensorMeta& meta) {
    return meta.producer >= 0 && meta.leaf.rfind("act/", 0) == 0;
  });
}

absl::StatusOr<Trace> ReadTrace(const BundleReader& reader, int64_t step) {
  Trace trace;
  for (const RecordRef& ref : reader.index().records) {
    if (step >= 0 && ref.step != step) continue;
    if (ref.kind != static_cast<uint16_t>(RecordKind::kOps) && ref.kind != static_cast<uint16_t>(RecordKind::kRouting)) {
      continue;
    }
    MOERR_ASSIGN_OR_RETURN(Record record, reader.ReadRecord(ref));
    if (ref.kind == static_cast<uint16_t>(RecordKind::kRouting)) {
      trace.routing.push_back(std::move(record.routing));
      continue;
    }
    for (OpEvent& op : record.ops.ops) trace.ops.push_back(std::move(op));
    for (TensorMeta& t : record.ops.tensors) trace.tensors.push_back(std::move(t));
  }
  std::stable_sort(trace.ops.begin(), trace.ops.end(), [](const OpEvent& a, const OpEvent& b) { return a.seq < b.seq; });
  trace.Index();
  return trace;
}

bool AllocatesUninitialised(absl::string_view op) {
  return op == "aten::empty" || op == "aten::empty_like" || op == "aten::empty_strided" || op == "aten::new_empty" ||
         op == "aten::new_empty_strided";
}

absl::flat_hash_set<uint64_t> UninitialisedValues(const Trace& trace) {
  absl::flat_hash_set<uint64_t> allocating;  // seqs of ops that allocate without filling
  for (const OpEvent& op : trace.ops) {
    if (AllocatesUninitialised(op.name)) allocating.insert(op.seq);
  }
  absl::flat_hash_set<uint64_t> ids;
  // First-seen order: a view comes after the value it views.
  for (const TensorMeta& t : trace.tensors) {
    if ((t.producer >= 0 && allocating.contains(static_cast<uint64_t>(t.producer))) ||
        (t.view_of != 0 && ids.contains(t.view_of))) {
      ids.insert(t.id);
    }
  }
  return ids;
}

}  // namespace moerr::formats
