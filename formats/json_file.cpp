#include "formats/json_file.h"

#include "absl/strings/str_format.h"
#include "formats/file_sink.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "support/status.h"

namespace moerr::formats {

absl::StatusOr<llvm::json::Value> ReadJsonFile(const std::string& path) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
  if (!buffer) return absl::NotFoundError(absl::StrFormat("cannot open %s: %s", path, buffer.getError().message()));
  auto value = llvm::json::parse((*buffer)->getBuffer());
  if (!value) return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, llvm::toString(value.takeError())));
  return std::move(*value);
}

absl::Status WriteJsonFile(const std::string& path, const llvm::json::Value& value, bool overwrite) {
  std::string text = llvm::formatv("{0:2}", value).str() + "\n";
  MOERR_ASSIGN_OR_RETURN(auto sink, FileSink::Create(path, overwrite));
  MOERR_RETURN_IF_ERROR(sink->Write(absl::MakeConstSpan(reinterpret_cast<const std::byte*>(text.data()), text.size())));
  return sink->Finish(/*sync=*/true);
}

}  // namespace moerr::formats
