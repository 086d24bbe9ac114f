// The trace model in memory: op events, tensor metadata with fingerprints,
// routing decisions. The recorder writes them as `ops` and `routing` records;
// replay, bisect, diff and lint read them back with ReadTrace.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/dtype.h"

namespace moerr::formats {

class BundleReader;

struct Fingerprint {
  uint64_t numel = 0;
  double min = std::numeric_limits<double>::quiet_NaN();
  double max = std::numeric_limits<double>::quiet_NaN();
  double mean = 0, abs_max = 0, l2 = 0;
  uint64_t nan = 0, pos_inf = 0, neg_inf = 0, beyond_f16 = 0, beyond_bf16 = 0;
  uint64_t hash = 0;
  // The fields not known exactly, as Field bits. Everything moerr records
  // sets none; a bundle imported from a dump that lacks a statistic sets its
  // bit (docs/IMPORT.md). An unknown min, max, mean, abs_max or l2 holds NaN;
  // an unknown count holds a lower bound (1 where the dump shows such a value
  // exists); an unknown hash holds 0 and matches no other hash.
  uint32_t unknown = 0;
  // An imported dump's own checksum of the bytes, when it has one: two
  // values with checksums of one kind are equal or not by them, where no
  // hash says (docs/IMPORT.md). Recordings have none.
  enum class Checksum : uint8_t { kNone = 0, kCrc32 = 1, kXor64 = 2 };
  Checksum checksum_kind = Checksum::kNone;
  uint64_t checksum = 0;
  enum Field : uint32_t {
    kMin = 1u << 0, kMax = 1u << 1, kMean = 1u << 2, kAbsMax = 1u << 3, kL2 = 1u << 4, kNan = 1u << 5,
    kPosInf = 1u << 6, kNegInf = 1u << 7, kBeyondF16 = 1u << 8, kBeyondBf16 = 1u << 9, kHash = 1u << 10,
  };
  bool Known(uint32_t fields) const { return (unknown & fields) == 0; }

  bool Finite() const { return nan == 0 && pos_inf == 0 && neg_inf == 0; }
  bool operator==(const Fingerprint& o) const;
};

enum class Phase : uint8_t { kForward = 0, kBackward = 1, kOptimizer = 2, kOther = 3 };
absl::string_view PhaseName(Phase p);

struct TensorMeta {
  uint64_t id = 0;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape, strides;
  int64_t storage_offset = 0;
  Fingerprint fingerprint;
  int64_t producer = -1;
  std::string leaf;  // bundle tensor name of a captured leaf
  uint64_t view_of = 0;  // non-zero: a view into the storage of that tensor id
};

struct OpArg {
  enum class Kind : uint8_t {
    kNone, kTensor, kTensors, kInt, kFloat, kBool, kText, kInts, kFloats, kBools, kDevice, kUnsupported,
    kOptionalTensors,
    // A Python number that reached the op as a wrapped-number 0-dim tensor
    // (bundle.capnp, Arg.wrappedFloat): f64, i64 and bool.
    kWrappedFloat, kWrappedInt, kWrappedBool,
  };
  Kind kind = Kind::kNone;
  int64_t i = 0;     // kInt, kTensor (id), kBool (0/1), kWrappedInt, kWrappedBool (0/1)
  double f = 0;      // kFloat, kWrappedFloat
  std::string text;  // kText, kDevice, kUnsupported
  std::vector<int64_t> ints;    // kInts, kTensors (ids), kBools (0/1), kOptionalTensors (-1 = None)
  std::vector<double> floats;   // kFloats
};

// "tensor", "int", "wrapped_float", ...: the kind as Python's Bundle.ops shows it.
absl::string_view ArgKindName(OpArg::Kind kind);

struct OpEvent;
// The ids of the tensors `op` reads, in argument order (lists flattened,
// None left out, repeats kept).
std::vector<uint64_t> TensorsRead(const OpEvent& op);

struct OpEvent {
  uint64_t seq = 0;
  uint32_t thread = 0;
  Phase phase = Phase::kForward;
  std::string name, overload, module;
  int64_t sequence_nr = -1, forward_seq = -1;
  std::vector<OpArg> args;
  std::vector<uint64_t> outputs;  // 0: not a tensor
  int8_t autocast = -1;           // CPU autocast dtype in force (a DType), or -1
  std::string device;             // device type of its first tensor argument ("cpu", "cuda"), or ""
  // A module boundary an importer wrote (msprobe's Module.* entries): its
  // inputs and outputs are values its inner ops read and computed, and those
  // ops run before it. Never set by the recorder.
  bool scope = false;
};

struct OpBatch {
  std::vector<OpEvent> ops;
  std::vector<TensorMeta> tensors;
};

struct RoutingRecord {
  int64_t layer = 0, micro_batch = 0;
  std::string topk_ids, topk_weights, logits;
  std::vector<int64_t> token_counts;
};

// Per MoE layer, the routed token slots each expert got over `routing`.
std::map<int64_t, std::vector<int64_t>> TokensPerExpert(const std::vector<RoutingRecord>& routing);

// All ops and tensor metadata of one step (or every step when step < 0), in
// execution order.
struct Trace {
  std::vector<OpEvent> ops;
  std::vector<TensorMeta> tensors;  // in first-seen order
  std::vector<RoutingRecord> routing;
  const TensorMeta* Find(uint64_t id) const;
  void Index();  // builds the id lookup after filling `tensors`

 private:
  std::vector<std::pair<uint64_t, uint32_t>> by_id_;
};

// The ids whose values are uninitialised memory: outputs of ops that
// allocate without filling (empty, empty_like, ...), and views of them. Their
// values mean nothing until another op writes them (which makes a new id), so
// neither bisect, replay nor diff judges them.
absl::flat_hash_set<uint64_t> UninitialisedValues(const Trace& trace);
// Ops whose outputs are uninitialised memory: empty, empty_like, ...
bool AllocatesUninitialised(absl::string_view op);

absl::StatusOr<Trace> ReadTrace(const BundleReader& reader, int64_t step);

// Whether `trace`, a step of `reader`, holds every op's outputs (a full
// recording): the recording annotation says mode "full", or, in a bundle
// written before it said so, some op's activation ("act/") is stored. A
// cut of one foreign op holds only "ext/" outputs: there the mode decides.
bool HoldsOpOutputs(const BundleReader& reader, const Trace& trace);

}  // namespace moerr::formats
