#include "tools/command.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <c10/util/Exception.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/raised_step.h"
#include "formats/world_manifest.h"
#include "kj/exception.h"
#include "support/status.h"

namespace moerr::tools {

int ReportError(const absl::Status& status) {
  const int exit_code = ExitCodeOf(status);
  if (exit_code == kExitInternal) {
    std::fprintf(stderr, "moerr: internal error: %s (a bug in moerr; please report it)\n",
                 std::string(status.message()).c_str());
  } else {
    std::fprintf(stderr, "moerr: error: %s\n", std::string(status.message()).c_str());
  }
  return exit_code;
}

void OnRun(CLI::App* cmd, int& exit_code, std::function<ExitOr()> body) {
  cmd->callback([&exit_code, body = std::move(body)] {
    const ExitOr result = body();
    exit_code = result.ok() ? *result : ReportError(result.status());
  });
}

int ReportException() {
  std::string what = "an exception of unknown type";
  try {
    throw;
  } catch (const c10::Error& e) {
    what = std::string("LibTorch: ") + e.what_without_backtrace();
  } catch (const kj::Exception& e) {
    what = std::string("Cap'n Proto: ") + e.getDescription().cStr();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  return ReportError(absl::InternalError("uncaught exception: " + what));
}

absl::Status CheckOverwrite(const std::string& path, bool force, const std::vector<std::string>& inputs) {
  MOERR_RETURN_IF_ERROR(CheckNotAnInput(path, inputs));
  if (force || !std::filesystem::exists(path)) return absl::OkStatus();
  return absl::AlreadyExistsError(path + " exists; pass --force to overwrite it");
}

std::optional<double> ParseFraction(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, '/');
  int64_t a = 0, b = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &a) || !absl::SimpleAtoi(parts[1], &b) || a < 1 || b < a) {
    return std::nullopt;
  }
  return double(a) / double(b);
}

absl::Status ClaimWorkDir(const std::string& dir, const std::string& command, const std::vector<std::string>& own) {
  namespace fs = std::filesystem;
  const fs::path marker = fs::path(dir) / (".moerr-" + command);
  std::error_code error;
  if (fs::exists(dir, error) && !fs::exists(marker, error)) {
    if (!fs::is_directory(dir, error)) return absl::InvalidArgumentError(dir + " is not a directory");
    bool empty = true, owned = true;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, error)) {
      empty = false;
      owned = owned && std::find(own.begin(), own.end(), e.path().filename().string()) != own.end();
    }
    if (!empty && !(owned && !own.empty() && fs::exists(fs::path(dir) / own[0], error))) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s holds files moerr %s did not write, and it overwrites files of fixed names there; pass another "
          "directory",
          dir, command));
    }
  }
  fs::create_directories(dir, error);
  if (error) return absl::UnavailableError(absl::StrFormat("cannot create %s: %s", dir, error.message()));
  std::FILE* f = std::fopen(marker.c_str(), "w");
  if (f == nullptr) return absl::UnavailableError(absl::StrFormat("cannot write in %s: %s", dir, std::strerror(errno)));
  std::fprintf(f, "the working directory of moerr %s\n", command.c_str());
  std::fclose(f);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> StepsToRead(const formats::BundleReader& reader, const std::string& path,
                                                 const std::vector<int64_t>& requested) {
  const std::vector<int64_t> present = reader.Steps();
  const std::string listed = present.empty() ? "none" : absl::StrJoin(present, ", ");
  for (int64_t step : requested) {
    if (!std::binary_search(present.begin(), present.end(), step)) {
      return absl::NotFoundError(absl::StrFormat("step %d is not in %s (its steps: %s)", step, path, listed));
    }
  }
  if (!requested.empty()) return requested;
  std::vector<int64_t> steps = reader.CompleteSteps();
  // A step left by an exception is the step to debug: read with the others.
  MOERR_ASSIGN_OR_RETURN(const auto raised, formats::ReadRaisedSteps(reader));
  for (const auto& [step, r] : raised) steps.push_back(step);
  std::sort(steps.begin(), steps.end());
  if (steps.empty()) {
    return absl::NotFoundError(absl::StrFormat(
        "%s has no complete step (its steps: %s); pass --step to read an incomplete one", path, listed));
  }
  return steps;
}

CLI::Validator RecordingPath() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        absl::StatusOr<std::string> resolved = formats::ResolveRecording(path);
        if (!resolved.ok()) return std::string(resolved.status().message());
        path = *std::move(resolved);
        return "";
      },
      "");
}

CLI::Option* AddParsedOption(CLI::App* cmd, const std::string& name, std::function<absl::Status(const std::string&)> parse,
                             const std::string& help, const std::string& default_text) {
  // A validator runs on each value given, so a repeated option parses each.
  CLI::Option* option = cmd->add_option(name, help)->check(CLI::Validator(
      [parse = std::move(parse)](std::string& text) {
        const absl::Status parsed = parse(text);
        return parsed.ok() ? std::string() : std::string(parsed.message());
      },
      ""));
  if (!default_text.empty()) option->default_str(default_text);
  return option;
}

absl::StatusOr<std::string> RaisedLine(const formats::BundleReader& reader, int64_t step) {
  MOERR_ASSIGN_OR_RETURN(const std::optional<formats::RaisedStep> raised, formats::ReadRaisedStep(reader, step));
  if (!raised) return std::string();
  return absl::StrFormat("step %d RAISED %s", step, raised->Headline());
}

absl::StatusOr<OpenedStep> OpenStep(const std::string& path, int64_t step) {
  return formats::OpenStepTrace(path, step);
}

}  // namespace moerr::tools
