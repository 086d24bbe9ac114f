// What the commands read when given a directory (formats::ResolveRecording):
// the run, or the one bundle, of a training or import output directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "formats/world_manifest.h"
#include "tests/testing/test_util.h"

namespace moerr::formats {
namespace {

using testing::TempDir;

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

TEST(ResolveRecordingTest, AFileOrARunDirectoryIsItself) {
  TempDir dir;
  Touch(dir.File("a.moerr"));
  EXPECT_EQ(*ResolveRecording(dir.File("a.moerr")), dir.File("a.moerr"));
  EXPECT_EQ(*ResolveRecording(dir.File("missing.moerr")), dir.File("missing.moerr"));  // the command says it is missing
  ASSERT_TRUE(WriteWorldManifest(dir.path(), ExpertParallelWorld(2, 2, 4)).ok());
  EXPECT_EQ(*ResolveRecording(dir.path()), dir.path());
}

TEST(ResolveRecordingTest, AnOutputDirectoryIsItsRunOrItsOneBundle) {
  TempDir dir;
  std::filesystem::create_directories(dir.File("ranks/run"));
  ASSERT_TRUE(WriteWorldManifest(dir.File("ranks/run"), ExpertParallelWorld(2, 2, 4)).ok());
  EXPECT_EQ(*ResolveRecording(dir.File("ranks")), dir.File("ranks/run"));

  std::filesystem::create_directories(dir.File("one/run"));
  Touch(dir.File("one/run/run.moerr"));
  Touch(dir.File("one/metrics.jsonl"));
  EXPECT_EQ(*ResolveRecording(dir.File("one")), dir.File("one/run/run.moerr"));

  std::filesystem::create_directories(dir.File("killed"));
  Touch(dir.File("killed/x.moerr.partial"));
  EXPECT_EQ(*ResolveRecording(dir.File("killed")), dir.File("killed/x.moerr.partial"));
}

TEST(ResolveRecordingTest, ADirectoryWithoutOneRecordingIsRefusedNamingWhy) {
  TempDir dir;
  std::filesystem::create_directories(dir.File("empty"));
  absl::StatusOr<std::string> empty = ResolveRecording(dir.File("empty"));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("not a recording"), absl::string_view::npos) << empty.status();
  std::filesystem::create_directories(dir.File("two"));
  Touch(dir.File("two/a.moerr"));
  Touch(dir.File("two/b.moerr"));
  absl::StatusOr<std::string> two = ResolveRecording(dir.File("two"));
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("2 bundles (a.moerr, b.moerr)"), absl::string_view::npos) << two.status();
}

}  // namespace
}  // namespace moerr::formats
