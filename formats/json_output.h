// The --json output of every command.
#pragma once

#include "llvm/Support/JSON.h"

namespace moerr::formats {

// Prints `value` as indented JSON on stdout. Through stdio, as the commands'
// text is, so the two never interleave out of order.
void PrintJson(llvm::json::Value value);

}  // namespace moerr::formats
