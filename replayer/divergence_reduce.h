// The op-level reduce of a divergence from a reference recording (`moerr
// reduce BUNDLE --against REF`; docs/PROXY.md, "Op by op"). The failure kept
// is the headline of `moerr diff REF BUNDLE` judged on introduced error
// (DiffPrecisions, introduced_error.h): the first matched op whose output in
// BUNDLE introduces error beyond its budget, its recorded output against
// the op's fp64 run on its own recorded inputs.
//
// That judgement needs no op before the culprit (it runs on its recorded
// inputs), so the culprit alone is kept: its inputs cut free (step_cut.h)
// with the values an isolated replay of BUNDLE reads, its recorded outputs
// kept as BUNDLE holds them. Output: a full-mode bundle of that op, and a
// repro (repro_script.h, WriteDivergenceScript) that asserts the recorded
// output's error against the op's fp64 run.
//
// Refused, each saying why: a recording without the values of every op (a
// stats or replayable bundle: the judgement would be an estimate, and the
// repro needs the recorded output); steps whose differences are within
// rounding; a first difference that is the program's (other ops called),
// or that lies in the reference's op rather than BUNDLE's. A first
// difference that is the op's call (the same op called with another
// scalar, its output within its budget) is kept too: the expected output is
// then the op called as the reference calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "diff/precision_diff.h"
#include "formats/step_trace.h"

namespace moerr::replayer {

struct DivergenceReduceOptions {
  std::string out_path;                    // required: the reduced bundle
  std::string script_path, values_path;    // required: the repro script and its values (safetensors)
  std::string work_dir;                    // required: where a judgement's scratch bundle goes
};

struct DivergenceReduceReport {
  int64_t step = 0, against_step = 0;
  size_t op_index = 0;          // the op kept, in the reduced recording's step
  size_t against_op_index = 0;  // the op it is matched with in the reference's step
  std::string op, module, phase;
  // Its side of the diff's verdict: the output judged (`slot`, the one
  // furthest past its budget) and its relative L2 errors against the op's
  // fp64 run on its recorded inputs (`introduced`: the recorded output's;
  // `rounding`: this machine's run in the recorded dtypes; `budget`).
  diff::IntroducedSide judged;
  double inherited = 0;         // largest relative L2 difference of its inputs from the reference's
  // How its call differs from the reference's ("argument 1 (other): 1 vs
  // 1.01", the reference's value first) when that is the failure: "" when
  // alike, or when its own output is beyond its budget. When it differs
  // (and its own output is within its budget), judged.introduced is the recorded
  // output's error against the fp64 run of the op called as the reference
  // calls it.
  std::string call_difference;
  size_t ops_before = 0;        // ops in the recorded step
  uint64_t bytes_before = 0, bytes_after = 0;  // file sizes: the recording, the reduced bundle
  double seconds = 0;           // the whole reduction
  double diff_seconds = 0;      // of it, the diff judged on introduced error
  std::string assertion;        // what the repro asserts
};

// `progress` is told each stage ("replaying A beside fp64", ...).
absl::StatusOr<DivergenceReduceReport> ReduceDivergence(
    const formats::StepTrace& bundle, const formats::StepTrace& reference, const DivergenceReduceOptions& options,
    const std::function<void(const std::string& what)>& progress = nullptr);

}  // namespace moerr::replayer
