// `moerr forward` on the built binary: the top-k ids and the greedy
// continuation agree with each other, token files of both kinds give the
// same logits as --prompt-ids, --compare measures a known perturbation and
// exits 1 past --tolerance, and bad input exits 2 with a message.
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "moerr_runner.h"

namespace {

using namespace moerr::tools::testing;

class ForwardTest : public TinyRunTest {
 protected:
  static void SetUpTestSuite() { MakeTinyRun("forward"); }

  static std::string Checkpoint() { return "run/checkpoint"; }

  // `moerr forward --checkpoint run/checkpoint ARGS... --json`, exit 0, parsed.
  static llvm::json::Object Json(std::vector<std::string> args) {
    args.insert(args.begin(), {"forward", "--checkpoint", Checkpoint()});
    args.push_back("--json");
    const Result r = Moerr(dir(), args);
    EXPECT_EQ(r.code, 0) << Describe(args, r);
    auto v = llvm::json::parse(r.out);
    if (!v || v->getAsObject() == nullptr) {
      ADD_FAILURE() << "not a JSON object: " << r.out;
      return {};
    }
    return std::move(*v->getAsObject());
  }
};

// sequences[b].positions[t].top[j].id
int64_t TopId(const llvm::json::Object& j, size_t b, size_t t, size_t rank) {
  const auto& seq = *(*j.getArray("sequences"))[b].getAsObject();
  const auto& pos = *(*seq.getArray("positions"))[t].getAsObject();
  return *(*pos.getArray("top"))[rank].getAsObject()->getInteger("id");
}

std::vector<int64_t> Generated(const llvm::json::Object& j, size_t b) {
  std::vector<int64_t> out;
  for (const auto& id : *(*j.getArray("sequences"))[b].getAsObject()->getArray("generated")) out.push_back(*id.getAsInteger());
  return out;
}

// A safetensors file of F32/I64 tensors, written byte by byte as the format says.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

void WriteSafetensors(const fs::path& path, const std::vector<RawTensor>& tensors) {
  llvm::json::Object header;
  size_t offset = 0;
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = llvm::json::Object{{"dtype", t.dtype},
                                        {"shape", llvm::json::Array(t.shape)},
                                        {"data_offsets", llvm::json::Array{offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
    data += t.bytes;
  }
  std::string text = llvm::formatv("{0}", llvm::json::Value(std::move(header))).str();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // the data 8-byte aligned, as writers do
  const uint64_t n = text.size();
  Spit(path, std::string(reinterpret_cast<const char*>(&n), 8) + text + data);
}

// The F32 values of tensor `name` of a safetensors file.
std::vector<float> ReadF32(const fs::path& path, const std::string& name) {
  const std::string bytes = Slurp(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = llvm::json::parse(bytes.substr(8, n));
  EXPECT_TRUE(static_cast<bool>(header));
  const auto* offsets = header->getAsObject()->getObject(name)->getArray("data_offsets");
  const size_t begin = *(*offsets)[0].getAsInteger(), end = *(*offsets)[1].getAsInteger();
  std::vector<float> out((end - begin) / 4);
  std::memcpy(out.data(), bytes.data() + 8 + n + begin, end - begin);
  return out;
}

std::string F32Bytes(const std::vector<float>& v) { return std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size()); }

TEST_F(ForwardTest, GreedyContinuationFollowsTheTopIds) {
  const llvm::json::Object j = Json({"--prompt-ids", "1,2,3,4", "--generate", "3", "--top-k", "4"});
  EXPECT_EQ(llvm::json::Value(llvm::json::Array(*j.getArray("shape"))), llvm::json::Value(llvm::json::Array{1, 4, 16}));
  const auto& positions = *(*j.getArray("sequences"))[0].getAsObject()->getArray("positions");
  ASSERT_EQ(positions.size(), 4u);
  for (const auto& p : positions) {
    const auto& top = *p.getAsObject()->getArray("top");
    ASSERT_EQ(top.size(), 4u);
    for (size_t k = 1; k < top.size(); ++k) {
      EXPECT_GE(*top[k - 1].getAsObject()->getNumber("logit"), *top[k].getAsObject()->getNumber("logit"));
    }
  }
  const std::vector<int64_t> g = Generated(j, 0);
  ASSERT_EQ(g.size(), 3u);
  // Each greedy token is the top id at the end of the sequence before it.
  EXPECT_EQ(g[0], TopId(j, 0, 3, 0));
  const llvm::json::Object longer = Json({"--prompt-ids", "1,2,3,4," + std::to_string(g[0])});
  EXPECT_EQ(g[1], TopId(longer, 0, 4, 0));
  EXPECT_EQ(*j.getObject("logits")->getInteger("nonfinite"), 0);
}

TEST_F(ForwardTest, TokenFilesGiveTheSameLogitsAsPromptIds) {
  Spit(dir() / "ids.txt", "1 2 3\n\n4,5,6\n");
  const llvm::json::Object text = Json({"--tokens", "ids.txt", "--top-k", "16"});
  EXPECT_EQ(llvm::json::Value(llvm::json::Array(*text.getArray("shape"))), llvm::json::Value(llvm::json::Array{2, 3, 16}));
  const llvm::json::Object one = Json({"--prompt-ids", "4,5,6", "--top-k", "16"});
  for (size_t t = 0; t < 3; ++t) {
    for (size_t k = 0; k < 16; ++k) EXPECT_EQ(TopId(text, 1, t, k), TopId(one, 0, t, k)) << t << " " << k;
  }
  const std::vector<int64_t> ids = {4, 5, 6};
  WriteSafetensors(dir() / "ids.safetensors",
                   {{"input_ids", "I64", {1, 3}, std::string(reinterpret_cast<const char*>(ids.data()), 24)}});
  const llvm::json::Object st = Json({"--tokens", "ids.safetensors", "--top-k", "16"});
  EXPECT_EQ(llvm::json::Value(llvm::json::Array(*st.getArray("sequences"))), llvm::json::Value(llvm::json::Array(*one.getArray("sequences"))));
}

TEST_F(ForwardTest, CompareMeasuresAKnownPerturbation) {
  const std::vector<std::string> save = {"forward", "--checkpoint", Checkpoint(), "--prompt-ids", "3,1,4,1",
                                         "--save", "ref.safetensors", "--force"};
  const Result saved = Moerr(dir(), save);
  ASSERT_EQ(saved.code, 0) << Describe(save, saved);
  const llvm::json::Object same = Json({"--compare", "ref.safetensors"});  // ids from the file
  EXPECT_EQ(*same.getObject("compare")->getNumber("max_abs_error"), 0.0);
  EXPECT_EQ(*same.getObject("compare")->getInteger("top1_agree"), 4);

  // [T, V] logits with position 2's lowest logit raised 7 above its highest.
  std::vector<float> logits = ReadF32(dir() / "ref.safetensors", "logits");
  ASSERT_EQ(logits.size(), 4u * 16);
  float* row = logits.data() + 2 * 16;
  const size_t lo = std::min_element(row, row + 16) - row;
  const float hi = *std::max_element(row, row + 16);
  const float shift = hi + 7 - row[lo];
  row[lo] = hi + 7;
  WriteSafetensors(dir() / "moved.safetensors", {{"logits", "F32", {4, 16}, F32Bytes(logits)}});
  const std::vector<std::string> args = {"forward", "--checkpoint", Checkpoint(), "--prompt-ids", "3,1,4,1",
                                         "--compare", "moved.safetensors", "--json"};
  const Result r = Moerr(dir(), args);
  EXPECT_EQ(r.code, 1) << Describe(args, r);
  auto j = llvm::json::parse(r.out);
  ASSERT_TRUE(static_cast<bool>(j)) << r.out;
  const auto& cmp = *j->getAsObject()->getObject("compare");
  EXPECT_NEAR(*cmp.getNumber("max_abs_error"), shift, 1e-4);
  EXPECT_NEAR(*cmp.getNumber("mean_abs_error"), shift / 64, 1e-5);
  EXPECT_EQ(*cmp.getInteger("top1_agree"), 3);
  EXPECT_NEAR(*cmp.getNumber("topk_agreement"), (3 + 4.0 / 5) / 4, 1e-9);  // one of 5 ids differs there
  EXPECT_FALSE(*cmp.getBoolean("within_tolerance"));
  const std::vector<std::string> loose = {"forward", "--checkpoint", Checkpoint(), "--prompt-ids", "3,1,4,1",
                                          "--compare", "moved.safetensors", "--tolerance", "100"};
  const Result ok = Moerr(dir(), loose);
  EXPECT_EQ(ok.code, 0) << Describe(loose, ok);
  EXPECT_NE(ok.out.find("top-1 agrees at 3 of 4 positions"), std::string::npos) << ok.out;
}

TEST_F(ForwardTest, BadInputExits2WithAMessage) {
  fs::copy(dir() / Checkpoint(), dir() / "dropout", fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  const std::string config = Slurp(dir() / "dropout/config.json");
  Spit(dir() / "dropout/config.json", "{\"attention_dropout\": 0.5, " + config.substr(config.find('{') + 1));
  fs::copy(dir() / Checkpoint(), dir() / "unknown", fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  Spit(dir() / "unknown/config.json", "{\"attn_logit_softcapping\": 50.0, " + config.substr(config.find('{') + 1));
  Spit(dir() / "ragged.txt", "1 2\n3\n");
  Spit(dir() / "junk.safetensors", "not a safetensors file");
  WriteSafetensors(dir() / "float_ids.safetensors", {{"input_ids", "F32", {1, 2}, F32Bytes({1, 2})}});
  WriteSafetensors(dir() / "short.safetensors", {{"logits", "F32", {3, 16}, F32Bytes(std::vector<float>(48))}});
  const std::string ck = Checkpoint();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--checkpoint", "absent", "--prompt-ids", "1"}, "absent/config.json"},
      {{"--checkpoint", "dropout", "--prompt-ids", "1"}, "\"attention_dropout\": 0.5 changes the forward pass"},
      {{"--checkpoint", "unknown", "--prompt-ids", "1"}, "unknown key \"attn_logit_softcapping\": 50"},
      {{"--checkpoint", ck, "--prompt-ids", "1,x"}, "\"x\" is not an integer token id"},
      {{"--checkpoint", ck, "--prompt-ids", "1,16"}, "token id 16 is outside the model's vocabulary [0, 16)"},
      {{"--checkpoint", ck, "--prompt-ids", "-1"}, "token id -1 is outside"},
      {{"--checkpoint", ck}, "give the token ids"},
      {{"--checkpoint", ck, "--prompt-ids", "1", "--tokens", "ragged.txt"}, "not both"},
      {{"--checkpoint", ck, "--tokens", "ragged.txt"}, "sequence 1 has 1 ids, sequence 0 has 2"},
      {{"--checkpoint", ck, "--tokens", "absent.txt"}, "cannot open absent.txt"},
      {{"--checkpoint", ck, "--tokens", "short.safetensors"}, "has no \"input_ids\" tensor (it holds: logits)"},
      {{"--checkpoint", ck, "--tokens", "float_ids.safetensors"}, "input_ids is Float, not an integer tensor"},
      {{"--checkpoint", ck, "--tokens", "junk.safetensors"}, "junk.safetensors: safetensors:"},
      {{"--checkpoint", ck, "--prompt-ids", "1,2", "--compare", "short.safetensors"},
       "logits has shape [1, 3, 16]; the forward gives [1, 2, 16]"},
      {{"--checkpoint", ck, "--prompt-ids", "1", "--compare", "float_ids.safetensors"}, "has no \"logits\" tensor"},
      {{"--checkpoint", ck, "--prompt-ids", "1", "--generate", "-1"}, "--generate must be in [0, 4096]"},
      {{"--checkpoint", ck, "--prompt-ids", "1", "--save", "ragged.txt"}, "ragged.txt exists; pass --force"},
  };
  std::vector<std::vector<std::string>> commands;
  for (const auto& [args, message] : cases) {
    commands.push_back(args);
    commands.back().insert(commands.back().begin(), "forward");
  }
  const std::vector<Result> results = MoerrAll(dir(), commands);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(results[i].code, 2) << Describe(commands[i], results[i]);
    EXPECT_NE(results[i].err.find("moerr: error: "), std::string::npos) << Describe(commands[i], results[i]);
    EXPECT_NE(results[i].err.find(cases[i].second), std::string::npos)
        << "expected \"" << cases[i].second << "\"\n" << Describe(commands[i], results[i]);
  }
}

TEST_F(ForwardTest, VerboseListsTheIgnoredMetadataKeys) {
  fs::copy(dir() / Checkpoint(), dir() / "meta", fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  const std::string config = Slurp(dir() / "meta/config.json");
  Spit(dir() / "meta/config.json", "{\"torch_dtype\": \"bfloat16\", \"architectures\": [\"Qwen3MoeForCausalLM\"], " +
                                       config.substr(config.find('{') + 1));
  const std::vector<std::string> quiet = {"forward", "--checkpoint", "meta", "--prompt-ids", "1"};
  std::vector<std::string> verbose = quiet;
  verbose.push_back("--verbose");
  const Result q = Moerr(dir(), quiet), v = Moerr(dir(), verbose);
  ASSERT_EQ(q.code, 0) << Describe(quiet, q);
  ASSERT_EQ(v.code, 0) << Describe(verbose, v);
  EXPECT_EQ(q.out.find("ignored"), std::string::npos) << q.out;
  EXPECT_NE(v.out.find("config.json keys ignored as metadata: architectures, torch_dtype"), std::string::npos) << v.out;
}

}  // namespace
