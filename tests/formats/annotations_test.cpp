#include "formats/annotations.h"

#include <gtest/gtest.h>

#include "formats/bundle_writer.h"
#include "tests/testing/test_util.h"

namespace moerr::formats {
namespace {

using testing::TempDir;

// The text of `v` as the bundle stores it (keys sorted).
std::string Text(const llvm::json::Value& v) { return llvm::formatv("{0}", v).str(); }

// A bundle holding each typed annotation, written through its ToJson.
struct Written {
  Recording recording;
  ReplayTime time{1.5, 0.25};
  FaultNote fault{"nan-grad", 1};
  CollectiveFailed failed{"all_reduce", "0", 7, 3, "model.layers.1.mlp", "timed out", 1};
  HfModel hf{"hf/rank0.safetensors", 2, "causal_lm_mean", "float32", llvm::json::Object{{"model_type", "qwen2_moe"}}};
};

TEST(Annotations, EachKindRoundTripsThroughABundle) {
  TempDir dir;
  Written w;
  w.recording.mode = "full";
  w.recording.trigger = "always";
  w.recording.threads = 4;
  w.recording.deterministic = true;
  w.recording.reduced = llvm::json::Object{{"from", "a.moerr"}, {"step", 3}};
  w.recording.other["written_by"] = "an older moerr";
  {
    auto writer = BundleWriter::Create(dir.File("b.moerr"), WriterOptions().set_sync(false)).value();
    ASSERT_TRUE(writer->Annotate(kRecordingAnnotation, ToJson(w.recording)).ok());
    ASSERT_TRUE(writer->Annotate(kFaultAnnotation, ToJson(w.fault)).ok());
    ASSERT_TRUE(writer->Annotate(kCollectiveFailedAnnotation, ToJson(w.failed)).ok());
    ASSERT_TRUE(writer->Annotate(kHfModelAnnotation, ToJson(w.hf)).ok());
    ASSERT_TRUE(writer->Annotate(kReplayTimeAnnotation, ToJson(w.time), 3).ok());
    ASSERT_TRUE(writer->Annotate(kMetricsAnnotation, llvm::json::Object{{"loss", 0.5}}, 3).ok());
    ASSERT_TRUE(writer->Close().ok());
  }
  auto reader = BundleReader::Open(dir.File("b.moerr")).value();

  const Recording r = ReadRecording(*reader, "b.moerr").value();
  EXPECT_EQ(Text(ToJson(r)), Text(ToJson(w.recording)));
  EXPECT_EQ(r.threads_or_zero(), 4);
  EXPECT_EQ(r.other.getString("written_by").getValueOr(""), "an older moerr");
  EXPECT_FALSE(r.imported.has_value());

  const ReplayTime t = ReadReplayTime(*reader, 3, "b.moerr").value();
  EXPECT_EQ(t.seconds, 1.5);
  EXPECT_EQ(t.cpu_seconds, 0.25);

  const FaultNote f = ReadFaultNote(*reader, "b.moerr").value();
  EXPECT_EQ(f.kind, "nan-grad");
  EXPECT_EQ(f.rank, 1);

  const CollectiveFailed c = ReadCollectiveFailed(*reader, "b.moerr").value();
  EXPECT_EQ(Text(ToJson(c)), Text(ToJson(w.failed)));
  EXPECT_EQ(c.seq, 7);
  EXPECT_EQ(c.module, "model.layers.1.mlp");

  const HfModel hf = ReadHfModel(*reader, "b.moerr").value();
  EXPECT_EQ(Text(ToJson(hf)), Text(ToJson(w.hf)));
  EXPECT_EQ(hf.config->getString("model_type").getValueOr(""), "qwen2_moe");

  EXPECT_EQ(ReadObjectAnnotation(*reader, kMetricsAnnotation, 3, "b.moerr")->getNumber("loss"), 0.5);
}

TEST(Annotations, TheFieldNamesAreTheBundles) {
  // What old bundles hold: the readers take these texts as they are.
  EXPECT_EQ(Text(ToJson(ReplayTime{2, 1})), R"({"cpu_seconds":1,"seconds":2})");
  EXPECT_EQ(Text(ToJson(FaultNote{"stall", 0})), R"({"kind":"stall","rank":0})");
  Recording imported;
  imported.mode = "stats";
  imported.trigger = "always";
  imported.imported = llvm::json::Object{{"from", "msprobe"}};
  EXPECT_EQ(Text(ToJson(imported)), R"({"imported":{"from":"msprobe"},"mode":"stats","trigger":"always"})");
}

TEST(Annotations, AbsentIsNotFoundAndMalformedNamesBundleKeyAndField) {
  TempDir dir;
  {
    auto writer = BundleWriter::Create(dir.File("bad.moerr"), WriterOptions().set_sync(false)).value();
    ASSERT_TRUE(writer->Annotate(kRecordingAnnotation, llvm::json::Object{{"threads", "four"}}).ok());
    ASSERT_TRUE(writer->Annotate(kFaultAnnotation, llvm::json::Array{1, 2}).ok());
    ASSERT_TRUE(writer->Annotate(kReplayTimeAnnotation, llvm::json::Object{{"seconds", 1.0}}, 2).ok());
    ASSERT_TRUE(writer->Close().ok());
  }
  auto reader = BundleReader::Open(dir.File("bad.moerr")).value();

  const absl::Status recording = ReadRecording(*reader, "bad.moerr").status();
  EXPECT_TRUE(absl::IsInvalidArgument(recording)) << recording;
  EXPECT_EQ(recording.message(), R"(bad.moerr: annotation "recording": field "threads" is not an integer)");
  EXPECT_FALSE(RecordingOf(*reader).has_value());

  const absl::Status fault = ReadFaultNote(*reader, "bad.moerr").status();
  EXPECT_TRUE(absl::IsInvalidArgument(fault)) << fault;
  EXPECT_EQ(fault.message(), R"(bad.moerr: annotation "fault" is not a JSON object)");

  const absl::Status time = ReadReplayTime(*reader, 2, "bad.moerr").status();
  EXPECT_EQ(time.message(), R"(bad.moerr: annotation "replay_time" at step 2: field "cpu_seconds" is missing)");

  const absl::Status absent = ReadCollectiveFailed(*reader, "bad.moerr").status();
  EXPECT_TRUE(absl::IsNotFound(absent)) << absent;
  EXPECT_TRUE(absl::IsNotFound(ReadReplayTime(*reader, 5, "bad.moerr").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ReadObjectAnnotation(*reader, kFaultAnnotation, -1, "bad.moerr").status()));

  // A Python writer's null for an optional field is absent, not malformed.
  const HfModel hf = HfModelFrom(llvm::json::Object{{"file", "f"}, {"step", 1}, {"logits_dtype", nullptr}}, "x").value();
  EXPECT_FALSE(hf.logits_dtype.has_value());
  EXPECT_FALSE(hf.config.has_value());
  EXPECT_EQ(HfModelFrom(llvm::json::Object{{"step", 1}}, "x").status().message(), R"(x: field "file" is missing)");
}

TEST(Annotations, StepMetricsNoteReadsTheJudgedFieldsOfMetrics) {
  // As moe::MetricsToJson writes them: non-finite values as names.
  TempDir dir;
  {
    auto writer = BundleWriter::Create(dir.File("m.moerr"), WriterOptions().set_sync(false)).value();
    ASSERT_TRUE(writer->Annotate(kMetricsAnnotation,
                                 llvm::json::Object{{"step", 3}, {"loss", "nan"}, {"grad_norm", "inf"},
                                                    {"loss_scale", 0.5}, {"skipped", true}, {"finite", false}},
                                 3).ok());
    ASSERT_TRUE(writer->Annotate(kMetricsAnnotation, llvm::json::Object{{"loss", 0.25}}, 4).ok());
    ASSERT_TRUE(writer->Close().ok());
  }
  auto reader = BundleReader::Open(dir.File("m.moerr")).value();
  const StepMetricsNote three = ReadStepMetricsNote(*reader, 3, "m.moerr").value();
  EXPECT_EQ(three.skipped, true);
  EXPECT_EQ(three.finite, false);
  EXPECT_EQ(three.loss_scale, 0.5);
  const StepMetricsNote four = ReadStepMetricsNote(*reader, 4, "m.moerr").value();  // an older trainer's
  EXPECT_FALSE(four.skipped || four.finite || four.loss_scale);
  EXPECT_TRUE(absl::IsNotFound(ReadStepMetricsNote(*reader, 5, "m.moerr").status()));

  // A non-finite scale is written as a name: not malformed, but no number.
  EXPECT_FALSE(StepMetricsNoteFrom(llvm::json::Object{{"loss_scale", "inf"}}, "x")->loss_scale.has_value());
  EXPECT_EQ(StepMetricsNoteFrom(llvm::json::Object{{"skipped", 1}}, "x").status().message(),
            R"(x: field "skipped" is not a boolean)");
  EXPECT_EQ(StepMetricsNoteFrom(llvm::json::Object{{"loss_scale", "big"}}, "x").status().message(),
            R"(x: field "loss_scale" is neither a number nor "nan", "inf" or "-inf")");
}

TEST(Annotations, TheProxyLookupsReadTheLayersPlan) {
  llvm::json::Object layer{{"layer", 1}, {"kept", llvm::json::Array{5, 9}}, {"maps_to", llvm::json::Array{0, 0, 5, 9}}};
  llvm::json::Object proxy;
  proxy["layers"] = llvm::json::Array{std::move(layer)};
  EXPECT_EQ(ProxyKeptExpert(proxy, 1, 1), 9);
  EXPECT_EQ(ProxyMapsTo(proxy, 1, 2), 5);
  EXPECT_FALSE(ProxyKeptExpert(proxy, 1, 2).has_value());  // past the kept experts
  EXPECT_FALSE(ProxyKeptExpert(proxy, 0, 0).has_value());  // no plan for layer 0
  EXPECT_EQ(ProxyLayerOf(proxy, 0), nullptr);
}

}  // namespace
}  // namespace moerr::formats
