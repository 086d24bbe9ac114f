// The keys of each subcommand's --json output, which scripts read: inspect,
// verify, bisect, lint, diff and replay on a tiny healthy step and on one
// whose expert overflows fp16; and the exit code beside each.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llvm/Support/JSON.h"
#include "moerr_runner.h"

namespace {

using namespace moerr::tools::testing;

using Keys = std::vector<std::string>;

Keys KeysOf(const llvm::json::Object& o) {
  Keys keys;
  for (const auto& kv : o) keys.push_back(kv.first.str());
  std::sort(keys.begin(), keys.end());
  return keys;
}

// The keys of `required` that `o` lacks.
Keys Missing(const llvm::json::Object& o, const Keys& required) {
  Keys missing;
  for (const std::string& k : required) {
    if (o.get(k) == nullptr) missing.push_back(k);
  }
  return missing;
}

// run/run.moerr: one healthy step; bad/run.moerr: the same step with an
// expert broken so that it overflows (expert-overflow).
class JsonShapesTest : public TinyRunTest {
 protected:
  static void SetUpTestSuite() {
    MakeTinyRun("json-shapes");
    const std::vector<std::string> bad = {"train", "--preset", "tiny", "--warmup-steps", "0", "--steps", "1",
                                          "--fault", "expert-overflow", "--record", "replayable", "-o", "bad"};
    const Result trained = Moerr(dir(), bad);
    ASSERT_EQ(trained.code, 0) << Describe(bad, trained);
  }

  // `moerr ARGS`, which must exit `code` and print JSON; that JSON.
  static llvm::json::Value Json(const std::vector<std::string>& args, int code) {
    const Result r = Moerr(dir(), args);
    EXPECT_EQ(r.code, code) << Describe(args, r);
    llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(r.out);
    if (!parsed) {
      ADD_FAILURE() << "not JSON: " << llvm::toString(parsed.takeError()) << "\n" << Describe(args, r);
      return nullptr;
    }
    return std::move(*parsed);
  }
  // Json of an array of objects, one per step: its elements.
  static std::vector<llvm::json::Object> Steps(const std::vector<std::string>& args, int code) {
    llvm::json::Value v = Json(args, code);
    std::vector<llvm::json::Object> steps;
    const llvm::json::Array* array = v.getAsArray();
    if (array == nullptr) {
      ADD_FAILURE() << "not a JSON array";
      return steps;
    }
    for (const llvm::json::Value& e : *array) {
      if (e.getAsObject() == nullptr) {
        ADD_FAILURE() << "an element is not an object";
        continue;
      }
      steps.push_back(*e.getAsObject());
    }
    return steps;
  }
};

TEST_F(JsonShapesTest, Inspect) {
  const llvm::json::Value v = Json({"inspect", "run/run.moerr", "--json"}, 0);
  ASSERT_NE(v.getAsObject(), nullptr);
  EXPECT_EQ(KeysOf(*v.getAsObject()),
            (Keys{"annotations", "blobs", "chunks", "complete_steps", "file_bytes", "logical_bytes", "ops", "outcomes",
                  "raised_steps", "raw_bytes", "records", "roles", "stored_bytes", "tensors", "version", "writer"}));
  EXPECT_EQ(v.getAsObject()->getArray("complete_steps")->size(), 1u);
}

TEST_F(JsonShapesTest, Verify) {
  const llvm::json::Value v = Json({"verify", "run/run.moerr", "--json"}, 0);
  ASSERT_NE(v.getAsObject(), nullptr);
  EXPECT_EQ(KeysOf(*v.getAsObject()), (Keys{"bundle", "bytes", "frames", "ok", "tensors"}));
  EXPECT_TRUE(v.getAsObject()->getBoolean("ok").getValueOr(false));
}

TEST_F(JsonShapesTest, BisectWithoutAndWithAnOverflow) {
  const std::vector<llvm::json::Object> healthy = Steps({"bisect", "run/run.moerr", "--json"}, 0);
  ASSERT_EQ(healthy.size(), 1u);
  EXPECT_EQ(KeysOf(healthy[0]), (Keys{"found", "ops", "step"}));
  EXPECT_FALSE(healthy[0].getBoolean("found").getValueOr(true));

  const std::vector<llvm::json::Object> bad = Steps({"bisect", "bad/run.moerr", "--json"}, 1);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(KeysOf(bad[0]), (Keys{"abs_max", "cause", "chain", "forward_op", "found", "limit", "module", "nan",
                                  "neg_inf", "numel", "op", "op_index", "phase", "pos_inf", "step", "trend",
                                  "uncertain_links"}));
  EXPECT_TRUE(bad[0].getBoolean("found").getValueOr(false));
  const Keys link = {"abs_max", "exploded", "input_rise_bits", "module", "op", "op_index", "output",
                     "outside_input_abs_max", "peer_rise_bits", "peers", "phase"};
  Keys cause = link;
  cause.push_back("found_explosion");
  std::sort(cause.begin(), cause.end());
  ASSERT_NE(bad[0].getObject("cause"), nullptr);
  EXPECT_EQ(KeysOf(*bad[0].getObject("cause")), cause);
  ASSERT_NE(bad[0].getArray("chain"), nullptr);
  ASSERT_FALSE(bad[0].getArray("chain")->empty());
  for (const llvm::json::Value& l : *bad[0].getArray("chain")) {
    ASSERT_NE(l.getAsObject(), nullptr);
    EXPECT_EQ(KeysOf(*l.getAsObject()), link);
  }
}

TEST_F(JsonShapesTest, LintFindingsAndTheirExitCode) {
  const Keys required = {"check", "message", "numbers", "severity", "step", "where"};
  for (const auto& [bundle, code] : {std::pair<std::string, int>{"run/run.moerr", 0}, {"bad/run.moerr", 1}}) {
    const std::vector<llvm::json::Object> findings = Steps({"lint", bundle, "--json"}, code);
    ASSERT_FALSE(findings.empty()) << bundle;
    bool warned = false;
    for (const llvm::json::Object& f : findings) {
      EXPECT_EQ(Missing(f, required), Keys{}) << bundle;
      const std::string severity = f.getString("severity").getValueOr("").str();
      EXPECT_TRUE(severity == "info" || severity == "warning" || severity == "error") << severity;
      warned = warned || severity != "info";
      // A finding about an op names it and its phase.
      if (f.get("op_index") != nullptr) {
        EXPECT_EQ(Missing(f, {"op", "phase"}), Keys{}) << bundle;
      }
    }
    EXPECT_EQ(warned, code == 1) << bundle << ": exit 1 on a warning or worse, 0 otherwise";
  }
}

TEST_F(JsonShapesTest, DiffOfAStepWithItselfAndWithABrokenOne) {
  const Keys root = {"a", "b", "bytes_compared", "diverged", "diverged_ops", "introduced", "matched", "only_a", "only_b",
                     "outputs_compared", "step_a", "step_b", "tensors_compared", "unmatched"};
  const llvm::json::Value same = Json({"diff", "run/run.moerr", "run/run.moerr", "--json"}, 0);
  ASSERT_NE(same.getAsObject(), nullptr);
  EXPECT_EQ(KeysOf(*same.getAsObject()), root);
  EXPECT_EQ(same.getAsObject()->getInteger("diverged_ops").getValueOr(-1), 0);
  EXPECT_EQ(same.getAsObject()->getArray("diverged")->size(), 0u);

  const llvm::json::Value broken = Json({"diff", "run/run.moerr", "bad/run.moerr", "--json"}, 1);
  ASSERT_NE(broken.getAsObject(), nullptr);
  EXPECT_EQ(KeysOf(*broken.getAsObject()), root);
  const llvm::json::Array* diverged = broken.getAsObject()->getArray("diverged");
  ASSERT_NE(diverged, nullptr);
  ASSERT_FALSE(diverged->empty());
  EXPECT_EQ(broken.getAsObject()->getInteger("diverged_ops").getValueOr(-1), static_cast<int64_t>(diverged->size()));
  const llvm::json::Object& first = *(*diverged)[0].getAsObject();
  EXPECT_EQ(KeysOf(first), (Keys{"error", "module", "op", "op_a", "op_b", "outputs", "phase"}));
  ASSERT_FALSE(first.getArray("outputs")->empty());
  EXPECT_EQ(Missing(*(*first.getArray("outputs"))[0].getAsObject(),
                    {"compared_on", "diverged", "dtype_a", "dtype_b", "error", "inf_mismatch", "nan_mismatch", "slot"}),
            Keys{});
}

TEST_F(JsonShapesTest, ReplayProgramAndModel) {
  const std::vector<llvm::json::Object> program = Steps({"replay", "run/run.moerr", "--json"}, 0);
  ASSERT_EQ(program.size(), 1u);
  EXPECT_EQ(KeysOf(program[0]),
            (Keys{"by_reference", "compared", "differ", "dispatched", "first_divergence", "from_record", "mode",
                  "not_reexecuted", "not_reexecuted_ops", "ops", "other_device_ops", "recorded_devices", "refused",
                  "step", "within_tolerance"}));
  EXPECT_EQ(program[0].getString("mode").getValueOr("").str(), "program");
  EXPECT_EQ(program[0].getInteger("not_reexecuted").getValueOr(-1), 0);
  EXPECT_EQ(program[0].getInteger("differ").getValueOr(-1), 0);

  const std::vector<llvm::json::Object> model = Steps({"replay", "run/run.moerr", "--model", "--json"}, 0);
  ASSERT_EQ(model.size(), 1u);
  EXPECT_EQ(KeysOf(model[0]),
            (Keys{"decisions", "diverged", "first_divergence", "forced", "live_router_agrees", "metrics", "mode",
                  "only_in_record", "only_in_replay", "ops_aligned", "routing", "routing_problem", "seconds", "step"}));
  EXPECT_EQ(model[0].getString("mode").getValueOr("").str(), "model");
  ASSERT_NE(model[0].getObject("metrics"), nullptr);
  EXPECT_EQ(KeysOf(*model[0].getObject("metrics")), (Keys{"grad_norm", "kl", "loss", "reward"}));
}

}  // namespace
