// The `moerr._moerr` extension: the recorder and the bundle reader for
// Python. Tensors cross as torch tensors (the same LibTorch python3-torch
// uses, so the recorder's observer sees ops issued from Python). A bad-input
// Status arrives as ValueError (FileNotFoundError for NotFound), other errors
// as RuntimeError, each carrying the Status message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include <ATen/record_function.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"

#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "formats/world_manifest.h"
#include "recorder/recorder.h"
#include "recorder/hooks/tensor_adapter.h"

namespace py = pybind11;

namespace moerr::python {
namespace {

[[noreturn]] void Raise(const absl::Status& s) {
  const std::string message(s.message());
  switch (s.code()) {
    case absl::StatusCode::kNotFound: PyErr_SetString(PyExc_FileNotFoundError, message.c_str()); break;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange: PyErr_SetString(PyExc_ValueError, message.c_str()); break;
    default: PyErr_SetString(PyExc_RuntimeError, message.c_str()); break;
  }
  throw py::error_already_set();
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

// Recorder calls that wait for the tracer's worker thread run without the
// GIL: the worker may hold a tensor Python knew (one without a storage) and
// drop its last reference, which takes the GIL.
template <typename F>
auto WithoutGil(F f) {
  py::gil_scoped_release no_gil;
  return f();
}

template <typename T>
T Take(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}

llvm::json::Value ParseJson(const std::string& text) {
  auto v = llvm::json::parse(text);
  if (!v) {
    Raise(absl::InvalidArgumentError("annotation is not JSON: " + llvm::toString(v.takeError())));
  }
  return std::move(*v);
}

// The Recorder, started on construction.
class PyRecorder {
 public:
  // `watch`: (metric, "spike" or "collapse", threshold) rules of the anomaly trigger.
  PyRecorder(const std::string& path, const std::string& mode, const std::string& trigger, int64_t first,
             int64_t last, int64_t ring, double spike, bool overwrite,
             const std::vector<std::tuple<std::string, std::string, double>>& watch) {
    recorder::RecordOptions options(path);
    if (mode == "stats") options.set_mode(recorder::CaptureMode::kStats);
    else if (mode == "replayable") options.set_mode(recorder::CaptureMode::kReplayable);
    else if (mode == "full") options.set_mode(recorder::CaptureMode::kFull);
    else Raise(absl::InvalidArgumentError("mode \"" + mode + "\": stats, replayable or full"));
    if (trigger == "window") options.set_window(first, last);
    else if (trigger == "anomaly") options.set_anomaly(ring, spike);
    else if (trigger != "always") Raise(absl::InvalidArgumentError("trigger \"" + trigger + "\": always, window or anomaly"));
    for (const auto& [metric, kind, threshold] : watch) {
      using K = recorder::MetricWatch::Kind;
      if (kind != "spike" && kind != "collapse") {
        Raise(absl::InvalidArgumentError("watch " + metric + ": \"" + kind + "\" is not a rule: spike or collapse"));
      }
      options.watches.push_back({metric, kind == "spike" ? K::kSpike : K::kCollapse, threshold});
    }
    options.set_overwrite(overwrite).set_crash_handler(false);
    rec_ = Take(recorder::Recorder::Start(options));
  }

  ~PyRecorder() {
    if (rec_) WithoutGil([&] { rec_.reset(); });  // stops, logging errors
  }

  void StepBegin(int64_t step) {
    recorder::Recorder& rec = Live();
    Check(WithoutGil([&] { return rec.StepBegin(step); }));
  }
  void StepEnd(int64_t step, double loss, double grad_norm, std::vector<std::pair<std::string, double>> metrics) {
    recorder::Recorder& rec = Live();
    Check(WithoutGil([&] { return rec.StepEnd(step, {loss, grad_norm, std::move(metrics)}); }));
  }
  void StepRaised(int64_t step, const std::string& type, const std::string& message, const std::string& traceback) {
    recorder::Recorder& rec = Live();
    Check(WithoutGil([&] { return rec.StepRaised(step, {type, message, traceback, std::nullopt}); }));
  }
  void Annotate(const std::string& key, const std::string& json) { Check(Live().Annotate(key, ParseJson(json))); }
  void AnnotateStep(const std::string& key, const std::string& json) {
    Check(Live().AnnotateStep(key, ParseJson(json)));
  }
  void NameTensors(const std::vector<std::pair<std::string, at::Tensor>>& named) { Live().NameTensors(named); }
  // The trace's name of each process group, by the group's own name
  // (ProcessGroup.group_name): what its collectives are recorded under.
  void NameGroups(const std::vector<std::pair<std::string, std::string>>& names) { Live().NameGroups(names); }
  // The number of the next collective in `group` (the trace's name), for
  // one the Python recorder hands over itself.
  int64_t NextCollective(const std::string& group) { return Live().NextCollectiveInGroup(group); }
  void Routing(int64_t layer, const at::Tensor& ids, const at::Tensor& weights,
               const c10::optional<at::Tensor>& maybe_logits, const at::Tensor& hidden) {
    const at::Tensor logits = maybe_logits.value_or(at::Tensor());
    if (ids.dim() != 2 || weights.sizes() != ids.sizes() ||
        (logits.defined() && (logits.dim() != 2 || logits.size(0) != ids.size(0)))) {
      Raise(absl::InvalidArgumentError("routing: topk_ids and topk_weights [T, k], logits [T, E] or None"));
    }
    recorder::Recorder& rec = Live();
    WithoutGil([&] { rec.OnRouting({layer, ids, weights, logits, hidden}); });
  }
  // One collective of torch.distributed: the recorder hears of it before and
  // after `transfer` (which runs it and waits for it) and records it as the
  // op c10d::<kind> with what arrived in `outputs`. `transfer` runs with
  // RecordFunction off on this thread: what the process group does inside
  // (the dispatcher's c10d:: op, its profiling scope, copies) is the
  // collective, not ops of the step. A Python exception from it is the
  // collective failing: the recorder hears why, and it propagates.
  py::object Collective(const recorder::CollectiveCall& call, const std::vector<at::Tensor>& inputs,
                        const std::vector<at::Tensor>& outputs, bool in_place, const py::function& transfer) {
    CheckRows(call, inputs, call.send_rows, "send");
    CheckRows(call, outputs, call.recv_rows, "recv");
    recorder::Recorder& rec = Live();
    WithoutGil([&] { rec.OnCollectiveStart(call, inputs, in_place); });
    py::object result;
    try {
      at::DisableRecordFunctionGuard untraced;
      result = transfer();
    } catch (py::error_already_set& e) {
      // The exception's type and message, without pybind's traceback.
      const std::string why = py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
                              py::str(e.value()).cast<std::string>();
      WithoutGil([&] { rec.OnCollectiveFailed(call, why); });
      throw;
    }
    WithoutGil([&] { rec.OnCollectiveEnd(call, outputs); });
    return result;
  }
  // The recorder hashes slices of dim 0 by the splits: they must cover it.
  static void CheckRows(const recorder::CollectiveCall& call, const std::vector<at::Tensor>& tensors,
                        const std::vector<int64_t>& rows, const char* which) {
    if (rows.empty()) return;
    const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
    for (const at::Tensor& t : tensors) {
      if (!t.defined() || t.dim() == 0 || t.size(0) != total) {
        Raise(absl::InvalidArgumentError(absl::StrFormat(
            "collective %s #%d in %s: %s rows add up to %d, not the tensor's dim 0", call.kind, call.seq, call.group,
            which, total)));
      }
    }
  }
  std::vector<int64_t> Written() const { return rec_ ? rec_->written_steps() : written_; }
  // Ops traced since the recording started (inside steps only).
  uint64_t OpsRecorded() const { return rec_ ? rec_->ops_recorded() : 0; }
  void Stop() {
    if (!rec_) return;
    const absl::Status s = WithoutGil([&] { return rec_->Stop(); });
    written_ = rec_->written_steps();
    rec_.reset();
    Check(s);
  }

 private:
  recorder::Recorder& Live() {
    if (!rec_) Raise(absl::FailedPreconditionError("the recording has stopped"));
    return *rec_;
  }
  std::unique_ptr<recorder::Recorder> rec_;
  std::vector<int64_t> written_;
};

recorder::CollectiveCall MakeCall(const std::string& kind, const std::string& group, int64_t seq, int64_t group_rank,
                                  int64_t group_size, int64_t root, std::vector<int64_t> send_rows,
                                  std::vector<int64_t> recv_rows) {
  const auto negative = [](const std::vector<int64_t>& rows) {
    return std::any_of(rows.begin(), rows.end(), [](int64_t n) { return n < 0; });
  };
  if (group_size < 1 || group_rank < 0 || group_rank >= group_size || seq < 0 || root < -1 || root >= group_size ||
      negative(send_rows) || negative(recv_rows) ||
      (!send_rows.empty() && static_cast<int64_t>(send_rows.size()) != group_size) ||
      (!recv_rows.empty() && static_cast<int64_t>(recv_rows.size()) != group_size)) {
    Raise(absl::InvalidArgumentError("collective " + kind + " in " + group +
                                     ": group rank, root and splits must fit the group size"));
  }
  recorder::CollectiveCall call;
  call.kind = kind, call.group = group, call.seq = seq, call.group_rank = group_rank, call.group_size = group_size;
  call.root = root, call.send_rows = std::move(send_rows), call.recv_rows = std::move(recv_rows);
  return call;
}

// RUN/world.json of a torch.distributed run: rank K's bundle is
// rank<K>.moerr; with ep_size > 0 the expert-parallel layout
// (formats::ExpertParallelWorld), else only the group "world"; `groups`
// (name -> instances, world ranks by group rank) added to it.
void WriteWorldManifest(const std::string& run_dir, int64_t world_size, int64_t ep_size, int64_t experts,
                        const std::map<std::string, std::vector<std::vector<int64_t>>>& groups) {
  if (world_size < 1 || ep_size < 0 || experts < 0 || (ep_size > 0 && (world_size % ep_size || experts % ep_size))) {
    Raise(absl::InvalidArgumentError(absl::StrFormat(
        "world of %d ranks, ep_size %d, %d experts: ep_size must divide the world size and the experts", world_size,
        ep_size, experts)));
  }
  formats::WorldManifest w = formats::ExpertParallelWorld(world_size, ep_size > 0 ? ep_size : 1, experts);
  if (ep_size == 0) {
    w.ep_size = 1;
    w.groups.erase("expert-parallel");
    w.groups.erase("expert-replica");
  }
  for (const auto& [name, instances] : groups) w.groups[name] = instances;
  Check(formats::WriteWorldManifest(run_dir, w));
}

py::dict FingerprintDict(const formats::Fingerprint& f) {
  py::dict d;
  d["numel"] = f.numel, d["min"] = f.min, d["max"] = f.max, d["mean"] = f.mean, d["abs_max"] = f.abs_max;
  d["l2"] = f.l2, d["nan"] = f.nan, d["pos_inf"] = f.pos_inf, d["neg_inf"] = f.neg_inf;
  d["beyond_f16"] = f.beyond_f16, d["beyond_bf16"] = f.beyond_bf16, d["hash"] = f.hash;
  return d;
}

// A read-only bundle.
class PyBundle {
 public:
  explicit PyBundle(const std::string& path) : reader_(Take(formats::BundleReader::Open(path))) {}

  std::vector<int64_t> Steps() const { return reader_->CompleteSteps(); }

  at::Tensor Tensor(const std::string& name, int64_t step) const {
    const formats::OwnedTensor t = Take(reader_->ReadTensor(name, step));
    return recorder::ToTensor(t.view());
  }

  std::vector<std::pair<std::string, int64_t>> TensorNames() const {
    std::vector<std::pair<std::string, int64_t>> out;
    for (const formats::TensorInfo& t : reader_->index().tensors) out.emplace_back(t.name, t.step);
    return out;
  }

  // An argument as {"kind": ..., "value": ...}: tensor ids, numbers, lists, text.
  static py::dict ArgDict(const formats::OpArg& a) {
    using K = formats::OpArg::Kind;
    py::dict d;
    d["kind"] = std::string(formats::ArgKindName(a.kind));
    switch (a.kind) {
      case K::kNone: break;
      case K::kTensor: case K::kInt: case K::kWrappedInt: d["value"] = a.i; break;
      case K::kBool: case K::kWrappedBool: d["value"] = a.i != 0; break;
      case K::kFloat: case K::kWrappedFloat: d["value"] = a.f; break;
      case K::kFloats: d["value"] = a.floats; break;
      case K::kText: case K::kDevice: case K::kUnsupported: d["value"] = a.text; break;
      default: d["value"] = a.ints; break;  // ids (-1: None), ints, bools as 0/1
    }
    return d;
  }

  // Each op: index, name, overload, module, phase, its arguments and its
  // outputs' fingerprints.
  py::list Ops(int64_t step) const {
    const formats::Trace trace = Take(formats::ReadTrace(*reader_, step));
    py::list ops;
    for (size_t i = 0; i < trace.ops.size(); ++i) {
      const formats::OpEvent& op = trace.ops[i];
      py::list outputs;
      for (uint64_t id : op.outputs) {
        const formats::TensorMeta* m = id ? trace.Find(id) : nullptr;
        if (m == nullptr) {
          outputs.append(py::none());
          continue;
        }
        py::dict out = FingerprintDict(m->fingerprint);
        out["id"] = m->id;
        out["dtype"] = std::string(formats::DTypeName(m->dtype));
        out["shape"] = m->shape;
        outputs.append(out);
      }
      py::dict d;
      d["index"] = i, d["name"] = op.name, d["overload"] = op.overload, d["module"] = op.module;
      d["phase"] = std::string(formats::PhaseName(op.phase));
      py::list args;
      for (const formats::OpArg& a : op.args) args.append(ArgDict(a));
      d["args"] = args;
      d["outputs"] = outputs;
      ops.append(d);
    }
    return ops;
  }

  // What the trace of `step` says of tensor `id`: where it lives (a view of
  // another id, its offset in elements), which op made it (-1: none) and its
  // leaf's name in the bundle ("" when not stored).
  py::dict TensorMeta(int64_t step, uint64_t id) const {
    const formats::Trace trace = Take(formats::ReadTrace(*reader_, step));
    const formats::TensorMeta* m = trace.Find(id);
    if (m == nullptr) Raise(absl::NotFoundError(absl::StrFormat("step %d has no tensor %d", step, id)));
    py::dict d;
    d["id"] = m->id, d["dtype"] = std::string(formats::DTypeName(m->dtype)), d["shape"] = m->shape;
    d["strides"] = m->strides, d["offset"] = m->storage_offset, d["view_of"] = m->view_of;
    d["producer"] = m->producer, d["leaf"] = m->leaf;
    return d;
  }

  py::list Routing(int64_t step) const {
    const formats::Trace trace = Take(formats::ReadTrace(*reader_, step));
    py::list out;
    for (const formats::RoutingRecord& r : trace.routing) {
      py::dict d;
      d["layer"] = r.layer, d["micro_batch"] = r.micro_batch, d["token_counts"] = r.token_counts;
      d["topk_ids"] = Tensor(r.topk_ids, step);
      d["topk_weights"] = Tensor(r.topk_weights, step);
      d["logits"] = r.logits.empty() ? py::object(py::none()) : py::cast(Tensor(r.logits, step));
      out.append(d);
    }
    return out;
  }

  std::string Annotation(const std::string& key, int64_t step) const {
    return llvm::formatv("{0}", Take(reader_->ReadAnnotation(key, step))).str();
  }

 private:
  std::unique_ptr<formats::BundleReader> reader_;
};

}  // namespace
}  // namespace moerr::python

PYBIND11_MODULE(_moerr, m) {
  using namespace moerr::python;
  m.doc() = "moerr's recorder and bundle reader (use the `moerr` package)";
  py::class_<PyRecorder>(m, "Recorder")
      .def(py::init<const std::string&, const std::string&, const std::string&, int64_t, int64_t, int64_t, double,
                    bool, const std::vector<std::tuple<std::string, std::string, double>>&>(),
           py::arg("path"), py::arg("mode"), py::arg("trigger"), py::arg("first"), py::arg("last"), py::arg("ring"),
           py::arg("spike"), py::arg("overwrite"), py::arg("watch") = std::vector<std::tuple<std::string, std::string, double>>())
      .def("step_begin", &PyRecorder::StepBegin)
      .def("step_end", &PyRecorder::StepEnd, py::arg("step"), py::arg("loss"), py::arg("grad_norm"),
           py::arg("metrics") = std::vector<std::pair<std::string, double>>())
      .def("step_raised", &PyRecorder::StepRaised, py::arg("step"), py::arg("type"), py::arg("message"),
           py::arg("traceback"))
      .def("annotate", &PyRecorder::Annotate)
      .def("annotate_step", &PyRecorder::AnnotateStep)
      .def("name_tensors", &PyRecorder::NameTensors)
      .def("name_groups", &PyRecorder::NameGroups)
      .def("next_collective", &PyRecorder::NextCollective)
      .def("routing", &PyRecorder::Routing)
      .def("collective", &PyRecorder::Collective, py::arg("call"), py::arg("inputs"), py::arg("outputs"),
           py::arg("in_place"), py::arg("transfer"))
      .def("written_steps", &PyRecorder::Written)
      .def("ops_recorded", &PyRecorder::OpsRecorded)
      .def("stop", &PyRecorder::Stop);
  py::class_<moerr::recorder::CollectiveCall>(m, "CollectiveCall")
      .def(py::init(&MakeCall), py::arg("kind"), py::arg("group"), py::arg("seq"), py::arg("group_rank"),
           py::arg("group_size"), py::arg("root") = -1, py::arg("send_rows") = std::vector<int64_t>(),
           py::arg("recv_rows") = std::vector<int64_t>())
      .def_readonly("kind", &moerr::recorder::CollectiveCall::kind)
      .def_readonly("group", &moerr::recorder::CollectiveCall::group)
      .def_readonly("seq", &moerr::recorder::CollectiveCall::seq);
  m.def("write_world_manifest", &WriteWorldManifest, py::arg("run_dir"), py::arg("world_size"), py::arg("ep_size"),
        py::arg("experts"), py::arg("groups"));
  py::class_<PyBundle>(m, "Bundle")
      .def(py::init<const std::string&>())
      .def("steps", &PyBundle::Steps)
      .def("tensor", &PyBundle::Tensor, py::arg("name"), py::arg("step") = -1)
      .def("tensor_names", &PyBundle::TensorNames)
      .def("ops", &PyBundle::Ops)
      .def("tensor_meta", &PyBundle::TensorMeta)
      .def("routing", &PyBundle::Routing)
      .def("annotation", &PyBundle::Annotation, py::arg("key"), py::arg("step") = -1);
}
