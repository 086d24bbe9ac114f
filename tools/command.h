// The `moerr` command: one file per subcommand. Each Add*Command registers
// its options and, with OnRun, a body that calls library functions, prints,
// and returns its exit code or the status that stopped it.
// Exit codes: support/exit_code.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/bundle_reader.h"
#include "formats/json_number.h"
#include "formats/json_output.h"
#include "formats/step_trace.h"
#include "formats/trace.h"
#include "llvm/Support/JSON.h"
#include "support/exit_code.h"
#include "support/filesystem.h"

namespace moerr::tools {

// Prints "moerr: error: <message>" (or "moerr: internal error: ...") to
// stderr and returns ExitCodeOf(status).
int ReportError(const absl::Status& status);

// Makes `body` (kExitOk or kExitFinding when it ran, or the status that
// stopped it) the callback of `cmd`: runs it when the subcommand is given
// and sets `exit_code` to what it returned, or to ReportError(its status).
void OnRun(CLI::App* cmd, int& exit_code, std::function<ExitOr()> body);
// The BUNDLE argument's transform: a training or import output directory
// becomes the recording it holds (formats::ResolveRecording); a directory
// that holds none is a usage error naming what it holds.
CLI::Validator RecordingPath();
// An option whose text `parse` reads into a library options struct as the
// command line is parsed, so the option's default is the struct's own,
// shown in help as `default_text`. A value `parse` refuses is a usage error
// (exit 2) with its message, before the command runs. Given more than once
// (with MultiOptionPolicy::TakeAll), each value is parsed in turn.
CLI::Option* AddParsedOption(CLI::App* cmd, const std::string& name, std::function<absl::Status(const std::string&)> parse,
                             const std::string& help, const std::string& default_text = "");
// Called inside a catch block at main's boundary: prints the exception in
// flight (c10::Error without its backtrace, kj::Exception, std::exception)
// as an internal error and returns kExitInternal. Library code returns
// absl::Status; an exception that gets this far is a bug.
int ReportException();

// CheckNotAnInput, then AlreadyExists when `path` exists and `force` is not
// set: an output a command would overwrite.
absl::Status CheckOverwrite(const std::string& path, bool force, const std::vector<std::string>& inputs);

// A working directory `command` fills with files and directories of the
// fixed names `own`, overwriting and removing them: it must be new, empty,
// marked by an earlier run (DIR/.moerr-COMMAND), or hold nothing but those
// names and own[0] (what every run leaves, its cache): an earlier run from
// before the mark. FailedPrecondition otherwise, so nothing someone else put
// there is lost. Creates and marks it.
// "1/4" -> 0.25: a fraction a/b of integers with 0 < a <= b (--keep);
// nullopt for any other text.
std::optional<double> ParseFraction(const std::string& text);

absl::Status ClaimWorkDir(const std::string& dir, const std::string& command, const std::vector<std::string>& own);

// The steps a command reads from the bundle at `path`: `requested`, each of
// which must have records there, or every complete and every raised step
// when none is requested (NotFound when there are none).
absl::StatusOr<std::vector<int64_t>> StepsToRead(const formats::BundleReader& reader, const std::string& path,
                                                 const std::vector<int64_t>& requested);
// "step 4 RAISED RuntimeError: ... (after op 412 aten::mm in ...)", printed
// first for a step left by an exception; "" for any other step.
absl::StatusOr<std::string> RaisedLine(const formats::BundleReader& reader, int64_t step);

// The bundle at `path`, opened, and the trace of its step `step` (of its
// first complete step when `step` < 0).
using OpenedStep = formats::StepTrace;
absl::StatusOr<OpenedStep> OpenStep(const std::string& path, int64_t step);

using formats::JsonNumber;  // non-finite values print as null
using formats::PrintJson;

// Each subcommand's registration (tools/commands.def): its options and its
// body, which sets `exit_code` when the subcommand runs.
#define MOERR_COMMAND(Name) void Add##Name##Command(CLI::App& app, int& exit_code);
#include "tools/commands.def"
#undef MOERR_COMMAND

}  // namespace moerr::tools
