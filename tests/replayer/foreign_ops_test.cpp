// Replaying a step that used ops this LibTorch does not have (docs/REPLAY.md,
// "Ops this LibTorch does not have"). record_fake_npu records a step with
// fakenpu::npu_swiglu (correct) and fakenpu::npu_swiglu_backward (its gate
// gradient doubled) from a library this process never loads; the shipped
// torch_npu references of npu_swiglu serve as their references. It also
// records a step of npu::npu_fusion_attention and its grad (correct, with
// torch_npu 7.1.0's schemas), which the shipped references serve by name,
// and the same calls with sparse_mode 5, which those references refuse.
#include <gtest/gtest.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "formats/bundle_reader.h"
#include "formats/world_manifest.h"
#include "llvm/Support/JSON.h"
#include "replayer/op_references.h"
#include "replayer/program_replay.h"
#include "tests/testing/test_util.h"

namespace moerr::replayer {
namespace {

constexpr char kForward[] = "fakenpu::npu_swiglu";
constexpr char kBackward[] = "fakenpu::npu_swiglu_backward";

class ForeignOpsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new formats::testing::TempDir();
    for (const char* mode : {"stats", "replayable", "full"}) {
      const std::string cmd = absl::StrCat(RECORD_FAKE_NPU, " ", Bundle(mode), " ", mode);
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    const std::string attention = absl::StrCat(RECORD_FAKE_NPU, " ", Bundle("attention"), " full attention");
    ASSERT_EQ(std::system(attention.c_str()), 0) << attention;
    for (const char* mode : {"stats", "full"}) {
      const std::string sparse5 =
          absl::StrCat(RECORD_FAKE_NPU, " ", Bundle(absl::StrCat("sparse5-", mode)), " ", mode, " attention-sparse5");
      ASSERT_EQ(std::system(sparse5.c_str()), 0) << sparse5;
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Bundle(const std::string& mode) { return dir_->File(mode + ".moerr"); }

  // The shipped npu_swiglu references, standing for the fakenpu ops.
  static std::vector<std::string> ReferenceSpecs() {
    const std::string dir = OpReferences::ShippedDir();
    EXPECT_FALSE(dir.empty()) << "the shipped references were not built";
    return {absl::StrCat(kForward, "=", dir, "/npu_swiglu.pt"),
            absl::StrCat(kBackward, "=", dir, "/npu_swiglu_backward.pt")};
  }

  static size_t IndexOf(const formats::Trace& trace, const std::string& name) {
    for (size_t i = 0; i < trace.ops.size(); ++i) {
      if (trace.ops[i].name == name) return i;
    }
    ADD_FAILURE() << name << " is not in the trace";
    return 0;
  }

  // Runs the moerr command; its exit code and stdout.
  static std::pair<int, std::string> Moerr(const std::string& args) {
    const std::string cmd = absl::StrCat(MOERR_BIN, " ", args, " 2>&1");
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
    std::string out;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), pipe.get())) > 0) out.append(buf.data(), n);
    const int status = ::pclose(pipe.release());
    return {WEXITSTATUS(status), out};
  }

  static formats::testing::TempDir* dir_;
};

formats::testing::TempDir* ForeignOpsTest::dir_ = nullptr;

TEST_F(ForeignOpsTest, TheOpsAreNotInThisProcess) {
  EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({kForward, ""}).has_value());
  EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({kBackward, ""}).has_value());
  EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({"npu::npu_fusion_attention", ""}).has_value());
}

TEST_F(ForeignOpsTest, TheShippedReferencesLoadByName) {
  auto refs = OpReferences::Load({});
  ASSERT_TRUE(refs.ok()) << refs.status();
  for (const char* op : {"npu::npu_fusion_attention", "npu::npu_fusion_attention_grad", "npu::npu_grouped_matmul",
                         "npu::npu_moe_token_permute", "npu::npu_moe_token_permute_grad",
                         "npu::npu_moe_token_unpermute", "npu::npu_moe_token_unpermute_grad", "npu::npu_rms_norm",
                         "npu::npu_rms_norm_backward", "npu::npu_rotary_mul", "npu::npu_rotary_mul_backward",
                         "npu::npu_swiglu", "npu::npu_swiglu_backward"}) {
    EXPECT_NE(refs->Find(op), nullptr) << op;
  }
  const at::Tensor x = at::randn({3, 8});
  auto out = refs->Run("npu::npu_swiglu", {c10::IValue(x), c10::IValue(int64_t{-1})});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_TRUE((*out)[0].allclose(at::silu(x.narrow(1, 0, 4)) * x.narrow(1, 4, 4)));
  // Optional arguments pass as None: the fused MoE permute of 3 tokens, top-2.
  const at::Tensor tokens = at::randn({3, 4});
  const at::Tensor experts = at::tensor({1, 0, 0, 1, 1, 0});
  auto permuted = refs->Run("npu::npu_moe_token_permute", {c10::IValue(tokens), c10::IValue(experts.reshape({3, 2})),
                                                           c10::IValue(), c10::IValue(false)});
  ASSERT_TRUE(permuted.ok()) << permuted.status();
  ASSERT_EQ(permuted->size(), 2u);
  EXPECT_TRUE((*permuted)[0].equal(tokens.index_select(0, at::tensor({0, 1, 2, 0, 1, 2}))));
  // A call recorded with an older schema, which stops before trailing
  // arguments the reference takes with defaults: torch_npu 7.1.0's
  // npu_fusion_attention (19 arguments of 24), one head of 3 queries and keys.
  const at::Tensor q = at::randn({1, 1, 3, 4});
  std::vector<c10::IValue> older{c10::IValue(q), c10::IValue(q), c10::IValue(q), c10::IValue(int64_t{1}),
                                 c10::IValue(std::string("BNSD"))};
  for (int i = 0; i < 3; ++i) older.emplace_back();  // pse, padding_mask, atten_mask
  for (const c10::IValue& v : {c10::IValue(0.5), c10::IValue(1.0), c10::IValue(int64_t{2147483647}),
                               c10::IValue(int64_t{2147483647}), c10::IValue(int64_t{0}), c10::IValue(),
                               c10::IValue(), c10::IValue(), c10::IValue(int64_t{0}), c10::IValue(true),
                               c10::IValue(false)}) {
    older.push_back(v);
  }
  ASSERT_EQ(older.size(), 19u);
  auto attention = refs->Run("npu::npu_fusion_attention", older);
  ASSERT_TRUE(attention.ok()) << attention.status();
  ASSERT_EQ(attention->size(), 7u);  // attention_out, softmax_max, softmax_sum, softmax_out; 3 ints
  EXPECT_FALSE((*attention)[4].defined());  // seed, offset, numels: in their places, not tensors
  EXPECT_TRUE((*attention)[0].allclose(at::softmax(at::matmul(q, q.transpose(-1, -2)) * 0.5, -1).matmul(q)));
  // A reference given for an op with other arguments says so.
  auto wrong = refs->Run("npu::npu_swiglu", {c10::IValue(x), c10::IValue(x), c10::IValue(x)});
  EXPECT_FALSE(wrong.ok());
  EXPECT_FALSE(OpReferences::Load({"npu::npu_swiglu"}).ok());              // no FILE
  EXPECT_FALSE(OpReferences::Load({"npu::npu_swiglu=/nonexistent.pt"}).ok());
}

TEST_F(ForeignOpsTest, ReplayCompletesWithTheOpsServedFromTheRecord) {
  auto reader = formats::BundleReader::Open(Bundle("replayable"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto report = ReplayStep(**reader, 0);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->not_reexecuted, 2u);
  EXPECT_EQ(report->not_reexecuted_ops.at(kForward), 1u);
  EXPECT_EQ(report->not_reexecuted_ops.at(kBackward), 1u);
  EXPECT_EQ(report->dispatched + report->not_reexecuted + report->from_record, report->ops);
  EXPECT_GT(report->compared, 5u);
  EXPECT_EQ(report->mismatched, 0u);  // the ops after them read their recorded outputs
}

TEST_F(ForeignOpsTest, AStatsBundleListsEveryOpThatBlocksTheReplay) {
  auto reader = formats::BundleReader::Open(Bundle("stats"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto report = ReplayStep(**reader, 0);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(report.status().message());
  EXPECT_NE(message.find("2 ops of step 0 cannot be replayed"), std::string::npos) << message;
  EXPECT_NE(message.find(absl::StrCat(kForward, " in forward")), std::string::npos) << message;
  EXPECT_NE(message.find(absl::StrCat(kBackward, " in backward")), std::string::npos) << message;
}

TEST_F(ForeignOpsTest, WithReferencesAChainedReplayFirstDivergesAtTheWrongBackward) {
  auto reader = formats::BundleReader::Open(Bundle("replayable"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto refs = OpReferences::Load(ReferenceSpecs(), /*shipped=*/false);
  ASSERT_TRUE(refs.ok()) << refs.status();
  ReplayOptions options;
  options.references = &*refs;
  auto report = ReplayStep(**reader, 0, options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->by_reference, 2u);
  EXPECT_EQ(report->not_reexecuted, 0u);
  ASSERT_TRUE(report->first_divergence.has_value());
  EXPECT_EQ(report->first_divergence->op.name, kBackward);
  EXPECT_EQ(report->mismatched, 1u);  // the ops after it read the recorded gradient
}

TEST_F(ForeignOpsTest, IsolatedReplayNamesTheBackwardAndNotTheForward) {
  auto reader = formats::BundleReader::Open(Bundle("full"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto trace = formats::ReadTrace(**reader, 0);
  ASSERT_TRUE(trace.ok()) << trace.status();
  auto refs = OpReferences::Load(ReferenceSpecs(), /*shipped=*/false);
  ASSERT_TRUE(refs.ok()) << refs.status();
  ReplayOptions options;
  options.isolated = true;
  options.references = &*refs;
  auto report = ReplayTrace(**reader, 0, *trace, options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->reference_checks.size(), 2u);
  for (const ReferenceCheck& c : report->reference_checks) {
    const formats::OpEvent& op = trace->ops[c.op_index];
    if (op.name == kForward) {
      EXPECT_EQ(op.phase, formats::Phase::kForward);
      EXPECT_FALSE(c.suspect) << c.recorded_ulps << " ULPs, allowed " << c.allowed_ulps;
      EXPECT_LE(c.recorded_ulps, c.allowed_ulps);
    } else {
      EXPECT_EQ(op.name, kBackward);
      EXPECT_EQ(op.phase, formats::Phase::kBackward);
      EXPECT_TRUE(c.suspect);
      EXPECT_GT(c.recorded_ulps, 1000 * c.allowed_ulps);  // a factor of 2 is ~2^23 ULPs in f32
      EXPECT_GT(c.recorded_rel_l2, 0.1);
      EXPECT_LT(c.reference_rel_l2, 1e-6);
    }
  }
  EXPECT_EQ(IndexOf(*trace, kForward) < IndexOf(*trace, kBackward), true);
}

TEST_F(ForeignOpsTest, EachOpsDeviceTypeIsRecorded) {
  auto reader = formats::BundleReader::Open(Bundle("replayable"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto trace = formats::ReadTrace(**reader, 0);
  ASSERT_TRUE(trace.ok()) << trace.status();
  for (const formats::OpEvent& op : trace->ops) EXPECT_EQ(op.device, "cpu") << op.name;
}

// The step as if recorded on a GPU: every op's device type "cuda", and the
// first matmul's recorded output off by `relative` in its norm (and hash).
formats::Trace AsIfFromAGpu(formats::Trace trace, double relative) {
  for (formats::OpEvent& op : trace.ops) op.device = "cuda";
  const uint64_t mm = trace.ops[0].outputs.at(0);
  EXPECT_EQ(trace.ops[0].name, "aten::mm");
  for (formats::TensorMeta& meta : trace.tensors) {
    if (meta.id != mm) continue;
    meta.fingerprint.l2 *= 1 + relative;
    meta.fingerprint.hash ^= 1;
  }
  return trace;
}

TEST_F(ForeignOpsTest, OpsRecordedOnAnotherDeviceAreComparedWithinTolerance) {
  auto reader = formats::BundleReader::Open(Bundle("replayable"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto recorded = formats::ReadTrace(**reader, 0);
  ASSERT_TRUE(recorded.ok()) << recorded.status();

  formats::Trace gpu = AsIfFromAGpu(*recorded, 1e-7);  // an fp32 rounding difference
  auto report = ReplayTrace(**reader, 0, gpu);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->other_device, report->dispatched);
  EXPECT_EQ(report->recorded_devices, std::set<std::string>{"cuda"});
  EXPECT_EQ(report->within_tolerance, 1u);
  EXPECT_EQ(report->mismatched, 0u);

  formats::Trace cpu = gpu;  // the same difference, recorded on this device type: bitwise is the rule
  for (formats::OpEvent& op : cpu.ops) op.device = "cpu";
  report = ReplayTrace(**reader, 0, cpu);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->other_device, 0u);
  EXPECT_EQ(report->mismatched, 1u);

  formats::Trace far = AsIfFromAGpu(*recorded, 1e-2);  // beyond fp32's 1e-5
  report = ReplayTrace(**reader, 0, far);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->mismatched, 1u);
  ASSERT_TRUE(report->first_divergence.has_value());
  EXPECT_EQ(report->first_divergence->op_index, 0u);
}

TEST_F(ForeignOpsTest, TheCommandReportsNotReExecutedOpsAndTheVerdict) {
  auto [code, out] = Moerr(absl::StrCat("replay ", Bundle("replayable")));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find(absl::StrCat("2 not re-executed (outputs from the record: ", kForward, " x1, ", kBackward,
                                  " x1)")),
            std::string::npos)
      << out;

  const std::vector<std::string> specs = ReferenceSpecs();
  std::tie(code, out) = Moerr(absl::StrCat("replay ", Bundle("full"), " --isolated --json --reference ", specs[0],
                                           " --reference ", specs[1]));
  EXPECT_EQ(code, 1) << out;  // a finding: a suspect op
  auto json = llvm::json::parse(out);
  ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError()) << "\n" << out;
  const llvm::json::Object* step = (*json->getAsArray())[0].getAsObject();
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->getInteger("by_reference").getValueOr(-1), 2);
  const llvm::json::Array* checks = step->getArray("reference_checks");
  ASSERT_NE(checks, nullptr);
  ASSERT_EQ(checks->size(), 2u);
  for (const llvm::json::Value& v : *checks) {
    const llvm::json::Object& c = *v.getAsObject();
    const bool backward = c.getString("op").getValueOr("") == kBackward;
    EXPECT_EQ(c.getString("phase").getValueOr("").str(), backward ? "backward" : "forward");
    EXPECT_EQ(c.getString("verdict").getValueOr("").str(), backward ? "suspect" : "consistent");
    EXPECT_TRUE(c.getInteger("recorded_ulps").hasValue());
    EXPECT_TRUE(c.getInteger("reference_ulps").hasValue());
  }

  std::tie(code, out) = Moerr(absl::StrCat("replay ", Bundle("stats")));
  EXPECT_NE(out.find("cannot be replayed"), std::string::npos) << out;
  EXPECT_NE(code, 0);
}

// bisect and lint carry the isolated replay's verdict: the backward, not the
// forward, and only where the bundle holds every op's outputs.
TEST_F(ForeignOpsTest, BisectAndLintNameTheWrongBackward) {
  const std::vector<std::string> specs = ReferenceSpecs();
  const std::string refs = absl::StrCat(" --reference ", specs[0], " --reference ", specs[1]);
  auto [code, out] = Moerr(absl::StrCat("bisect ", Bundle("full"), refs));
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("vendor op suspect: op "), std::string::npos) << out;
  EXPECT_NE(out.find(absl::StrCat(kBackward, " (backward, ")), std::string::npos) << out;
  EXPECT_EQ(out.find(absl::StrCat(kForward, " (")), std::string::npos) << out;

  std::tie(code, out) = Moerr(absl::StrCat("bisect ", Bundle("full"), " --json", refs));
  EXPECT_EQ(code, 1) << out;
  auto json = llvm::json::parse(out);
  ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError()) << "\n" << out;
  const llvm::json::Array* vendor = (*json->getAsArray())[0].getAsObject()->getArray("vendor_ops");
  ASSERT_NE(vendor, nullptr) << out;
  ASSERT_EQ(vendor->size(), 1u) << out;
  const llvm::json::Object& op = *(*vendor)[0].getAsObject();
  EXPECT_EQ(op.getString("op").getValueOr("").str(), kBackward);
  EXPECT_EQ(op.getString("phase").getValueOr("").str(), "backward");
  EXPECT_GT(op.getInteger("recorded_ulps").getValueOr(0), 1000 * op.getInteger("allowed_ulps").getValueOr(0));

  std::tie(code, out) = Moerr(absl::StrCat("lint ", Bundle("full"), " --only vendor-op --json", refs));
  EXPECT_EQ(code, 1) << out;
  json = llvm::json::parse(out);
  ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError()) << "\n" << out;
  ASSERT_EQ(json->getAsArray()->size(), 1u) << out;
  const llvm::json::Object& finding = *(*json->getAsArray())[0].getAsObject();
  EXPECT_EQ(finding.getString("check").getValueOr("").str(), "vendor-op");
  EXPECT_EQ(finding.getString("severity").getValueOr("").str(), "error");
  EXPECT_EQ(finding.getString("op").getValueOr("").str(), kBackward);
  EXPECT_EQ(finding.getString("phase").getValueOr("").str(), "backward");

  // Without the references no op has one: bisect says nothing of vendor ops.
  std::tie(code, out) = Moerr(absl::StrCat("bisect ", Bundle("full")));
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.find("vendor op"), std::string::npos) << out;
  // A replayable bundle cannot be replayed isolated: one line says so.
  std::tie(code, out) = Moerr(absl::StrCat("bisect ", Bundle("replayable"), refs));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("vendor ops not checked against their references: isolated replay needs"), std::string::npos)
      << out;
  std::tie(code, out) = Moerr(absl::StrCat("lint ", Bundle("replayable"), " --only vendor-op", refs));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("0 findings"), std::string::npos) << out;
}

// A correct npu::npu_fusion_attention and its grad recorded with torch_npu
// 7.1.0's schemas (19 and 27 arguments; ints among the forward's outputs,
// four grad outputs), judged by the shipped references, which load by name,
// take 26.0.0's 24 and 29 arguments and return five grad outputs: every
// output consistent.
TEST_F(ForeignOpsTest, TheShippedAttentionReferencesJudgeCallsOfAnOlderSchema) {
  auto [code, out] = Moerr(absl::StrCat("replay ", Bundle("attention"), " --isolated --json"));
  EXPECT_EQ(code, 0) << out;
  auto json = llvm::json::parse(out);
  ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError()) << "\n" << out;
  const llvm::json::Object& step = *(*json->getAsArray())[0].getAsObject();
  EXPECT_EQ(step.getInteger("by_reference").getValueOr(-1), 2) << out;
  EXPECT_EQ(step.getInteger("not_reexecuted").getValueOr(-1), 0) << out;
  const llvm::json::Array* checks = step.getArray("reference_checks");
  ASSERT_NE(checks, nullptr) << out;
  std::map<std::string, std::set<int64_t>> slots;
  for (const llvm::json::Value& v : *checks) {
    const llvm::json::Object& c = *v.getAsObject();
    EXPECT_EQ(c.getString("verdict").getValueOr("").str(), "consistent") << out;
    slots[c.getString("op").getValueOr("").str()].insert(c.getInteger("output_slot").getValueOr(-1));
  }
  for (int64_t slot : {0, 1, 2}) {  // out, softmax_max, softmax_sum; dq, dk, dv
    EXPECT_EQ(slots["npu::npu_fusion_attention"].count(slot), 1u) << out;
    EXPECT_EQ(slots["npu::npu_fusion_attention_grad"].count(slot), 1u) << out;
  }
}

// A run directory of two ranks (world.json) whose bundles are copies of
// `rank0_bundle` and `rank1_bundle`.
std::string RunOf(formats::testing::TempDir& dir, const std::string& name, const std::string& rank0_bundle,
                  const std::string& rank1_bundle) {
  const std::string run = dir.File(name);
  std::filesystem::create_directories(run);
  EXPECT_TRUE(formats::WriteWorldManifest(run, formats::ExpertParallelWorld(2, 2, 2)).ok());
  std::filesystem::copy_file(rank0_bundle, run + "/rank0.moerr");
  std::filesystem::copy_file(rank1_bundle, run + "/rank1.moerr");
  return run;
}

// replay --isolated, bisect and lint of a run directory give the verdict of
// each rank's bundle, rank by rank, in text and JSON.
TEST_F(ForeignOpsTest, ARunDirectoryIsCheckedRankByRank) {
  const std::vector<std::string> specs = ReferenceSpecs();
  const std::string refs = absl::StrCat(" --reference ", specs[0], " --reference ", specs[1]);
  const std::string both_full = RunOf(*dir_, "run_full", Bundle("full"), Bundle("full"));
  auto [code, out] = Moerr(absl::StrCat("replay ", both_full, " --isolated", refs));
  EXPECT_EQ(code, 1) << out;
  const size_t rank1 = out.find("rank 1 (");
  ASSERT_NE(out.find("rank 0 ("), std::string::npos) << out;
  ASSERT_NE(rank1, std::string::npos) << out;
  for (const std::string& part : {out.substr(0, rank1), out.substr(rank1)}) {  // each rank's own verdicts
    EXPECT_NE(part.find("ops checked against their references"), std::string::npos) << out;
    EXPECT_NE(part.find(absl::StrCat(kBackward, " backward  output 0 f32")), std::string::npos) << out;
    EXPECT_NE(part.find("SUSPECT"), std::string::npos) << out;
    EXPECT_NE(part.find(": consistent"), std::string::npos) << out;  // the forward
  }
  std::tie(code, out) = Moerr(absl::StrCat("replay ", both_full, " --isolated --json", refs));
  EXPECT_EQ(code, 1) << out;
  auto json = llvm::json::parse(out);
  ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError()) << "\n" << out;
  const llvm::json::Array* ranks = json->getAsObject()->getArray("ranks");
  ASSERT_NE(ranks, nullptr) << out;
  ASSERT_EQ(ranks->size(), 2u) << out;
  for (size_t r = 0; r < 2; ++r) {
    const llvm::json::Object& rank = *(*ranks)[r].getAsObject();
    EXPECT_EQ(rank.getInteger("rank").getValueOr(-1), static_cast<int64_t>(r));
    const llvm::json::Array* checks = (*rank.getArray("steps"))[0].getAsObject()->getArray("reference_checks");
    ASSERT_NE(checks, nullptr) << out;
    ASSERT_EQ(checks->size(), 2u) << out;
    for (const llvm::json::Value& v : *checks) {
      const bool backward = v.getAsObject()->getString("op").getValueOr("") == kBackward;
      EXPECT_EQ(v.getAsObject()->getString("verdict").getValueOr("").str(), backward ? "suspect" : "consistent");
    }
  }

  // Rank 1 replayable: bisect and lint judge rank 0 and say rank 1 could not be.
  const std::string mixed = RunOf(*dir_, "run_mixed", Bundle("full"), Bundle("replayable"));
  std::tie(code, out) = Moerr(absl::StrCat("bisect ", mixed, refs));
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find(absl::StrCat("step 0: rank 0: vendor op suspect: op ")), std::string::npos) << out;
  EXPECT_NE(out.find(absl::StrCat(kBackward, " (backward, ")), std::string::npos) << out;
  EXPECT_EQ(out.find(absl::StrCat(kForward, " (")), std::string::npos) << out;
  EXPECT_NE(out.find("step 0: rank 1: vendor ops not checked against their references: isolated replay needs"),
            std::string::npos)
      << out;
  std::tie(code, out) = Moerr(absl::StrCat("bisect ", mixed, " --json", refs));
  EXPECT_EQ(code, 1) << out;
  json = llvm::json::parse(out);
  ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError()) << "\n" << out;
  const llvm::json::Object& step = *(*json->getAsArray())[0].getAsObject();
  const llvm::json::Array* vendor = step.getArray("vendor_ops");
  ASSERT_NE(vendor, nullptr) << out;
  ASSERT_EQ(vendor->size(), 1u) << out;
  EXPECT_EQ((*vendor)[0].getAsObject()->getInteger("rank").getValueOr(-1), 0);
  EXPECT_EQ((*vendor)[0].getAsObject()->getString("op").getValueOr("").str(), kBackward);
  const llvm::json::Array* skipped = step.getArray("vendor_ops_skipped");
  ASSERT_NE(skipped, nullptr) << out;
  ASSERT_EQ(skipped->size(), 1u) << out;
  EXPECT_EQ((*skipped)[0].getAsObject()->getInteger("rank").getValueOr(-1), 1);

  std::tie(code, out) = Moerr(absl::StrCat("lint ", mixed, " --only vendor-op --json", refs));
  EXPECT_EQ(code, 1) << out;
  const size_t start = out.rfind("\n[", out.find("vendor-op\"")) + 1;  // after rank 1's note on stderr
  json = llvm::json::parse(out.substr(start));
  ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError()) << "\n" << out;
  ASSERT_EQ(json->getAsArray()->size(), 1u) << out;
  const llvm::json::Object& finding = *(*json->getAsArray())[0].getAsObject();
  EXPECT_EQ(finding.getString("check").getValueOr("").str(), "vendor-op");
  EXPECT_EQ(finding.getInteger("rank").getValueOr(-1), 0);
  EXPECT_EQ(finding.getString("op").getValueOr("").str(), kBackward);
  EXPECT_NE(out.find("rank1.moerr step 0: vendor-op not checked"), std::string::npos) << out;
}

// Calls a shipped reference refuses (npu_fusion_attention and its grad with
// sparse_mode 5) are served from the record: the replay completes, the calls
// count as not re-executed, isolated replay gives them no verdict, and the
// refusal is named in the report, the text and the JSON. Where the bundle
// holds no outputs (stats), they join the ops that block the replay.
TEST_F(ForeignOpsTest, ACallTheReferenceRefusesIsServedFromTheRecord) {
  auto refs = OpReferences::Load({});
  ASSERT_TRUE(refs.ok()) << refs.status();
  auto reader = formats::BundleReader::Open(Bundle("sparse5-full"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const bool isolated : {false, true}) {
    ReplayOptions options;
    options.isolated = isolated;
    options.references = &*refs;
    auto report = ReplayStep(**reader, 0, options);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->by_reference, 0u);
    EXPECT_EQ(report->not_reexecuted, 2u);
    EXPECT_TRUE(report->reference_checks.empty());
    EXPECT_EQ(report->mismatched, 0u);
    ASSERT_EQ(report->refused.size(), 2u);
    EXPECT_EQ(report->refused[0].op, "npu::npu_fusion_attention");
    EXPECT_EQ(report->refused[1].op, "npu::npu_fusion_attention_grad");
    EXPECT_LT(report->refused[0].op_index, report->refused[1].op_index);
    for (const RefusedCall& c : report->refused) {
      EXPECT_EQ(c.reason.rfind("sparse_mode 5 is not implemented", 0), 0u) << c.reason;
    }
  }

  auto [code, out] = Moerr(absl::StrCat("replay ", Bundle("sparse5-full")));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("2 not re-executed"), std::string::npos) << out;
  EXPECT_NE(out.find("npu::npu_fusion_attention x1: the reference refused: sparse_mode 5 is not implemented"),
            std::string::npos)
      << out;
  std::tie(code, out) = Moerr(absl::StrCat("replay ", Bundle("sparse5-full"), " --isolated --json"));
  EXPECT_EQ(code, 0) << out;
  auto json = llvm::json::parse(out);
  ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError()) << "\n" << out;
  const llvm::json::Object& step = *(*json->getAsArray())[0].getAsObject();
  EXPECT_EQ(step.getInteger("not_reexecuted").getValueOr(-1), 2) << out;
  ASSERT_NE(step.getArray("reference_checks"), nullptr) << out;
  EXPECT_TRUE(step.getArray("reference_checks")->empty()) << out;
  const llvm::json::Array* refused = step.getArray("refused");
  ASSERT_NE(refused, nullptr) << out;
  ASSERT_EQ(refused->size(), 2u) << out;
  const llvm::json::Object& first = *(*refused)[0].getAsObject();
  EXPECT_EQ(first.getString("op").getValueOr("").str(), "npu::npu_fusion_attention");
  EXPECT_TRUE(first.getInteger("op_index").hasValue());
  EXPECT_NE(first.getString("reason").getValueOr("").find("sparse_mode 5"), llvm::StringRef::npos) << out;

  auto stats = formats::BundleReader::Open(Bundle("sparse5-stats"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  ReplayOptions options;
  options.references = &*refs;
  auto blocked = ReplayStep(**stats, 0, options);
  ASSERT_FALSE(blocked.ok());
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(blocked.status().message());
  EXPECT_NE(message.find("2 ops of step 0 cannot be replayed"), std::string::npos) << message;
  for (const char* op : {"npu::npu_fusion_attention in forward (op ", "npu::npu_fusion_attention_grad in "}) {
    const size_t at = message.find(op);
    ASSERT_NE(at, std::string::npos) << message;
    EXPECT_NE(message.find("): the reference refused: sparse_mode 5 is not implemented", at), std::string::npos)
        << message;
  }
}

// A run directory one of whose ranks cannot be replayed (a stats bundle
// beside a full one): replay reports that rank, with why, replays the other,
// and exits with a finding (1), not an error (2).
TEST_F(ForeignOpsTest, ARankThatCannotBeReplayedIsReportedAndTheOthersGoOn) {
  const std::vector<std::string> specs = ReferenceSpecs();
  const std::string refs = absl::StrCat(" --reference ", specs[0], " --reference ", specs[1]);
  const std::string run = RunOf(*dir_, "run_stats_rank", Bundle("stats"), Bundle("full"));
  // Why rank 0 is not replayed, in each mode.
  const std::map<std::string, std::string> why{{" --isolated", "isolated replay needs every op's outputs"},
                                               {"", "a stats bundle cannot be replayed"}};
  for (const auto& [mode, reason] : why) {
    auto [code, out] = Moerr(absl::StrCat("replay ", run, mode, refs));
    EXPECT_EQ(code, 1) << out;
    const size_t rank1 = out.find("rank 1 (");
    ASSERT_NE(rank1, std::string::npos) << out;
    const size_t skipped = out.find("rank 0 not replayed: ");
    ASSERT_NE(skipped, std::string::npos) << out;
    EXPECT_LT(skipped, rank1) << out;
    EXPECT_LT(out.find(reason, skipped), rank1) << out;
    EXPECT_NE(out.find("step 0: ", rank1), std::string::npos) << out;  // rank 1's own summary
  }
  auto [code, out] = Moerr(absl::StrCat("replay ", run, " --isolated --json", refs));
  EXPECT_EQ(code, 1) << out;
  auto json = llvm::json::parse(out);
  ASSERT_TRUE(static_cast<bool>(json)) << llvm::toString(json.takeError()) << "\n" << out;
  const llvm::json::Array* ranks = json->getAsObject()->getArray("ranks");
  ASSERT_NE(ranks, nullptr) << out;
  ASSERT_EQ(ranks->size(), 2u) << out;
  const llvm::json::Object& bad = *(*ranks)[0].getAsObject();
  EXPECT_EQ(bad.getInteger("rank").getValueOr(-1), 0);
  EXPECT_EQ(bad.getString("error").getValueOr("").find(why.at(" --isolated")), 0u) << out;
  EXPECT_EQ(bad.getArray("steps"), nullptr) << out;
  const llvm::json::Object& good = *(*ranks)[1].getAsObject();
  EXPECT_EQ(good.getInteger("rank").getValueOr(-1), 1);
  EXPECT_FALSE(good.getString("error").hasValue()) << out;
  const llvm::json::Array* steps = good.getArray("steps");
  ASSERT_NE(steps, nullptr) << out;
  ASSERT_EQ(steps->size(), 1u) << out;
  const llvm::json::Array* checks = (*steps)[0].getAsObject()->getArray("reference_checks");
  ASSERT_NE(checks, nullptr) << out;
  EXPECT_EQ(checks->size(), 2u) << out;

  // A bad option is the command's error, not every rank's.
  std::tie(code, out) = Moerr(absl::StrCat("replay ", run, " --reference npu::npu_swiglu=/nonexistent.pt"));
  EXPECT_EQ(code, 2) << out;
}

}  // namespace
}  // namespace moerr::replayer
