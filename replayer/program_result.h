// What a program replay of one step found (`moerr replay BUNDLE`, also
// --isolated and --check), as text and as JSON, and the op descriptions the
// replay command's reports share.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "analysis/first_overflow.h"
#include "formats/trace.h"
#include "llvm/Support/JSON.h"
#include "replayer/program_replay.h"

namespace moerr::replayer {

// What a program replay of one step found.
struct ProgramResult {
  const replayer::ReplayReport* report = nullptr;
  const formats::Trace* trace = nullptr;
  bool isolated = false;
  // With a precision policy: the step as the replay saw it, and the first
  // overflow of the record and of the replay (pointing into those traces).
  std::optional<formats::Trace> replayed;
  std::optional<analysis::FirstOverflow> recorded_overflow, policy_overflow;
  std::vector<replayer::OutputError> worst;  // isolated: the largest own errors, worst first
  std::optional<bool> same;                  // --check: whether a second replay was bitwise identical
};

// {"op_index", "op", "module", "phase"} of op `index`.
llvm::json::Object OpJson(size_t index, const formats::OpEvent& op);
// "aten::mm (model.layers.0.mlp, forward)".
std::string Where(const formats::OpEvent& op);

void PrintProgramReplay(const ProgramResult& r);
llvm::json::Object ProgramReplayJson(const ProgramResult& r);

}  // namespace moerr::replayer
