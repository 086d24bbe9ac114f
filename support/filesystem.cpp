#include "support/filesystem.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace moerr {

absl::Status MakeDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return absl::OkStatus();
  const int error = errno;
  struct stat st;
  if (error == EEXIST && ::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("cannot create directory ", path, ": a file of that name exists"));
  }
  return absl::UnavailableError(absl::StrCat("cannot create directory ", path, ": ", std::strerror(error)));
}

absl::Status CheckNotAnInput(const std::string& path, const std::vector<std::string>& inputs) {
  for (const std::string& input : inputs) {
    std::error_code error;
    if (std::filesystem::equivalent(path, input, error)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("the output %s is the input %s; write the output elsewhere", path, input));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDistinctInputs(const std::vector<std::string>& inputs) {
  for (size_t i = 1; i < inputs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      std::error_code error;
      if (std::filesystem::equivalent(inputs[i], inputs[j], error)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s and %s are the same file; name each input once", inputs[j], inputs[i]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace moerr
