#include "formats/json_output.h"

#include <cstdio>
#include <utility>

#include "llvm/Support/FormatVariadic.h"

namespace moerr::formats {

void PrintJson(llvm::json::Value value) {
  std::printf("%s\n", llvm::formatv("{0:2}", std::move(value)).str().c_str());
}

}  // namespace moerr::formats
