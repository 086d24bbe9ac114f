#include <torch/version.h>

#include "absl/strings/str_format.h"
#include "formats/frame.h"
#include "support/version.h"
#include "tools/command.h"

int main(int argc, char** argv) {
  using namespace moerr::tools;
  CLI::App app{"moerr: debug failing training steps of Mixture-of-Experts models from their recorded bundles", "moerr"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");
  app.footer("Exit codes: 0 ok; 1 the check ran and found a problem; 2 bad input or usage; 3 internal error (a bug)");
  // A reader opens every minor version of its major format version.
  app.set_version_flag("--version",
                       absl::StrFormat("moerr %s\nbundle format: writes %d.%d, reads %d.x\ntorch: built against %s",
                                       moerr::Version(), moerr::formats::kMajorVersion,
                                       moerr::formats::kMinorVersion, moerr::formats::kMajorVersion, TORCH_VERSION),
                       "Print moerr's version, the bundle format versions it writes and reads, and the torch "
                       "it was built against");
  int exit_code = moerr::kExitOk;
#define MOERR_COMMAND(Name) Add##Name##Command(app, exit_code);
#include "tools/commands.def"
#undef MOERR_COMMAND
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? moerr::kExitOk : moerr::kExitError;
  } catch (...) {
    return ReportException();  // LibTorch, Cap'n Proto or any other exception: a bug
  }
  return exit_code;
}
