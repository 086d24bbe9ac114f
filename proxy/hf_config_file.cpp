#include "proxy/hf_config_file.h"

#include <array>

#include "absl/strings/str_format.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SHA256.h"

namespace moerr::proxy {

absl::StatusOr<HfConfigFile> ReadHfConfigFile(const std::string& path, int64_t min_vocab) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false);
  if (!buffer) {
    return absl::NotFoundError(absl::StrFormat("--hf-config %s: cannot read it: %s", path, buffer.getError().message()));
  }
  const llvm::StringRef bytes = (*buffer)->getBuffer();
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(bytes);
  if (!parsed) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--hf-config %s is not JSON: %s", path, llvm::toString(parsed.takeError())));
  }
  const llvm::json::Object* object = parsed->getAsObject();
  if (object == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--hf-config %s is not a JSON object (a transformers config.json is one)", path));
  }
  HfConfigFile out;
  out.path = path;
  absl::StatusOr<moe::MoeConfig> config = moe::FromHfConfig(*object);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--hf-config %s: moerr cannot build this model: %s", path, config.status().message()));
  }
  out.config = *std::move(config);
  if (out.config.vocab_size < min_vocab) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--hf-config %s: vocab_size %d is smaller than the addition task needs (%d token ids)", path,
        out.config.vocab_size, min_vocab));
  }
  const std::array<uint8_t, 32> sha = llvm::SHA256::hash(llvm::arrayRefFromStringRef(bytes));
  out.digest = llvm::toHex(llvm::makeArrayRef(sha.data(), 6), /*LowerCase=*/true);
  return out;
}

}  // namespace moerr::proxy
