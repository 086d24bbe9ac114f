// OpTracer's argument capture (op_tracer.h): an op's arguments in their
// recorded form, and the ids of the tensors it reads and produces, new ones
// queued to the worker for their fingerprints and captures.
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "recorder/op_tracer.h"

namespace moerr::recorder {

uint64_t OpTracer::NewTensor(const at::Tensor& t, int64_t producer, std::string leaf_name, formats::Role role,
                             uint64_t view_of, const ViewSource* derive_from) {
  // A named value is read from the bundle in replay, on a storage of its
  // own; but "act/" (full mode) is only compared, its op re-executed.
  const bool standalone = !leaf_name.empty() && !absl::StartsWith(leaf_name, "act/");
  const uint64_t id = ids_.Add(t, view_of != 0, standalone);
  // Overwritten in place (a spare batch's slot keeps its capacity); every
  // field is set. The worker fills in the fingerprint.
  formats::TensorMeta& meta =
      pending_tensors_ < pending_.tensors.size() ? pending_.tensors[pending_tensors_] : pending_.tensors.emplace_back();
  ++pending_tensors_;
  meta.id = id;
  // Every dtype a bundle stores; others (complex) are recorded as f32-shaped
  // metadata with a hash of their bytes.
  meta.dtype = ToDType(t.scalar_type()).value_or(formats::DType::kF32);
  meta.shape.assign(t.sizes().begin(), t.sizes().end());
  meta.strides.assign(t.strides().begin(), t.strides().end());
  meta.storage_offset = t.storage_offset();
  meta.fingerprint = formats::Fingerprint();
  meta.producer = producer;
  meta.view_of = view_of;
  meta.leaf = leaf_name;
  TraceWorker::Job job;
  job.id = id;
  job.tensor = t;
  if (derive_from != nullptr) {
    job.base = derive_from->id;
    job.source = *derive_from;
  }
  job.capture = std::move(leaf_name);
  job.role = role;
  worker_.Add(std::move(job));
  return id;
}

uint64_t OpTracer::InputId(const at::Tensor& t, const ArgUse& use) {
  const TensorIdentities::Input found = ids_.ResolveInput(t, use.written);
  if (found.id != 0) return found.id;
  if (found.view_of != 0) return NewTensor(t, -1, "", formats::Role::kActivation, found.view_of);
  // First seen in backward: a value autograd made inside a composite op or
  // the engine (saved for backward, gradient buffers). Not a leaf of the
  // step: captured so that the backward ops can be replayed.
  if (use.in_backward && !(t.is_leaf() && t.requires_grad())) {
    std::string name = mode_ == CaptureMode::kStats ? "" : absl::StrCat("saved/", ids_.next_id());
    return NewTensor(t, -1, std::move(name), formats::Role::kActivation);
  }
  // A leaf: nothing recorded produced this tensor (or this version of it).
  std::string name;
  formats::Role role = formats::Role::kLeaf;
  const std::string* named = ids_.NameOf(t);
  if (t.is_leaf() && t.requires_grad()) role = formats::Role::kParameter;
  if (use.in_optimizer) role = formats::Role::kOptimizerState;
  if (use.in_batch) role = formats::Role::kBatch;
  if (mode_ != CaptureMode::kStats) {
    const uint64_t id = ids_.next_id();
    name = named != nullptr ? absl::StrCat("param/", *named, "@", id) : absl::StrCat("leaf/", id);
    if (named != nullptr) role = formats::Role::kParameter;
  }
  return NewTensor(t, -1, std::move(name), role);
}

uint64_t OpTracer::OutputId(const at::Tensor& t, int64_t producer, const SchemaInfo& op,
                            const std::vector<ViewSource>& inputs) {
  if (const uint64_t same = ids_.SameTensor(t)) return same;  // the op returned an input unchanged
  // A dense view of exactly an input's elements: the same values, so the
  // same statistics, without a copy or a pass (fingerprint.h).
  if (mode_ != CaptureMode::kFull) {
    const ViewSource* in = ViewedInput(t, inputs);
    if (in != nullptr && ids_.InThisStep(in->id)) {
      return NewTensor(t, producer, "", formats::Role::kActivation, in->id, in);
    }
  }
  std::string name;
  formats::Role role = formats::Role::kActivation;
  if (mode_ != CaptureMode::kStats && op.random) {
    // Random outputs are replayed from their recorded values.
    name = absl::StrCat("rng/", ids_.next_id());
    role = formats::Role::kRng;
  } else if (mode_ != CaptureMode::kStats && op.external) {
    // So are the outputs of ops outside ATen: the replaying LibTorch may
    // not have them (docs/REPLAY.md, "Ops this LibTorch does not have").
    name = absl::StrCat("ext/", ids_.next_id());
  } else if (mode_ == CaptureMode::kFull) {
    name = absl::StrCat("act/", ids_.next_id());
  }
  const uint64_t id = NewTensor(t, producer, std::move(name), role);
  if (op.allocates_uninitialised) ids_.MarkUnfilled(id);
  return id;
}

// A Python number as the op saw it: a 0-dim CPU tensor flagged as a wrapped
// number, whose value is recorded bit for bit (a double holds every f64 and
// an int64 every i64). False for a dtype Python numbers do not wrap to
// (complex): that one is recorded as a tensor. Read through the data
// pointer, not item(), which would dispatch an op from inside the callback.
bool OpTracer::RecordWrappedNumber(const at::Tensor& t, formats::OpArg& a) {
  using K = formats::OpArg::Kind;
  if (!t.is_cpu() || t.dim() != 0) return false;
  switch (t.scalar_type()) {
    case at::kDouble: a.kind = K::kWrappedFloat, a.f = *t.const_data_ptr<double>(); return true;
    case at::kLong: a.kind = K::kWrappedInt, a.i = *t.const_data_ptr<int64_t>(); return true;
    case at::kBool: a.kind = K::kWrappedBool, a.i = *t.const_data_ptr<bool>(); return true;
    default: return false;
  }
}

// A Scalar[] (the per-tensor scalars of `_foreach_*.ScalarList`) arrives as
// a generic list: recorded as floats or ints when its numbers are all of one
// kind, which replays as the same Scalars. False otherwise.
bool OpTracer::RecordNumberList(const c10::IValue& v, formats::OpArg& a) {
  using K = formats::OpArg::Kind;
  const c10::ArrayRef<c10::IValue> list = v.toListRef();
  if (list.empty()) return false;
  if (std::all_of(list.begin(), list.end(), [](const c10::IValue& e) { return e.isDouble(); })) {
    a.kind = K::kFloats;
    for (const c10::IValue& e : list) a.floats.push_back(e.toDouble());
    return true;
  }
  if (std::all_of(list.begin(), list.end(), [](const c10::IValue& e) { return e.isInt(); })) {
    a.kind = K::kInts;
    for (const c10::IValue& e : list) a.ints.push_back(e.toInt());
    return true;
  }
  return false;
}

void OpTracer::ToArg(const c10::IValue& v, const ArgUse& use, std::vector<ViewSource>& sources, formats::OpArg& a) {
  using K = formats::OpArg::Kind;
  // `a` is a reused slot: every field is reset, keeping capacity. Lists are
  // read through toListRef(): no copy of the list.
  a.kind = K::kNone;
  a.i = 0;
  a.f = 0;
  a.text.clear();
  a.ints.clear();
  a.floats.clear();
  if (v.isNone()) return;
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return;
    if (t.unsafeGetTensorImpl()->is_wrapped_number() && RecordWrappedNumber(t, a)) return;
    a.kind = K::kTensor;
    a.i = static_cast<int64_t>(InputId(t, use));
    if (auto source = SourceOf(t, static_cast<uint64_t>(a.i))) sources.push_back(*source);
  } else if (v.isTensorList()) {
    a.kind = K::kTensors;
    for (const c10::IValue& e : v.toListRef()) a.ints.push_back(static_cast<int64_t>(InputId(e.toTensor(), use)));
  } else if (v.isList() && v.toListRef().size() > 0 && (v.toListRef()[0].isTensor() || v.toListRef()[0].isNone())) {
    a.kind = K::kOptionalTensors;
    for (const c10::IValue& e : v.toListRef()) {
      a.ints.push_back(e.isTensor() && e.toTensor().defined()
                           ? static_cast<int64_t>(InputId(e.toTensor(), use))
                           : -1);
    }
  } else if (v.isInt()) {
    a.kind = K::kInt, a.i = v.toInt();
  } else if (v.isDouble()) {
    a.kind = K::kFloat, a.f = v.toDouble();
  } else if (v.isBool()) {
    a.kind = K::kBool, a.i = v.toBool();
  } else if (v.isString()) {
    a.kind = K::kText, a.text = v.toStringRef();
  } else if (v.isIntList()) {
    a.kind = K::kInts;
    for (const c10::IValue& e : v.toListRef()) a.ints.push_back(e.toInt());
  } else if (v.isDoubleList()) {
    a.kind = K::kFloats;
    for (const c10::IValue& e : v.toListRef()) a.floats.push_back(e.toDouble());
  } else if (v.isBoolList()) {
    a.kind = K::kBools;
    for (const c10::IValue& e : v.toListRef()) a.ints.push_back(e.toBool());
  } else if (v.isList() && RecordNumberList(v, a)) {
    return;
  } else if (v.isDevice()) {
    a.kind = K::kDevice, a.text = v.toDevice().str();
  } else {
    a.kind = K::kUnsupported, a.text = v.tagKind();
  }
}

}  // namespace moerr::recorder
