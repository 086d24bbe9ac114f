// Errors out of proxy/ name where the input was bad: the bundle's file and
// step, the tensor, and the layer and expert it belongs to.
#include <gtest/gtest.h>

#include "proxy/proxy_builder.h"
#include "proxy/reduce.h"
#include "proxy/step_bundle.h"
#include "tests/testing/test_util.h"
#include "tests/testing/recording.h"

namespace moerr::proxy {
namespace {

using formats::testing::TempDir;

// Whether `status`'s message contains `part`.
::testing::AssertionResult Says(const absl::Status& status, const std::string& part) {
  if (std::string(status.message()).find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << status.message() << "\" does not say \"" << part << "\"";
}

// The tiny recorded step, changed by `edit`, written as DIR/bad.moerr.
std::unique_ptr<formats::BundleReader> BadBundle(const TempDir& dir, const std::function<void(StepBundle&)>& edit) {
  auto reader = testing::RecordTinySteps(dir.File("r.moerr"), moe::Precision::kFp32,
                                         recorder::CaptureMode::kReplayable, 1);
  StepBundle step = LoadStepBundle(*reader, 0).value();
  edit(step);
  EXPECT_TRUE(WriteStepBundle(step, dir.File("bad.moerr")).ok());
  return formats::BundleReader::Open(dir.File("bad.moerr")).value();
}

ProxyOptions ProxyOf(const TempDir& dir) {
  ProxyOptions options;
  options.keep = 2;
  options.out_dir = dir.File("p");
  options.source = dir.File("bad.moerr");
  return options;
}

TEST(ProxyErrorsTest, AnExpertTensorOfTheWrongShapeNamesFileStepTensorLayerAndExpert) {
  TempDir dir;
  const std::string name = "policy/model.layers.1.mlp.experts.2.down_proj.weight";
  auto bad = BadBundle(dir, [&](StepBundle& step) {
    for (auto& [n, t] : step.state.tensors) {
      if (n == name) t = t.narrow(0, 0, t.size(0) - 1).clone();
    }
  });
  const absl::Status status = BuildProxy(*bad, ProxyOf(dir)).status();
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(Says(status, dir.File("bad.moerr") + ", step 0, trainer state"));
  // The tensor's HF name carries the layer (1) and the expert (2).
  EXPECT_TRUE(Says(status, "\"model.layers.1.mlp.experts.2.down_proj.weight\": shape"));
}

TEST(ProxyErrorsTest, RecordedExpertIdsOutOfRangeNameFileStepLayerAndMicroBatch) {
  TempDir dir;
  auto bad = BadBundle(dir, [](StepBundle& step) {
    for (RoutingEntry& r : step.routing) {
      if (r.layer != 1) continue;
      r.ids[0][0] = 11;       // the layer has 8 experts
      r.logits = at::Tensor();  // no logits to pick the id's weight from
    }
  });
  const absl::Status status = BuildProxy(*bad, ProxyOf(dir)).status();
  ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_TRUE(Says(status, "proxy of " + dir.File("bad.moerr") + ", step 0"));
  EXPECT_TRUE(Says(status, "routing of layer 1, micro-batch 0: expert ids"));
  EXPECT_TRUE(Says(status, "8 experts"));
}

TEST(ProxyErrorsTest, ReducingAStatsBundleNamesFileAndStep) {
  TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), moe::FaultKind::kExpertOverflow,
                                          recorder::CaptureMode::kStats, injected, finite);
  ReduceOptions options;
  options.out_path = dir.File("small.moerr");
  options.work_dir = dir.File("work");
  options.source = dir.File("f.moerr");
  const absl::Status status = Reduce(*reader, options).status();
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(Says(status, dir.File("f.moerr") + ", step 0, trainer state: "));
  EXPECT_TRUE(Says(status, "replayable or full mode"));
}

}  // namespace
}  // namespace moerr::proxy
