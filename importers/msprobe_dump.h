// msprobe's dump.json and construct.json, parsed into plain structs
// (docs/IMPORT.md has the mapping and the sources it follows). No LibTorch:
// the parser is fuzzed on its own (tests/fuzz/msprobe_dump_fuzz.cpp).
//
// dump.json: {"task": "statistics"|"tensor"|..., "level": "L0"|"L1"|"mix",
// "framework", "dump_data_dir", "data": {ENTRY: {...}}}. An API entry is
// named PREFIX.API.CALL.DIRECTION ("Functional.linear.3.forward"), a module
// entry Module.PATH.CLASS.DIRECTION.CALL ("Module.layers.0.Linear.forward.0")
// or Module.PATH.CLASS.parameters_grad.CALL. Forward entries hold
// input_args, input_kwargs and output (and a module's parameters); backward
// entries input (the output gradients) and output (the input gradients).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/trace.h"

namespace moerr::importers {

// One value of an entry: a tensor (with its statistics) or anything else.
struct DumpValue {
  std::string where;  // "input_args[0]", "output[1][0]", "input_kwargs.bias": for messages
  bool tensor = false;
  // A tensor: "torch.float32"... as dumped, and its shape.
  std::string dtype;
  std::vector<int64_t> shape;
  // Max, Min, Mean, Norm as dumped: nullopt when absent or null; booleans
  // (a bool tensor's any/all) as 0/1. NaN and +-Inf as dumped.
  std::optional<double> max, min, mean, norm;
  // Max_except_inf_nan, Min_except_inf_nan: written when Max / Min is not
  // finite, the extremes over the finite values (NaN when none is finite).
  std::optional<double> max_finite, min_finite;
  std::string data_name;  // the tensor task's file under dump_tensor_data/; "" in statistics dumps
  // The "md5" field: the md5 summary's CRC-32 ("f93a987e") or the xor
  // summary's 64-bit xor ("0x0100010001000100"); "" when absent.
  std::string checksum;
  // Not a tensor: its "type" ("int", "float", "bool", "torch.dtype", ...) and
  // its value when a number, a bool or a string; `none` for a JSON null.
  std::string type;
  std::optional<double> number;
  std::optional<std::string> text;
  bool none = false;
};

enum class EntryKind : uint8_t { kApi, kModule, kParametersGrad };

struct DumpEntry {
  std::string name;  // the entry's key in "data"
  EntryKind kind = EntryKind::kApi;
  formats::Phase phase = formats::Phase::kForward;
  // "Functional.linear" for an API, "Module.Linear" for a module: the entry
  // name without its call count and direction, and a module's path.
  std::string op;
  std::string module;  // a module entry's own path ("layers.0"); an API's comes from construct.json
  std::vector<DumpValue> inputs, outputs;
  // The nan_check task's "is_nan" (torch_npu only): the NPU's overflow flag
  // read after the call, non-zero where it saw a NaN or an overflow;
  // nullopt when absent or null (the check failed).
  std::optional<int64_t> is_nan;
};

struct DumpFile {
  std::string task, level, framework, dump_data_dir;
  std::vector<DumpEntry> entries;  // in the file's order, which is execution order
};

// Parses the text of a dump.json; `file` names it in errors, which also name
// the entry and the value ("dump.json: entry Functional.linear.0.forward:
// output[0]: shape: expected a list of integers"). Python's json module writes
// NaN, Infinity and -Infinity as bare words; they are read as such.
absl::StatusOr<DumpFile> ParseDumpJson(absl::string_view text, absl::string_view file);

// The parts of an entry name: PREFIX.API.CALL.DIRECTION, or a module's.
// InvalidArgument for a name that follows neither form.
absl::Status ParseEntryName(absl::string_view name, DumpEntry& entry);

// construct.json: each entry's enclosing module entry (or null). Returns the
// module path of each entry's parent ("layers.0" for
// "Module.layers.0.Linear.forward.0"), or a parent that is not an entry
// name verbatim ("optimizer", msprobe's scope of the optimizer's APIs);
// entries with no parent are left out.
absl::StatusOr<std::map<std::string, std::string>> ParseConstructJson(absl::string_view text, absl::string_view file);

// Python's json words NaN, Infinity and -Infinity outside strings replaced by
// the strings "NaN", "Infinity", "-Infinity", so a strict JSON parser reads
// the text; nothing inside a string changes.
std::string QuoteNonFiniteWords(absl::string_view text);

}  // namespace moerr::importers
