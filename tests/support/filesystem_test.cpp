#include "support/filesystem.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"

namespace moerr {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/moerr_filesystem_" + std::to_string(::getpid()) + "_" + name;
}

TEST(MakeDirectory, CreatesAndAcceptsAnExistingDirectory) {
  const std::string dir = TempPath("dir");
  ASSERT_TRUE(MakeDirectory(dir).ok());
  struct stat st;
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_TRUE(MakeDirectory(dir).ok());
  ::rmdir(dir.c_str());
}

TEST(MakeDirectory, RefusesAFileOfThatNameAndAMissingParent) {
  const std::string file = TempPath("file");
  std::ofstream(file) << "x";
  absl::Status s = MakeDirectory(file);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), file + ": a file of that name exists")) << s;
  ::unlink(file.c_str());

  const std::string orphan = TempPath("missing") + "/child";
  s = MakeDirectory(orphan);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), orphan)) << s;
}

}  // namespace
}  // namespace moerr
