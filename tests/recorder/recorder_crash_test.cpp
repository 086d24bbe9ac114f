// Crash safety, with a child process (record_child.cpp): a recording killed
// at any point salvages every step completed before the kill, and a SIGSEGV
// leaves a salvageable bundle that names the crash.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "formats/bundle_reader.h"
#include "formats/ring_salvage.h"
#include "formats/salvage.h"
#include "formats/trace.h"
#include "tests/testing/test_util.h"

extern char** environ;

namespace moerr::recorder {
namespace {

using formats::testing::TempDir;

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

TEST(RecorderCrashTest, SalvageRecoversEveryCompleteStepAfterSigkill) {
  TempDir dir;
  constexpr int kSteps = 6;
  const std::string ref = dir.File("ref.moerr");
  int status = 0;
  waitpid(Spawn({RECORD_CHILD, ref, std::to_string(kSteps), "stats"}), &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto reference = formats::BundleReader::Open(ref).value();
  // Where each step's end (and its checkpoint) lies in the file.
  std::map<int64_t, uint64_t> step_end;
  const std::vector<std::byte> bytes = formats::testing::ReadFile(ref);
  const formats::ScanResult scan = formats::ScanFrames(absl::MakeConstSpan(bytes).subspan(0, bytes.size() - formats::kFooterSize));
  for (const formats::RecordRef& r : reference->index().records) {
    if (r.kind == static_cast<uint16_t>(formats::RecordKind::kStepEnd)) step_end[r.step] = r.offset + r.length;
  }
  std::map<int64_t, size_t> ref_ops;
  for (int64_t s = 0; s < kSteps; ++s) ref_ops[s] = formats::ReadTrace(*reference, s)->ops.size();

  constexpr int kKillPoints = 20;
  for (int k = 0; k < kKillPoints; ++k) {
    const uint64_t threshold = reference->file_size() * (k + 0.5) / kKillPoints;
    SCOPED_TRACE(::testing::Message() << "kill at >= " << threshold << " bytes");
    const std::string path = dir.File("kill" + std::to_string(k) + ".moerr");
    const pid_t child = Spawn({RECORD_CHILD, path, std::to_string(kSteps), "stats"});
    while (FileSize(path + ".partial") < threshold && waitpid(child, &status, WNOHANG) == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    const std::string partial = FileSize(path + ".partial") > 0 ? path + ".partial" : path;
    auto report = formats::Salvage(partial, dir.File("fixed" + std::to_string(k) + ".moerr"), true);
    ASSERT_TRUE(report.ok()) << report.status();
    std::set<int64_t> complete(report->complete_steps.begin(), report->complete_steps.end());
    for (const auto& [s, end] : step_end) {
      if (end <= threshold) {
        EXPECT_TRUE(complete.count(s)) << "step " << s << " was complete before the kill";
      }
    }
    auto fixed = formats::BundleReader::Open(dir.File("fixed" + std::to_string(k) + ".moerr")).value();
    ASSERT_TRUE(fixed->Verify().ok());
    for (int64_t s : complete) EXPECT_EQ(formats::ReadTrace(*fixed, s)->ops.size(), ref_ops[s]) << "step " << s;
  }
}

TEST(RecorderCrashTest, SigsegvLeavesASalvageableBundleWithTheCrashRecorded) {
  TempDir dir;
  const std::string path = dir.File("segv.moerr");
  int status = 0;
  waitpid(Spawn({RECORD_CHILD, path, "5", "replayable", "2"}), &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  auto report = formats::Salvage(path + ".partial", dir.File("fixed.moerr"), false);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->complete_steps, (std::vector<int64_t>{0, 1, 2}));
  auto fixed = formats::BundleReader::Open(dir.File("fixed.moerr")).value();
  auto crash = fixed->ReadAnnotation("crash");
  ASSERT_TRUE(crash.ok()) << crash.status();
  EXPECT_EQ(*crash->getAsObject()->getString("name"), "SIGSEGV");
}

// trigger=anomaly, killed inside step 3: the ring's steps 2 (complete) and
// 3 (up to the kill) are on disk, beside a bundle that holds none, and
// salvage with the ring recovers both with their ops.
TEST(RecorderCrashTest, TheAnomalyRingOutlivesASigkilledProcess) {
  TempDir dir;
  const std::string path = dir.File("ring.moerr");
  int status = 0;
  waitpid(Spawn({RECORD_CHILD, path, "5", "replayable", "3", "ring"}), &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  const std::vector<formats::RingSlotFile> slots = formats::RingSlots(path + ".partial");
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[0].step, 2);
  EXPECT_EQ(slots[1].step, 3);
  auto report = formats::SalvageWithRing(path + ".partial", dir.File("fixed.moerr"), false);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->bundle.complete_steps.empty());
  ASSERT_EQ(report->slots.size(), 2u);
  auto fixed = formats::BundleReader::Open(dir.File("fixed.moerr")).value();
  ASSERT_TRUE(fixed->Verify().ok());
  EXPECT_EQ(fixed->CompleteSteps(), (std::vector<int64_t>{2}));
  EXPECT_EQ(fixed->Steps(), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(fixed->ReadAnnotation("recording").ok());  // the bundle's own records come first
  for (int64_t s : {2, 3}) {
    auto trace = formats::ReadTrace(*fixed, s);
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_GT(trace->ops.size(), 100u) << "step " << s;
  }
  EXPECT_NE(fixed->FindTensor("rng/cpu", 3), nullptr);  // a capture of the step cut off
}

}  // namespace
}  // namespace moerr::recorder
