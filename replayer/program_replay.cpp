#include "replayer/program_replay.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/annotations.h"
#include "formats/collective_op.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "replayer/boxed_call.h"
#include "replayer/introduced_error.h"
#include "replayer/policy_casts.h"
#include "replayer/recorded_threads.h"
#include "replayer/reference_run.h"
#include "support/seconds_since.h"
#include "support/status.h"
#include "recorder/hooks/torch_boundary.h"

namespace moerr::replayer {
namespace {

using formats::OpArg;

// How an output is judged against the record: bitwise; within the dtype's
// tolerance (an op recorded on another device type); or within tolerance,
// the ops after it reading the recorded value when the bundle holds it (a
// reference's output, so one reference's rounding does not spread).
enum class Judge { kBitwise, kTolerance, kReference };

// Whether `op` is not re-executed but served from the record (its outputs
// are leaves of the bundle): an op this LibTorch does not have (`known`
// false; "ext/<id>"), or a collective, whose other ranks are not here
// ("recv/<id>"). One predicate decides, for every kind of op that cannot run
// here.
bool ServedFromRecord(const formats::OpEvent& op, bool known) { return !known || formats::IsCollective(op); }

class Replay {
 public:
  Replay(const formats::BundleReader& reader, int64_t step, const formats::Trace& trace, const ReplayOptions& options)
      : reader_(reader), step_(step), trace_(trace), options_(options), dead_after_(trace.ops.size()) {
    // Each value is dropped after the last op that reads it (or produces it,
    // when none reads it), so the allocator reuses memory as the program did.
    absl::flat_hash_map<uint64_t, size_t> last_use;
    for (size_t i = 0; i < trace.ops.size(); ++i) {
      for (uint64_t id : formats::TensorsRead(trace.ops[i])) last_use[id] = i;
      for (uint64_t id : trace.ops[i].outputs) last_use.try_emplace(id, i);
    }
    // A view first read without a producer is made from its base on demand:
    // the base lives as long as the view may still be made.
    for (auto it = trace.tensors.rbegin(); it != trace.tensors.rend(); ++it) {
      if (it->view_of == 0 || it->producer >= 0) continue;
      auto view = last_use.find(it->id);
      if (view == last_use.end()) continue;
      size_t& base = last_use[it->view_of];
      base = std::max(base, view->second);
    }
    for (const auto& [id, op] : last_use) dead_after_[op].push_back(id);
  }

  // The replayed value of tensor `id`: a replayed output, a leaf from the
  // bundle, or a view into another value's storage.
  // `produced_view`: a view an op produced may be rebuilt from its base too
  // (the outputs of an op served from the record).
  absl::StatusOr<at::Tensor> Value(uint64_t id, bool produced_view = false) {
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
      if (t.is_non_overlapping_and_dense()) {
        t.copy_(values);
      } else {  // an expanded or overlapping view: its elements, contiguous
        t = values.to(options_.device);
      }
      fingerprints_[id] = recorder::KnownFingerprint{meta->fingerprint, true};
    } else if (meta->view_of != 0 && (meta->producer < 0 || produced_view)) {
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
    Capture(id, t);
    return t;
  }

  // Keeps a copy of `t` as tensor `id` when ReplayOptions::capture asks for it.
  void Capture(uint64_t id, const at::Tensor& t) {
    if (captured_ == nullptr || options_.capture == nullptr || !options_.capture->count(id)) return;
    captured_->try_emplace(id, t.detach().clone());
  }

  // The value of input tensor `id` for an op under `rule` (or none).
  absl::StatusOr<at::Tensor> Input(uint64_t id, const PolicyRule* rule) {
    if (probing_) {  // zeros of the recorded shape and dtype (ProbeReference)
      const formats::TensorMeta* meta = trace_.Find(id);
      if (meta == nullptr) return absl::DataLossError(absl::StrFormat("tensor %d has no metadata", id));
      return at::zeros(meta->shape, at::TensorOptions().dtype(recorder::ToScalarType(meta->dtype)));
    }
    MOERR_ASSIGN_OR_RETURN(at::Tensor t, Value(id));
    return CoerceInput(t, trace_.Find(id), rule);
  }

  // A Python number as the recorded op saw it (formats::OpArg::kWrappedFloat):
  // a 0-dim CPU tensor that type promotion ranks as a number.
  static at::Tensor WrappedNumber(at::Tensor t) {
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  }

  // A Scalar[] argument takes a list typed as Scalars: a list of ints or
  // floats is not one to the dispatcher's unboxing.
  static bool IsScalarList(const c10::Argument* schema_arg) {
    if (schema_arg == nullptr) return false;
    const auto list = schema_arg->real_type()->cast<c10::ListType>();
    return list != nullptr && list->getElementType()->kind() == c10::TypeKind::NumberType;
  }
  template <typename T>
  static c10::IValue ScalarList(const std::vector<T>& values) {
    c10::List<at::Scalar> list;
    for (T v : values) list.push_back(at::Scalar(v));
    return c10::IValue(list);
  }

  absl::StatusOr<c10::IValue> ToIValue(const OpArg& a, const c10::Argument* schema_arg, const PolicyRule* rule,
                                       std::vector<recorder::ViewSource>& sources) {
    switch (a.kind) {
      case OpArg::Kind::kNone: return c10::IValue();
      case OpArg::Kind::kTensor: {
        MOERR_ASSIGN_OR_RETURN(at::Tensor t, Input(a.i, rule));
        if (auto s = recorder::SourceOf(t, a.i)) sources.push_back(*s);
        return c10::IValue(t);
      }
      case OpArg::Kind::kTensors: {
        std::vector<at::Tensor> list;
        for (int64_t id : a.ints) {
          MOERR_ASSIGN_OR_RETURN(at::Tensor t, Input(id, rule));
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
          MOERR_ASSIGN_OR_RETURN(at::Tensor t, Input(id, rule));
          list.push_back(t);
        }
        return c10::IValue(list);
      }
      case OpArg::Kind::kInt: return c10::IValue(CoerceIntArgument(a.i, schema_arg, rule));
      case OpArg::Kind::kFloat: return c10::IValue(a.f);
      case OpArg::Kind::kBool: return c10::IValue(a.i != 0);
      case OpArg::Kind::kText: return c10::IValue(a.text);
      case OpArg::Kind::kInts:
        return IsScalarList(schema_arg) ? ScalarList(a.ints) : c10::IValue(a.ints);
      case OpArg::Kind::kFloats:
        return IsScalarList(schema_arg) ? ScalarList(a.floats) : c10::IValue(a.floats);
      case OpArg::Kind::kBools: {
        c10::List<bool> list;
        for (int64_t b : a.ints) list.push_back(b != 0);
        return c10::IValue(list);
      }
      case OpArg::Kind::kDevice: return c10::IValue(c10::Device(a.text));
      case OpArg::Kind::kWrappedFloat: return c10::IValue(WrappedNumber(at::scalar_tensor(a.f, at::kDouble)));
      case OpArg::Kind::kWrappedInt: return c10::IValue(WrappedNumber(at::scalar_tensor(a.i, at::kLong)));
      case OpArg::Kind::kWrappedBool: return c10::IValue(WrappedNumber(at::scalar_tensor(a.i != 0, at::kBool)));
      case OpArg::Kind::kUnsupported: break;
    }
    return absl::UnimplementedError(absl::StrFormat("argument of kind %s cannot be re-dispatched", a.text));
  }

  // Records the replayed `output` for `id`, and compares its fingerprint
  // with the record when this op produced it, as `judge` says.
  absl::Status Output(size_t index, const formats::OpEvent& op, uint64_t id, const at::Tensor& output,
                      const std::vector<recorder::ViewSource>& sources, ReplayReport& report,
                      Judge judge = Judge::kBitwise) {
    if (id == 0 || !output.defined()) return absl::OkStatus();
    const formats::TensorMeta* meta = trace_.Find(id);
    // Isolated: the next op reads the recorded value, not this one.
    const bool recorded_value =
        (options_.isolated || judge == Judge::kReference) && meta != nullptr && !meta->leaf.empty();
    if (!recorded_value) Capture(id, values_[id] = output);
    if (meta == nullptr || meta->producer != static_cast<int64_t>(op.seq)) return absl::OkStatus();
    // A dense view of exactly an input's elements takes its fingerprint from
    // the input, as the recorder does: no pass over the values.
    std::optional<recorder::KnownFingerprint> derived;
    if (meta->view_of != 0) {
      if (const recorder::ViewSource* in = recorder::ViewedInput(output, sources)) {
        if (auto base = fingerprints_.find(in->id); base != fingerprints_.end()) {
          derived = recorder::DeriveViewFingerprint(base->second, *in, output);
        }
      }
    }
    const recorder::KnownFingerprint fp = derived ? *derived : recorder::KnownFingerprint{recorder::ComputeFingerprint(output), true};
    fingerprints_[id] = fp;
    if (uninitialised_.contains(id)) return absl::OkStatus();  // nothing to compare
    MOERR_ASSIGN_OR_RETURN(formats::DType dtype, recorder::ToDType(output.scalar_type()));
    report.outputs.push_back(ReplayedOutput{id, dtype, fp.fingerprint});
    ++report.compared;
    if (fp.fingerprint == meta->fingerprint) return absl::OkStatus();
    if (judge != Judge::kBitwise) {
      const diff::FingerprintDelta delta = diff::CompareFingerprints(meta->fingerprint, fp.fingerprint);
      if (delta.nan_mismatch == 0 && delta.inf_mismatch == 0 &&
          delta.Score() <= options_.tolerances.For(meta->dtype)) {
        ++report.within_tolerance;
        return absl::OkStatus();
      }
    }
    ++report.mismatched;
    if (!report.first_divergence) {
      report.first_divergence = Divergence{index, op, id, meta->fingerprint, fp.fingerprint};
    }
    if (recorded_value) {
      MOERR_ASSIGN_OR_RETURN(formats::OwnedTensor recorded, reader_.ReadTensor(meta->leaf, step_));
      const at::Tensor replayed = output.device().is_cpu() ? output : output.cpu();
      MOERR_ASSIGN_OR_RETURN(formats::TensorView view, recorder::ViewOf(replayed));
      auto metrics = diff::CompareTensors(recorded.view(), view);
      if (metrics.ok()) report.errors.push_back(OutputError{index, id, *metrics});
    }
    return absl::OkStatus();
  }

  // Re-executes op `index` through the dispatcher (under the policy's rule
  // for it, in the autocast state it ran under) and judges its outputs.
  absl::Status Dispatch(size_t index, const formats::OpEvent& op, const c10::OperatorHandle& handle,
                        ReplayReport& report) {
    const PolicyRule* rule = options_.policy.Match(op);
    if (rule != nullptr) ++report.policy_ops;
    const Judge judge = OtherDevice(op) ? Judge::kTolerance : Judge::kBitwise;
    if (judge == Judge::kTolerance) {
      ++report.other_device;
      report.recorded_devices.insert(op.device);
    }
    const std::vector<c10::Argument>& schema_args = handle.schema().arguments();
    std::vector<c10::IValue> stack;
    std::vector<recorder::ViewSource> sources;
    for (size_t i = 0; i < op.args.size(); ++i) {
      auto v = ToIValue(op.args[i], i < schema_args.size() ? &schema_args[i] : nullptr, rule, sources);
      if (!v.ok()) {
        return Annotate(v.status(), absl::StrFormat("op %d %s, argument %d%s", op.seq, op.name, i,
                                                             i < schema_args.size() ? " (" + schema_args[i].name() + ")" : ""));
      }
      stack.push_back(*std::move(v));
    }
    std::vector<c10::IValue> exact;  // taken before the call, which may write its inputs
    if (options_.introduced && Measurable(trace_, op)) {
      MOERR_ASSIGN_OR_RETURN(exact, ExactStack(op, schema_args));
    }
    // The CPU autocast state the op ran under (bf16 training casts inside
    // ops); an upcast op runs without it.
    const bool autocast = op.autocast >= 0 && !(rule != nullptr && rule->Upcast());
    at::autocast::set_autocast_enabled(at::kCPU, autocast);
    if (autocast) {
      at::autocast::set_autocast_dtype(at::kCPU, recorder::ToScalarType(static_cast<formats::DType>(op.autocast)));
    }
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<at::Tensor>> outputs = CallBoxed(handle, std::move(stack));
    report.dispatch_seconds += SecondsSince(start);
    MOERR_RETURN_IF_ERROR(outputs.status());
    ++report.dispatched;
    const bool round = rule != nullptr && !rule->Upcast();
    for (size_t o = 0; o < outputs->size() && o < op.outputs.size(); ++o) {
      const at::Tensor& t = (*outputs)[o];
      MOERR_RETURN_IF_ERROR(
          Output(index, op, op.outputs[o], round ? RoundOutput(t, rule->action) : t, sources, report, judge));
    }
    if (exact.empty()) return absl::OkStatus();
    return MeasureIntroduced(reader_, step_, trace_, index, handle, std::move(exact), *outputs, report);
  }

  // The arguments of `op` for its fp64 run (MeasureIntroduced): floating
  // inputs and dtype arguments widened, the tensors it writes copied so
  // that the run leaves the replay's values alone.
  absl::StatusOr<std::vector<c10::IValue>> ExactStack(const formats::OpEvent& op,
                                                      const std::vector<c10::Argument>& schema_args) {
    static const PolicyRule kExact{PolicyRule::Selector::kTree, "", PolicyRule::Action::kFp64};
    std::vector<c10::IValue> stack;
    std::vector<recorder::ViewSource> unused;
    for (size_t i = 0; i < op.args.size(); ++i) {
      const c10::Argument* schema_arg = i < schema_args.size() ? &schema_args[i] : nullptr;
      MOERR_ASSIGN_OR_RETURN(c10::IValue v, ToIValue(op.args[i], schema_arg, &kExact, unused));
      const bool written = schema_arg != nullptr && schema_arg->alias_info() != nullptr && schema_arg->alias_info()->isWrite();
      stack.push_back(written ? CopyTensors(v) : std::move(v));
    }
    return stack;
  }

  absl::Status Run(ReplayReport& report) {
    at::DisableRecordFunctionGuard no_record;  // a replay is not a recording
    c10::NoGradGuard no_grad;
    struct AutocastRestore {
      bool enabled = at::autocast::is_autocast_enabled(at::kCPU);
      at::ScalarType dtype = at::autocast::get_autocast_dtype(at::kCPU);
      ~AutocastRestore() {
        at::autocast::set_autocast_enabled(at::kCPU, enabled);
        at::autocast::set_autocast_dtype(at::kCPU, dtype);
        at::autocast::clear_cache();
      }
    } restore;
    captured_ = &report.captured;
    const size_t end = std::min(trace_.ops.size(), options_.end_op);
    for (size_t index = 0; index < end; ++index) {
      if (index > 0) {
        for (uint64_t id : dead_after_[index - 1]) values_.erase(id);
      }
      const formats::OpEvent& op = trace_.ops[index];
      auto where = [&] {
        return absl::StrFormat("op %d (%s, %s, %s)", index, op.name, formats::PhaseName(op.phase),
                               op.module.empty() ? "no module" : op.module);
      };
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
      const c10::optional<c10::OperatorHandle>& handle = Operator(op);
      if (Reference(op) != nullptr) {
        MOERR_RETURN_IF_ERROR(Annotate(RunReference(index, op, handle, report), where()));
        if (options_.stop_at_first_divergence && report.first_divergence) break;
        continue;
      }
      if (ServedFromRecord(op, handle.has_value())) {
        MOERR_RETURN_IF_ERROR(Annotate(ServeFromRecord(op, report), where() + ", not re-executed"));
        continue;
      }
      MOERR_RETURN_IF_ERROR(Annotate(Dispatch(index, op, *handle, report), where()));
      if (options_.stop_at_first_divergence && report.first_divergence) break;
    }
    return absl::OkStatus();
  }

  // The ops of [0, end) that would be served from the record but whose
  // outputs the bundle does not hold (a stats bundle), all of them in one
  // error, by name and phase; OK when there are none. Among them the calls
  // whose reference refuses them, which ProbeReference finds: their outputs
  // cannot come from the reference either.
  absl::Status CheckServable() {
    // ("name in phase", the reference's refusal or "") -> op indices
    std::map<std::pair<std::string, std::string>, std::vector<size_t>> blocking;
    size_t count = 0;
    const size_t end = std::min(trace_.ops.size(), options_.end_op);
    for (size_t index = 0; index < end; ++index) {
      const formats::OpEvent& op = trace_.ops[index];
      const bool referenced = Reference(op) != nullptr;
      if (!referenced && !ServedFromRecord(op, Operator(op).has_value())) continue;
      const bool held = std::all_of(op.outputs.begin(), op.outputs.end(), [&](uint64_t id) {
        const formats::TensorMeta* meta = trace_.Find(id);
        return id == 0 || (meta != nullptr && (!meta->leaf.empty() || meta->view_of != 0));
      });
      if (held) continue;
      std::string refusal;
      if (referenced) {
        refusal = ProbeReference(op);
        if (refusal.empty()) continue;
      }
      blocking[{absl::StrFormat("%s in %s", op.name, formats::PhaseName(op.phase)), refusal}].push_back(index);
      ++count;
    }
    if (count == 0) return absl::OkStatus();
    std::vector<std::string> parts;
    constexpr size_t kListed = 8;  // kinds of op named; the rest are counted
    for (const auto& [what, ops] : blocking) {
      if (parts.size() == kListed) {
        parts.push_back(absl::StrFormat("and %d more kinds", blocking.size() - kListed));
        break;
      }
      constexpr size_t kIndices = 10;  // op indices shown per kind
      std::string indices = absl::StrJoin(ops.begin(), ops.begin() + std::min(ops.size(), kIndices), ", ");
      if (ops.size() > kIndices) absl::StrAppend(&indices, ", ... ", ops.size() - kIndices, " more");
      parts.push_back(absl::StrFormat("%s (op%s %s)%s", what.first, ops.size() > 1 ? "s" : "", indices,
                                      what.second.empty() ? "" : ": the reference refused: " + what.second));
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "%d op%s of step %d cannot be replayed: they cannot run here (ops this LibTorch does not have, calls their "
        "reference refuses, or collectives) and the bundle holds none of their outputs (record with --record "
        "replayable or full, or give each a reference with --reference OP=FILE): %s",
        count, count > 1 ? "s" : "", step_, absl::StrJoin(parts, "; ")));
  }

 private:
  const formats::BundleReader& reader_;
  int64_t step_;
  const formats::Trace& trace_;
  ReplayOptions options_;
  absl::flat_hash_map<uint64_t, at::Tensor> values_;
  std::vector<std::vector<uint64_t>> dead_after_;  // per op index: values no later op reads
  absl::flat_hash_map<uint64_t, recorder::KnownFingerprint> fingerprints_;
  const absl::flat_hash_set<uint64_t> uninitialised_ = formats::UninitialisedValues(trace_);
  const std::string replay_device_ = c10::DeviceTypeName(options_.device.type(), /*lower_case=*/true);
  // Dispatcher lookups by "name.overload": a step calls a few hundred
  // distinct operators tens of thousands of times.
  absl::flat_hash_map<std::string, c10::optional<c10::OperatorHandle>> operators_;
  bool probing_ = false;  // Input gives zeros of the recorded shapes (ProbeReference)
  std::map<uint64_t, at::Tensor>* captured_ = nullptr;  // the report's, during Run

  // Whether `op` ran on another device type than this replay (a bundle
  // from before device types were recorded says none: as here).
  bool OtherDevice(const formats::OpEvent& op) const {
    return !op.device.empty() && op.device != replay_device_;
  }

  const OpReferences::Info* Reference(const formats::OpEvent& op) const {
    return options_.references == nullptr ? nullptr : options_.references->Find(op.name);
  }

  // Runs `op` through its reference, without autocast; its outputs are cast
  // to their recorded dtypes and compared within tolerance.
  absl::Status RunReference(size_t index, const formats::OpEvent& op,
                            const c10::optional<c10::OperatorHandle>& handle, ReplayReport& report) {
    const PolicyRule* rule = options_.policy.Match(op);
    if (rule != nullptr) ++report.policy_ops;
    std::vector<c10::IValue> args;
    std::vector<recorder::ViewSource> sources;
    MOERR_RETURN_IF_ERROR(ReferenceArgs(op, handle, rule, args, sources));
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<at::Tensor>> ran = RunReferenceOf(*options_.references, op, args);
    report.dispatch_seconds += SecondsSince(start);
    if (!ran.ok()) {
      // Refused: the call is served from the record, as an op without a
      // reference is; replay goes on.
      const std::string reason = RefusalReason(ran.status());
      report.refused.push_back(RefusedCall{index, op.name, reason});
      return Annotate(ServeFromRecord(op, report),
                      absl::StrCat("its reference refused it (", reason, ") and it is not re-executed"));
    }
    std::vector<at::Tensor>& outputs = *ran;
    ++report.by_reference;
    for (size_t o = 0; o < outputs.size(); ++o) {
      const formats::TensorMeta* meta = trace_.Find(op.outputs[o]);
      at::Tensor& t = outputs[o];
      if (meta != nullptr && t.defined() && t.is_floating_point()) t = t.to(recorder::ToScalarType(meta->dtype));
      MOERR_RETURN_IF_ERROR(Output(index, op, op.outputs[o], t, sources, report, Judge::kReference));
    }
    if (!options_.isolated) return absl::OkStatus();
    return CheckAgainstReference(index, op, args, outputs, report);
  }

  // Isolated replay: each recorded floating output of `op` against the
  // reference's fp64 run on the same inputs, beside the reference's own
  // distance from it (`outputs`, its run in the recorded dtypes).
  absl::Status CheckAgainstReference(size_t index, const formats::OpEvent& op, const std::vector<c10::IValue>& args,
                                     const std::vector<at::Tensor>& outputs, ReplayReport& report) {
    std::vector<c10::IValue> wide;
    for (const c10::IValue& v : args) wide.push_back(Widen(v));
    const absl::StatusOr<std::vector<at::Tensor>> ran = options_.references->Run(op.name, wide);
    if (!ran.ok()) {  // no verdict without the fp64 run
      report.refused.push_back(RefusedCall{index, op.name, RefusalReason(ran.status()) + " (its fp64 run)"});
      return absl::OkStatus();
    }
    const std::vector<at::Tensor>& exact = *ran;
    const uint64_t allowance = Reference(op)->ulps;
    for (size_t o = 0; o < outputs.size() && o < exact.size(); ++o) {
      const formats::TensorMeta* meta = trace_.Find(op.outputs[o]);
      if (meta == nullptr || meta->leaf.empty() || !outputs[o].is_floating_point()) continue;
      MOERR_ASSIGN_OR_RETURN(const formats::OwnedTensor recorded, reader_.ReadTensor(meta->leaf, step_));
      MOERR_ASSIGN_OR_RETURN(ReferenceCheck c, JudgeAgainstReference(recorded.view(), exact[o], outputs[o], allowance));
      c.op_index = index;
      c.slot = o;
      c.output = op.outputs[o];
      c.dtype = meta->dtype;
      report.reference_checks.push_back(c);
    }
    return absl::OkStatus();
  }

  // Feeds the recorded outputs of `op` to the ops after it (it is not
  // re-executed).
  absl::Status ServeFromRecord(const formats::OpEvent& op, ReplayReport& report) {
    for (uint64_t id : op.outputs) {
      if (id == 0) continue;
      MOERR_ASSIGN_OR_RETURN(at::Tensor t, Value(id, /*produced_view=*/true));
      (void)t;
    }
    ++report.not_reexecuted;
    ++report.not_reexecuted_ops[op.name];
    return absl::OkStatus();
  }

  // The arguments of `op` for its reference, under `rule`.
  absl::Status ReferenceArgs(const formats::OpEvent& op, const c10::optional<c10::OperatorHandle>& handle,
                             const PolicyRule* rule, std::vector<c10::IValue>& args,
                             std::vector<recorder::ViewSource>& sources) {
    const std::vector<c10::Argument>* schema_args = handle ? &handle->schema().arguments() : nullptr;
    for (size_t i = 0; i < op.args.size(); ++i) {
      const c10::Argument* schema_arg =
          schema_args != nullptr && i < schema_args->size() ? &(*schema_args)[i] : nullptr;
      MOERR_ASSIGN_OR_RETURN(c10::IValue v, ToIValue(op.args[i], schema_arg, rule, sources));
      args.push_back(std::move(v));
    }
    return absl::OkStatus();
  }

  // Whether the reference of `op` refuses the call, judged on zeros of the
  // recorded shapes and dtypes with the recorded options (where the bundle
  // holds no values: a stats bundle): its reason, or "" when it runs.
  std::string ProbeReference(const formats::OpEvent& op) {
    at::DisableRecordFunctionGuard no_record;
    c10::NoGradGuard no_grad;
    const bool autocast = at::autocast::is_autocast_enabled(at::kCPU);  // RunReferenceOf turns it off
    probing_ = true;
    const absl::Status status = CatchTorch("probe", [&] {
      std::vector<c10::IValue> args;
      std::vector<recorder::ViewSource> sources;
      MOERR_RETURN_IF_ERROR(ReferenceArgs(op, Operator(op), nullptr, args, sources));
      return RunReferenceOf(*options_.references, op, args).status();
    });
    probing_ = false;
    at::autocast::set_autocast_enabled(at::kCPU, autocast);
    return status.ok() ? "" : RefusalReason(status);
  }

  const c10::optional<c10::OperatorHandle>& Operator(const formats::OpEvent& op) {
    auto [it, inserted] = operators_.try_emplace(absl::StrCat(op.name, ".", op.overload));
    if (inserted) it->second = c10::Dispatcher::singleton().findSchema(c10::OperatorName(op.name, op.overload));
    return it->second;
  }
};

}  // namespace

absl::StatusOr<ReplayReport> ReplayStep(const formats::BundleReader& reader, int64_t step,
                                        const ReplayOptions& options) {
  MOERR_ASSIGN_OR_RETURN(formats::Trace trace, formats::ReadTrace(reader, step));
  return ReplayTrace(reader, step, trace, options);
}

absl::StatusOr<ReplayReport> ReplayTrace(const formats::BundleReader& reader, int64_t step,
                                         const formats::Trace& trace, const ReplayOptions& options) {
  if (trace.ops.empty()) return absl::NotFoundError(absl::StrFormat("step %d has no recorded ops", step));
  const std::optional<formats::Recording> recording = formats::RecordingOf(reader);
  const int64_t recorded_threads = recording ? recording->threads_or_zero() : 0;
  if (const llvm::json::Object* imported = recording && recording->imported ? &*recording->imported : nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "this bundle was imported from %s: a dump holds the API calls it saw, not the dispatcher ops, parameters "
        "and RNG that a replay runs; bisect, lint, diff and report read it (docs/IMPORT.md)",
        imported->getString("from").getValueOr("another tool's dump").str()));
  }
  if (options.isolated && !formats::HoldsOpOutputs(reader, trace)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "isolated replay needs every op's outputs, and step %d holds none (record with --record full)", step));
  }
  ReplayReport report;
  report.step = step;
  report.ops = trace.ops.size();
  Replay replay(reader, step, trace, options);
  MOERR_RETURN_IF_ERROR(replay.CheckServable());
  const RecordedThreads threads(recorded_threads);
  MOERR_RETURN_IF_ERROR(CatchTorch(absl::StrFormat("replay of step %d", step), [&] { return replay.Run(report); }));
  return report;
}

}  // namespace moerr::replayer
