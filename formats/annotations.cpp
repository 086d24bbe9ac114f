#include "formats/annotations.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "formats/json_number.h"
#include "support/status.h"

namespace moerr::formats {
namespace {

// Reads an annotation object's fields; the first bad one is kept as an
// InvalidArgument error naming it. A field absent from the object is not an
// error for Optional (left unset); for Required it is.
class Fields {
 public:
  Fields(const llvm::json::Value& v, absl::string_view where) : where_(where), o_(v.getAsObject()) {
    if (o_ == nullptr) status_ = absl::InvalidArgumentError(absl::StrFormat("%s is not a JSON object", where_));
  }

  const llvm::json::Object& object() const { return *o_; }
  const absl::Status& status() const { return status_; }

  void Required(const char* name, std::string& out) { Get(name, out, /*required=*/true); }
  void Required(const char* name, int64_t& out) { Get(name, out, true); }
  void Required(const char* name, double& out) { Get(name, out, true); }
  template <typename T>
  void Optional(const char* name, std::optional<T>& out) {
    T v{};
    if (Get(name, v, false)) out = std::move(v);
  }
  // Like Optional, with null read as absent (a Python writer's None).
  template <typename T>
  void OptionalOrNull(const char* name, std::optional<T>& out) {
    if (const llvm::json::Value* v = Find(name, false); v != nullptr && v->kind() != llvm::json::Value::Null) {
      Optional(name, out);
    }
  }

 private:
  const llvm::json::Value* Find(const char* name, bool required) {
    if (!status_.ok()) return nullptr;
    const llvm::json::Value* v = o_->get(name);
    if (v == nullptr && required) Fail(name, "is missing");
    return v;
  }
  bool Fail(const char* name, const char* what) {
    status_ = absl::InvalidArgumentError(absl::StrFormat("%s: field \"%s\" %s", where_, name, what));
    return false;
  }
  bool Get(const char* name, std::string& out, bool required) {
    const llvm::json::Value* v = Find(name, required);
    if (v == nullptr) return false;
    const auto s = v->getAsString();
    if (!s) return Fail(name, "is not a string");
    out = s->str();
    return true;
  }
  bool Get(const char* name, int64_t& out, bool required) {
    const llvm::json::Value* v = Find(name, required);
    if (v == nullptr) return false;
    const auto i = v->getAsInteger();
    if (!i) return Fail(name, "is not an integer");
    out = *i;
    return true;
  }
  bool Get(const char* name, double& out, bool required) {
    const llvm::json::Value* v = Find(name, required);
    if (v == nullptr) return false;
    const auto d = v->getAsNumber();
    if (!d) return Fail(name, "is not a number");
    out = *d;
    return true;
  }
  bool Get(const char* name, bool& out, bool required) {
    const llvm::json::Value* v = Find(name, required);
    if (v == nullptr) return false;
    const auto b = v->getAsBoolean();
    if (!b) return Fail(name, "is not a boolean");
    out = *b;
    return true;
  }
  bool Get(const char* name, llvm::json::Object& out, bool required) {
    const llvm::json::Value* v = Find(name, required);
    if (v == nullptr) return false;
    const llvm::json::Object* o = v->getAsObject();
    if (o == nullptr) return Fail(name, "is not an object");
    out = *o;
    return true;
  }

  std::string where_;
  const llvm::json::Object* o_;
  absl::Status status_;
};

// The annotation `key` of `step` as JSON: NotFound naming the bundle when
// it has none, its read error annotated with where otherwise.
absl::StatusOr<llvm::json::Value> ReadValue(const BundleReader& reader, absl::string_view key, int64_t step,
                                            absl::string_view bundle) {
  absl::StatusOr<llvm::json::Value> v = reader.ReadAnnotation(key, step);
  if (absl::IsNotFound(v.status())) {
    return absl::NotFoundError(absl::StrFormat("%s: no annotation \"%s\"%s", bundle.empty() ? "the bundle" : bundle,
                                               key, step < 0 ? "" : absl::StrFormat(" at step %d", step)));
  }
  if (!v.ok()) return Annotate(v.status(), AnnotationWhere(bundle, key, step));
  return v;
}

// The annotation `key` of `step`, parsed by `from`.
template <typename T>
absl::StatusOr<T> ReadTyped(const BundleReader& reader, const char* key, int64_t step, absl::string_view bundle,
                            absl::StatusOr<T> (*from)(const llvm::json::Value&, absl::string_view)) {
  MOERR_ASSIGN_OR_RETURN(const llvm::json::Value v, ReadValue(reader, key, step, bundle));
  return from(v, AnnotationWhere(bundle, key, step));
}

}  // namespace

std::string AnnotationWhere(absl::string_view bundle, absl::string_view key, int64_t step) {
  std::string out = absl::StrFormat("%s: annotation \"%s\"", bundle.empty() ? "the bundle" : bundle, key);
  if (step >= 0) absl::StrAppendFormat(&out, " at step %d", step);
  return out;
}

absl::StatusOr<llvm::json::Object> ReadObjectAnnotation(const BundleReader& reader, absl::string_view key,
                                                        int64_t step, absl::string_view bundle) {
  MOERR_ASSIGN_OR_RETURN(llvm::json::Value v, ReadValue(reader, key, step, bundle));
  if (llvm::json::Object* o = v.getAsObject()) return std::move(*o);
  return absl::InvalidArgumentError(AnnotationWhere(bundle, key, step) + " is not a JSON object");
}

// ---- proxy -------------------------------------------------------------------

const llvm::json::Object* ProxyLayerOf(const llvm::json::Object& proxy, int64_t layer) {
  const llvm::json::Array* layers = proxy.getArray("layers");
  for (size_t i = 0; layers != nullptr && i < layers->size(); ++i) {
    const llvm::json::Object* o = (*layers)[i].getAsObject();
    if (o != nullptr && o->getInteger("layer") == layer) return o;
  }
  return nullptr;
}

std::optional<int64_t> ProxyArrayAt(const llvm::json::Object* o, const char* key, int64_t i) {
  const llvm::json::Array* a = o ? o->getArray(key) : nullptr;
  if (a == nullptr || i < 0 || i >= static_cast<int64_t>(a->size())) return std::nullopt;
  if (auto v = (*a)[static_cast<size_t>(i)].getAsInteger()) return *v;
  return std::nullopt;
}

std::optional<int64_t> ProxyKeptExpert(const llvm::json::Object& proxy, int64_t layer, int64_t expert) {
  return ProxyArrayAt(ProxyLayerOf(proxy, layer), "kept", expert);
}

std::optional<int64_t> ProxyMapsTo(const llvm::json::Object& proxy, int64_t layer, int64_t original) {
  return ProxyArrayAt(ProxyLayerOf(proxy, layer), "maps_to", original);
}

// ---- recording ---------------------------------------------------------------

llvm::json::Object ToJson(const Recording& r) {
  llvm::json::Object o = r.other;
  if (!r.mode.empty()) o["mode"] = r.mode;
  if (r.trigger) o["trigger"] = *r.trigger;
  if (r.libtorch) o["libtorch"] = *r.libtorch;
  if (r.threads) o["threads"] = *r.threads;
  if (r.deterministic) o["deterministic"] = *r.deterministic;
  if (r.imported) o["imported"] = llvm::json::Object(*r.imported);
  if (r.reduced) o["reduced"] = llvm::json::Object(*r.reduced);
  return o;
}

absl::StatusOr<Recording> RecordingFrom(const llvm::json::Value& v, absl::string_view where) {
  Fields f(v, where);
  Recording r;
  std::optional<std::string> mode;
  f.Optional("mode", mode);
  f.Optional("trigger", r.trigger);
  f.Optional("libtorch", r.libtorch);
  f.Optional("threads", r.threads);
  f.Optional("deterministic", r.deterministic);
  f.Optional("imported", r.imported);
  f.Optional("reduced", r.reduced);
  MOERR_RETURN_IF_ERROR(f.status());
  r.mode = mode.value_or("");
  for (const auto& field : f.object()) {
    static constexpr const char* kNamed[] = {"mode", "trigger", "libtorch", "threads", "deterministic", "imported",
                                             "reduced"};
    const llvm::json::ObjectKey& key = field.first;
    if (std::none_of(std::begin(kNamed), std::end(kNamed), [&](const char* n) { return key == n; })) {
      r.other[key] = field.second;
    }
  }
  return r;
}

absl::StatusOr<Recording> ReadRecording(const BundleReader& reader, absl::string_view bundle) {
  return ReadTyped<Recording>(reader, kRecordingAnnotation, -1, bundle, &RecordingFrom);
}

std::optional<Recording> RecordingOf(const BundleReader& reader) {
  absl::StatusOr<Recording> r = ReadRecording(reader, "");
  if (!r.ok()) return std::nullopt;
  return *std::move(r);
}

bool HoldsReplayableValues(const BundleReader& reader) {
  const absl::StatusOr<Recording> recording = ReadRecording(reader, "");
  if (absl::IsNotFound(recording.status())) return true;  // another tool's bundle: assumed to
  // A malformed annotation may hide a stats or imported recording: not claimed.
  return recording.ok() && !recording->imported && recording->mode != "stats";
}

// ---- replay_time -------------------------------------------------------------

llvm::json::Object ToJson(const ReplayTime& t) {
  return llvm::json::Object{{"seconds", t.seconds}, {"cpu_seconds", t.cpu_seconds}};
}

absl::StatusOr<ReplayTime> ReplayTimeFrom(const llvm::json::Value& v, absl::string_view where) {
  Fields f(v, where);
  ReplayTime t;
  f.Required("seconds", t.seconds);
  f.Required("cpu_seconds", t.cpu_seconds);
  MOERR_RETURN_IF_ERROR(f.status());
  return t;
}

absl::StatusOr<ReplayTime> ReadReplayTime(const BundleReader& reader, int64_t step, absl::string_view bundle) {
  return ReadTyped<ReplayTime>(reader, kReplayTimeAnnotation, step, bundle, &ReplayTimeFrom);
}

// ---- fault -------------------------------------------------------------------

llvm::json::Object ToJson(const FaultNote& n) {
  llvm::json::Object o{{"kind", n.kind}};
  if (n.rank) o["rank"] = *n.rank;
  return o;
}

absl::StatusOr<FaultNote> FaultNoteFrom(const llvm::json::Value& v, absl::string_view where) {
  Fields f(v, where);
  FaultNote n;
  f.Required("kind", n.kind);
  f.Optional("rank", n.rank);
  MOERR_RETURN_IF_ERROR(f.status());
  return n;
}

absl::StatusOr<FaultNote> ReadFaultNote(const BundleReader& reader, absl::string_view bundle) {
  return ReadTyped<FaultNote>(reader, kFaultAnnotation, -1, bundle, &FaultNoteFrom);
}

// ---- collective_failed -------------------------------------------------------

llvm::json::Object ToJson(const CollectiveFailed& c) {
  return llvm::json::Object{{"kind", c.kind},     {"group", c.group}, {"seq", c.seq},
                            {"step", c.step},     {"module", c.module}, {"error", c.error},
                            {"group_rank", c.group_rank}};
}

absl::StatusOr<CollectiveFailed> CollectiveFailedFrom(const llvm::json::Value& v, absl::string_view where) {
  Fields f(v, where);
  CollectiveFailed c;
  f.Required("kind", c.kind);
  f.Required("group", c.group);
  f.Required("seq", c.seq);
  f.Required("step", c.step);
  std::optional<std::string> module, error;
  std::optional<int64_t> group_rank;
  f.Optional("module", module);
  f.Optional("error", error);
  f.Optional("group_rank", group_rank);
  MOERR_RETURN_IF_ERROR(f.status());
  c.module = module.value_or("");
  c.error = error.value_or("");
  c.group_rank = group_rank.value_or(-1);
  return c;
}

absl::StatusOr<CollectiveFailed> ReadCollectiveFailed(const BundleReader& reader, absl::string_view bundle) {
  return ReadTyped<CollectiveFailed>(reader, kCollectiveFailedAnnotation, -1, bundle, &CollectiveFailedFrom);
}

// ---- metrics -----------------------------------------------------------------

absl::StatusOr<StepMetricsNote> StepMetricsNoteFrom(const llvm::json::Value& v, absl::string_view where) {
  Fields f(v, where);
  StepMetricsNote m;
  f.Optional("skipped", m.skipped);
  f.Optional("finite", m.finite);
  MOERR_RETURN_IF_ERROR(f.status());
  // A number, or the name MetricsToJson writes for a non-finite scale.
  if (const llvm::json::Value* scale = f.object().get("loss_scale")) {
    if (const auto n = scale->getAsNumber()) {
      m.loss_scale = *n;
    } else if (!NumberOrName(*scale)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: field \"loss_scale\" is neither a number nor \"nan\", \"inf\" or \"-inf\"", where));
    }
  }
  return m;
}

absl::StatusOr<StepMetricsNote> ReadStepMetricsNote(const BundleReader& reader, int64_t step,
                                                    absl::string_view bundle) {
  return ReadTyped<StepMetricsNote>(reader, kMetricsAnnotation, step, bundle, &StepMetricsNoteFrom);
}

// ---- hf_model ------------------------------------------------------------------

llvm::json::Object ToJson(const HfModel& m) {
  llvm::json::Object o{{"file", m.file}, {"step", m.step}, {"objective", m.objective}};
  o["logits_dtype"] = m.logits_dtype ? llvm::json::Value(*m.logits_dtype) : llvm::json::Value(nullptr);
  if (m.config) o["config"] = llvm::json::Object(*m.config);
  return o;
}

absl::StatusOr<HfModel> HfModelFrom(const llvm::json::Value& v, absl::string_view where) {
  Fields f(v, where);
  HfModel m;
  f.Required("file", m.file);
  f.Required("step", m.step);
  std::optional<std::string> objective;
  f.Optional("objective", objective);
  f.OptionalOrNull("logits_dtype", m.logits_dtype);
  f.OptionalOrNull("config", m.config);
  MOERR_RETURN_IF_ERROR(f.status());
  m.objective = objective.value_or("");
  return m;
}

absl::StatusOr<HfModel> ReadHfModel(const BundleReader& reader, absl::string_view bundle) {
  return ReadTyped<HfModel>(reader, kHfModelAnnotation, -1, bundle, &HfModelFrom);
}

}  // namespace moerr::formats
