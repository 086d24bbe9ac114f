// The proxy: surgery keeps the backbone bitwise and the kept experts in
// order, mapped routing names only kept experts, proxies of every family load
// back, clustering is deterministic, and a fault reproduces in the proxy.
#include "analysis/check.h"
#include "proxy/proxy_builder.h"
#include "proxy/proxy_eval.h"
#include "proxy/reduce.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <regex>
#include <set>

#include "absl/strings/str_format.h"
#include "analysis/first_overflow.h"
#include "formats/module_path.h"
#include "moe/checkpoint.h"
#include "moe/router.h"
#include "proxy/surgery.h"
#include "proxy/weight_noise.h"
#include "recorder/hooks/tensor_adapter.h"
#include "replayer/model_replay.h"
#include "tests/testing/test_util.h"
#include "tests/testing/recording.h"

namespace moerr::proxy {
namespace {

using formats::testing::TempDir;

// Reduce writing DIR/small.moerr, its candidates under DIR/work.
ReduceOptions ReduceIn(const TempDir& dir) {
  ReduceOptions options;
  options.out_path = dir.File("small.moerr");
  options.work_dir = dir.File("work");
  return options;
}

ReduceReport ReduceInto(const formats::BundleReader& bundle, const TempDir& dir) {
  return Reduce(bundle, ReduceIn(dir)).value();
}

bool IsExpertOrGate(const std::string& name) {
  static const std::regex re(R"(.*\.(experts\.\d+\.|gate\.(weight|e_score_correction_bias)$).*)");
  return std::regex_match(name, re);
}

// One recorded fault-free tiny step (DIR/r.moerr) and its proxy keeping
// `keep` experts per layer (DIR/p).
ProxyReport TinyProxy(const TempDir& dir, int64_t keep, std::unique_ptr<formats::BundleReader>& reader) {
  reader = testing::RecordTinySteps(dir.File("r.moerr"), moe::Precision::kFp32, recorder::CaptureMode::kReplayable, 1);
  ProxyOptions options;
  options.keep = keep;
  options.out_dir = dir.File("p");
  return BuildProxy(*reader, options).value();
}

TEST(ProxyTest, SurgeryKeepsTheBackboneAndTheKeptExpertsInOrder) {
  TempDir dir;
  std::unique_ptr<formats::BundleReader> reader;
  const ProxyReport report = TinyProxy(dir, 3, reader);
  ASSERT_EQ(report.plans.size(), 2u);
  moe::MoeTransformer original = std::move(replayer::LoadTrainer(*reader, 0).value()->policy());
  moe::MoeTransformer proxy = moe::LoadCheckpoint(report.checkpoint).value();
  EXPECT_EQ(proxy->config().num_experts, 3);
  EXPECT_LT(report.params_proxy, report.params_original);
  std::map<std::string, at::Tensor> before, after;
  for (const auto& [name, t] : original->NamedTensors()) before[name] = t;
  for (const auto& [name, t] : proxy->NamedTensors()) after[name] = t;
  int backbone = 0;
  for (const auto& [name, t] : proxy->NamedTensors()) {
    if (IsExpertOrGate(name)) continue;
    ASSERT_TRUE(before.count(name)) << name;
    EXPECT_TRUE(t.equal(before[name])) << name;  // bitwise
    ++backbone;
  }
  EXPECT_GT(backbone, 10);
  for (const LayerPlan& plan : report.plans) {
    EXPECT_TRUE(std::is_sorted(plan.kept.begin(), plan.kept.end()));
    const std::string prefix = absl::StrFormat("model.layers.%d.mlp.", plan.layer);
    const at::Tensor rows = at::tensor(plan.kept, at::kLong);
    const at::Tensor& w_proxy = after[prefix + "gate.weight"];
    EXPECT_TRUE(w_proxy.equal(before[prefix + "gate.weight"].index_select(0, rows)));
    for (size_t i = 0; i < plan.kept.size(); ++i) {
      const std::string from = absl::StrFormat("%sexperts.%d.down_proj.weight", prefix, plan.kept[i]);
      const std::string to = absl::StrFormat("%sexperts.%d.down_proj.weight", prefix, i);
      EXPECT_TRUE(after[to].equal(before[from])) << to;
    }
    // The kept experts' scores rank as they did in the original router.
    const at::Tensor x = at::randn({64, w_proxy.size(1)}, at::kDouble);
    const at::Tensor ranked_proxy = std::get<1>(x.mm(w_proxy.to(at::kDouble).t()).sort(1));
    const at::Tensor ranked_original =
        std::get<1>(x.mm(before[prefix + "gate.weight"].to(at::kDouble).t()).index_select(1, rows).sort(1));
    EXPECT_TRUE(ranked_proxy.equal(ranked_original));
  }
}

// DeepSeek-V3's grouped routing in a proxy: top-k at most the experts of
// topk_group groups, and groups of one expert become one group (the same
// routing; transformers scores a group by its top two and cannot take one).
TEST(ProxyTest, GroupedRoutingStaysWithinTheKeptGroups) {
  moe::MoeConfig c = moe::Preset("tiny", moe::Family::kDeepseekV3).value();
  c.num_experts = 8, c.n_group = 2, c.topk_group = 1, c.top_k = 3;
  ASSERT_TRUE(moe::Validate(c).ok());
  const moe::MoeConfig two_a_group = ProxyConfig(c, 4).value();
  EXPECT_EQ(two_a_group.n_group, 2);
  EXPECT_EQ(two_a_group.topk_group, 1);
  EXPECT_EQ(two_a_group.top_k, 2);
  c.n_group = 4, c.topk_group = 2;
  const moe::MoeConfig one_a_group = ProxyConfig(c, 4).value();
  EXPECT_EQ(one_a_group.n_group, 1);
  EXPECT_EQ(one_a_group.topk_group, 1);
  EXPECT_EQ(one_a_group.top_k, 2);
  EXPECT_EQ(ProxyConfig(c, 8).value().top_k, 3);
  // The same choices and weights as the four groups of one would give.
  moe::MoeConfig groups_of_one = c;
  groups_of_one.num_experts = 4, groups_of_one.top_k = 2;
  torch::manual_seed(3);
  moe::Router grouped(groups_of_one, 1, "gate"), single(one_a_group, 1, "gate");
  torch::NoGradGuard no_grad;
  single->weight.copy_(grouped->weight);
  single->e_score_correction_bias.normal_(0, 0.3);
  grouped->e_score_correction_bias.copy_(single->e_score_correction_bias);
  const at::Tensor x = torch::randn({64, c.hidden_size});
  const moe::RouterOutput a = grouped->forward(x), b = single->forward(x);
  EXPECT_TRUE(at::equal(a.topk_ids, b.topk_ids));
  EXPECT_TRUE(at::equal(a.topk_weights, b.topk_weights));
}

TEST(ProxyTest, MappedRoutingNamesOnlyKeptExperts) {
  TempDir dir;
  std::unique_ptr<formats::BundleReader> reader;
  const ProxyReport report = TinyProxy(dir, 2, reader);
  auto proxy = formats::BundleReader::Open(report.bundle).value();
  const formats::Trace recorded = formats::ReadTrace(*reader, 0).value();
  const formats::Trace mapped = formats::ReadTrace(*proxy, 0).value();
  ASSERT_EQ(mapped.routing.size(), recorded.routing.size());
  for (size_t r = 0; r < mapped.routing.size(); ++r) {
    const LayerPlan* plan = nullptr;
    for (const LayerPlan& p : report.plans) plan = p.layer == mapped.routing[r].layer ? &p : plan;
    ASSERT_NE(plan, nullptr);
    const at::Tensor ids = recorder::ToTensor(proxy->ReadTensor(mapped.routing[r].topk_ids, 0)->view()).to(at::kLong);
    const at::Tensor was =
        recorder::ToTensor(reader->ReadTensor(recorded.routing[r].topk_ids, 0)->view()).to(at::kLong);
    EXPECT_EQ(ids.size(1), 2);
    EXPECT_GE(ids.min().item<int64_t>(), 0);
    EXPECT_LT(ids.max().item<int64_t>(), 2);
    for (int64_t t = 0; t < ids.size(0); ++t) {
      EXPECT_NE(ids[t][0].item<int64_t>(), ids[t][1].item<int64_t>());
      // The first choice is the medoid of the recorded first choice.
      const int64_t medoid = plan->medoid_of[was[t][0].item<int64_t>()];
      EXPECT_EQ(plan->kept[ids[t][0].item<int64_t>()], medoid);
    }
  }
  // And model replay runs the proxy step with that routing.
  replayer::ModelReplayOptions replay;
  replay.record_path = dir.File("replay.moerr");
  auto replayed = replayer::ReplayModelStep(*proxy, 0, replay);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(replayed->forced, replayed->decisions);
  EXPECT_TRUE(replayed->routing_problem.empty()) << replayed->routing_problem;
}

class FamilyProxyTest : public ::testing::TestWithParam<moe::Family> {};

TEST_P(FamilyProxyTest, LoadsBack) {
  torch::manual_seed(0);
  const moe::MoeConfig config = moe::Preset("tiny", GetParam()).value();
  moe::MoeTransformer model(config);
  const int64_t keep = 4;  // divisible by DeepSeek's 4 routing groups
  std::vector<LayerPlan> plans;
  for (int64_t layer = config.first_k_dense; layer < config.num_layers; ++layer) {
    LayerPlan p;
    p.layer = layer;
    p.kept = {0, 2, 5, 7};
    p.medoid_of = {0, 0, 2, 2, 5, 5, 7, 7};
    plans.push_back(p);
  }
  const moe::MoeConfig proxy_config = ProxyConfig(config, keep).value();
  moe::MoeTransformer proxy(proxy_config);
  std::map<std::string, formats::TensorView> views;
  std::vector<at::Tensor> alive;
  for (const auto& [name, t] : model->NamedTensors()) {
    auto mapped = MapTensor(name, t, plans);
    if (!mapped) continue;
    alive.push_back(mapped->second.contiguous());
    views[mapped->first] = recorder::ViewOf(alive.back()).value();
  }
  ASSERT_TRUE(moe::LoadWeights(proxy, views).ok());
  TempDir dir;
  ASSERT_TRUE(moe::SaveCheckpoint(proxy, dir.File("ckpt"), false).ok());
  auto loaded = moe::LoadCheckpoint(dir.File("ckpt"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->config().num_experts, keep);
  EXPECT_EQ((*loaded)->config().family, config.family);
  const at::Tensor tokens = at::randint(0, 16, {2, 6}, at::kLong);
  EXPECT_TRUE((*loaded)->forward(tokens).equal(proxy->forward(tokens)));
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyProxyTest,
                         ::testing::Values(moe::Family::kQwen2Moe, moe::Family::kQwen3Moe, moe::Family::kDeepseekV3,
                                           moe::Family::kMixtral),
                         [](const auto& info) { return moe::FamilyName(info.param); });

TEST(ClusteringTest, IsDeterministicUnderASeed) {
  torch::manual_seed(3);
  LayerStats s;
  s.layer = 1;
  s.experts = 8;
  s.frequency = at::rand({8}, at::kDouble) * 100;
  s.weight_mass = s.frequency * 0.5;
  const at::Tensor onehot = (at::rand({200, 8}) < 0.25).to(at::kDouble);
  s.coactivation = onehot.t().mm(onehot);
  s.context = at::randn({8, 16});
  s.router_rows = at::randn({8, 16});
  s.max_activation = at::rand({8}, at::kDouble) + 1;
  s.max_activation[6] = 100.0;  // a super expert
  s.reap = at::rand({8}, at::kDouble);
  s.output_mean = at::randn({8, 16});
  for (Method method : {Method::kCluster, Method::kClusterFrequency, Method::kFrequency, Method::kRandom, Method::kReap,
                        Method::kHcMedoid}) {
    ClusterOptions options;
    options.method = method;
    options.seed = 11;
    const LayerPlan a = PlanLayer(s, 3, {2}, options).value();
    const LayerPlan b = PlanLayer(s, 3, {2}, options).value();
    EXPECT_EQ(a.kept, b.kept) << MethodName(method);
    EXPECT_EQ(a.medoid_of, b.medoid_of) << MethodName(method);
    EXPECT_EQ(a.kept.size(), 3u);
    EXPECT_EQ(a.forced, (std::vector<int64_t>{2, 6}));  // implicated and super
    for (int64_t e : a.forced) EXPECT_TRUE(std::count(a.kept.begin(), a.kept.end(), e)) << e;
    for (int64_t e = 0; e < 8; ++e) EXPECT_TRUE(std::count(a.kept.begin(), a.kept.end(), a.medoid_of[e]));
  }
  ClusterOptions options;
  EXPECT_FALSE(PlanLayer(s, 1, {2, 4}, options).ok());  // two implicated experts, one slot
  EXPECT_EQ(PlanLayer(s, 1, {2}, options)->kept, (std::vector<int64_t>{2}));  // the super expert yields
}

// The proxy keeps the expert the failure names, and the failure reproduces:
// the replayed proxy step overflows first in a routed expert, forward.
TEST(ProxyTest, ExpertOverflowReproducesInTheProxy) {
  TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), moe::FaultKind::kExpertOverflow,
                                          recorder::CaptureMode::kReplayable, injected, finite);
  ASSERT_FALSE(finite);
  ProxyOptions options;
  options.keep_fraction = 0.25;
  options.out_dir = dir.File("p");
  const ProxyReport report = BuildProxy(*reader, options).value();
  ASSERT_EQ(report.implicated.size(), 1u);
  EXPECT_EQ(absl::StrFormat("model.layers.%d.mlp.experts.%d", report.implicated[0].first, report.implicated[0].second),
            injected.module);
  auto proxy = formats::BundleReader::Open(report.bundle).value();
  moe::StepMetrics metrics;
  const testing::ModelReplayed replayed =
      testing::ModelReplayToTrace(*proxy, report.step, dir.File("replay.moerr"), &metrics);
  EXPECT_FALSE(metrics.finite);
  const auto first = analysis::FindFirstOverflow(replayed.trace);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->op->phase, formats::Phase::kForward);
  EXPECT_NE(first->op->module.find(".mlp.experts."), std::string::npos) << first->op->module;

  // The proxy bundle records no ops; reduce finds its failure by replaying it.
  const ReduceReport reduced = ReduceInto(*proxy, dir);
  EXPECT_EQ(reduced.failure.kind, "overflow");
  EXPECT_EQ(reduced.failure.module_class, "model.layers.mlp.experts");
  EXPECT_LE(reduced.after.params, reduced.before.params);
}

// reduce: the expert-overflow step shrinks (experts, layers, prompts) and
// the reduced bundle still overflows first in a routed expert, forward.
TEST(ReduceTest, ShrinksAFailingStepAndKeepsItsFailure) {
  TempDir dir;
  moe::InjectedFault injected;
  bool finite = true;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), moe::FaultKind::kExpertOverflow,
                                          recorder::CaptureMode::kReplayable, injected, finite);
  const ReduceReport report = ReduceInto(*reader, dir);
  EXPECT_EQ(report.failure.kind, "overflow");
  EXPECT_EQ(report.failure.phase, "forward");
  EXPECT_EQ(report.failure.module_class, "model.layers.mlp.experts");
  EXPECT_FALSE(report.accepted.empty());
  EXPECT_LT(report.after.params, report.before.params);
  EXPECT_LE(report.after.experts, report.before.experts / 2);
  auto small = formats::BundleReader::Open(dir.File("small.moerr")).value();
  const testing::ModelReplayed replayed = testing::ModelReplayToTrace(*small, report.step, dir.File("replay.moerr"));
  const auto first = analysis::FindFirstOverflow(replayed.trace);  // points into `replayed.trace`
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(formats::ModuleClass(first->op->module), "model.layers.mlp.experts");

  EXPECT_LT(report.after.response_tokens * report.after.prompts * report.after.group_size,
            report.before.response_tokens * report.before.prompts * report.before.group_size);

  // A healthy step has no failure to keep.
  auto healthy = testing::RecordTinySteps(dir.File("h.moerr"), moe::Precision::kFp32,
                                          recorder::CaptureMode::kReplayable, 1);
  EXPECT_EQ(Reduce(*healthy, ReduceIn(dir)).status().code(), absl::StatusCode::kFailedPrecondition);
}

// reduce keeps a failure that is no overflow by its lint warning: the lost
// update of skip-update stays lost in the reduced step.
TEST(ReduceTest, KeepsALintWarningWhenNothingOverflows) {
  TempDir dir;
  moe::InjectedFault injected;
  bool finite = false;
  auto reader = testing::RecordFaultyStep(dir.File("f.moerr"), moe::FaultKind::kSkipUpdate,
                                          recorder::CaptureMode::kReplayable, injected, finite);
  ASSERT_TRUE(finite);
  const ReduceReport report = ReduceInto(*reader, dir);
  EXPECT_EQ(report.failure.kind, "optimizer-hazards");
  EXPECT_LT(report.after.params, report.before.params);
  auto small = formats::BundleReader::Open(dir.File("small.moerr")).value();
  const testing::ModelReplayed replayed = testing::ModelReplayToTrace(*small, report.step, dir.File("replay.moerr"));
  analysis::LintInput input{
      analysis::StepView{replayed.recording.get(), "", report.step, &replayed.trace}, std::nullopt};
  const std::vector<analysis::Finding> findings = analysis::RunChecks(input, {"optimizer-hazards"}).value();
  ASSERT_FALSE(findings.empty());
  EXPECT_EQ(findings.front().severity, analysis::Severity::kWarning);
}

// Every expert of a model mapped to itself.
std::vector<LayerPlan> IdentityPlans(const moe::MoeTransformer& model) {
  std::vector<LayerPlan> plans;
  for (moe::MoeLayer m : model->MoeLayers()) {
    LayerPlan& p = plans.emplace_back();
    p.layer = m->gate()->layer();
    for (int64_t e = 0; e < model->config().num_experts; ++e) p.kept.push_back(e), p.medoid_of.push_back(e);
  }
  return plans;
}

// Replaying a run forces each forward over the sampled batch onto the
// decisions the original made in the same forward: onto another model, every
// decision is the original's; onto the same model, the run is the original.
TEST(ProxyEvalTest, ReplayedRunsRouteAsTheOriginalDid) {
  torch::manual_seed(0);
  const moe::MoeConfig config = moe::Preset("tiny").value();
  const moe::MoeTransformer model(config), other(config);
  const std::vector<LayerPlan> identity = IdentityPlans(model);
  const Trajectory original = Train(model, 3, 5);
  const Trajectory onto_other = Train(other, 3, 5, &original, &identity);
  ASSERT_EQ(onto_other.policy_routing.size(), 3u);
  int64_t live_differs = 0;
  for (size_t s = 0; s < 3; ++s) {
    for (auto side : {&Trajectory::policy_routing, &Trajectory::reference_routing}) {
      const Trajectory::Decisions& a = (original.*side)[s];
      const Trajectory::Decisions& b = (onto_other.*side)[s];
      ASSERT_EQ(a.size(), identity.size());
      for (const auto& [layer, calls] : a) {
        ASSERT_EQ(b.at(layer).size(), calls.size()) << "layer " << layer;
        for (size_t i = 0; i < calls.size(); ++i) {
          EXPECT_TRUE(at::equal(b.at(layer)[i].first, calls[i].first)) << "step " << s << " layer " << layer;
          // The other model's own router would have chosen otherwise.
          live_differs += !at::equal(std::get<1>(b.at(layer)[i].second.topk(config.top_k, -1)), calls[i].first);
        }
      }
    }
  }
  EXPECT_GT(live_differs, 0);
  const Trajectory onto_same = Train(model, 3, 5, &original, &identity);
  EXPECT_EQ(onto_same.loss, original.loss);
  EXPECT_EQ(onto_same.grad_norm, original.grad_norm);
  EXPECT_EQ(onto_same.kl, original.kl);
  EXPECT_EQ(onto_same.reward, original.reward);
}

// proxy-eval on the tiny model, unwarmed, in `dir`: a short run of one
// configuration (`cluster` at 1/2) and one fault, over two trainer seeds
// (the fewest with a band).
EvalOptions TinyEval(const TempDir& dir) {
  EvalOptions options;
  options.preset = "tiny";
  options.warmup_steps = 0;
  options.out_dir = dir.File("eval");
  options.steps = 3;
  options.seeds = 1;
  options.trainer_seeds = 2;
  options.keeps = {0.5};
  options.methods = {"cluster"};
  options.faults = {moe::FaultKind::kRouterCollapse};
  return options;
}

// proxy-eval end to end on the tiny model: every configuration gets a row
// with measured numbers, and faults that show in the original are counted.
TEST(ProxyEvalTest, MeasuresEveryConfiguration) {
  TempDir dir;
  EvalOptions options = TinyEval(dir);
  options.steps = 4;
  options.methods = {"cluster", "random"};
  options.faults = {moe::FaultKind::kExpertOverflow, moe::FaultKind::kRouterCollapse};
  const EvalReport report = EvaluateProxies(options).value();
  ASSERT_EQ(report.rows.size(), 2u);
  for (const EvalRow& row : report.rows) {
    SCOPED_TRACE(row.method);
    EXPECT_EQ(row.kept, 4);
    EXPECT_GT(row.hidden_cosine, 0.5);
    EXPECT_LE(row.hidden_cosine, 1.0 + 1e-9);
    EXPECT_GE(row.logit_kl, 0.0);
    EXPECT_GE(row.routing_agreement, 0.0);
    EXPECT_LE(row.routing_agreement, 1.0);
    EXPECT_EQ(row.cases, 2);  // both faults show in the original
    EXPECT_LE(row.localised, row.reproduced);
    EXPECT_LE(row.reproduced, row.cases);
    EXPECT_GT(row.params_ratio, 1.0);
    // Micro-batches leave less of the peak to activations, which a proxy
    // keeps whole, so the proxy's saving shows more.
    EXPECT_GT(row.whole_batch_peak_memory_ratio, 1.0);
    EXPECT_GT(row.peak_memory_ratio, row.whole_batch_peak_memory_ratio);
  }
  EXPECT_EQ(report.rows[0].reproduced, 2);  // cluster keeps the broken expert
  // Dynamics over the trainer seeds: the original's run at each, and each
  // metric of each row judged against them; fault responses per seed.
  ASSERT_EQ(report.original_seeds.size(), 2u);
  EXPECT_EQ(report.original_seeds[0].loss.size(), 4u);
  EXPECT_NE(report.original_seeds[0].loss, report.original_seeds[1].loss);  // other prompts
  for (const EvalRow& row : report.rows) {
    SCOPED_TRACE(row.method);
    const SeedBands& bands = row.seed_band;
    for (const SeedBand* b : {&bands.loss, &bands.reward, &bands.kl, &bands.grad_norm}) {
      EXPECT_EQ(b->seeds, 2);
      EXPECT_EQ(b->steps, 4);
      EXPECT_GE(b->in_band, 0.0);
      EXPECT_LE(b->in_band, 1.0);
    }
    // The loss and the grad norm move from step to step: each r is defined.
    for (const SeedBand* b : {&row.seed_band.loss, &row.seed_band.grad_norm}) {
      EXPECT_TRUE(std::isfinite(b->r_proxy));
      EXPECT_TRUE(std::isfinite(b->r_extra_seed));
    }
    ASSERT_EQ(row.responses.size(), 4u);  // 2 faults x 2 trainer seeds
    EXPECT_EQ(row.responses[0].seed, 5u);
    EXPECT_EQ(row.responses[1].seed, 6u);
    EXPECT_EQ(row.response_error.faults, 4);
    // Its noise row: the original with noise matched to the row's logit KL
    // (within MatchNoiseToKl's factor), judged over the same seeds.
    ASSERT_TRUE(row.noise.has_value());
    const NoiseRow& noise = *row.noise;
    ASSERT_EQ(noise.error, "");
    EXPECT_EQ(noise.target_kl, row.logit_kl);
    EXPECT_GT(noise.rel, 0.0);
    EXPECT_GE(noise.kl, row.logit_kl / MatchOptions().factor);
    EXPECT_LE(noise.kl, row.logit_kl * MatchOptions().factor);
    for (const SeedBand* b : {&noise.seed_band.loss, &noise.seed_band.reward, &noise.seed_band.kl,
                              &noise.seed_band.grad_norm}) {
      EXPECT_EQ(b->seeds, 2);
      EXPECT_EQ(b->steps, 4);
      EXPECT_TRUE(std::isfinite(b->in_band));
      EXPECT_GE(b->in_band, 0.0);
      EXPECT_LE(b->in_band, 1.0);
    }
    EXPECT_TRUE(std::isfinite(noise.corr_grad_norm));
  }
  // Each row's noise is matched to its own logit KL.
  EXPECT_NE(report.rows[0].noise->rel, report.rows[1].noise->rel);
  const std::string json = llvm::formatv("{0}", llvm::json::Value(ToJson(report))).str();
  EXPECT_NE(json.find("\"routing_agreement\""), std::string::npos);
  EXPECT_NE(json.find("\"trainer_seeds\":2"), std::string::npos);
  EXPECT_NE(json.find("\"seed_band\":{"), std::string::npos);
  EXPECT_NE(json.find("\"r_extra_seed\""), std::string::npos);
  EXPECT_NE(json.find("\"noise\":{"), std::string::npos);
  for (const char* key : {"\"target_kl\"", "\"rel\"", "\"tries\"", "\"noise_seed\":0", "\"smoothed_corr\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key;
  }
}

// A noise row whose KL cannot be matched keeps MatchNoiseToKl's message
// instead of failing the evaluation, and runs nothing.
TEST(ProxyEvalTest, AnUnmatchableNoiseRowSaysWhy) {
  torch::manual_seed(0);
  const moe::MoeTransformer model(moe::Preset("tiny").value());
  const at::Tensor tokens = at::randint(0, model->config().vocab_size, {2, 6}, at::kLong);
  const std::vector<Trajectory> original(2);
  const NoiseRow row = MeasureNoiseRow(model, tokens, 0.0, original, 3, TrendOptions{});
  EXPECT_NE(row.error.find("finite and > 0"), std::string::npos) << row.error;
  EXPECT_EQ(row.seed_band.reward.seeds, 0);  // not run
  const std::string json = llvm::formatv("{0}", llvm::json::Value(ToJson(row))).str();
  EXPECT_NE(json.find("\"error\":"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"seed_band\""), std::string::npos) << json;
}

// --static-only: the static fidelity of each configuration and nothing
// else, in the rows and in the JSON; another sample seed is another sample.
TEST(ProxyEvalTest, StaticOnlyMeasuresStaticFidelityAlone) {
  TempDir dir;
  EvalOptions options = TinyEval(dir);
  options.static_only = true;
  options.methods = {"cluster", "reap"};
  const EvalReport report = EvaluateProxies(options).value();
  ASSERT_EQ(report.rows.size(), 2u);
  for (const EvalRow& row : report.rows) {
    SCOPED_TRACE(row.method);
    EXPECT_GT(row.hidden_cosine, 0.5);
    EXPECT_GE(row.logit_kl, 0.0);
    EXPECT_GE(row.accuracy, 0.0);
    EXPECT_GT(row.params_ratio, 1.0);
    EXPECT_EQ(row.cases, 0);  // no fault reproduction
    EXPECT_TRUE(row.responses.empty());
    EXPECT_EQ(row.step_time_ratio, 0.0);  // no RL steps
  }
  const std::string json = llvm::formatv("{0}", llvm::json::Value(ToJson(report))).str();
  EXPECT_NE(json.find("\"static_only\":true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"logit_kl\""), std::string::npos);
  EXPECT_EQ(json.find("\"corr_loss\""), std::string::npos);
  EXPECT_EQ(json.find("\"fault_cases\""), std::string::npos);
  options.sample_seed = 1;
  const EvalReport other = EvaluateProxies(options).value();
  EXPECT_NE(other.rows[0].logit_kl, report.rows[0].logit_kl);  // another held-out batch
  // The run's options go with it (what --pool compares); static only: the
  // warm-up and the sample seed alone.
  const llvm::json::Object other_json = ToJson(other);
  const llvm::json::Object* recorded = other_json.getObject("options");
  ASSERT_NE(recorded, nullptr);
  EXPECT_EQ(recorded->getInteger("sample_seed").getValueOr(-1), 1);
  EXPECT_EQ(recorded->getInteger("warmup_steps").getValueOr(-1), options.warmup_steps);
  EXPECT_EQ(recorded->size(), 2u);
}

// A work directory keeps one warm-up per preset, family and length: a run
// asking for another family warms that one up instead of reusing the first.
TEST(ProxyEvalTest, CachesAWarmUpPerPresetFamilyAndLength) {
  TempDir dir;
  EvalOptions options = TinyEval(dir);
  ASSERT_EQ(EvaluateProxies(options).value().family, "qwen3_moe");
  options.family = moe::Family::kDeepseekV3;
  const EvalReport deepseek = EvaluateProxies(options).value();
  EXPECT_EQ(deepseek.family, "deepseek_v3");
  ASSERT_EQ(deepseek.rows.size(), 1u);
  EXPECT_EQ(deepseek.rows[0].kept, 4);
  for (const char* family : {"qwen3_moe", "deepseek_v3"}) {
    const auto warm = moe::LoadCheckpoint(dir.File("eval/warmup/tiny-") + family + "-0");
    ASSERT_TRUE(warm.ok()) << family << ": " << warm.status();
    EXPECT_EQ(moe::FamilyName((*warm)->config().family), family);
  }
}

}  // namespace
}  // namespace moerr::proxy
