#include "replayer/program_replay.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "recorder/fingerprint.h"
#include "replayer/first_overflow.h"
#include "recorder/tensor_adapter.h"
#include "support/status.h"
#include "support/torch_boundary.h"

namespace moerr::replayer {
namespace {

using formats::OpArg;


class Replay {
 public:
  Replay(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace, const ReplayOptions& options)
      : reader_(reader), step_(step), trace_(trace), options_(options) {}

  // The replayed value of tensor `id`: a replayed output, a leaf from the
  // bundle, or a view into another value's storage.
  absl::StatusOr<at::Tensor> Value(uint64_t id) {
    if (auto it = values_.find(id); it != values_.end()) return it->second;
    const formats::TensorMeta* meta = trace_.Find(id);
    if (meta == nullptr) return absl::DataLossError(absl::StrFormat("tensor %d has no metadata", id));
    at::Tensor t;
    if (!meta->leaf.empty()) {
      MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor owned, reader_.ReadTensor(meta->leaf, step_));
      // The bundle stores values contiguous; the op saw them with these
      // strides, and views of them (and their fingerprints) depend on it.
      const at::Tensor values = recorder::ToTensor(owned.view());
      t = at::empty_strided(meta->shape, meta->strides, values.options().device(options_.device));
      t.copy_(values);
      fingerprints_[id] = recorder::KnownFingerprint{meta->fingerprint, true};
    } else if (meta->view_of != 0 && meta->producer < 0) {
      MOERR_ASSIGN_OR_RETURN(at::Tensor base, Value(meta->view_of));
      t = base.as_strided(meta->shape, meta->strides, meta->storage_offset);
      fingerprints_[id] = recorder::KnownFingerprint{recorder::ComputeFingerprint(t), true};
    } else {
      return absl::FailedPreconditionError(absl::StrFormat(
          "tensor %d is read before any op produced it and its bytes are not in the bundle (a stats bundle "
          "cannot be replayed; record with --record replayable)",
          id));
    }
    values_[id] = t;
    return t;
  }

  absl::StatusOr<c10::IValue> ToIValue(const OpArg& a, std::vector<recorder::ViewSource>& sources) {
    switch (a.kind) {
      case OpArg::Kind::kNone: return c10::IValue();
      case OpArg::Kind::kTensor: {
        MOERR_ASSIGN_OR_RETURN(at::Tensor t, Value(a.i));
        if (auto s = recorder::SourceOf(t, a.i)) sources.push_back(*s);
        return c10::IValue(t);
      }
      case OpArg::Kind::kTensors: {
        std::vector<at::Tensor> list;
        for (int64_t id : a.ints) {
          MOERR_ASSIGN_OR_RETURN(at::Tensor t, Value(id));
          list.push_back(t);
        }
        return c10::IValue(list);
      }
      case OpArg::Kind::kOptionalTensors: {
        c10::List<c10::optional<at::Tensor>> list;
        for (int64_t id : a.ints) {
          if (id < 0) {
            list.push_back(c10::nullopt);
            continue;
          }
          MOERR_ASSIGN_OR_RETURN(at::Tensor t, Value(id));
          list.push_back(t);
        }
        return c10::IValue(list);
      }
      case OpArg::Kind::kInt: return c10::IValue(a.i);
      case OpArg::Kind::kFloat: return c10::IValue(a.f);
      case OpArg::Kind::kBool: return c10::IValue(a.i != 0);
      case OpArg::Kind::kText: return c10::IValue(a.text);
      case OpArg::Kind::kInts: return c10::IValue(a.ints);
      case OpArg::Kind::kFloats: return c10::IValue(a.floats);
      case OpArg::Kind::kBools: {
        c10::List<bool> list;
        for (int64_t b : a.ints) list.push_back(b != 0);
        return c10::IValue(list);
      }
      case OpArg::Kind::kDevice: return c10::IValue(c10::Device(a.text));
      case OpArg::Kind::kUnsupported: break;
    }
    return absl::UnimplementedError(absl::StrFormat("argument of kind %s cannot be re-dispatched", a.text));
  }

  // Records the replayed `output` for `id`, and compares its fingerprint
  // with the record when this op produced it.
  void Output(size_t index, const formats::OpEvent& op, uint64_t id, const at::Tensor& output,
              const std::vector<recorder::ViewSource>& sources, ReplayReport& report) {
    if (id == 0 || !output.defined()) return;
    const formats::TensorMeta* meta = trace_.Find(id);
    values_[id] = output;
    if (meta == nullptr || meta->producer != static_cast<int64_t>(op.seq)) return;
    recorder::KnownFingerprint fp{recorder::ComputeFingerprint(output), true};
    if (meta->view_of != 0) {
      if (const recorder::ViewSource* in = recorder::ViewedInput(output, sources)) {
        if (auto base = fingerprints_.find(in->id); base != fingerprints_.end()) {
          fp = recorder::DeriveViewFingerprint(base->second, *in, output);
        }
      }
    }
    fingerprints_[id] = fp;
    // Uninitialised memory, or a view of it: nothing to compare until an op
    // writes it (which makes a new version, so a new id).
    if (AllocatesUninitialised(op.name) || (meta->view_of != 0 && uninitialised_.contains(meta->view_of))) {
      uninitialised_.insert(id);
      return;
    }
    report.fingerprints.emplace_back(id, fp.fingerprint);
    ++report.compared;
    if (fp.fingerprint == meta->fingerprint) return;
    ++report.mismatched;
    if (!report.first_divergence) {
      report.first_divergence = Divergence{index, op, id, meta->fingerprint, fp.fingerprint};
    }
  }

  absl::Status Run(ReplayReport& report) {
    at::DisableRecordFunctionGuard no_record;  // a replay is not a recording
    c10::NoGradGuard no_grad;
    struct AutocastRestore {
      bool enabled = at::autocast::is_cpu_enabled();
      at::ScalarType dtype = at::autocast::get_autocast_cpu_dtype();
      ~AutocastRestore() {
        at::autocast::set_cpu_enabled(enabled);
        at::autocast::set_autocast_cpu_dtype(dtype);
        at::autocast::clear_cache();
      }
    } restore;
    for (size_t index = 0; index < trace_.ops.size(); ++index) {
      const formats::OpEvent& op = trace_.ops[index];
      const std::string where = absl::StrFormat("op %d (%s, %s, %s)", index, op.name, formats::PhaseName(op.phase),
                                                op.module.empty() ? "no module" : op.module);
      // Random ops: their outputs were captured; take them from the record.
      bool recorded_outputs = !op.outputs.empty();
      for (uint64_t id : op.outputs) {
        const formats::TensorMeta* meta = trace_.Find(id);
        recorded_outputs = recorded_outputs && id != 0 && meta != nullptr && meta->leaf.rfind("rng/", 0) == 0;
      }
      if (recorded_outputs) {
        for (uint64_t id : op.outputs) {
          MOERR_ASSIGN_OR_RETURN(at::Tensor t, Value(id));
          (void)t;
        }
        ++report.from_record;
        continue;
      }
      auto handle = c10::Dispatcher::singleton().findSchema(c10::OperatorName(op.name, op.overload));
      if (!handle) return absl::UnimplementedError(where + ": no such operator in this LibTorch");
      std::vector<c10::IValue> stack;
      std::vector<recorder::ViewSource> sources;
      for (const OpArg& a : op.args) {
        auto v = ToIValue(a, sources);
        if (!v.ok()) return Annotate(v.status(), where);
        stack.push_back(*std::move(v));
      }
      // The CPU autocast state the op ran under (bf16 training casts inside ops).
      at::autocast::set_cpu_enabled(op.autocast >= 0);
      if (op.autocast >= 0) {
        at::autocast::set_autocast_cpu_dtype(recorder::ToScalarType(static_cast<formats::DType>(op.autocast)));
      }
      MOERR_RETURN_IF_ERROR(CatchTorch(where, [&] {
        handle->callBoxed(&stack);
        return absl::OkStatus();
      }));
      ++report.dispatched;
      // Outputs: tensors and tensor lists, flattened as the recorder did.
      size_t o = 0;
      for (const c10::IValue& v : stack) {
        if (v.isTensor()) {
          if (o < op.outputs.size()) Output(index, op, op.outputs[o++], v.toTensor(), sources, report);
        } else if (v.isTensorList()) {
          for (const at::Tensor& t : v.toTensorVector()) {
            if (o < op.outputs.size()) Output(index, op, op.outputs[o++], t, sources, report);
          }
        } else {
          ++o;
        }
      }
      if (options_.stop_at_first_divergence && report.first_divergence) break;
    }
    return absl::OkStatus();
  }

 private:
  const formats::BundleReader& reader_;
  int64_t step_;
  const formats::Trace& trace_;
  ReplayOptions options_;
  absl::flat_hash_map<uint64_t, at::Tensor> values_;
  absl::flat_hash_map<uint64_t, recorder::KnownFingerprint> fingerprints_;
  absl::flat_hash_set<uint64_t> uninitialised_;  // ids whose values are uninitialised memory
};

}  // namespace

absl::StatusOr<ReplayReport> ReplayStep(const formats::BundleReader& reader, int64_t step,
                                        const ReplayOptions& options) {
  MOERR_ASSIGN_OR_RETURN(formats::Trace trace, formats::ReadTrace(reader, step));
  if (trace.ops.empty()) return absl::NotFoundError(absl::StrFormat("step %d has no recorded ops", step));
  ReplayReport report;
  report.step = step;
  report.ops = trace.ops.size();
  Replay replay(reader, step, trace, options);
  MOERR_RETURN_IF_ERROR(replay.Run(report));
  return report;
}

}  // namespace moerr::replayer
