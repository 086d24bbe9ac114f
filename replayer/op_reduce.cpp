#include "replayer/op_reduce.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "analysis/overflow_cause.h"
#include "formats/collective_op.h"
#include "formats/trace.h"
#include "recorder/hooks/torch_boundary.h"
#include "replayer/program_replay.h"
#include "replayer/repro_script.h"
#include "replayer/row_shrink.h"
#include "replayer/step_cut.h"
#include "support/check.h"
#include "support/seconds_since.h"
#include "support/status.h"

namespace moerr::replayer {
namespace {

using Clock = std::chrono::steady_clock;
using OpSet = std::vector<size_t>;  // op indices into the step, ascending

// The failure a candidate must keep: the recorded ops (by seq) of the first
// overflow and of its cause (when an op before it exploded).
struct Kept {
  uint64_t first_seq = 0;
  std::optional<uint64_t> cause_seq;
};

Kept KeptOf(const analysis::OverflowCause& found) {
  Kept k{found.first.op->seq, std::nullopt};
  if (found.found_explosion) k.cause_seq = found.cause.op->seq;
  return k;
}

bool SameFailure(const std::optional<analysis::OverflowCause>& found, const Kept& kept) {
  return found && KeptOf(*found).first_seq == kept.first_seq && KeptOf(*found).cause_seq == kept.cause_seq;
}

// Whether `cut`, replayed on the leaves `pool` holds, fails as `kept` says.
bool CutFails(const formats::BundleReader& pool, int64_t step, const formats::Trace& cut, const Kept& kept) {
  const absl::StatusOr<ReplayReport> report = ReplayTrace(pool, step, cut);
  return report.ok() && SameFailure(analysis::FindOverflowCause(ReplayedTrace(cut, *report, cut.ops.size())), kept);
}

// The recorded step that fails, with its trace and first overflow.
struct FailingStep {
  int64_t step = 0;
  formats::Trace trace;
  size_t first = 0;                 // op index of the first overflow
  std::optional<size_t> cause;      // op index of its cause
  Failure failure;
};

// The first step (`options.step`, or each complete step in turn) that
// overflows; none when no step does.
absl::StatusOr<std::optional<FailingStep>> FirstOverflowingStep(const formats::BundleReader& reader, int64_t which,
                                                                const std::string& source) {
  for (int64_t step : which >= 0 ? std::vector<int64_t>{which} : reader.CompleteSteps()) {
    absl::StatusOr<formats::Trace> trace = formats::ReadTrace(reader, step);
    if (!trace.ok()) return Annotate(trace.status(), absl::StrFormat("%s, step %d", source, step));
    const std::optional<analysis::OverflowCause> found = analysis::FindOverflowCause(*trace);
    if (!found) continue;
    if (formats::IsCollective(*found->first.op)) {
      // Its output is what peers sent, served from the record in a replay of
      // this rank alone: no op here made it, and a repro would assert the
      // record against itself.
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s, step %d: the first values that are not finite are the output of op %zu %s in %s, a collective: its "
          "peers made them, and a reduce of this rank alone serves them from the record; reduce the run directory "
          "(moerr reduce RUN picks the rank where an op made them) or the rank moerr bisect RUN names",
          source, step, found->first.op_index, found->first.op->name, found->first.op->module));
    }
    FailingStep out{step, {}, found->first.op_index, std::nullopt, OverflowFailure(found->first)};
    if (found->found_explosion) out.cause = found->cause.op_index;
    out.trace = *std::move(trace);
    out.trace.Index();
    return out;
  }
  return std::nullopt;
}

absl::StatusOr<FailingStep> FindOverflowingStep(const formats::BundleReader& reader, const OpReduceOptions& options) {
  MOERR_ASSIGN_OR_RETURN(std::optional<FailingStep> found, FirstOverflowingStep(reader, options.step, options.source));
  if (found) return *std::move(found);
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: %s; the op-level reduce keeps a first overflow (an op making Inf or NaN from finite inputs), a vendor "
      "op's verdict against its reference, or, with --against REF, a divergence from a reference recording",
      options.source,
      options.step >= 0 ? absl::StrFormat("step %d has no overflow", options.step) : "no recorded step overflows"));
}

// The recording's own annotation, or an error naming why its values cannot
// be replayed (a stats bundle holds fingerprints only).
absl::StatusOr<formats::Recording> ReplayableRecording(const formats::BundleReader& reader,
                                                       const OpReduceOptions& options) {
  absl::StatusOr<formats::Recording> recording = formats::ReadRecording(reader, options.source);
  if (absl::IsNotFound(recording.status())) recording = formats::Recording{};
  if (!recording.ok()) return recording.status();
  if (recording->mode == "stats") {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s was recorded in stats mode: it holds fingerprints, not values, and an op-level reduce replays ops on "
        "their values (record with mode \"replayable\" or \"full\")",
        options.source));
  }
  return *std::move(recording);
}

class Reducer {
 public:
  Reducer(const FailingStep& failing, const formats::Trace& base, const formats::BundleReader& pool, Kept kept,
          const OpReduceProgress& progress)
      : failing_(failing), base_(base), pool_(pool), kept_(kept), progress_(progress) {}

  // The ops of `ops` the first overflow depends on, through the tensors they
  // produce (a value no op of `ops` produces is cut free). Keeps the first
  // overflow, which is last.
  OpSet Slice(const OpSet& ops) const {
    absl::flat_hash_set<uint64_t> needed;
    OpSet out;
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      const formats::OpEvent& op = base_.ops[*it];
      const bool feeds = *it == failing_.first ||
                         std::any_of(op.outputs.begin(), op.outputs.end(), [&](uint64_t id) { return needed.contains(id); });
      if (!feeds) continue;
      for (uint64_t id : formats::TensorsRead(op)) needed.insert(id);
      out.push_back(*it);
    }
    std::reverse(out.begin(), out.end());
    return out;
  }

  // Whether the cut to `ops` still fails the same way; each set replays once.
  bool Fails(const OpSet& ops) {
    if (auto it = tried_.find(ops); it != tried_.end()) return it->second;
    const bool fails = CutFails(pool_, failing_.step, CutStep(base_, ops), kept_);
    tried_.emplace(ops, fails);
    if (progress_) progress_(static_cast<int64_t>(tried_.size()), absl::StrFormat("%d ops", ops.size()));
    return fails;
  }

  // The shortest suffix of `ops` (sliced) that still fails: a binary search
  // over where it starts, taking failing to be monotone in the start.
  OpSet Suffix(const OpSet& ops) {
    size_t lo = 0, hi = ops.size() - 1;  // ops[lo:] fails; ops[hi:] is the first overflow alone
    auto from = [&](size_t k) { return Slice(OpSet(ops.begin() + static_cast<ptrdiff_t>(k), ops.end())); };
    if (Fails(from(hi))) return from(hi);
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      (Fails(from(mid)) ? lo : hi) = mid;
    }
    return from(lo);
  }

  // ddmin over `ops` but the first overflow: remove a chunk (its complement
  // sliced) while that still fails, refining chunks down to single ops.
  OpSet Minimize(OpSet ops) {
    size_t n = 2;
    while (ops.size() > 1) {
      const size_t others = ops.size() - 1;  // ops.back() is the first overflow
      const size_t chunks = std::min(n, others);
      bool cut = false;
      for (size_t c = 0; c < chunks && !cut; ++c) {
        const size_t begin = others * c / chunks, end = others * (c + 1) / chunks;
        OpSet rest(ops.begin(), ops.begin() + static_cast<ptrdiff_t>(begin));
        rest.insert(rest.end(), ops.begin() + static_cast<ptrdiff_t>(end), ops.end());
        rest = Slice(rest);
        if (rest.size() < ops.size() && Fails(rest)) {
          ops = std::move(rest);
          n = std::max<size_t>(n - 1, 2);
          cut = true;
        }
      }
      if (cut) continue;
      if (chunks >= others) break;  // every single op tried: 1-minimal
      n = std::min(2 * n, others);
    }
    return ops;
  }

  int64_t tried() const { return static_cast<int64_t>(tried_.size()); }

 private:
  const FailingStep& failing_;
  const formats::Trace& base_;
  const formats::BundleReader& pool_;
  Kept kept_;
  const OpReduceProgress& progress_;
  std::map<OpSet, bool> tried_;
};

// Every tensor the ops up to and including `last` read or make: what a
// candidate may cut free.
std::set<uint64_t> ValuesUpTo(const formats::Trace& trace, size_t last) {
  std::set<uint64_t> out;
  for (size_t i = 0; i <= last; ++i) {
    for (uint64_t id : formats::TensorsRead(trace.ops[i])) out.insert(id);
    for (uint64_t id : trace.ops[i].outputs) {
      if (id != 0) out.insert(id);
    }
  }
  return out;
}

// What the stages after the op sets read: the recording, its failure, the
// options.
struct Reduction {
  const formats::BundleReader& source;
  const OpReduceOptions& options;
  const FailingStep& failing;
  Kept kept;
  const formats::Recording& recording;  // its "recording" annotation
  const OpReduceProgress& progress;
};

// A cut and its leaves' values, written as a pool bundle at `path` (each
// candidate of the shrink replaces the last) and read back.
absl::StatusOr<std::unique_ptr<formats::BundleReader>> WritePool(const Reduction& r, const std::string& path,
                                                                 const ShrunkCut& c) {
  MOERR_RETURN_IF_ERROR(WriteCutBundle(path, r.failing.step, c.cut, /*with_ops=*/false, c.values, r.source,
                                       r.recording, /*compress=*/false));
  return formats::BundleReader::Open(path);
}

// Shrinks the rows of the values feeding `ops` (row_shrink.h), each
// candidate replayed; then replays the result once more for the kept ops'
// outputs as they now are (shapes, strides, fingerprints).
absl::StatusOr<ShrunkCut> Shrink(const Reduction& r, const formats::Trace& base, const OpSet& ops,
                                 const std::map<uint64_t, at::Tensor>& captured, OpReduceReport& report) {
  ShrunkCut in{CutStep(base, ops), {}};
  for (const formats::TensorMeta& meta : in.cut.tensors) {
    if (meta.leaf.empty()) continue;
    auto value = captured.find(meta.id);
    if (value == captured.end()) {
      return absl::DataLossError(absl::StrFormat("%s, step %d: tensor %d was not made by the replay of the step",
                                                 r.options.source, r.failing.step, meta.id));
    }
    in.values[meta.id] = value->second;
  }
  report.elements_before = CutFreeElements(in.cut);
  const std::string path = (std::filesystem::path(r.options.work_dir) / "shrink.moerr").string();
  ShrunkCut out = ShrinkRows(std::move(in), [&](const ShrunkCut& c) {
    ++report.tried;
    if (r.progress) r.progress(report.tried, "shrinking rows");
    absl::StatusOr<std::unique_ptr<formats::BundleReader>> pool = WritePool(r, path, c);
    return pool.ok() && CutFails(**pool, r.failing.step, c.cut, r.kept);
  });
  report.elements_after = CutFreeElements(out.cut);
  MOERR_ASSIGN_OR_RETURN(const std::unique_ptr<formats::BundleReader> pool,
                         WritePool(r, path, out));
  std::set<uint64_t> made;
  for (const formats::OpEvent& op : out.cut.ops) made.insert(op.outputs.begin(), op.outputs.end());
  ReplayOptions measure;
  measure.capture = &made;
  MOERR_ASSIGN_OR_RETURN(const ReplayReport replayed, ReplayTrace(*pool, r.failing.step, out.cut, measure));
  out.cut = ReplayedTrace(out.cut, replayed, out.cut.ops.size());
  for (formats::TensorMeta& meta : out.cut.tensors) {
    auto t = replayed.captured.find(meta.id);
    if (meta.producer < 0 || t == replayed.captured.end()) continue;
    meta.shape = t->second.sizes().vec();
    meta.strides = t->second.strides().vec();
    if (!meta.leaf.empty()) out.values[meta.id] = t->second;  // a random or foreign op's, as the cut holds it
  }
  out.cut.Index();
  return out;
}

// Writes the reduced bundle (`cut`, its leaves from `values`) and the repro,
// and fills in what they hold.
absl::Status WriteReduced(const Reduction& r, const formats::Trace& cut, const std::map<uint64_t, at::Tensor>& values,
                          OpReduceReport& report) {
  const OpReduceOptions& options = r.options;
  const FailingStep& failing = r.failing;
  formats::Recording annotation = r.recording;
  annotation.mode = "replayable";  // leaves only: the replay makes the rest
  annotation.reduced = llvm::json::Object{{"from", options.source},
                                          {"step", failing.step},
                                          {"ops", static_cast<int64_t>(report.ops_before)},
                                          {"kept", static_cast<int64_t>(report.kept.size())}};
  MOERR_RETURN_IF_ERROR(WriteCutBundle(options.out_path, failing.step, cut, /*with_ops=*/true, values, r.source,
                                       annotation, /*compress=*/true));
  report.bytes_after = std::filesystem::file_size(options.out_path);
  ReproSource source{options.source, failing.step, report.ops_before, report.kept,
                     r.recording.threads_or_zero(), std::nullopt};
  if (failing.cause) {
    const auto at = std::find(report.kept.begin(), report.kept.end(), *failing.cause);
    if (at != report.kept.end()) source.cause = static_cast<size_t>(at - report.kept.begin());
  }
  return CatchTorch("writing the repro", [&] {
    MOERR_ASSIGN_OR_RETURN(report.assertion,
                           WriteReproScript(options.script_path, options.values_path, cut, values, source));
    return absl::OkStatus();
  });
}

}  // namespace

absl::StatusOr<bool> Overflows(const formats::BundleReader& reader, int64_t step, const std::string& source) {
  MOERR_ASSIGN_OR_RETURN(const std::optional<FailingStep> found, FirstOverflowingStep(reader, step, source));
  return found.has_value();
}

absl::StatusOr<OpReduceReport> ReduceOps(const formats::BundleReader& reader, const OpReduceOptions& options,
                                         const OpReduceProgress& progress) {
  MOERR_CHECK(!options.out_path.empty() && !options.work_dir.empty() && !options.script_path.empty() &&
              !options.values_path.empty());
  const Clock::time_point start = Clock::now();
  MOERR_ASSIGN_OR_RETURN(const formats::Recording recording, ReplayableRecording(reader, options));
  MOERR_ASSIGN_OR_RETURN(const FailingStep failing, FindOverflowingStep(reader, options));
  OpReduceReport report;
  report.step = failing.step;
  report.failure = failing.failure;
  report.first_overflow = failing.first;
  report.cause = failing.cause;
  report.ops_before = failing.trace.ops.size();
  report.bytes_before = reader.file_size();
  const Kept kept{failing.trace.ops[failing.first].seq,
                  failing.cause ? std::optional<uint64_t>(failing.trace.ops[*failing.cause].seq) : std::nullopt};

  // One replay up to the first overflow makes every value a cut may need.
  const std::set<uint64_t> values = ValuesUpTo(failing.trace, failing.first);
  ReplayOptions capture;
  capture.end_op = failing.first + 1;
  capture.capture = &values;
  const Clock::time_point replay_start = Clock::now();
  absl::StatusOr<ReplayReport> whole = ReplayTrace(reader, failing.step, failing.trace, capture);
  if (!whole.ok()) return Annotate(whole.status(), absl::StrFormat("%s, step %d", options.source, failing.step));
  report.replay_seconds = SecondsSince(replay_start);
  const formats::Trace base = ReplayedTrace(failing.trace, *whole, capture.end_op);  // as the replay saw it
  if (!SameFailure(analysis::FindOverflowCause(base), kept)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s, step %d: a replay of the step does not reproduce its %s; the op-level reduce cuts the step from the "
        "replay's values (moerr replay %s shows where it departs)",
        options.source, failing.step, failing.failure.description, options.source));
  }

  // The value pool: every value a candidate may read, as a leaf.
  formats::Trace pool_trace;
  for (const formats::TensorMeta& meta : base.tensors) {
    if (!whole->captured.count(meta.id)) continue;
    pool_trace.tensors.push_back(meta);
    pool_trace.tensors.back().leaf = CutLeafName(meta);
  }
  const std::string pool_path = (std::filesystem::path(options.work_dir) / "values.moerr").string();
  MOERR_RETURN_IF_ERROR(WriteCutBundle(pool_path, failing.step, pool_trace, /*with_ops=*/false, whole->captured,
                                       reader, recording, /*compress=*/false));
  MOERR_ASSIGN_OR_RETURN(const std::unique_ptr<formats::BundleReader> pool, formats::BundleReader::Open(pool_path));

  Reducer reducer(failing, base, *pool, kept, progress);
  OpSet all(failing.first + 1);
  for (size_t i = 0; i <= failing.first; ++i) all[i] = i;
  OpSet ops = reducer.Slice(all);
  if (!reducer.Fails(ops)) {  // the slice does not fail: start from the whole prefix
    if (!reducer.Fails(all)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s, step %d: its ops up to the first overflow, replayed on the values one replay of the step made, do "
          "not fail as the step did",
          options.source, failing.step));
    }
    ops = all;
  }
  ops = reducer.Minimize(reducer.Suffix(ops));
  report.kept = ops;
  report.tried = reducer.tried();
  const Reduction reduction{reader, options, failing, kept, recording, progress};
  MOERR_ASSIGN_OR_RETURN(const ShrunkCut shrunk, Shrink(reduction, base, ops, whole->captured, report));
  MOERR_RETURN_IF_ERROR(WriteReduced(reduction, shrunk.cut, shrunk.values, report));
  report.seconds = SecondsSince(start);
  return report;
}

}  // namespace moerr::replayer
