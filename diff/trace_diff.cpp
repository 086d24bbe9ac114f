#include "diff/trace_diff.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
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

absl::StatusOr<DiffReport> DiffTraces(const formats::BundleReader& reader_a, const formats::Trace& a, int64_t step_a,
                                      const formats::BundleReader& reader_b, const formats::Trace& b, int64_t step_b,
                                      const DiffOptions& options) {
  MOERR_ASSIGN_OR_RETURN(std::vector<AlignedPair> alignment, AlignTraces(a, b, options.max_edits));
  const absl::flat_hash_set<uint64_t> skip_a = formats::UninitialisedValues(a);
  const absl::flat_hash_set<uint64_t> skip_b = formats::UninitialisedValues(b);
  DiffReport report;
  report.ops.reserve(alignment.size());
  for (const AlignedPair& pair : alignment) {
    OpDiff op_diff;
    op_diff.a = pair.a;
    op_diff.b = pair.b;
    if (pair.a < 0 || pair.b < 0) {
      ++(pair.a < 0 ? report.only_b : report.only_a);
      report.ops.push_back(std::move(op_diff));
      continue;
    }
    ++report.matched;
    const formats::OpEvent& op_a = a.ops[pair.a];
    const formats::OpEvent& op_b = b.ops[pair.b];
    const size_t slots = std::min(op_a.outputs.size(), op_b.outputs.size());
    for (size_t slot = 0; slot < slots; ++slot) {
      const TensorMeta* ma = Produced(a, op_a, slot);
      const TensorMeta* mb = Produced(b, op_b, slot);
      if (ma == nullptr || mb == nullptr || skip_a.contains(ma->id) || skip_b.contains(mb->id)) continue;
      OutputDiff out;
      out.slot = slot;
      out.a_id = ma->id;
      out.b_id = mb->id;
      out.a_dtype = ma->dtype;
      out.b_dtype = mb->dtype;
      out.fingerprints = CompareFingerprints(ma->fingerprint, mb->fingerprint);
      out.nan_mismatch = out.fingerprints.nan_mismatch;
      out.inf_mismatch = out.fingerprints.inf_mismatch;
      out.error = out.fingerprints.Score();
      if (ma->shape != mb->shape) {
        out.note = "shapes differ";
        out.diverged = true;
      } else if (options.compare_bytes && !ma->leaf.empty() && !mb->leaf.empty() && !out.fingerprints.bitwise_equal) {
        MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor ta, reader_a.ReadTensor(ma->leaf, step_a));
        MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor tb, reader_b.ReadTensor(mb->leaf, step_b));
        MOERR_ASSIGN_OR_RETURN(TensorMetrics metrics, CompareTensors(ta.view(), tb.view()));
        report.bytes_compared += ta.bytes.size() + tb.bytes.size();
        ++report.tensors_compared;
        out.tensors = metrics;
        out.error = metrics.rel_l2;
        out.nan_mismatch = metrics.nan_mismatch;
        out.inf_mismatch = metrics.inf_mismatch;
      }
      // Checksums that differ say the values do, by how much no statistic
      // may say; bytes, when both sides hold them, decide instead.
      const bool by_checksum = out.fingerprints.checksums_differ && !out.tensors;
      if (by_checksum && out.note.empty()) out.note = "the dumps' checksums differ";
      out.diverged = out.diverged || out.nan_mismatch > 0 || out.inf_mismatch > 0 ||
                     out.error > options.thresholds.For(ma->dtype) || by_checksum;
      ++report.outputs_compared;
      op_diff.error = std::max(op_diff.error, out.error);
      op_diff.diverged = op_diff.diverged || out.diverged;
      op_diff.outputs.push_back(std::move(out));
    }
    if (op_diff.diverged) {
      ++report.diverged_ops;
      if (!report.first_divergence) report.first_divergence = report.ops.size();
    }
    report.ops.push_back(std::move(op_diff));
  }
  return report;
}

}  // namespace moerr::diff
