// msprobe and torch.save dumps imported as bundles, then read back by
// bisect's and diff's libraries. Fixtures: tests/importers/msprobe_fixture.h.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "analysis/first_overflow.h"
#include "diff/trace_diff.h"
#include "formats/bundle_reader.h"
#include "formats/world_manifest.h"
#include "importers/dump_stats.h"
#include "importers/msprobe_dump.h"
#include "importers/msprobe_import.h"
#include "importers/torch_import.h"
#include "importers/torch_unpickler.h"
#include "recorder/fingerprint.h"
#include "tests/importers/msprobe_fixture.h"
#include "tests/testing/test_util.h"

namespace moerr::importers {
namespace {

using formats::Fingerprint;
using formats::testing::TempDir;
using testing::FixtureEntry;
using testing::WriteMsprobeDump;

// A forward pass of two layers and its backward: linear, gelu, linear, then
// the backward entries, all in module "layers.N" by construct.json.
std::vector<FixtureEntry> Step(at::Tensor x, double scale, int64_t seed) {
  at::manual_seed(seed);
  const at::Tensor w0 = at::randn({8, 8}), w1 = at::randn({8, 8}) * scale;
  const at::Tensor h = at::linear(x, w0), g = at::gelu(h), y = at::linear(g, w1);
  const at::Tensor dy = at::ones_like(y), dg = at::matmul(dy, w1);
  return {{"Functional.linear.0.forward", {x, w0}, {h}, "Module.layers.0.Linear.forward.0"},
          {"Functional.gelu.0.forward", {h}, {g}, ""},
          {"Functional.linear.1.forward", {g, w1}, {y}, "Module.layers.1.Linear.forward.0"},
          {"Functional.linear.1.backward", {dy}, {dg}, ""},
          {"Functional.linear.0.backward", {dg}, {at::matmul(dg, w0)}, ""}};
}

formats::Trace ReadStep(const std::string& bundle, int64_t step, std::unique_ptr<formats::BundleReader>* keep = nullptr) {
  auto reader = formats::BundleReader::Open(bundle);
  EXPECT_TRUE(reader.ok()) << reader.status();
  auto trace = formats::ReadTrace(**reader, step);
  EXPECT_TRUE(trace.ok()) << trace.status();
  if (keep != nullptr) *keep = std::move(*reader);
  return std::move(*trace);
}

const formats::TensorMeta& Output(const formats::Trace& t, size_t op, size_t slot = 0) {
  const formats::TensorMeta* m = t.Find(t.ops.at(op).outputs.at(slot));
  EXPECT_NE(m, nullptr);
  return *m;
}

// `value` as torch.save writes it (LibTorch's pickle_save: the same zip format).
void SavePickle(const c10::IValue& value, const std::string& path) {
  const std::vector<char> bytes = torch::jit::pickle_save(value);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(MsprobeImportTest, StatisticsDumpBecomesAStatsBundle) {
  TempDir dir;
  WriteMsprobeDump(dir.File("dump"), 0, 0, "statistics", Step(at::randn({4, 8}), 1.0, 1));
  auto result = ImportMsprobe(dir.File("dump"), dir.File("run"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->task, "statistics");
  ASSERT_EQ(result->bundles.size(), 1u);
  EXPECT_EQ(result->manifest, "");  // one rank: no world
  const formats::Trace t = ReadStep(result->bundles[0], 0);
  ASSERT_EQ(t.ops.size(), 5u);
  EXPECT_EQ(t.ops[0].name, "Functional.linear");
  EXPECT_EQ(t.ops[0].module, "layers.0");
  EXPECT_EQ(t.ops[1].module, "");
  EXPECT_EQ(t.ops[2].module, "layers.1");
  EXPECT_EQ(t.ops[3].phase, formats::Phase::kBackward);
  EXPECT_EQ(t.ops[3].module, "layers.1");  // the forward entry's scope
  EXPECT_EQ(t.ops[0].args.size(), 2u);
  // A finite output: everything but the hash is known, from Max/Min/Mean/Norm.
  const Fingerprint& f = Output(t, 0).fingerprint;
  EXPECT_EQ(f.unknown, Fingerprint::kHash);
  EXPECT_EQ(f.nan + f.pos_inf + f.neg_inf, 0u);
  EXPECT_GT(f.l2, 0);
  EXPECT_EQ(f.abs_max, std::max(std::fabs(f.min), std::fabs(f.max)));
  EXPECT_EQ(f.numel, 32u);
}

TEST(MsprobeImportTest, NonFiniteStatisticsMarkWhatTheyCannotTell) {
  TempDir dir;
  at::Tensor x = at::randn({4, 8});
  std::vector<FixtureEntry> step = Step(x, 1.0, 2);
  step[1].outputs[0] = step[1].outputs[0].clone();
  step[1].outputs[0][0][0] = INFINITY;  // gelu's output overflows
  step[1].outputs[0][1][1] = NAN;
  step[2].inputs[0] = step[1].outputs[0];
  WriteMsprobeDump(dir.File("dump"), 0, 0, "statistics", step);
  auto result = ImportMsprobe(dir.File("dump"), dir.File("run"));
  ASSERT_TRUE(result.ok()) << result.status();
  const formats::Trace t = ReadStep(result->bundles[0], 0);
  const Fingerprint& f = Output(t, 1).fingerprint;
  EXPECT_FALSE(f.Finite());
  EXPECT_EQ(f.nan, 1u);  // at least one; how many is not in the dump
  EXPECT_FALSE(f.Known(Fingerprint::kNan));
  EXPECT_FALSE(f.Known(Fingerprint::kMean | Fingerprint::kL2));
  EXPECT_TRUE(std::isnan(f.l2));
  // Max_except_inf_nan and Min_except_inf_nan still give the finite abs-max.
  ASSERT_TRUE(f.Known(Fingerprint::kAbsMax));
  const at::Tensor out = step[1].outputs[0];
  EXPECT_FLOAT_EQ(f.abs_max, out.masked_select(out.isfinite()).abs().max().item<float>());

  // Bisect names the first overflowing API: gelu, whose input was finite.
  const auto first = analysis::FindFirstOverflow(t);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->op_index, 1u);
  EXPECT_EQ(first->op->name, "Functional.gelu");
}

// The nan_check task (torch_npu only, so written here from msprobe 26.2's
// NanCheckDataProcessor: dtype and shape per tensor, and "is_nan", the
// NPU's overflow flag after the call, per entry; null where it failed).
TEST(MsprobeImportTest, NanCheckFlagsMarkTheFirstOverflowingCall) {
  TempDir dir;
  std::filesystem::create_directories(dir.File("dump/step0/rank0"));
  auto tensor = [](const char* shape) {
    return absl::StrCat(R"({"type": "torch.Tensor", "dtype": "torch.float32", "shape": )", shape,
                        R"(, "requires_grad": false})");
  };
  std::ofstream(dir.File("dump/step0/rank0/dump.json"))
      << R"({"task": "nan_check", "level": "L1", "framework": "pytorch", "dump_data_dir": null, "data": {)"
      << R"("Functional.linear.0.forward": {"input_args": [)" << tensor("[4, 8]") << "], \"output\": ["
      << tensor("[4, 8]") << R"(], "is_nan": 0},)"
      << R"("Functional.gelu.0.forward": {"input_args": [)" << tensor("[4, 8]") << "], \"output\": ["
      << tensor("[4, 8]") << R"(], "is_nan": 1},)"
      << R"("Functional.layer_norm.0.forward": {"input_args": [)" << tensor("[4, 8]") << "], \"output\": ["
      << tensor("[4, 8]") << R"(], "is_nan": null}}})";
  auto result = ImportMsprobe(dir.File("dump"), dir.File("run"));
  ASSERT_TRUE(result.ok()) << result.status();
  const formats::Trace t = ReadStep(result->bundles[0], 0);
  EXPECT_TRUE(Output(t, 0).fingerprint.Finite());
  const Fingerprint& flagged = Output(t, 1).fingerprint;
  EXPECT_FALSE(flagged.Finite());
  EXPECT_EQ(flagged.nan, 1u);
  EXPECT_FALSE(flagged.Known(Fingerprint::kNan));
  const auto first = analysis::FindFirstOverflow(t);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->op->name, "Functional.gelu");
}

TEST(MsprobeImportTest, StatisticsOfTensorsWithoutFiniteValues) {
  DumpValue all_inf;
  all_inf.max = all_inf.min = all_inf.mean = all_inf.max_finite = all_inf.min_finite = -INFINITY;
  all_inf.norm = INFINITY;
  const Fingerprint f = FingerprintFromStats(all_inf, formats::DType::kF32, 6);
  EXPECT_EQ(f.abs_max, 0);  // over finite values: there are none
  EXPECT_EQ(f.l2, 0);
  EXPECT_EQ(f.nan, 0u);
  EXPECT_EQ(f.pos_inf, 0u);
  EXPECT_EQ(f.neg_inf, 1u);
  EXPECT_EQ(f.unknown, Fingerprint::kHash | Fingerprint::kNegInf);
  // A dump from before Max_except_inf_nan: the finite abs-max is unknown.
  DumpValue old = all_inf;
  old.max = 2.0;
  old.max_finite.reset();
  old.min_finite.reset();
  const Fingerprint g = FingerprintFromStats(old, formats::DType::kBF16, 6);
  EXPECT_TRUE(std::isnan(g.abs_max));
  EXPECT_FALSE(g.Known(Fingerprint::kAbsMax | Fingerprint::kBeyondF16));
  EXPECT_EQ(g.max, 2.0);
}

TEST(MsprobeImportTest, TensorDumpBecomesAFullBundleWithItsDataflow) {
  TempDir dir;
  const std::vector<FixtureEntry> step = Step(at::randn({4, 8}), 1.0, 3);
  WriteMsprobeDump(dir.File("dump"), 0, 0, "tensor", step);
  auto result = ImportMsprobe(dir.File("dump"), dir.File("run"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->missing_files, 0u);
  std::unique_ptr<formats::BundleReader> reader;
  const formats::Trace t = ReadStep(result->bundles[0], 0, &reader);
  // Fingerprints come from the bytes, as the recorder makes them.
  const formats::TensorMeta& h = Output(t, 0);
  EXPECT_EQ(h.fingerprint, recorder::ComputeFingerprint(step[0].outputs[0].contiguous()));
  EXPECT_EQ(h.leaf.rfind("act/", 0), 0u);
  auto bytes = reader->ReadTensor(h.leaf, 0);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->bytes.size(), 32u * 4);
  // gelu reads what linear produced: the same value, by content.
  EXPECT_EQ(t.ops[1].args[0].i, static_cast<int64_t>(h.id));
  EXPECT_EQ(h.producer, static_cast<int64_t>(t.ops[0].seq));
}

TEST(MsprobeImportTest, TwoRanksAndTwoStepsMakeARun) {
  TempDir dir;
  for (int64_t step : {0, 1}) {
    for (int64_t rank : {0, 1}) {
      WriteMsprobeDump(dir.File("dump"), step, rank, "statistics", Step(at::randn({2, 8}), 1.0, 10 * step + rank));
    }
  }
  auto result = ImportMsprobe(dir.File("dump"), dir.File("run"));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->bundles.size(), 2u);
  EXPECT_EQ(result->stats.steps, 4u);
  auto world = formats::ReadWorldManifest(dir.File("run"));
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(world->world_size, 2);
  EXPECT_EQ(world->ranks[1].bundle, "rank1.moerr");
  for (const std::string& b : result->bundles) {
    EXPECT_EQ(ReadStep(b, 1).ops.size(), 5u);
  }
  // An existing output is refused without --force.
  EXPECT_EQ(ImportMsprobe(dir.File("dump"), dir.File("run")).status().code(), absl::StatusCode::kAlreadyExists);
  ImportOptions force;
  force.overwrite = true;
  EXPECT_TRUE(ImportMsprobe(dir.File("dump"), dir.File("run"), force).ok());
  // Forced over with one rank: the run's earlier manifest and bundles go.
  auto one = ImportMsprobe(dir.File("dump/step1/rank1"), dir.File("run"), force);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE(formats::IsRunDirectory(dir.File("run")));
  EXPECT_FALSE(std::filesystem::exists(dir.File("run/rank0.moerr")));
  EXPECT_TRUE(std::filesystem::exists(dir.File("run/rank1.moerr")));
}

TEST(MsprobeImportTest, TruncatedAndMalformedDumpsNameTheFileAndEntry) {
  TempDir dir;
  WriteMsprobeDump(dir.File("dump"), 0, 0, "statistics", Step(at::randn({2, 8}), 1.0, 4));
  const std::string json = dir.File("dump/step0/rank0/dump.json");
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(json, std::ios::trunc) << text.substr(0, text.size() / 2);
  auto cut = ImportMsprobe(dir.File("dump"), dir.File("run"));
  ASSERT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cut.status().message().find("dump.json"), std::string::npos) << cut.status();
  EXPECT_NE(cut.status().message().find("cut short"), std::string::npos) << cut.status();

  auto bad_shape = ParseDumpJson(
      R"({"task": "statistics", "data": {"Functional.relu.0.forward": {"input_args": [], "output": [)"
      R"({"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, -1], "Max": 1}]}}})",
      "d/dump.json");
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_EQ(bad_shape.status().message(),
            "d/dump.json: entry Functional.relu.0.forward: output[0]: shape: expected a list of non-negative integers");
  auto bad_name = ParseDumpJson(R"({"data": {"relu": {}}})", "d/dump.json");
  ASSERT_FALSE(bad_name.ok());
  EXPECT_NE(bad_name.status().message().find("entry relu"), std::string::npos) << bad_name.status();
  EXPECT_EQ(ImportMsprobe(dir.File("nothing"), dir.File("run")).status().code(), absl::StatusCode::kNotFound);

  // A tensor file that is not the value dump.json describes.
  std::vector<FixtureEntry> step = Step(at::randn({2, 8}), 1.0, 7);
  WriteMsprobeDump(dir.File("tdump"), 0, 0, "tensor", step);
  SavePickle(c10::IValue(at::ones({3})), dir.File("tdump/step0/rank0/dump_tensor_data/Functional.gelu.0.forward.output.0.pt"));
  auto wrong = ImportMsprobe(dir.File("tdump"), dir.File("trun"));
  ASSERT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("entry Functional.gelu.0.forward: output[0]: the file holds f32 [3], "
                                          "dump.json says torch.float32 [2, 8]"),
            std::string::npos)
      << wrong.status();
}

TEST(MsprobeImportTest, EntryNamesBecomeOpsAndModulePaths) {
  DumpEntry api, module, grads;
  ASSERT_TRUE(ParseEntryName("Tensor.__add__.12.backward", api).ok());
  EXPECT_EQ(api.op, "Tensor.__add__");
  EXPECT_EQ(api.phase, formats::Phase::kBackward);
  ASSERT_TRUE(ParseEntryName("Module.layers.3.mlp.experts.5.Linear.forward.0", module).ok());
  EXPECT_EQ(module.op, "Module.Linear");
  EXPECT_EQ(module.module, "layers.3.mlp.experts.5");
  ASSERT_TRUE(ParseEntryName("Module.conv2.Conv2d.parameters_grad.0", grads).ok());
  EXPECT_EQ(grads.kind, EntryKind::kParametersGrad);
  EXPECT_EQ(grads.module, "conv2");
  DumpEntry bad;
  EXPECT_FALSE(ParseEntryName("Functional.linear.x.forward", bad).ok());
  EXPECT_FALSE(ParseEntryName("Module.Linear.forward", bad).ok());
}

// msprobe's compare case: the same step on two devices, one op off.
TEST(MsprobeImportTest, DiffOfTwoImportedDumpsFindsTheDeviatingOp) {
  for (const std::string task : {"tensor", "statistics"}) {
    SCOPED_TRACE(task);
    TempDir dir;
    const at::Tensor x = at::randn({4, 8});
    std::vector<FixtureEntry> a = Step(x, 1.0, 5), b = Step(x, 1.0, 5);
    b[2].outputs[0] = b[2].outputs[0] * 1.01;  // linear.1 deviates by 1%
    b.erase(b.begin() + 4);                      // and B lacks the last entry
    WriteMsprobeDump(dir.File("a"), 0, 0, task, a);
    WriteMsprobeDump(dir.File("b"), 0, 0, task, b);
    auto ra = ImportMsprobe(dir.File("a"), dir.File("ra"));
    auto rb = ImportMsprobe(dir.File("b"), dir.File("rb"));
    ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
    std::unique_ptr<formats::BundleReader> reader_a, reader_b;
    const formats::Trace ta = ReadStep(ra->bundles[0], 0, &reader_a), tb = ReadStep(rb->bundles[0], 0, &reader_b);
    auto report = diff::DiffTraces(*reader_a, ta, 0, *reader_b, tb, 0);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->only_a, 1u);
    EXPECT_EQ(report->diverged_ops, 1u);
    ASSERT_TRUE(report->first_divergence.has_value());
    const diff::OpDiff& d = report->ops[*report->first_divergence];
    EXPECT_EQ(d.a, 2);
    EXPECT_NEAR(d.error, 0.01, 1e-3);  // rel L2 on bytes; on Norm's lower bound from statistics
    if (task == "tensor") {
      ASSERT_TRUE(d.outputs[0].tensors.has_value());
      EXPECT_NEAR(d.outputs[0].tensors->cosine, 1.0, 1e-6);
      EXPECT_GT(d.outputs[0].tensors->max_abs, 0);
    }
  }
}

// The step `moerr import torch IN -o RUN` wrote (empty when it failed).
formats::Trace TorchStep(const std::string& in, const std::string& run) {
  auto result = ImportTorch(in, run);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? ReadStep(result->bundles[0], 0) : formats::Trace{};
}

TEST(TorchImportTest, ATensorDictBecomesOneOpPerName) {
  TempDir dir;
  c10::Dict<std::string, at::Tensor> d;
  d.insert("layers.0.out", at::ones({2, 3}));
  d.insert("layers.1.out", at::full({2}, INFINITY));
  d.insert("loss", at::zeros({}));
  SavePickle(c10::IValue(d), dir.File("step.pt"));
  const formats::Trace t = TorchStep(dir.File("step.pt"), dir.File("run"));
  ASSERT_EQ(t.ops.size(), 3u);
  EXPECT_EQ(t.ops[1].name, "layers.1.out");
  EXPECT_EQ(t.ops[1].module, "layers.1");
  const auto first = analysis::FindFirstOverflow(t);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->op->name, "layers.1.out");

  SavePickle(c10::IValue(int64_t{3}), dir.File("int.pt"));
  auto not_dict = ImportTorch(dir.File("int.pt"), dir.File("run2"));
  ASSERT_EQ(not_dict.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_dict.status().message().find("not a tensor or a dict"), std::string::npos) << not_dict.status();
  // A directory: its files in natural order, names "stem/key".
  std::filesystem::create_directory(dir.File("dumps"));
  std::filesystem::copy_file(dir.File("step.pt"), dir.File("dumps/x2.pt"));
  SavePickle(c10::IValue(at::ones({3})), dir.File("dumps/x10.pt"));
  const formats::Trace td = TorchStep(dir.File("dumps"), dir.File("run-dir"));
  ASSERT_EQ(td.ops.size(), 4u);
  EXPECT_EQ(td.ops[0].name, "x2/layers.0.out");
  EXPECT_EQ(td.ops[3].name, "x10");

  std::ofstream(dir.File("junk.pt")) << "not a pickle";
  EXPECT_EQ(ImportTorch(dir.File("junk.pt"), dir.File("run3")).status().code(), absl::StatusCode::kInvalidArgument);
}

// `pickle` bytes read by TorchUnpickler: the value, or the error's message.
absl::StatusOr<const PickleValue*> Unpickle(TorchUnpickler& u, const std::string& pickle) {
  size_t pos = 0;
  return u.Load(pickle, pos);
}

TEST(TorchUnpicklerTest, MalformedPicklesAreRefusedByByte) {
  const std::pair<std::string, std::string> kCases[] = {
      {std::string("\x80\x02K\x01", 4), "byte 4: the pickle is cut short"},
      {"\x80\x02I1\n.", "byte 2: opcode 0x49 is not one of pickle protocols 2 to 5"},
      {"\x80\x02h\x05.", "byte 2: reads memo 5, which was never set"},
      {"\x80\x02]e.", "byte 3: closes a MARK that was never set"},
      {"\x80\x02K\x01K\x02.", "the pickle ends with 2 values on its stack, not 1"},
      {"\x80\x02}(K\x01u.", "byte 6: sets a dict item without its value"},
  };
  for (const auto& [pickle, message] : kCases) {
    TorchUnpickler u;
    const auto v = Unpickle(u, pickle);
    ASSERT_FALSE(v.ok()) << message;
    EXPECT_NE(v.status().message().find(message), std::string::npos) << v.status();
  }
}

TEST(TorchUnpicklerTest, UnknownCallsBecomeNamedObjects) {
  TorchUnpickler u;
  // protocol 4: FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL; then
  // {"cfg": mymod.Config() by NEWOBJ, "n": os.system("x") by REDUCE}
  const std::string pickle("\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x03" "cfg\x8c\x05mymod\x8c\x06"
                           "Config\x93)\x81}b\x8c\x01n\x8c\x02os\x8c\x06system\x93\x8c\x01x\x85Ru.", 62);
  const auto v = Unpickle(u, pickle);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ((*v)->kind, PickleValue::Kind::kDict);
  ASSERT_EQ((*v)->items.size(), 4u);
  EXPECT_EQ(DescribeValue(*(*v)->items[1]), "a mymod.Config object");
  EXPECT_EQ(DescribeValue(*(*v)->items[3]), "an os.system object");  // never called
}

// A zip archive as torch.save lays it out, holding `pickle` as data.pkl.
void WritePt(const std::string& path, const std::string& pickle) {
  caffe2::serialize::PyTorchStreamWriter writer(path);
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeEndOfFile();
}

TEST(TorchImportTest, AListHoldingItselfIsRefusedByPath) {
  TempDir dir;
  WritePt(dir.File("loop.pt"), std::string("\x80\x02]q\x00h\x00" "a.", 9));  // x = []; x.append(x)
  auto result = ImportTorch(dir.File("loop.pt"), dir.File("run"));
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("loop.pt: 0.0.0."), std::string::npos) << result.status();
  EXPECT_NE(result.status().message().find("nested deeper than 32 levels"), std::string::npos) << result.status();
  EXPECT_FALSE(std::filesystem::exists(dir.File("run")));
}

}  // namespace
}  // namespace moerr::importers

#ifdef MOERR_BIN
namespace moerr::importers {
namespace {

// `moerr CMD...`: its exit code and what it printed (stdout and stderr).
std::pair<int, std::string> Moerr(const std::string& args) {
  std::FILE* p = popen(("'" MOERR_BIN "' " + args + " 2>&1").c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  return {WEXITSTATUS(pclose(p)), out};
}

// The command end to end: import, then `moerr bisect --json` names the API;
// bad input exits 2 naming the file.
TEST(ImportCommandTest, ImportThenBisectAndExitCodes) {
  TempDir dir;
  std::vector<FixtureEntry> step = Step(at::randn({4, 8}), 1.0, 6);
  step[2].outputs[0] = step[2].outputs[0].clone().fill_(-INFINITY);
  WriteMsprobeDump(dir.File("dump"), 0, 0, "statistics", step);
  WriteMsprobeDump(dir.File("dump"), 0, 1, "statistics", step);
  const auto [code, out] = Moerr("import msprobe --json '" + dir.File("dump") + "' -o '" + dir.File("run") + "'");
  ASSERT_EQ(code, 0) << out;
  auto json = llvm::json::parse(out);
  ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError()) << out;
  EXPECT_EQ(json->getAsObject()->getArray("bundles")->size(), 2u);
  EXPECT_EQ(json->getAsObject()->getInteger("ops").getValueOr(0), 10);

  const auto [bisect_code, bisect] = Moerr("bisect --json '" + dir.File("run/rank1.moerr") + "'");
  EXPECT_EQ(bisect_code, 1) << bisect;  // a finding
  auto found = llvm::json::parse(bisect);
  ASSERT_TRUE(static_cast<bool>(found)) << llvm::toString(found.takeError()) << bisect;
  const llvm::json::Object* cause = found->getAsArray()->front().getAsObject()->getObject("cause");
  ASSERT_NE(cause, nullptr) << bisect;
  EXPECT_EQ(cause->getString("op").getValueOr("").str(), "Functional.linear");
  EXPECT_EQ(cause->getString("module").getValueOr("").str(), "layers.1");

  EXPECT_EQ(Moerr("import msprobe '" + dir.File("dump") + "' -o '" + dir.File("run") + "'").first, 2);  // exists
  std::ofstream(dir.File("dump/step0/rank0/dump.json"), std::ios::trunc) << "{\"task\": \"statistics\", \"data\": {";
  const auto [cut_code, cut] = Moerr("import msprobe '" + dir.File("dump") + "' -o '" + dir.File("run2") + "'");
  EXPECT_EQ(cut_code, 2) << cut;
  EXPECT_NE(cut.find("rank0/dump.json"), std::string::npos) << cut;
  EXPECT_EQ(Moerr("import torch '" + dir.File("none.pt") + "' -o '" + dir.File("run3") + "'").first, 2);
}

}  // namespace
}  // namespace moerr::importers
#endif
