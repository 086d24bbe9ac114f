#include "analysis/first_overflow.h"

#include <cmath>
#include <limits>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "formats/dtype.h"
#include "support/check.h"

namespace moerr::analysis {
namespace {

// Output `id` of `op` when `op` produced it (not an input it returned) and
// its values are initialised; else nullptr.
const formats::TensorMeta* ProducedValues(const formats::Trace& trace, const formats::OpEvent& op, uint64_t id,
                                          const absl::flat_hash_set<uint64_t>& uninitialised) {
  const formats::TensorMeta* meta = id ? trace.Find(id) : nullptr;
  if (meta == nullptr || meta->producer != static_cast<int64_t>(op.seq) || uninitialised.contains(id)) return nullptr;
  return meta;
}

}  // namespace

double DTypeMax(formats::DType dtype) {
  switch (dtype) {
    case formats::DType::kF64: return 1.7976931348623157e308;
    case formats::DType::kF32: return 3.4028234663852886e38;
    case formats::DType::kBF16: return 3.3895313892515355e38;
    case formats::DType::kF16: return 65504.0;
    case formats::DType::kI64: return 9.223372036854775807e18;
    case formats::DType::kI32: return 2147483647.0;
    case formats::DType::kI16: return 32767.0;
    case formats::DType::kI8: return 127.0;
    case formats::DType::kU8: return 255.0;
    case formats::DType::kBool: return 1.0;
  }
  return 0;
}

absl::StatusOr<double> ParseOverflowLimit(const std::string& name) {
  if (name == "dtype") return 0.0;
  if (name == "fp16") return DTypeMax(formats::DType::kF16);
  if (name == "bf16") return DTypeMax(formats::DType::kBF16);
  return absl::InvalidArgumentError("--limit " + name + ": one of dtype, fp16 or bf16");
}

std::optional<FirstOverflow> FindFirstOverflow(const formats::Trace& trace, const OverflowOptions& options) {
  absl::flat_hash_map<uint64_t, size_t> by_seq;
  for (size_t i = 0; i < trace.ops.size(); ++i) by_seq[trace.ops[i].seq] = i;
  auto finite = [&](uint64_t id) {
    const formats::TensorMeta* meta = trace.Find(id);
    return meta == nullptr || meta->fingerprint.Finite();
  };
  const absl::flat_hash_set<uint64_t> uninitialised = formats::UninitialisedValues(trace);
  // The output of op `j` a trend shows: its first initialised, non-zero one.
  auto trend_point = [&](size_t j, double limit) -> std::optional<HeadroomPoint> {
    const formats::OpEvent& op = trace.ops[j];
    for (uint64_t out : op.outputs) {
      const formats::TensorMeta* m = ProducedValues(trace, op, out, uninitialised);
      if (m == nullptr || m->fingerprint.abs_max <= 0) continue;
      return HeadroomPoint{j, &op, m->fingerprint.abs_max, std::log2(limit / m->fingerprint.abs_max), m->dtype};
    }
    return std::nullopt;
  };
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const formats::OpEvent& op = trace.ops[i];
    bool inputs_finite = true;
    for (const formats::OpArg& a : op.args) {
      if (a.kind == formats::OpArg::Kind::kTensor) inputs_finite = inputs_finite && finite(a.i);
      if (a.kind == formats::OpArg::Kind::kTensors || a.kind == formats::OpArg::Kind::kOptionalTensors) {
        for (int64_t id : a.ints) inputs_finite = inputs_finite && (id < 0 || finite(id));
      }
      // A non-finite scalar is an input too: masked_fill(scores, mask, -inf)
      // makes infinities on purpose.
      if (a.kind == formats::OpArg::Kind::kFloat || a.kind == formats::OpArg::Kind::kWrappedFloat) inputs_finite = inputs_finite && std::isfinite(a.f);
      if (a.kind == formats::OpArg::Kind::kFloats) {
        for (double f : a.floats) inputs_finite = inputs_finite && std::isfinite(f);
      }
    }
    if (!inputs_finite) continue;
    for (uint64_t id : op.outputs) {
      const formats::TensorMeta* meta = ProducedValues(trace, op, id, uninitialised);
      if (meta == nullptr || !formats::IsFloating(meta->dtype)) continue;
      const double limit = options.limit > 0 ? options.limit : DTypeMax(meta->dtype);
      const bool beyond = options.fraction > 0 && meta->fingerprint.abs_max > options.fraction * limit;
      if (meta->fingerprint.Finite() && !beyond) continue;
      FirstOverflow found{i, &op, nullptr, id, meta->fingerprint, limit, {}};
      if (op.forward_seq >= 0) {
        if (auto it = by_seq.find(op.forward_seq); it != by_seq.end()) found.forward_op = &trace.ops[it->second];
      }
      // The trend: earlier ops of the same module in the same phase; when
      // there are none (the first backward op of a module), any module's.
      for (const bool same_module : {true, false}) {
        for (size_t j = i; j-- > 0 && found.trend.size() < 8;) {
          const formats::OpEvent& before = trace.ops[j];
          if (before.phase != op.phase || (same_module && before.module != op.module)) continue;
          if (auto point = trend_point(j, limit)) found.trend.insert(found.trend.begin(), *point);
        }
        if (!found.trend.empty()) break;
      }
      return found;
    }
  }
  return std::nullopt;
}

std::vector<HeadroomPoint> HeadroomProfile(const formats::Trace& trace, double limit) {
  const absl::flat_hash_set<uint64_t> uninitialised = formats::UninitialisedValues(trace);
  std::vector<HeadroomPoint> out;
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const formats::OpEvent& op = trace.ops[i];
    std::optional<HeadroomPoint> least;
    for (uint64_t id : op.outputs) {
      const formats::TensorMeta* m = ProducedValues(trace, op, id, uninitialised);
      if (m == nullptr || !formats::IsFloating(m->dtype)) continue;
      const formats::Fingerprint& f = m->fingerprint;
      const double range = limit > 0 ? limit : DTypeMax(m->dtype);
      const double bits = !f.Finite() ? -std::numeric_limits<double>::infinity()
                          : f.abs_max > 0 ? std::log2(range) - std::log2(f.abs_max)  // no range / abs_max: f64's overflows
                                          : std::numeric_limits<double>::quiet_NaN();
      if (std::isnan(bits)) continue;
      if (!least || bits < least->headroom_bits) {
        least = HeadroomPoint{i, &op, f.Finite() ? f.abs_max : std::numeric_limits<double>::infinity(), bits,
                              m->dtype};
      }
    }
    if (least) out.push_back(*least);
  }
  return out;
}

std::vector<PredictedOverflow> PredictOverflows(const formats::Trace& trace, formats::DType format) {
  MOERR_CHECK(format == formats::DType::kF16 || format == formats::DType::kBF16) << "a 16-bit format";
  const absl::flat_hash_set<uint64_t> uninitialised = formats::UninitialisedValues(trace);
  std::vector<PredictedOverflow> out;
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const formats::OpEvent& op = trace.ops[i];
    for (uint64_t id : op.outputs) {
      const formats::TensorMeta* meta = ProducedValues(trace, op, id, uninitialised);
      if (meta == nullptr) continue;
      const bool wider = meta->dtype == formats::DType::kF32 || meta->dtype == formats::DType::kF64 ||
                         (format == formats::DType::kF16 && meta->dtype == formats::DType::kBF16);
      const uint64_t count =
          format == formats::DType::kF16 ? meta->fingerprint.beyond_f16 : meta->fingerprint.beyond_bf16;
      if (wider && count > 0) out.push_back(PredictedOverflow{i, id, count, meta->fingerprint.abs_max});
    }
  }
  return out;
}

}  // namespace moerr::analysis
