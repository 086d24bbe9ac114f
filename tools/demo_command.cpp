// `moerr demo`: the crash-recovery story, end to end. A child process records
// training steps into a bundle and is killed (SIGKILL) in the middle of a
// step, as a crashed job would be. The demo then shows what a user does with
// the dump: inspect refuses it with advice, salvage rebuilds the index from
// the complete frames, verify checks every byte, inspect shows what survived.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_join.h"
#include "formats/bundle_reader.h"
#include "formats/bundle_summary.h"
#include "formats/bundle_writer.h"
#include "formats/salvage.h"
#include "tools/command.h"

namespace moerr::tools {
namespace {

using formats::DType;
using formats::OwnedTensor;
using formats::Role;

OwnedTensor Bf16Normal(std::vector<int64_t> shape, float stddev, uint64_t seed) {
  OwnedTensor t{DType::kBF16, std::move(shape), {}};
  const int64_t n = formats::CheckedNumel(t.shape).value();
  t.bytes.resize(2 * n);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  for (int64_t i = 0; i < n; ++i) {
    const float f = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint16_t h = static_cast<uint16_t>(bits >> 16);
    std::memcpy(t.bytes.data() + 2 * i, &h, 2);
  }
  return t;
}

OwnedTensor Int32Uniform(std::vector<int64_t> shape, int high, uint64_t seed) {
  OwnedTensor t{DType::kI32, std::move(shape), {}};
  const int64_t n = formats::CheckedNumel(t.shape).value();
  t.bytes.resize(4 * n);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = static_cast<int32_t>(rng() % high);
    std::memcpy(t.bytes.data() + 4 * i, &v, 4);
  }
  return t;
}

// The recording child: 4 MoE layers x 8 experts of bf16 weights (unchanged
// across steps, so stored once), per-step Adam moments and routing ids. It
// dies with SIGKILL halfway through step `crash_step`.
[[noreturn]] void RecordAndCrash(const std::string& path, int crash_step) {
  auto writer = formats::BundleWriter::Create(path, formats::WriterOptions().set_overwrite(true));
  if (!writer.ok()) _exit(3);
  auto& w = **writer;
  (void)w.Annotate("model", llvm::json::Object{{"layers", 4}, {"experts", 8}, {"top_k", 2}, {"hidden", 256}});
  std::vector<std::pair<std::string, OwnedTensor>> params;
  for (int l = 0; l < 4; ++l)
    for (int e = 0; e < 8; ++e)
      params.emplace_back("model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + ".down_proj.weight",
                          Bf16Normal({256, 512}, 0.02f, 100 * l + e));
  for (int step = 0;; ++step) {
    (void)w.BeginStep(step);
    for (size_t i = 0; i < params.size(); ++i) {
      if (step == crash_step && i == params.size() / 2) {
        (void)w.Checkpoint();  // flush what is queued, as a long step would
        ::kill(::getpid(), SIGKILL);
      }
      (void)w.PutTensor(params[i].first, Role::kParameter, step, params[i].second.view());
      (void)w.PutTensor(params[i].first + ".exp_avg", Role::kOptimizerState, step,
                        Bf16Normal({256, 512}, 1e-3f, 7919 * step + i).view());
    }
    for (int l = 0; l < 4; ++l) {
      (void)w.PutTensor("model.layers." + std::to_string(l) + ".mlp.gate.topk_ids", Role::kBatch, step,
                        Int32Uniform({1024, 2}, 8, 31 * step + l).view());
    }
    (void)w.EndStep(step);
  }
}

int RunDemo(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string bundle = dir + "/run.moerr", fixed = dir + "/run.salvaged.moerr";
  std::filesystem::remove(bundle);
  std::filesystem::remove(bundle + ".partial");
  std::filesystem::remove(fixed);

  std::printf("1. A training job records steps into %s and is killed (SIGKILL) halfway through step 3.\n",
              bundle.c_str());
  const pid_t child = ::fork();
  if (child < 0) return ReportError(absl::InternalError("fork failed"));
  if (child == 0) RecordAndCrash(bundle, /*crash_step=*/3);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
    return ReportError(absl::InternalError("the recording child did not die as planned"));
  }
  std::printf("   the job died by signal %d; it left %s (%s)\n\n", WTERMSIG(status), (bundle + ".partial").c_str(),
              formats::HumanBytes(std::filesystem::file_size(bundle + ".partial")).c_str());

  std::printf("2. $ moerr inspect %s.partial\n", bundle.c_str());
  auto broken = formats::BundleReader::Open(bundle + ".partial");
  if (broken.ok()) return ReportError(absl::InternalError("a killed writer's bundle opened as finished"));
  std::printf("   moerr: error: %s\n\n", std::string(broken.status().message()).c_str());

  std::printf("3. $ moerr salvage %s.partial -o %s\n", bundle.c_str(), fixed.c_str());
  auto report = formats::Salvage(bundle + ".partial", fixed, /*overwrite=*/true);
  if (!report.ok()) return ReportError(report.status());
  std::printf("   kept %llu complete frames; recovered %llu tensors; complete steps: %s\n",
              static_cast<unsigned long long>(report->frames), static_cast<unsigned long long>(report->tensors),
              absl::StrJoin(report->complete_steps, ", ").c_str());
  std::printf("   lost: step(s) %s began but did not finish; %s after the last complete frame\n\n",
              absl::StrJoin(report->incomplete_steps, ", ").c_str(), formats::HumanBytes(report->bytes_dropped).c_str());

  std::printf("4. $ moerr verify %s\n", fixed.c_str());
  auto reader = formats::BundleReader::Open(fixed);
  if (!reader.ok()) return ReportError(reader.status());
  auto verified = (*reader)->Verify();
  if (!verified.ok()) return ReportError(verified.status());
  std::printf("   ok: %llu frames checksummed, %llu distinct tensors' contents re-hashed (%s)\n\n",
              static_cast<unsigned long long>(verified->frames), static_cast<unsigned long long>(verified->blobs),
              formats::HumanBytes(verified->raw_bytes).c_str());

  std::printf("5. $ moerr inspect %s\n", fixed.c_str());
  auto summary = formats::Summarize(**reader);
  if (!summary.ok()) return ReportError(summary.status());
  std::printf("%s\n", formats::RenderText(*summary, fixed).c_str());
  std::printf("The expert weights did not change between steps, so each is stored once (%.2fx of the\n"
              "logical bytes on disk); each is read back on its own without touching the rest.\n",
              static_cast<double>(summary->stored_bytes) / summary->logical_bytes);
  return kExitOk;
}

}  // namespace

void AddDemoCommand(CLI::App& app, int& exit_code) {
  auto dir = std::make_shared<std::string>("moerr-demo");
  CLI::App* cmd = app.add_subcommand(
      "demo", "End-to-end demo: a recording job is killed mid-step; salvage, verify and inspect its bundle");
  cmd->add_option("--dir", *dir, "Working directory for the demo's files")->capture_default_str();
  cmd->callback([dir, &exit_code] { exit_code = RunDemo(*dir); });
}

}  // namespace moerr::tools
