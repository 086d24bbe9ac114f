#include "importers/flight_recorder_import.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "formats/collective_op.h"
#include "formats/tensor_view.h"
#include "formats/world_manifest.h"
#include "importers/flight_recorder_dump.h"
#include "llvm/Support/ThreadPool.h"
#include "support/status.h"

namespace moerr::importers {
namespace {

namespace fs = std::filesystem;

// A dump's file name without its rank: "nccl_trace_rank_" for
// "nccl_trace_rank_3" and "nccl_trace_rank_3.json".
std::string PrefixOf(const std::string& name) {
  std::string stem = name;
  if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".json") == 0) stem.resize(stem.size() - 5);
  while (!stem.empty() && std::isdigit(static_cast<unsigned char>(stem.back()))) stem.pop_back();
  return stem;
}

// The dump files `inputs` names (see ImportFlightRecorder), by rank.
absl::StatusOr<std::map<int64_t, std::string>> FindDumpFiles(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  std::error_code ec;
  if (inputs.size() == 1 && fs::is_directory(inputs[0], ec)) {
    std::map<std::string, std::vector<std::string>> by_prefix;
    for (fs::directory_iterator it(inputs[0], ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code type_ec;
      if (it->is_regular_file(type_ec) && RankOfDumpName(name) >= 0) {
        by_prefix[PrefixOf(name)].push_back(it->path().string());
      }
    }
    if (ec) return absl::InvalidArgumentError(absl::StrCat(inputs[0], ": cannot be listed: ", ec.message()));
    if (by_prefix.empty()) {
      return absl::NotFoundError(absl::StrCat(inputs[0], ": no Flight Recorder dump here (files named <prefix><rank>, "
                                                         "as torch writes them: nccl_trace_rank_0, ...)"));
    }
    if (by_prefix.size() > 1) {
      std::vector<std::string> prefixes;
      for (const auto& [p, _] : by_prefix) prefixes.push_back(absl::StrCat("\"", p, "\""));
      return absl::InvalidArgumentError(absl::StrCat(inputs[0], ": dumps of several prefixes (", absl::StrJoin(prefixes, ", "),
                                                     "): name the files of one job"));
    }
    files = std::move(by_prefix.begin()->second);
  } else {
    files = inputs;
  }
  std::map<int64_t, std::string> out;
  for (const std::string& f : files) {
    const int64_t rank = RankOfDumpName(f);
    if (rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ": its name does not end with the rank (torch writes one dump per rank as <prefix><rank>)"));
    }
    auto [it, added] = out.emplace(rank, f);
    if (!added) return absl::InvalidArgumentError(absl::StrCat(f, " and ", it->second, " are both dumps of rank ", rank));
  }
  return out;
}

std::optional<formats::DType> DTypeOfTorchName(const std::string& name) {
  static const std::pair<const char*, formats::DType> kNames[] = {
      {"Double", formats::DType::kF64}, {"Float", formats::DType::kF32}, {"BFloat16", formats::DType::kBF16},
      {"Half", formats::DType::kF16},   {"Long", formats::DType::kI64},  {"Int", formats::DType::kI32},
      {"Short", formats::DType::kI16},  {"Char", formats::DType::kI8},   {"Byte", formats::DType::kU8},
      {"Bool", formats::DType::kBool}};
  for (const auto& [n, dtype] : kNames) {
    if (name == n) return dtype;
  }
  return std::nullopt;
}

// Every process group the dumps name, by its trace name, with its members:
// pg_config's ranks where a dump has them, else the ranks that dumped an
// entry of it (all of `world` for the default group).
struct Groups {
  std::map<std::string, FlightRecorderGroup> by_name;
  std::map<std::string, std::vector<int64_t>> members;
};

Groups GroupsOf(const std::vector<FlightRecorderDump>& dumps, int64_t world_size) {
  Groups g;
  std::map<std::string, std::set<int64_t>> seen;
  for (const FlightRecorderDump& d : dumps) {
    for (const FlightRecorderEntry& e : d.entries) {
      const std::string name = FlightRecorderGroupName(e.group_name, e.group_desc, e.pg_id);
      g.by_name.emplace(name, FlightRecorderGroup{e.group_name, e.group_desc, {}});
      seen[name].insert(d.rank);
    }
  }
  for (const FlightRecorderDump& d : dumps) {
    for (const auto& [pg, config] : d.groups) {
      for (auto& [name, group] : g.by_name) {
        if (group.name == pg && group.ranks.empty()) group.ranks = config.ranks;
      }
    }
  }
  for (auto& [name, group] : g.by_name) {
    std::vector<int64_t>& m = g.members[name];
    if (!group.ranks.empty()) {
      m = group.ranks;
    } else if (name == "world") {
      for (int64_t r = 0; r < world_size; ++r) m.push_back(r);
    } else {
      m.assign(seen[name].begin(), seen[name].end());
    }
  }
  return g;
}

int64_t WorldSizeOf(const std::vector<FlightRecorderDump>& dumps, int64_t given) {
  if (given > 0) return given;
  int64_t size = 0;
  for (const FlightRecorderDump& d : dumps) {
    size = std::max(size, d.rank + 1);
    for (const auto& [_, g] : d.groups) {
      for (int64_t r : g.ranks) size = std::max(size, r + 1);
    }
  }
  return size;
}

// One rank's dump written as a bundle.
class RankImport {
 public:
  RankImport(const FlightRecorderDump& dump, const Groups& groups) : dump_(dump), groups_(groups) {}

  absl::Status Write(ImportWriter& w, const ImportOptions& options) {
    MOERR_RETURN_IF_ERROR(w.BeginStep(0));
    llvm::json::Array entries;
    for (size_t i = 0; i < dump_.entries.size(); ++i) {
      MOERR_ASSIGN_OR_RETURN(llvm::json::Object note, AddEntry(w, dump_.entries[i], i));
      entries.push_back(std::move(note));
      if (options.progress && (i + 1) % 256 == 0) {
        options.progress(absl::StrCat("rank ", dump_.rank), static_cast<int64_t>(i + 1),
                         static_cast<int64_t>(dump_.entries.size()));
      }
    }
    MOERR_RETURN_IF_ERROR(w.Annotate(formats::kFlightRecorderAnnotation, Annotation(std::move(entries))));
    return w.EndStep(llvm::json::Object{{"source", dump_.file}, {"entries", static_cast<int64_t>(dump_.entries.size())}});
  }

 private:
  absl::StatusOr<llvm::json::Object> AddEntry(ImportWriter& w, const FlightRecorderEntry& e, size_t index);
  absl::Status AddTensors(ImportWriter& w, const FlightRecorderEntry& e, size_t index, bool outputs,
                          std::vector<uint64_t>& ids);
  llvm::json::Object Annotation(llvm::json::Array entries) const;
  int64_t FrameId(const FlightRecorderFrame& f) {
    std::string text = absl::StrCat(f.file, ":", f.line, " in ", f.name);
    auto [it, added] = frame_ids_.emplace(text, static_cast<int64_t>(frames_.size()));
    if (added) frames_.push_back(std::move(text));
    return it->second;
  }

  const FlightRecorderDump& dump_;
  const Groups& groups_;
  absl::flat_hash_map<std::string, int64_t> frame_ids_;
  std::vector<std::string> frames_;  // "file:line in function", by id
};

absl::Status RankImport::AddTensors(ImportWriter& w, const FlightRecorderEntry& e, size_t index, bool outputs,
                                    std::vector<uint64_t>& ids) {
  const auto& sizes = outputs ? e.output_sizes : e.input_sizes;
  const auto& dtypes = outputs ? e.output_dtypes : e.input_dtypes;
  for (size_t t = 0; t < sizes.size(); ++t) {
    absl::StatusOr<int64_t> numel = formats::CheckedNumel(sizes[t]);
    if (!numel.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(dump_.file, ": entry ", index, " (", e.profiling_name, ") ",
                                                     outputs ? "output " : "input ", t, ": ", numel.status().message()));
    }
    // The values are unknown: every field of the fingerprint says so. A
    // dtype moerr does not store keeps its name in the annotation only.
    formats::Fingerprint fp;
    fp.numel = static_cast<uint64_t>(*numel);
    fp.unknown = ~0u;
    const formats::DType dtype =
        t < dtypes.size() ? DTypeOfTorchName(dtypes[t]).value_or(formats::DType::kU8) : formats::DType::kU8;
    absl::StatusOr<uint64_t> id = outputs ? w.Output(dtype, sizes[t], fp, at::Tensor()) : w.Input(dtype, sizes[t], fp, at::Tensor());
    if (!id.ok()) return id.status();
    ids.push_back(*id);
  }
  return absl::OkStatus();
}

absl::StatusOr<llvm::json::Object> RankImport::AddEntry(ImportWriter& w, const FlightRecorderEntry& e, size_t index) {
  formats::CollectiveOp c;
  c.kind = e.kind;
  const std::string group = FlightRecorderGroupName(e.group_name, e.group_desc, e.pg_id);
  c.group = e.is_p2p ? group + "/p2p" : group;
  // Stored from 0; a dump's id is untrusted, INT64_MIN kept as it is.
  const int64_t id = e.is_p2p ? e.p2p_seq_id : e.collective_seq_id;
  c.seq = id == INT64_MIN ? id : id - 1;
  const std::vector<int64_t>& members = groups_.members.at(group);
  const auto at = std::find(members.begin(), members.end(), dump_.rank);
  c.group_rank = at == members.end() ? -1 : at - members.begin();
  c.group_size = static_cast<int64_t>(members.size());
  MOERR_RETURN_IF_ERROR(AddTensors(w, e, index, false, c.inputs));
  formats::OpEvent op;
  MOERR_RETURN_IF_ERROR(AddTensors(w, e, index, true, op.outputs));
  formats::ToOpEvent(c, op);
  op.phase = formats::Phase::kOther;
  llvm::json::Array frames;
  for (const FlightRecorderFrame& f : e.frames) frames.push_back(FrameId(f));
  auto strings = [](const std::vector<std::string>& v) { return llvm::json::Array(v); };
  llvm::json::Object note{{"op", static_cast<int64_t>(w.next_seq())},
                          {"record_id", e.record_id},
                          {"profiling_name", e.profiling_name},
                          {"collective_seq_id", e.collective_seq_id},
                          {"p2p_seq_id", e.p2p_seq_id},
                          {"op_id", e.op_id},
                          {"state", e.state},
                          {"input_dtypes", strings(e.input_dtypes)},
                          {"output_dtypes", strings(e.output_dtypes)},
                          {"time_created_ns", e.time_created_ns},
                          {"time_started_ns", e.time_started_ns},
                          {"time_completed_ns", e.time_completed_ns},
                          {"duration_ms", e.duration_ms},
                          {"timeout_ms", e.timeout_ms},
                          {"retired", e.retired},
                          {"thread", e.thread_name.empty() ? e.thread_id : e.thread_name},
                          {"frames", std::move(frames)}};
  if (!e.peer.empty()) note["peer"] = e.peer;
  MOERR_RETURN_IF_ERROR(w.AddOp(std::move(op)));
  return note;
}

llvm::json::Object RankImport::Annotation(llvm::json::Array entries) const {
  llvm::json::Object groups, status;
  for (const auto& [name, g] : groups_.by_name) {
    groups[name] = llvm::json::Object{{"name", g.name}, {"desc", g.desc}, {"ranks", groups_.members.at(name)}};
    if (auto it = dump_.status.find(g.name); it != dump_.status.end()) {
      status[name] = llvm::json::Object{{"last_enqueued", it->second.last_enqueued},
                                        {"last_started", it->second.last_started},
                                        {"last_completed", it->second.last_completed}};
    }
  }
  return llvm::json::Object{{"file", dump_.file},           {"version", dump_.version},
                            {"comm_lib_version", dump_.comm_lib_version}, {"groups", std::move(groups)},
                            {"pg_status", std::move(status)}, {"frames", llvm::json::Array(frames_)},
                            {"entries", std::move(entries)}};
}

// One rank's bundle at `path`; a failure abandons it (nothing is left).
absl::Status WriteRank(const FlightRecorderDump& dump, const Groups& groups, const std::string& path,
                       const ImportOptions& options, ImportStats& stats) {
  llvm::json::Object source{{"tool", "flight_recorder"}, {"path", dump.file}, {"version", dump.version}};
  MOERR_ASSIGN_OR_RETURN(std::unique_ptr<ImportWriter> writer,
                         ImportWriter::Create(path, options.overwrite, false, std::move(source)));
  absl::Status written = RankImport(dump, groups).Write(*writer, options);
  if (written.ok()) written = writer->Close();
  if (!written.ok()) {
    writer->Abandon();
    return written;
  }
  stats = writer->stats();
  return absl::OkStatus();
}

}  // namespace

std::string FlightRecorderGroupName(const std::string& name, const std::string& desc, int64_t pg_id) {
  if (desc == "default_pg" || ((desc.empty() || desc == "undefined") && pg_id == 0)) return "world";
  return absl::StrCat("pg", name);
}

absl::StatusOr<ImportResult> ImportFlightRecorder(const std::vector<std::string>& inputs, const std::string& run_dir,
                                                  const FlightRecorderImportOptions& options) {
  MOERR_ASSIGN_OR_RETURN(const auto files, FindDumpFiles(inputs));
  // Dumps are read, then written, a rank per task: each is independent, and
  // 64 ranks' pickles take seconds on one core. Progress is reported under
  // a lock.
  std::mutex progress_lock;
  ImportOptions locked = options;
  if (options.progress) {
    locked.progress = [&](const std::string& label, int64_t done, int64_t total) {
      std::lock_guard<std::mutex> hold(progress_lock);
      options.progress(label, done, total);
    };
  }
  llvm::ThreadPool pool(llvm::hardware_concurrency());
  std::vector<absl::StatusOr<FlightRecorderDump>> read(files.size());
  std::atomic<int64_t> files_read{0};
  size_t i = 0;
  for (const auto& [rank, file] : files) {
    pool.async([&, i, file = file] {
      read[i] = ReadFlightRecorderDump(file);
      if (locked.progress) locked.progress("read", ++files_read, static_cast<int64_t>(files.size()));
    });
    ++i;
  }
  pool.wait();
  std::vector<FlightRecorderDump> dumps;
  for (absl::StatusOr<FlightRecorderDump>& d : read) {
    if (!d.ok()) return d.status();
    dumps.push_back(*std::move(d));
  }
  const int64_t world_size = WorldSizeOf(dumps, options.world_size);
  // A rank number in a file name or pg_config is untrusted: the manifest
  // holds a row per rank.
  constexpr int64_t kMaxRanks = int64_t{1} << 20;
  if (world_size > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("a world of ", world_size, " ranks (from ",
                                                   options.world_size > 0 ? "--world-size" : "the dumps' ranks",
                                                   "): more than ", kMaxRanks, " is not read"));
  }
  if (dumps.back().rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(dumps.back().file, " is rank ", dumps.back().rank,
                                                   ", outside a world of ", world_size, " ranks"));
  }
  const Groups groups = GroupsOf(dumps, world_size);
  MOERR_RETURN_IF_ERROR(PrepareRunDirectory(run_dir, options.overwrite));
  ImportResult result;
  result.task = "flight_recorder";
  formats::WorldManifest world;
  world.world_size = world_size;
  for (int64_t r = 0; r < world_size; ++r) world.ranks.push_back(formats::WorldRank{r, absl::StrCat("rank", r, ".moerr"), {}});
  for (const auto& [name, members] : groups.members) world.groups[name] = {members};
  std::vector<absl::Status> written(dumps.size());
  std::vector<ImportStats> stats(dumps.size());
  for (const FlightRecorderDump& dump : dumps) {
    result.bundles.push_back((fs::path(run_dir) / world.ranks[static_cast<size_t>(dump.rank)].bundle).string());
  }
  for (size_t d = 0; d < dumps.size(); ++d) {
    pool.async([&, d] { written[d] = WriteRank(dumps[d], groups, result.bundles[d], locked, stats[d]); });
  }
  pool.wait();
  for (size_t d = 0; d < dumps.size(); ++d) {
    if (!written[d].ok()) {
      // A failed import leaves nothing that looks like a run.
      std::error_code ec;
      for (const std::string& done : result.bundles) fs::remove(done, ec);
      return written[d];
    }
    result.stats.steps += stats[d].steps;
    result.stats.ops += stats[d].ops;
    result.stats.tensors += stats[d].tensors;
  }
  MOERR_RETURN_IF_ERROR(formats::WriteWorldManifest(run_dir, world));
  result.manifest = (fs::path(run_dir) / formats::kWorldManifestName).string();
  return result;
}

}  // namespace moerr::importers
