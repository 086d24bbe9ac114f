// Multi-rank tests with real processes and real c10d Gloo collectives.
//
// NRanksEqualOneProcess: this binary launches itself as N ranks
// (distributed::Launch, with MOERR_TEST_OUT set: main() then runs one rank
// instead of the tests); each rank takes one GRPO step of the tiny model on
// its slice of a fixed global batch and saves what it holds; the test takes
// the same step in one process and compares.
//
// Tolerance: the ranks compute the same sums in a different order (the loss
// and metrics are per-rank partial sums added by all_reduce, dense gradients
// are sums of per-rank partial gradients, the aux loss's mean is a sum over
// ranks), so the results differ by fp32 rounding only: relative 1e-5 on the
// loss and metrics and on each gradient tensor (against its largest value),
// absolute 1e-6 on the updated weights (one AdamW step of lr 1e-4 moves a
// weight by at most ~1e-4; a rounding change in a gradient moves the update
// far less). Every rank must report the same metrics bitwise: they take
// the same clip and skip decisions.
//
// Launcher: `moerr train --ranks 2` over either store; with a rank killed
// by SIGKILL or stalled it must end (under a 120 s guard) naming that rank;
// past --deadline it kills the ranks still running and says so.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "distributed/launcher.h"
#include "distributed/process_group.h"
#include "moe/grpo_trainer.h"
#include "moe/moe_config.h"
#include "support/seconds_since.h"

namespace moerr {
namespace {

constexpr int64_t kSeed = 0;

// One tiny-model trainer, the same in every process: fixed weights, and a
// response source giving the same global batch of responses every time.
moe::GrpoTrainer MakeTrainer(moe::Precision precision) {
  at::set_num_threads(1);
  torch::manual_seed(kSeed);
  moe::MoeConfig config = moe::Preset("tiny").value();
  moe::MoeTransformer policy(config);
  moe::MoeTransformer reference = moe::CopyOf(policy);
  moe::GrpoOptions options;
  options.numerics.precision = precision;
  options.rollout_numerics.precision = precision;
  moe::GrpoTrainer trainer(policy, reference, moe::AdditionTask(), options, kSeed);
  trainer.set_response_source([vocab = config.vocab_size](int64_t step, const at::Tensor& prompts) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1234 + step);
    return at::randint(0, vocab, {prompts.size(0), moe::AdditionTask().answer_length()}, gen, at::kLong);
  });
  return trainer;
}

std::vector<double> MetricValues(const moe::StepMetrics& m) {
  return {m.loss, m.reward, m.kl, m.grad_norm, m.load_entropy, m.top_expert_share, m.clip_fraction};
}

// The parameters `rank` hosts in EP group 0: every dense one on rank 0, and
// each routed expert's on the EP rank hosting it (world rank = EP rank there).
bool Hosts(const std::string& name, const moe::ParallelLayout& layout, int64_t experts) {
  const size_t at = name.find(".experts.");
  if (at == std::string::npos) return layout.rank == 0;
  const int64_t e = std::stoll(name.substr(at + 9));
  return layout.ep_group() == 0 && layout.host_of(e, experts) == layout.ep_rank();
}

// The rank side: one step, then metrics, and the hosted weights and gradients.
int RunRank(const std::string& out, int64_t ep, moe::Precision precision) {
  auto env = distributed::RankFromEnvironment();
  if (!env.ok() || !env->has_value()) return 10;
  distributed::WorldOptions world;
  world.ep_size = ep;
  world.collective_timeout_s = 60;
  auto parallel = distributed::JoinWorld(**env, world);
  if (!parallel.ok()) {
    std::fprintf(stderr, "%s\n", parallel.status().ToString().c_str());
    return 11;
  }
  moe::GrpoTrainer trainer = MakeTrainer(precision);
  if (!trainer.set_parallel(parallel->get()).ok()) return 12;
  const moe::StepMetrics m = trainer.Step();
  const moe::ParallelLayout& layout = (*parallel)->layout();
  std::vector<at::Tensor> tensors{at::tensor(MetricValues(m), at::kDouble)};
  std::ofstream names(out + "/rank" + std::to_string(layout.rank) + ".names");
  for (const auto& p : trainer.policy()->named_parameters()) {
    if (!Hosts(p.key(), layout, trainer.policy()->config().num_experts)) continue;
    names << p.key() << "\n";
    tensors.push_back(p.value().detach().clone());
    tensors.push_back(p.value().grad().defined() ? p.value().grad().clone() : at::Tensor());
  }
  torch::save(tensors, out + "/rank" + std::to_string(layout.rank) + ".pt");
  return 0;
}

double RelDiff(double a, double b) { return std::abs(a - b) / std::max(1e-12, std::max(std::abs(a), std::abs(b))); }

struct Tolerance {
  double metric = 1e-5;  // relative
  double grad = 1e-5;    // against the tensor's largest value
  double weight = 1e-6;  // absolute
};

void ExpectNRanksEqualOneProcess(int64_t ranks, int64_t ep, moe::Precision precision = moe::Precision::kFp32,
                                 Tolerance tol = Tolerance()) {
  const std::string out = testing::TempDir() + "/moerr_dist_" + std::to_string(ranks) + "x" + std::to_string(ep) +
                          moe::PrecisionName(precision);
  std::filesystem::remove_all(out);
  std::filesystem::create_directories(out);
  distributed::LaunchOptions launch;
  launch.ranks = ranks;
  launch.argv = {"distributed_test"};
  launch.env = {{"MOERR_STORE", out + "/store"}, {"MOERR_TEST_OUT", out}, {"MOERR_TEST_EP", std::to_string(ep)},
                {"MOERR_TEST_PRECISION", moe::PrecisionName(precision)}};
  launch.deadline_s = 120;
  auto result = distributed::Launch(launch);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->ok()) << result->Describe();

  moe::GrpoTrainer single = MakeTrainer(precision);
  const std::vector<double> expected = MetricValues(single.Step());
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> params;  // name -> (weight, grad)
  for (const auto& p : single.policy()->named_parameters()) params[p.key()] = {p.value().detach(), p.value().grad()};

  std::vector<double> rank0;
  size_t compared = 0;
  double worst_metric = 0, worst_grad = 0, worst_weight = 0;  // the largest deviations, printed
  for (int64_t r = 0; r < ranks; ++r) {
    std::vector<at::Tensor> tensors;
    torch::load(tensors, out + "/rank" + std::to_string(r) + ".pt");
    const at::Tensor metrics = tensors.at(0);
    const std::vector<double> got(metrics.data_ptr<double>(), metrics.data_ptr<double>() + metrics.numel());
    if (r == 0) rank0 = got;
    EXPECT_EQ(got, rank0) << "rank " << r << " reports other metrics than rank 0";
    for (size_t i = 0; i < expected.size(); ++i) {
      worst_metric = std::max(worst_metric, RelDiff(got[i], expected[i]));
      EXPECT_LE(RelDiff(got[i], expected[i]), tol.metric) << "metric " << i << " on rank " << r << ": " << got[i]
                                                    << " vs one process " << expected[i];
    }
    std::ifstream names(out + "/rank" + std::to_string(r) + ".names");
    size_t i = 1;
    for (std::string name; std::getline(names, name); i += 2, ++compared) {
      const auto& [weight, grad] = params.at(name);
      const at::Tensor& w = tensors.at(i);
      const at::Tensor& g = tensors.at(i + 1);
      const double weight_diff = (w - weight).abs().max().item<double>();
      worst_weight = std::max(worst_weight, weight_diff);
      EXPECT_LE(weight_diff, tol.weight) << name << " on rank " << r;
      ASSERT_EQ(g.defined(), grad.defined()) << name << " on rank " << r;
      if (!g.defined()) continue;
      const double scale = std::max(1e-12, grad.abs().max().item<double>());
      const double grad_diff = (g - grad).abs().max().item<double>() / scale;
      worst_grad = std::max(worst_grad, grad_diff);
      EXPECT_LE(grad_diff, tol.grad) << name << " gradient on rank " << r;
    }
  }
  std::printf("%s, %lld ranks, EP %lld: loss %.9g grad norm %.9g; largest deviation from one process: metrics %.3g "
              "(relative), gradients %.3g (of the tensor's max), weights %.3g (absolute)\n",
              moe::PrecisionName(precision).c_str(), static_cast<long long>(ranks), static_cast<long long>(ep), expected[0], expected[3], worst_metric,
              worst_grad, worst_weight);
  EXPECT_EQ(compared, params.size()) << "every parameter is hosted by exactly one rank of EP group 0";
  std::filesystem::remove_all(out);
}

TEST(Distributed, TwoRanksExpertParallelEqualOneProcess) { ExpectNRanksEqualOneProcess(2, 2); }
TEST(Distributed, FourRanksTwoGroupsEqualOneProcess) { ExpectNRanksEqualOneProcess(4, 2); }
TEST(Distributed, FourRanksExpertParallelEqualOneProcess) { ExpectNRanksEqualOneProcess(4, 4); }
// bf16 (its activations travel through all_to_all as their bytes): a
// reordered bf16 sum can differ by a bf16 rounding (2^-8 = 4e-3), and a
// gradient passes a few of them (measured: 1.3e-2 of the tensor's max), so
// 2e-2 on the metrics and 5e-2 on the gradients; the first AdamW step moves
// a weight by about lr * sign(grad), so a rounding that flips a tiny
// gradient's sign moves it by up to 2 * lr = 2e-4.
TEST(Distributed, TwoRanksBf16EqualOneProcess) {
  ExpectNRanksEqualOneProcess(2, 2, moe::Precision::kBf16, Tolerance{2e-2, 5e-2, 2.5e-4});
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CommandResult RunMoerr(const std::string& args) {
  // `timeout` guards the test itself: the launcher must end on its own well before.
  const std::string cmd = "timeout -s KILL 120 " MOERR_BIN " " + args + " 2>&1";
  CommandResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;  // exit_code stays as initialised: the test fails on it
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string TrainArgs(const std::string& name) {
  const std::string out = testing::TempDir() + "/moerr_dist_" + name;
  std::filesystem::remove_all(out);
  return "train --warmup-steps 3 --steps 2 --force -o " + out;
}

TEST(DistributedLauncher, TrainsOnTwoRanksOverFileAndTcpStores) {
  for (const std::string store : {"file", "tcp"}) {
    const std::string out = testing::TempDir() + "/moerr_dist_ok_" + store;
    const CommandResult r = RunMoerr(TrainArgs("ok_" + store) + " --preset tiny --ranks 2 --ep 2 --store " + store);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("2 ranks, expert parallelism 2"), std::string::npos) << r.output;
    std::ifstream metrics(out + "/metrics.jsonl");
    int lines = 0;
    for (std::string line; std::getline(metrics, line);) ++lines;
    EXPECT_EQ(lines, 2) << "rank 0 writes one line per step";
    EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint")) << r.output;
  }
}

// A preset of the table, so past --preset's check, that the default family
// (qwen3_moe) cannot have: the ranks' model builds refuse it.
TEST(DistributedLauncher, BadInputEveryRankRejectsIsExitTwo) {
  const CommandResult r = RunMoerr(TrainArgs("bad") + " --ranks 2 --ep 2 --preset tiny-mla");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("preset tiny-mla has DeepSeek-V3's"), std::string::npos) << r.output;
}

// An output rank 0 would refuse is refused by every rank before its
// warm-up, so the run exits 2 (bad input), not 3 with ranks stopped.
TEST(DistributedLauncher, AnExistingOutputWithoutForceIsExitTwo) {
  const std::string out = testing::TempDir() + "/moerr_dist_exists";
  std::filesystem::remove_all(out);
  std::filesystem::create_directories(out);
  std::ofstream(out + "/metrics.jsonl") << "{}\n";
  const CommandResult r = RunMoerr("train --preset tiny --ranks 2 --ep 2 -o " + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("pass --force"), std::string::npos) << r.output;
}

TEST(DistributedLauncher, ReportsAKilledRank) {
  const CommandResult r = RunMoerr(TrainArgs("kill") + " --preset tiny --ranks 2 --ep 2 --rank-fault kill:1 --collective-timeout 20");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 1: killed by signal 9 (SIGKILL)"), std::string::npos) << r.output;
}

TEST(DistributedLauncher, ReportsAStalledRankWithoutHanging) {
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = RunMoerr(TrainArgs("stall") + " --preset tiny --ranks 2 --ep 2 --rank-fault stall:1 --collective-timeout 3");
  const double seconds = moerr::SecondsSince(start);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(seconds, 60) << r.output;
  // Rank 0 names the collective it timed out in; the launcher names rank 1.
  EXPECT_NE(r.output.find("rank 0: all_"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1: still running after another rank failed"), std::string::npos) << r.output;
}

TEST(DistributedLauncher, KillsRanksStillRunningAtTheDeadline) {
  // Rank 0 waits in a collective far longer than the deadline: only the deadline ends the run.
  const CommandResult r = RunMoerr(TrainArgs("deadline") +
                                   " --preset tiny --ranks 2 --ep 2 --rank-fault stall:1 --collective-timeout 600 "
                                   "--deadline 6");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 0: still running at the deadline (hung)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1: still running at the deadline (hung)"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace moerr

int main(int argc, char** argv) {
  // Started by ExpectNRanksEqualOneProcess as a rank.
  if (const char* out = std::getenv("MOERR_TEST_OUT"); out != nullptr && std::getenv("RANK") != nullptr) {
    return moerr::RunRank(out, std::atoll(std::getenv("MOERR_TEST_EP")),
                          moerr::moe::ParsePrecision(std::getenv("MOERR_TEST_PRECISION")).value());
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
