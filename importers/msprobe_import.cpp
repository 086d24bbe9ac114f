#include "importers/msprobe_import.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "formats/annotations.h"
#include "formats/collective_op.h"
#include "formats/world_manifest.h"
#include "importers/dataflow_index.h"
#include "importers/dump_stats.h"
#include "importers/msprobe_dump.h"
#include "importers/tensor_files.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "support/filesystem.h"
#include "support/status.h"
#include "xxhash.h"

namespace moerr::importers {
namespace {

namespace fs = std::filesystem;

// The number after `prefix` in a folder name ("step3" -> 3); "rank" alone
// is rank 0 (a single-rank dump); -1 when the name is not of that form.
int64_t Numbered(const std::string& name, absl::string_view prefix) {
  if (!absl::StartsWith(name, prefix)) return -1;
  if (name.size() == prefix.size()) return prefix == "rank" ? 0 : -1;
  int64_t n = -1;
  return absl::SimpleAtoi(absl::string_view(name).substr(prefix.size()), &n) && n >= 0 ? n : -1;
}

std::vector<std::pair<int64_t, fs::path>> Children(const fs::path& dir, absl::string_view prefix) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec)) continue;
    if (const int64_t n = Numbered(e.path().filename().string(), prefix); n >= 0) out.emplace_back(n, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The rank folders of one step: rank<K>, or proc<pid> as rank 0 when alone.
std::vector<std::pair<int64_t, fs::path>> RankDirs(const fs::path& step_dir) {
  std::vector<std::pair<int64_t, fs::path>> ranks = Children(step_dir, "rank");
  if (ranks.empty()) {
    std::vector<std::pair<int64_t, fs::path>> procs = Children(step_dir, "proc");
    if (procs.size() == 1) ranks.emplace_back(0, procs[0].second);
  }
  return ranks;
}

std::string Read(const fs::path& p, bool* present) {
  auto bytes = ReadFileBytes(p.string());
  *present = bytes.ok();
  return bytes.ok() ? std::move(*bytes) : std::string();
}

// A non-tensor value as an op argument.
formats::OpArg ScalarArg(const DumpValue& v) {
  formats::OpArg a;
  if (v.none) return a;
  if (v.number && (v.type == "int" || v.type == "bool")) {
    a.kind = v.type == "int" ? formats::OpArg::Kind::kInt : formats::OpArg::Kind::kBool;
    a.i = static_cast<int64_t>(*v.number);
  } else if (v.number) {
    a.kind = formats::OpArg::Kind::kFloat;
    a.f = *v.number;
  } else if (v.text) {
    a.kind = formats::OpArg::Kind::kText;
    a.text = *v.text;
  } else {
    a.kind = formats::OpArg::Kind::kUnsupported;
    a.text = v.type.empty() ? "unknown" : v.type;
  }
  return a;
}

struct StepImport {
  ImportWriter& writer;
  const fs::path& dir;
  ImportResult& result;
  bool tensors;  // the tensor task: values have files under dump_tensor_data/
  int64_t rank = 0, world_size = 1;
  std::map<std::string, int64_t> collectives;  // by kind: imported so far in the step
  DataflowIndex dataflow;
  // The links that are not certain, for the step's annotation:
  // {"op": seq, "arg": index, "tensor": id, "how": "ambiguous"|"extreme", "candidates": [seqs]}.
  llvm::json::Array uncertain;
  uint64_t linked = 0;  // inputs linked to an earlier value
};

// What identifies `v` (importers/dataflow_index.h): its bytes' hash and
// extremes when the file was read, else its checksum (md5 or xor summary)
// and its statistics. Statistics identify a finite tensor that is not all
// zeros: every NaN tensor of a shape has the same four, and so has every
// zero one, which no key is made for.
ValueKey KeyOf(const DumpValue& v, formats::DType dtype, const formats::Fingerprint& fp, bool from_bytes) {
  ValueKey key{dtype, v.shape, std::nullopt, std::nullopt};
  if (from_bytes) {
    key.content = fp.hash;
    key.extreme = ExtremeOf(fp.max, fp.min);
    return key;
  }
  const bool stats = v.max && v.min && std::isfinite(*v.max) && std::isfinite(*v.min);
  if (v.max && v.min && *v.max == 0 && *v.min == 0) return key;
  const bool checksum = fp.checksum_kind != formats::Fingerprint::Checksum::kNone && fp.checksum != 0;
  if (!stats && !checksum) return key;
  double values[5] = {};
  if (stats) {
    values[0] = *v.max, values[1] = *v.min, values[2] = v.mean.value_or(0), values[3] = v.norm.value_or(0);
    values[4] = static_cast<double>(v.mean.has_value() | v.norm.has_value() << 1 | 4);
    key.extreme = ExtremeOf(v.max, v.min);
  }
  key.content = XXH3_64bits_withSeed(values, sizeof values,
                                     fp.checksum ^ static_cast<uint64_t>(fp.checksum_kind) << 62);
  return key;
}

// The tensor of `v`: its fingerprint (from its file's bytes, else from the
// dump's statistics) and, in a tensor import, its bytes. An input that is an
// earlier value of the step (`arg`-th of the op) is linked to it instead.
absl::StatusOr<uint64_t> AddTensor(StepImport& s, const DumpEntry& e, const DumpValue& v, formats::DType dtype,
                                   bool output, size_t arg) {
  auto numel = formats::CheckedNumel(v.shape);
  if (!numel.ok()) return Annotate(numel.status(), absl::StrCat("entry ", e.name, ": ", v.where));
  at::Tensor bytes;
  formats::Fingerprint fp;
  const std::string where = absl::StrCat("entry ", e.name, ": ", v.where);
  // msprobe names a file, never a path: nothing outside dump_tensor_data/ is read.
  if (v.data_name.find('/') != std::string::npos || v.data_name == "..") {
    return absl::InvalidArgumentError(absl::StrCat(where, ": data_name \"", v.data_name, "\" is not a file name"));
  }
  const fs::path file = s.dir / "dump_tensor_data" / v.data_name;
  if (s.tensors && !v.data_name.empty() && fs::exists(file)) {
    absl::StatusOr<at::Tensor> loaded = LoadTensorFile(file.string());
    if (!loaded.ok()) return Annotate(loaded.status(), where);
    bytes = std::move(*loaded);
    const absl::StatusOr<formats::DType> file_dtype = recorder::ToDType(bytes.scalar_type());
    if (!file_dtype.ok()) return Annotate(file_dtype.status(), absl::StrCat(file.string(), ": ", where));
    if (*file_dtype != dtype || bytes.sizes().vec() != v.shape) {
      return absl::InvalidArgumentError(absl::StrCat(file.string(), ": ", where, ": the file holds ",
                                                     formats::DTypeName(*file_dtype), " [",
                                                     absl::StrJoin(bytes.sizes().vec(), ", "), "], dump.json says ",
                                                     v.dtype, " [", absl::StrJoin(v.shape, ", "), "]"));
    }
    fp = recorder::ComputeFingerprint(bytes);
  } else {
    if (s.tensors && !v.data_name.empty()) ++s.result.missing_files;
    fp = FingerprintFromStats(v, dtype, static_cast<uint64_t>(*numel));
  }
  if (output) ApplyNanCheck(e, dtype, fp);
  const ValueKey key = KeyOf(v, dtype, fp, bytes.defined());
  const uint64_t seq = s.writer.next_seq();
  if (output) {
    MOERR_ASSIGN_OR_RETURN(const uint64_t id, s.writer.Output(dtype, v.shape, fp, bytes));
    s.dataflow.AddOutput(key, id, seq, e.kind != EntryKind::kApi);
    return id;
  }
  if (const std::optional<DataflowIndex::Link> link = s.dataflow.Find(key)) {
    ++s.linked;
    if (link->kind == DataflowIndex::LinkKind::kAmbiguous || link->kind == DataflowIndex::LinkKind::kExtreme) {
      llvm::json::Array candidates;
      for (uint64_t c : link->candidates) candidates.push_back(c);
      s.uncertain.push_back(llvm::json::Object{
          {"op", seq}, {"arg", static_cast<int64_t>(arg)}, {"tensor", link->id},
          {"how", link->kind == DataflowIndex::LinkKind::kExtreme ? "extreme" : "ambiguous"},
          {"candidates", std::move(candidates)}});
    }
    return link->id;
  }
  MOERR_ASSIGN_OR_RETURN(const uint64_t id, s.writer.Input(dtype, v.shape, fp, bytes));
  s.dataflow.AddInput(key, id);
  return id;
}

// An msprobe Distributed.* API that is a collective moerr checks across
// ranks: its kind and the input_args index of what the rank sends.
struct DistributedApi {
  const char* kind;
  int sent_arg;
};

std::optional<DistributedApi> DistributedApiOf(absl::string_view op) {
  static const std::pair<absl::string_view, DistributedApi> kApis[] = {
      {"all_reduce", {"all_reduce", 0}},          {"broadcast", {"broadcast", 0}},
      {"all_to_all", {"all_to_all", 1}},          {"all_to_all_single", {"all_to_all", 1}},
      {"all_gather", {"all_gather", 1}},          {"all_gather_into_tensor", {"all_gather", 1}},
      {"_all_gather_base", {"all_gather", 1}},    {"reduce_scatter", {"reduce_scatter", 1}},
      {"reduce_scatter_tensor", {"reduce_scatter", 1}}, {"_reduce_scatter_base", {"reduce_scatter", 1}}};
  if (!absl::ConsumePrefix(&op, "Distributed.")) return std::nullopt;
  for (const auto& [name, api] : kApis) {
    if (op == name) return api;
  }
  return std::nullopt;
}

// Rewrites `op`, the forward entry `e` of a Distributed.* collective, as a
// collective of the trace (formats/collective_op.h) in group "world": the
// n-th of its kind on this rank is matched with the n-th on the others.
// A dump has no per-slice hashes or split sizes: only the sent values
// (their ids) and the received outputs are known.
void AsCollective(StepImport& s, const DumpEntry& e, const DistributedApi& api, formats::OpEvent& op) {
  formats::CollectiveOp c;
  c.kind = api.kind;
  c.group = "world";
  c.seq = s.collectives[c.kind]++;
  c.group_rank = s.rank;
  c.group_size = s.world_size;
  const std::string sent = absl::StrCat("input_args[", api.sent_arg, "]");
  for (size_t i = 0; i < e.inputs.size() && i < op.args.size(); ++i) {
    const bool tensor = op.args[i].kind == formats::OpArg::Kind::kTensor;
    if (tensor && absl::StartsWith(e.inputs[i].where, sent)) c.inputs.push_back(static_cast<uint64_t>(op.args[i].i));
    // broadcast(tensor, src): the root, a world rank, is the group rank in "world".
    if (c.kind == "broadcast" && op.args[i].kind == formats::OpArg::Kind::kInt &&
        (e.inputs[i].where == "input_args[1]" || e.inputs[i].where == "input_kwargs.src")) {
      c.root = op.args[i].i;
    }
  }
  formats::ToOpEvent(c, op);
}

absl::Status AddEntry(StepImport& s, const DumpEntry& e, const std::map<std::string, std::string>& parents) {
  formats::OpEvent op;
  op.name = e.op;
  op.phase = e.phase;
  op.module = e.module;
  op.scope = e.kind == EntryKind::kModule;
  if (e.kind == EntryKind::kApi) {
    // A backward entry's scope is its forward entry's.
    std::string forward = e.name;
    if (absl::EndsWith(forward, ".backward")) forward = absl::StrCat(forward.substr(0, forward.size() - 9), ".forward");
    if (auto it = parents.find(e.name); it != parents.end()) op.module = it->second;
    else if (auto fit = parents.find(forward); fit != parents.end()) op.module = fit->second;
  }
  for (const DumpValue& v : e.inputs) {
    const std::optional<formats::DType> dtype = v.tensor ? DTypeFromDumpName(v.dtype) : std::nullopt;
    if (v.tensor && !dtype) ++s.result.unsupported;
    if (!dtype) {
      formats::OpArg arg = ScalarArg(v);
      if (v.tensor) arg = formats::OpArg{formats::OpArg::Kind::kUnsupported, 0, 0, v.dtype, {}, {}};
      op.args.push_back(std::move(arg));
      continue;
    }
    MOERR_ASSIGN_OR_RETURN(const uint64_t id, AddTensor(s, e, v, *dtype, false, op.args.size()));
    op.args.push_back(formats::OpArg{formats::OpArg::Kind::kTensor, static_cast<int64_t>(id), 0, {}, {}, {}});
  }
  for (const DumpValue& v : e.outputs) {
    const std::optional<formats::DType> dtype = v.tensor ? DTypeFromDumpName(v.dtype) : std::nullopt;
    if (v.tensor && !dtype) ++s.result.unsupported;
    if (!dtype) {
      op.outputs.push_back(0);
      continue;
    }
    MOERR_ASSIGN_OR_RETURN(const uint64_t id, AddTensor(s, e, v, *dtype, true, 0));
    op.outputs.push_back(id);
  }
  if (e.kind == EntryKind::kApi && e.phase == formats::Phase::kForward) {
    if (const std::optional<DistributedApi> api = DistributedApiOf(e.op)) AsCollective(s, e, *api, op);
  }
  return s.writer.AddOp(std::move(op));
}

// Imports one dump.json as a step of `writer`, which the first step of a
// rank creates at `path`: a full bundle when its task is "tensor".
absl::Status ImportStep(std::unique_ptr<ImportWriter>& out, const std::string& path, const DumpLocation& at,
                        int64_t world_size, ImportResult& result, const ImportOptions& options) {
  const fs::path dir(at.dir);
  const std::string dump_path = (dir / "dump.json").string();
  MOERR_ASSIGN_OR_RETURN(const std::string text, ReadFileBytes(dump_path));
  MOERR_ASSIGN_OR_RETURN(const DumpFile dump, ParseDumpJson(text, dump_path));
  bool present = false;
  const std::string construct_path = (dir / "construct.json").string();
  const std::string construct = Read(construct_path, &present);
  std::map<std::string, std::string> parents;
  if (present && !construct.empty()) {
    MOERR_ASSIGN_OR_RETURN(parents, ParseConstructJson(construct, construct_path));
  }
  if (result.task.empty()) result.task = dump.task, result.level = dump.level;
  if (out == nullptr) {
    MOERR_ASSIGN_OR_RETURN(out, ImportWriter::Create(path, options.overwrite, dump.task == "tensor",
                                                     llvm::json::Object{{"from", "msprobe"},
                                                                        {"task", dump.task},
                                                                        {"level", dump.level},
                                                                        {"rank", at.rank}}));
  }
  ImportWriter& writer = *out;
  MOERR_RETURN_IF_ERROR(writer.BeginStep(at.step));
  StepImport s{writer, dir, result, dump.task == "tensor", at.rank, world_size, {}, {}, {}, 0};
  const std::string label = absl::StrCat("rank ", at.rank, " step ", at.step);
  for (size_t i = 0; i < dump.entries.size(); ++i) {
    MOERR_RETURN_IF_ERROR(Annotate(AddEntry(s, dump.entries[i], parents), dump_path));
    if (options.progress) options.progress(label, static_cast<int64_t>(i + 1), static_cast<int64_t>(dump.entries.size()));
  }
  // The entry behind each op, by seq order: the op names drop msprobe's call counts.
  llvm::json::Array entries;
  for (const DumpEntry& e : dump.entries) entries.push_back(e.name);
  const std::string stack_path = (dir / "stack.json").string();
  const std::string stack = Read(stack_path, &present);
  if (present && !stack.empty()) {
    llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(QuoteNonFiniteWords(stack));
    if (!parsed) return absl::InvalidArgumentError(absl::StrCat(stack_path, ": not valid JSON: ", llvm::toString(parsed.takeError())));
    MOERR_RETURN_IF_ERROR(writer.Annotate(formats::kMsprobeStackAnnotation, std::move(*parsed)));
  }
  return writer.EndStep(llvm::json::Object{{"source", dump_path},
                                           {"task", dump.task},
                                           {"level", dump.level},
                                           {"framework", dump.framework},
                                           {"rank", at.rank},
                                           {"entries", std::move(entries)},
                                           {"dataflow", llvm::json::Object{
                                                            {"from", s.tensors ? "bytes" : "statistics"},
                                                            {"linked", s.linked},
                                                            {"uncertain", std::move(s.uncertain)}}}});
}

// msprobe's own overflow_check result (`msprobe overflow_check --input_path
// STEP --output_path OUT` writes OUT/anomaly_analyze_<ns>.json), when one is
// in `root` or a step folder of it: the newest, as {"file", "first": {"<rank>":
// the entry of that rank's first anomaly}}. Nullopt when there is none.
absl::StatusOr<std::optional<llvm::json::Object>> OverflowCheckResult(const fs::path& root) {
  std::vector<fs::path> dirs{root};
  for (const auto& [step, step_dir] : Children(root, "step")) dirs.push_back(step_dir);
  fs::path newest;
  std::error_code ec;
  for (const fs::path& d : dirs) {
    for (const auto& e : fs::directory_iterator(d, ec)) {
      const std::string name = e.path().filename().string();
      if (absl::StartsWith(name, "anomaly_analyze_") && absl::EndsWith(name, ".json") &&
          (newest.empty() || name > newest.filename().string())) {
        newest = e.path();
      }
    }
  }
  if (newest.empty()) return std::optional<llvm::json::Object>();
  MOERR_ASSIGN_OR_RETURN(const std::string text, ReadFileBytes(newest.string()));
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(QuoteNonFiniteWords(text));
  if (!parsed) return absl::InvalidArgumentError(absl::StrCat(newest.string(), ": not valid JSON: ", llvm::toString(parsed.takeError())));
  const llvm::json::Object* ranks = parsed->getAsObject();
  if (ranks == nullptr) return absl::InvalidArgumentError(absl::StrCat(newest.string(), ": expected an object of ranks"));
  llvm::json::Object first;
  for (const auto& [key, anomalies] : *ranks) {
    const std::string name = key.str();
    absl::string_view rank = name;
    const llvm::json::Array* list = anomalies.getAsArray();
    const llvm::json::Object* top = list && !list->empty() ? (*list)[0].getAsObject() : nullptr;
    const auto entry = top ? top->getString("op_name") : llvm::None;
    if (!absl::ConsumePrefix(&rank, "rank_") || !entry) continue;
    first[std::string(rank)] = entry->str();
  }
  return llvm::json::Object{{"file", newest.string()}, {"first", std::move(first)}};
}

}  // namespace

absl::StatusOr<std::vector<DumpLocation>> FindDumps(const std::string& dir) {
  fs::path root(dir);
  if (!root.has_filename()) root = root.parent_path();  // "DIR/" names DIR
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  std::vector<DumpLocation> out;
  auto add_rank_dirs = [&](int64_t step, const fs::path& step_dir) {
    for (const auto& [rank, rank_dir] : RankDirs(step_dir)) {
      if (fs::exists(rank_dir / "dump.json", ec)) out.push_back(DumpLocation{step, rank, rank_dir.string()});
    }
  };
  if (fs::exists(root / "dump.json", ec)) {
    // One rank folder: its step and rank from the names around it, else 0.
    const int64_t step = Numbered(fs::absolute(root, ec).parent_path().filename().string(), "step");
    const int64_t rank = Numbered(root.filename().string(), "rank");
    out.push_back(DumpLocation{std::max<int64_t>(step, 0), std::max<int64_t>(rank, 0), root.string()});
  } else if (const auto steps = Children(root, "step"); !steps.empty()) {
    for (const auto& [step, step_dir] : steps) add_rank_dirs(step, step_dir);
  } else {
    add_rank_dirs(std::max<int64_t>(Numbered(root.filename().string(), "step"), 0), root);
  }
  if (out.empty()) {
    return absl::NotFoundError(absl::StrCat(dir, ": no msprobe dump here (expected step*/rank*/dump.json, "
                                                 "rank*/dump.json or dump.json)"));
  }
  std::sort(out.begin(), out.end(), [](const DumpLocation& a, const DumpLocation& b) {
    return std::tie(a.rank, a.step) < std::tie(b.rank, b.step);
  });
  return out;
}

absl::StatusOr<ImportResult> ImportMsprobe(const std::string& dir, const std::string& run_dir,
                                           const ImportOptions& options) {
  MOERR_ASSIGN_OR_RETURN(const std::vector<DumpLocation> dumps, FindDumps(dir));
  MOERR_RETURN_IF_ERROR(PrepareRunDirectory(run_dir, options.overwrite));
  MOERR_ASSIGN_OR_RETURN(const std::optional<llvm::json::Object> overflow_check,
                         OverflowCheckResult(fs::path(dir)));
  ImportResult result;
  formats::WorldManifest world;
  // Ranks 0..N-1 are a world of N (the manifest below); collectives name it.
  std::set<int64_t> ranks;
  for (const DumpLocation& d : dumps) ranks.insert(d.rank);
  const int64_t world_size = static_cast<int64_t>(ranks.size());
  for (size_t i = 0; i < dumps.size();) {
    const int64_t rank = dumps[i].rank;
    const std::string name = absl::StrCat("rank", rank, ".moerr");
    const std::string path = (fs::path(run_dir) / name).string();
    std::unique_ptr<ImportWriter> writer;
    for (; i < dumps.size() && dumps[i].rank == rank; ++i) {
      const absl::Status imported = ImportStep(writer, path, dumps[i], world_size, result, options);
      if (!imported.ok()) {
        // A failed import leaves nothing that looks like a run: no partial
        // bundle, and none of the ranks before it.
        if (writer != nullptr) writer->Abandon();
        std::error_code ec;
        for (const std::string& done : result.bundles) fs::remove(done, ec);
        return imported;
      }
    }
    if (overflow_check) {
      MOERR_RETURN_IF_ERROR(
          writer->Annotate(formats::kMsprobeOverflowCheckAnnotation, llvm::json::Object(*overflow_check)));
    }
    MOERR_RETURN_IF_ERROR(writer->Close());
    result.stats.steps += writer->stats().steps;
    result.stats.ops += writer->stats().ops;
    result.stats.tensors += writer->stats().tensors;
    result.stats.tensor_bytes += writer->stats().tensor_bytes;
    result.bundles.push_back(path);
    world.ranks.push_back(formats::WorldRank{rank, name, {}});
  }
  // The manifest needs ranks 0..N-1; a dump of chosen ranks gets none.
  bool dense = true;
  for (size_t r = 0; r < world.ranks.size(); ++r) dense = dense && world.ranks[r].rank == static_cast<int64_t>(r);
  if (dense && world.ranks.size() > 1) {
    world.world_size = static_cast<int64_t>(world.ranks.size());
    std::vector<int64_t> all;
    for (const auto& r : world.ranks) all.push_back(r.rank);
    world.groups["world"] = {all};
    MOERR_RETURN_IF_ERROR(formats::WriteWorldManifest(run_dir, world));
    result.manifest = (fs::path(run_dir) / formats::kWorldManifestName).string();
  }
  return result;
}

}  // namespace moerr::importers
