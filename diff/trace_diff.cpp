#include "diff/trace_diff.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "diff/bundle_tensor_compare.h"
#include "support/status.h"

namespace moerr::diff {
namespace {

using formats::DType;
using formats::TensorMeta;

// The outputs an op produced, by position, or nullptr for a slot that is not
// a tensor this op made (an input returned unchanged, a non-tensor).
const TensorMeta* Produced(const formats::Trace& trace, const formats::OpEvent& op, size_t slot) {
  const uint64_t id = op.outputs[slot];
  const TensorMeta* meta = id ? trace.Find(id) : nullptr;
  if (meta == nullptr || meta->producer != static_cast<int64_t>(op.seq)) return nullptr;
  return meta;
}

}  // namespace

Thresholds::Thresholds() {
  rel_l2_.fill(0);
  rel_l2_[static_cast<int>(DType::kF64)] = 1e-9;
  rel_l2_[static_cast<int>(DType::kF32)] = 1e-5;
  rel_l2_[static_cast<int>(DType::kF16)] = 2e-3;
  rel_l2_[static_cast<int>(DType::kBF16)] = 1.6e-2;
}

std::string Thresholds::Text() const {
  std::vector<std::string> parts;
  for (int d = 0; d < formats::kNumDTypes; ++d) {
    if (rel_l2_[d] > 0) parts.push_back(absl::StrFormat("%s %g", DTypeName(static_cast<DType>(d)), rel_l2_[d]));
  }
  return absl::StrJoin(parts, ", ");
}

absl::Status Thresholds::Set(absl::string_view spec) {
  const size_t eq = spec.find('=');
  double value = 0;
  if (eq == absl::string_view::npos || !absl::SimpleAtod(spec.substr(eq + 1), &value) || !(value >= 0)) {
    return absl::InvalidArgumentError(absl::StrFormat("threshold \"%s\": expected DTYPE=VALUE, e.g. f32=1e-4", spec));
  }
  const absl::string_view name = spec.substr(0, eq);
  for (int d = 0; d < formats::kNumDTypes; ++d) {
    if (formats::DTypeName(static_cast<DType>(d)) == name) {
      rel_l2_[d] = value;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat("threshold \"%s\": unknown dtype \"%s\"", spec, name));
}

namespace {

// One side of the diff: its bundle, its trace and step, and the values of it
// that were never initialised (not compared).
struct DiffSide {
  const formats::BundleReader& reader;
  const formats::Trace& trace;
  int64_t step;
  absl::flat_hash_set<uint64_t> skip;
};

// An output both bundles hold the bytes of, to compare on them.
struct ByteComparison {
  size_t op, output;  // indices into DiffReport::ops and OpDiff::outputs
  BlobPair blobs;
};

// The blob of a captured tensor, NotFound (naming it) when the bundle lacks it.
absl::StatusOr<uint32_t> BlobOf(const formats::BundleReader& reader, const std::string& leaf, int64_t step) {
  const formats::TensorInfo* tensor = reader.FindTensor(leaf, step);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrFormat("no tensor \"%s\" at step %d in the bundle", leaf, step));
  }
  return tensor->blob;
}

// A matched output's comparison on its fingerprints; its verdict comes later
// (Judge), once the bytes, if any, are compared.
OutputDiff FingerprintDiff(size_t slot, const TensorMeta& ma, const TensorMeta& mb) {
  OutputDiff out;
  out.slot = slot;
  out.a_id = ma.id;
  out.b_id = mb.id;
  out.a_dtype = ma.dtype;
  out.b_dtype = mb.dtype;
  out.fingerprints = CompareFingerprints(ma.fingerprint, mb.fingerprint);
  out.nan_mismatch = out.fingerprints.nan_mismatch;
  out.inf_mismatch = out.fingerprints.inf_mismatch;
  out.error = out.fingerprints.Score();
  if (ma.shape != mb.shape) {
    out.note = "shapes differ";
    out.diverged = true;
  }
  return out;
}

void Judge(OutputDiff& out, const Thresholds& thresholds) {
  // Checksums that differ say the values do, by how much no statistic
  // may say; bytes, when both sides hold them, decide instead.
  const bool by_checksum = out.fingerprints.checksums_differ && !out.tensors;
  if (by_checksum && out.note.empty()) out.note = "the dumps' checksums differ";
  out.diverged = out.diverged || out.nan_mismatch > 0 || out.inf_mismatch > 0 ||
                 out.error > std::max(thresholds.For(out.a_dtype), thresholds.For(out.b_dtype)) || by_checksum;
}

// The matched op pair's outputs, judged on fingerprints; those to compare on
// bytes are queued in `queue` (op index `op` in the report).
absl::Status DiffOutputs(const DiffSide& a, const DiffSide& b, const DiffOptions& options, const AlignedPair& pair,
                         size_t op, OpDiff& op_diff, std::vector<ByteComparison>& queue) {
  const formats::OpEvent& op_a = a.trace.ops[pair.a];
  const formats::OpEvent& op_b = b.trace.ops[pair.b];
  const size_t slots = std::min(op_a.outputs.size(), op_b.outputs.size());
  for (size_t slot = 0; slot < slots; ++slot) {
    const TensorMeta* ma = Produced(a.trace, op_a, slot);
    const TensorMeta* mb = Produced(b.trace, op_b, slot);
    if (ma == nullptr || mb == nullptr || a.skip.contains(ma->id) || b.skip.contains(mb->id)) continue;
    OutputDiff out = FingerprintDiff(slot, *ma, *mb);
    if (!out.diverged && options.compare_bytes && !ma->leaf.empty() && !mb->leaf.empty() &&
        !out.fingerprints.bitwise_equal) {
      MOERR_ASSIGN_OR_RETURN(const uint32_t blob_a, BlobOf(a.reader, ma->leaf, a.step));
      MOERR_ASSIGN_OR_RETURN(const uint32_t blob_b, BlobOf(b.reader, mb->leaf, b.step));
      queue.push_back(ByteComparison{op, op_diff.outputs.size(), BlobPair{blob_a, blob_b}});
    }
    op_diff.outputs.push_back(std::move(out));
  }
  return absl::OkStatus();
}

// Compares the queued outputs on their bytes, all at once (in parallel).
absl::Status CompareQueued(const formats::BundleReader& reader_a, const formats::BundleReader& reader_b,
                           const std::vector<ByteComparison>& queue, int threads, DiffReport& report) {
  std::vector<BlobPair> pairs;
  pairs.reserve(queue.size());
  for (const ByteComparison& q : queue) pairs.push_back(q.blobs);
  MOERR_ASSIGN_OR_RETURN(const std::vector<TensorMetrics> metrics,
                         CompareBlobPairs(reader_a, reader_b, pairs, threads));
  for (size_t i = 0; i < queue.size(); ++i) {
    OutputDiff& out = report.ops[queue[i].op].outputs[queue[i].output];
    report.bytes_compared += reader_a.index().blobs[queue[i].blobs.a].raw_size +
                             reader_b.index().blobs[queue[i].blobs.b].raw_size;
    ++report.tensors_compared;
    out.tensors = metrics[i];
    out.error = metrics[i].rel_l2;
    out.nan_mismatch = metrics[i].nan_mismatch;
    out.inf_mismatch = metrics[i].inf_mismatch;
  }
  return absl::OkStatus();
}

// Every output's verdict, each op's, and the report's counts of them.
void JudgeAll(const Thresholds& thresholds, DiffReport& report) {
  for (size_t i = 0; i < report.ops.size(); ++i) {
    OpDiff& op_diff = report.ops[i];
    for (OutputDiff& out : op_diff.outputs) {
      Judge(out, thresholds);
      ++report.outputs_compared;
      op_diff.error = std::max(op_diff.error, out.error);
      op_diff.diverged = op_diff.diverged || out.diverged;
    }
    if (op_diff.diverged) {
      ++report.diverged_ops;
      if (!report.first_divergence) report.first_divergence = i;
    }
  }
}

}  // namespace

absl::StatusOr<DiffReport> DiffTraces(const formats::BundleReader& reader_a, const formats::Trace& a, int64_t step_a,
                                      const formats::BundleReader& reader_b, const formats::Trace& b, int64_t step_b,
                                      const DiffOptions& options) {
  MOERR_ASSIGN_OR_RETURN(std::vector<AlignedPair> alignment, AlignTraces(a, b, options.max_edits));
  const DiffSide side_a{reader_a, a, step_a, formats::UninitialisedValues(a)};
  const DiffSide side_b{reader_b, b, step_b, formats::UninitialisedValues(b)};
  DiffReport report;
  report.ops.reserve(alignment.size());
  std::vector<ByteComparison> queue;
  for (const AlignedPair& pair : alignment) {
    OpDiff op_diff;
    op_diff.a = pair.a;
    op_diff.b = pair.b;
    if (pair.a < 0 || pair.b < 0) {
      ++(pair.a < 0 ? report.only_b : report.only_a);
    } else {
      ++report.matched;
      MOERR_RETURN_IF_ERROR(DiffOutputs(side_a, side_b, options, pair, report.ops.size(), op_diff, queue));
    }
    report.ops.push_back(std::move(op_diff));
  }
  MOERR_RETURN_IF_ERROR(CompareQueued(reader_a, reader_b, queue, options.threads, report));
  JudgeAll(options.thresholds, report);
  return report;
}

}  // namespace moerr::diff
