// The annotations a bundle carries (docs/FORMAT.md, "Annotations"): every
// key, and for each kind whose fields moerr reads, a struct with one writer
// (ToJson) and one reader (XFrom a value, ReadX from a bundle).
//
// An annotation is a JSON value stored under a key, step-less (step -1) or
// per step (bundle.capnp's Annotation record). The field names here are the
// bundle's: old bundles read as they did.
//
// Readers: NotFound when the bundle has no such annotation; InvalidArgument
// naming the bundle, the key (and step) and the field when it is malformed.
// `bundle` is the name errors give the bundle (its path).
//
// Kinds kept as JSON objects by design (opaque; one reader, ReadObjectAnnotation):
//   model_config   a Hugging Face config.json object (moe::ToHfConfig / FromHfConfig);
//   grpo_options   the trainer's options as moe::ToJson writes them (moe parses them);
//   trainer_state  the trainer's scalars (moe::TrainerState; GrpoTrainer::RestoreState parses them);
//   metrics        moe::StepMetrics as moe::MetricsToJson writes them, non-finite as names;
//                  readers show it field by field, by name; the fields a check
//                  judges are read through StepMetricsNote below;
//   proxy          how a proxy was built: the proxy builder's report, copied
//                  whole into a replay's bundle (world/world_replay_comparison.h reads it);
//   imported_step  an importer's note on the step: "source" and the fields of
//                  its tool (entries by op, dataflow, values...);
//   imported_values, imported_skipped, msprobe_stack, msprobe_overflow_check:
//                  an imported dump's own values, kept as the tool wrote them;
//   outcome        a Python loop's named metrics (formats/bundle_summary.h reads them).
// Kinds with their struct elsewhere: "raised" (formats/raised_step.h),
// "flight_recorder" (formats/collective_op.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/bundle_reader.h"
#include "llvm/Support/JSON.h"

namespace moerr::formats {

// ---- Keys ------------------------------------------------------------------
// Step-less unless marked "per step".
inline constexpr char kRecordingAnnotation[] = "recording";       // Recording
inline constexpr char kModelConfigAnnotation[] = "model_config";  // opaque
inline constexpr char kGrpoOptionsAnnotation[] = "grpo_options";  // opaque
inline constexpr char kTrainerStateAnnotation[] = "trainer_state";  // per step, opaque
inline constexpr char kMetricsAnnotation[] = "metrics";           // per step, opaque
inline constexpr char kLossScaleAnnotation[] = "loss_scale";      // per step, a number
inline constexpr char kReplayTimeAnnotation[] = "replay_time";    // per step, ReplayTime
inline constexpr char kFaultAnnotation[] = "fault";               // FaultNote
inline constexpr char kProxyAnnotation[] = "proxy";               // opaque
inline constexpr char kCollectiveFailedAnnotation[] = "collective_failed";  // CollectiveFailed
inline constexpr char kImportedStepAnnotation[] = "imported_step";          // per step, opaque
inline constexpr char kImportedValuesAnnotation[] = "imported_values";      // per step, opaque
inline constexpr char kImportedSkippedAnnotation[] = "imported_skipped";    // per step, opaque
inline constexpr char kMsprobeStackAnnotation[] = "msprobe_stack";          // opaque
inline constexpr char kMsprobeOverflowCheckAnnotation[] = "msprobe_overflow_check";  // opaque
inline constexpr char kOutcomeAnnotation[] = "outcome";           // per step, opaque
inline constexpr char kAnomalyAnnotation[] = "anomaly";           // per step, why the ring kept it
inline constexpr char kHfModelAnnotation[] = "hf_model";          // HfModel (moerr.record writes it)
// A string: why moerr.record(model=) wrote no capture for the rank.
inline constexpr char kHfModelUnwrittenAnnotation[] = "hf_model_unwritten";
// The demo's model summary ({layers, experts, top_k, hidden}); nothing reads it.
inline constexpr char kDemoModelAnnotation[] = "model";

// "BUNDLE: annotation \"KEY\"[ at step N]": the context of a reader's error.
std::string AnnotationWhere(absl::string_view bundle, absl::string_view key, int64_t step = -1);

// The annotation `key` of `step` as a JSON object: NotFound when absent,
// InvalidArgument when it is not an object. The one reader of the opaque kinds.
absl::StatusOr<llvm::json::Object> ReadObjectAnnotation(const BundleReader& reader, absl::string_view key,
                                                        int64_t step, absl::string_view bundle);

// ---- proxy (opaque) ------------------------------------------------------------
// The lookups every reader of a "proxy" annotation shares. Its "layers" hold
// one plan per layer: {"layer": L, "kept": [original expert of proxy expert
// j], "maps_to": [kept expert standing for original expert e], ...}.
//
// The plan of `layer`; nullptr when the annotation has none.
const llvm::json::Object* ProxyLayerOf(const llvm::json::Object& proxy, int64_t layer);
// Element `i` of the integer array `key` of `o` (nullptr: none), if there.
std::optional<int64_t> ProxyArrayAt(const llvm::json::Object* o, const char* key, int64_t i);
// The original expert that proxy expert `expert` of `layer` is ("kept").
std::optional<int64_t> ProxyKeptExpert(const llvm::json::Object& proxy, int64_t layer, int64_t expert);
// The kept expert that stands for original expert `original` of `layer` ("maps_to").
std::optional<int64_t> ProxyMapsTo(const llvm::json::Object& proxy, int64_t layer, int64_t original);

// ---- recording ---------------------------------------------------------------
// How the bundle was written: by the recorder, cut by a reduce, or imported
// from another tool's dump.
struct Recording {
  std::string mode;                           // "full", "stats", "replayable"; "" when absent
  std::optional<std::string> trigger;         // "always", "window", "anomaly"
  std::optional<std::string> libtorch;        // "2.11.0": the LibTorch that recorded it
  std::optional<int64_t> threads;             // intra-op threads of the recording process
  std::optional<bool> deterministic;          // torch's deterministic algorithms were on
  std::optional<llvm::json::Object> imported; // the dump it was imported from ("from": the tool)
  std::optional<llvm::json::Object> reduced;  // what a reduce cut it from ("from", "step", "ops", "kept"...)
  llvm::json::Object other;                   // fields not named above, kept as written

  int64_t threads_or_zero() const { return threads.value_or(0); }
};
llvm::json::Object ToJson(const Recording& r);
absl::StatusOr<Recording> RecordingFrom(const llvm::json::Value& v, absl::string_view where);
absl::StatusOr<Recording> ReadRecording(const BundleReader& reader, absl::string_view bundle);
// ReadRecording, with a bundle that has none (or a malformed one) as nullopt:
// for readers to whom the annotation is a hint.
std::optional<Recording> RecordingOf(const BundleReader& reader);
// Whether the bundle's values can be replayed (precision bisect, replay): a
// recording not in stats mode, and not imported (replay refuses an imported
// dump, whatever its mode). True for a bundle with no recording annotation,
// false for one whose annotation is malformed (its mode cannot be told).
bool HoldsReplayableValues(const BundleReader& reader);

// ---- replay_time (per step) ------------------------------------------------------
// Wall and process CPU seconds of a model replay's step (replayer/model_replay.h).
struct ReplayTime {
  double seconds = 0;
  double cpu_seconds = 0;
};
llvm::json::Object ToJson(const ReplayTime& t);
absl::StatusOr<ReplayTime> ReplayTimeFrom(const llvm::json::Value& v, absl::string_view where);
absl::StatusOr<ReplayTime> ReadReplayTime(const BundleReader& reader, int64_t step, absl::string_view bundle);

// ---- fault -------------------------------------------------------------------
// The fault `moerr train --fault` injected (moe/fault.h's name), and on which
// rank; also the "fault" field of a proxy annotation and of a verdict.
struct FaultNote {
  std::string kind;             // moe::FaultName
  std::optional<int64_t> rank;  // the faulty rank; -1 or absent: every rank
};
llvm::json::Object ToJson(const FaultNote& f);
absl::StatusOr<FaultNote> FaultNoteFrom(const llvm::json::Value& v, absl::string_view where);
absl::StatusOr<FaultNote> ReadFaultNote(const BundleReader& reader, absl::string_view bundle);

// ---- collective_failed -------------------------------------------------------
// The collective a rank was waiting in when it failed (recorder/recorder.h):
// written once, when the process group reports the failure.
struct CollectiveFailed {
  std::string kind;     // "all_reduce", ...
  std::string group;    // the process group's name
  int64_t seq = -1;     // the collective's number in its group
  int64_t step = -1;    // the step it was called in
  std::string module;   // the module that called it
  std::string error;    // what the process group said
  int64_t group_rank = -1;
};
llvm::json::Object ToJson(const CollectiveFailed& c);
absl::StatusOr<CollectiveFailed> CollectiveFailedFrom(const llvm::json::Value& v, absl::string_view where);
absl::StatusOr<CollectiveFailed> ReadCollectiveFailed(const BundleReader& reader, absl::string_view bundle);

// ---- metrics (per step) --------------------------------------------------------
// The fields of a "metrics" annotation that moerr judges (the lint's
// optimizer-hazards check); moe::MetricsToJson writes it (formats cannot
// depend on moe), and the rest of it is read whole, by name, through
// ReadObjectAnnotation.
struct StepMetricsNote {
  std::optional<bool> skipped;       // the optimizer skipped the update (gradients not finite at the scale)
  std::optional<bool> finite;        // the step's loss and gradients were finite
  std::optional<double> loss_scale;  // the fp16 loss scale of the step; nullopt when absent or not
                                     // finite (written as a name, "inf" or "nan")
};
absl::StatusOr<StepMetricsNote> StepMetricsNoteFrom(const llvm::json::Value& v, absl::string_view where);
absl::StatusOr<StepMetricsNote> ReadStepMetricsNote(const BundleReader& reader, int64_t step,
                                                    absl::string_view bundle);

// ---- hf_model ------------------------------------------------------------------
// A Python loop's capture for replay on other ranks (python/moerr/_hf.py
// writes it): the safetensors file beside the bundle, its step, and the HF
// config the loop's model was built from.
struct HfModel {
  std::string file;        // relative to the run's directory
  int64_t step = 0;
  std::string objective;   // the loss the loop computed ("causal_lm_mean")
  std::optional<std::string> logits_dtype;  // "float32", ...; absent or null: not captured
  std::optional<llvm::json::Object> config;  // config.json's fields
};
llvm::json::Object ToJson(const HfModel& m);
absl::StatusOr<HfModel> HfModelFrom(const llvm::json::Value& v, absl::string_view where);
absl::StatusOr<HfModel> ReadHfModel(const BundleReader& reader, absl::string_view bundle);

}  // namespace moerr::formats
