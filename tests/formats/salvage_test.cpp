#include "formats/salvage.h"

#include <gtest/gtest.h>

#include "formats/bundle_reader.h"
#include "llvm/Support/MemoryBuffer.h"
#include "support/version.h"
#include "tests/testing/test_util.h"

namespace moerr::formats {
namespace {

using testing::TempDir;

struct Expected {
  std::string name;
  int64_t step;
  uint64_t end;  // the tensor is recoverable from a cut at or after `end`
};

class SalvageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.File("b.moerr");
    file_ = testing::MakeSampleBundle(path_, /*chunk_bytes=*/1024);
    original_ = BundleReader::Open(path_).value();
    const ScanResult scan = ScanFrames(absl::MakeConstSpan(file_).subspan(0, file_.size() - kFooterSize));
    ASSERT_TRUE(scan.stop.ok()) << scan.stop;
    for (const ScannedFrame& f : scan.frames) {
      const uint64_t end = f.offset + kFrameHeaderSize + PaddedLength(f.header.length);
      if (f.header.kind == static_cast<uint32_t>(FrameKind::kIndex)) break;
      frame_ends_.push_back(end);
      if (f.header.kind != static_cast<uint32_t>(FrameKind::kRecord)) continue;
      auto r = DecodeRecord(absl::MakeConstSpan(file_).subspan(f.offset + kFrameHeaderSize, f.header.length),
                            f.offset, Limits());
      ASSERT_TRUE(r.ok());
      if (r->kind == static_cast<uint16_t>(RecordKind::kTensor)) expected_.push_back({r->tensor.name, r->tensor.step, end});
      if (r->kind == static_cast<uint16_t>(RecordKind::kStepEnd)) step_ends_.push_back({"", r->step, end});
    }
    ASSERT_GT(frame_ends_.size(), 20u);
  }

  // Cuts the file at `cut` and checks that salvage recovers exactly the
  // complete frames and every tensor whose record is among them, bitwise.
  void CheckCut(uint64_t cut) {
    SCOPED_TRACE(::testing::Message() << "cut at " << cut << " of " << file_.size());
    const std::vector<std::byte> prefix(file_.begin(), file_.begin() + cut);
    auto result = AnalyzeForSalvage(prefix);
    ASSERT_TRUE(result.ok()) << result.status();
    size_t complete = 0;
    uint64_t kept = kSuperblockSize;
    for (uint64_t end : frame_ends_) {
      if (end > cut) break;
      ++complete;
      kept = end;
    }
    EXPECT_EQ(result->report.frames, complete);
    EXPECT_EQ(result->data_end, kept);
    EXPECT_EQ(result->report.bytes_dropped, cut - kept);
    std::vector<int64_t> steps;
    for (const Expected& s : step_ends_) if (s.end <= cut) steps.push_back(s.step);
    EXPECT_EQ(result->report.complete_steps, steps);

    // Commit the rebuilt index after the kept prefix and read it back.
    const std::vector<std::byte> fixed = testing::AppendIndex(
        std::vector<std::byte>(prefix.begin(), prefix.begin() + kept), EncodeIndex(result->index));
    auto reader = BundleReader::FromBuffer(llvm::MemoryBuffer::getMemBufferCopy(
        llvm::StringRef(reinterpret_cast<const char*>(fixed.data()), fixed.size())));
    ASSERT_TRUE(reader.ok()) << reader.status();
    // The writer's version comes with the checkpoint salvage starts from.
    EXPECT_EQ((*reader)->index().writer, result->report.from_checkpoint ? moerr::Version() : "");
    size_t recovered = 0;
    for (const Expected& e : expected_) {
      const TensorInfo* t = (*reader)->FindTensor(e.name, e.step);
      if (e.end > cut) {
        EXPECT_EQ(t, nullptr) << e.name << "@" << e.step;
        continue;
      }
      ASSERT_NE(t, nullptr) << e.name << "@" << e.step;
      EXPECT_EQ((*reader)->ReadTensor(e.name, e.step)->bytes, original_->ReadTensor(e.name, e.step)->bytes);
      ++recovered;
    }
    EXPECT_EQ(result->report.tensors, recovered);
    EXPECT_TRUE((*reader)->Verify().ok());
  }

  TempDir dir_;
  std::string path_;
  std::vector<std::byte> file_;
  std::unique_ptr<BundleReader> original_;
  std::vector<uint64_t> frame_ends_;
  std::vector<Expected> expected_;
  std::vector<Expected> step_ends_;
};

TEST_F(SalvageTest, CutAtEveryFrameBoundary) {
  CheckCut(kSuperblockSize);
  for (uint64_t end : frame_ends_) CheckCut(end);
}

TEST_F(SalvageTest, CutAtRandomOffsetsInsideFrames) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200; ++i) CheckCut(kSuperblockSize + rng() % (file_.size() - kSuperblockSize));
}

TEST_F(SalvageTest, CorruptFrameStopsTheScanThere) {
  const uint64_t victim = frame_ends_[frame_ends_.size() / 2];  // header of the next frame
  std::vector<std::byte> bad = file_;
  bad[victim + kFrameHeaderSize] ^= std::byte{1};
  auto result = AnalyzeForSalvage(bad);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->data_end, victim);
  EXPECT_NE(result->report.stop_reason.find("checksum mismatch"), std::string::npos) << result->report.stop_reason;
}

TEST_F(SalvageTest, FinishedBundleSalvagesToItself) {
  auto report = Salvage(path_, dir_.File("copy.moerr"), false);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->had_footer);
  EXPECT_EQ(report->bytes_dropped, file_.size() - frame_ends_.back());  // the old index and footer
  EXPECT_EQ(report->tensors, original_->index().tensors.size());
  auto copy = BundleReader::Open(dir_.File("copy.moerr"));
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_TRUE((*copy)->Verify().ok());
  EXPECT_EQ((*copy)->index().writer, moerr::Version());
  // Refuses to overwrite.
  EXPECT_FALSE(Salvage(path_, dir_.File("copy.moerr"), false).ok());
}

}  // namespace
}  // namespace moerr::formats
