#include "importers/flight_recorder_dump.h"

#include <cctype>
#include <fstream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "importers/torch_unpickler.h"
#include "llvm/Support/JSON.h"
#include "support/status.h"

namespace moerr::importers {
namespace {

// 2,000 entries with their frames pickle to a few MB; a larger file is not
// read into memory.
constexpr uint64_t kMaxDumpBytes = uint64_t{1} << 30;

// A dump's two representations read through one interface, so that one
// parser below reads both: Get a dict's member, a number, a string, a
// list's (or tuple's) items.
struct PickleAccess {
  using V = PickleValue;
  static bool IsDict(const V& v) { return v.kind == V::Kind::kDict; }
  static const V* Get(const V& dict, absl::string_view key) {
    if (dict.kind != V::Kind::kDict) return nullptr;
    for (size_t i = 0; i + 1 < dict.items.size(); i += 2) {
      if (dict.items[i]->kind == V::Kind::kString && dict.items[i]->text == key) return dict.items[i + 1];
    }
    return nullptr;
  }
  template <typename F>
  static void ForEachMember(const V& dict, F&& f) {
    for (size_t i = 0; i + 1 < dict.items.size(); i += 2) {
      if (dict.items[i]->kind == V::Kind::kString) f(dict.items[i]->text, *dict.items[i + 1]);
    }
  }
  static bool IsList(const V& v) { return v.kind == V::Kind::kList || v.kind == V::Kind::kTuple; }
  template <typename F>
  static void ForEachItem(const V& list, F&& f) {
    for (const V* item : list.items) f(*item);
  }
  static std::optional<int64_t> Int(const V& v) {
    if (v.kind == V::Kind::kInt) return v.integer;
    if (v.kind == V::Kind::kBool) return v.boolean ? 1 : 0;
    int64_t n = 0;
    if (v.kind == V::Kind::kString && absl::SimpleAtoi(v.text, &n)) return n;
    return std::nullopt;
  }
  static std::optional<double> Number(const V& v) {
    if (v.kind == V::Kind::kFloat) return v.number;
    if (const std::optional<int64_t> i = Int(v)) return static_cast<double>(*i);
    return std::nullopt;
  }
  static std::optional<absl::string_view> Str(const V& v) {
    if (v.kind != V::Kind::kString) return std::nullopt;
    return absl::string_view(v.text);
  }
};

struct JsonAccess {
  using V = llvm::json::Value;
  static bool IsDict(const V& v) { return v.getAsObject() != nullptr; }
  static const V* Get(const V& dict, absl::string_view key) {
    const llvm::json::Object* o = dict.getAsObject();
    return o ? o->get(llvm::StringRef(key.data(), key.size())) : nullptr;
  }
  template <typename F>
  static void ForEachMember(const V& dict, F&& f) {
    for (const auto& [key, value] : *dict.getAsObject()) f(key.str(), value);
  }
  static bool IsList(const V& v) { return v.getAsArray() != nullptr; }
  template <typename F>
  static void ForEachItem(const V& list, F&& f) {
    for (const V& item : *list.getAsArray()) f(item);
  }
  static std::optional<int64_t> Int(const V& v) {
    if (const auto i = v.getAsInteger()) return *i;
    if (const auto b = v.getAsBoolean()) return *b ? 1 : 0;
    int64_t n = 0;
    if (const auto s = v.getAsString(); s && absl::SimpleAtoi(absl::string_view(s->data(), s->size()), &n)) return n;
    return std::nullopt;
  }
  static std::optional<double> Number(const V& v) {
    if (const auto d = v.getAsNumber()) return *d;
    if (const std::optional<int64_t> i = Int(v)) return static_cast<double>(*i);
    return std::nullopt;
  }
  static std::optional<absl::string_view> Str(const V& v) {
    const auto s = v.getAsString();
    if (!s) return std::nullopt;
    return absl::string_view(s->data(), s->size());
  }
};

// One dump's parse, over either representation.
template <typename A>
class DumpParser {
 public:
  using V = typename A::V;
  explicit DumpParser(FlightRecorderDump& out) : out_(out) {}

  absl::Status Parse(const V& root) {
    if (!A::IsDict(root)) return Bad("the dump is not a dict");
    out_.version = Text(A::Get(root, "version"));
    if (out_.version.empty()) return Bad("it has no \"version\": not a Flight Recorder dump");
    out_.comm_lib_version = Text(A::Get(root, "comm_lib_version"));
    if (const V* config = A::Get(root, "pg_config"); config && A::IsDict(*config)) ReadGroups(*config);
    if (const V* status = A::Get(root, "pg_status"); status && A::IsDict(*status)) ReadStatus(*status);
    const V* entries = A::Get(root, "entries");
    if (entries == nullptr) return absl::OkStatus();  // a recorder that saw no collective writes none
    if (!A::IsList(*entries)) return Bad("\"entries\" is not a list");
    absl::Status status;
    A::ForEachItem(*entries, [&](const V& e) {
      if (!status.ok()) return;
      if (out_.entries.size() >= kMaxEntries) {
        status = Bad(absl::StrCat("more than ", kMaxEntries, " entries"));
        return;
      }
      status = ReadEntry(e);
    });
    return status;
  }

 private:
  // A ring buffer holds 2,000 entries by default (TORCH_FR_BUFFER_SIZE).
  static constexpr size_t kMaxEntries = size_t{1} << 20;

  absl::Status Bad(absl::string_view what) const { return absl::InvalidArgumentError(absl::StrCat(out_.file, ": ", what)); }
  static std::string Text(const V* v) {
    const std::optional<absl::string_view> s = v ? A::Str(*v) : std::nullopt;
    return s ? std::string(*s) : std::string();
  }
  static int64_t IntOr(const V* v, int64_t fallback) {
    const std::optional<int64_t> i = v ? A::Int(*v) : std::nullopt;
    return i.value_or(fallback);
  }

  void ReadGroups(const V& config) {
    A::ForEachMember(config, [&](const std::string& key, const V& g) {
      FlightRecorderGroup group;
      group.name = Text(A::Get(g, "name"));
      if (group.name.empty()) group.name = key;
      group.desc = Text(A::Get(g, "desc"));
      // "ranks" is a Python list literal in a string: "[0, 1, 2]".
      const std::string ranks = Text(A::Get(g, "ranks"));
      for (absl::string_view r : absl::StrSplit(absl::StripSuffix(absl::StripPrefix(ranks, "["), "]"), ',')) {
        int64_t rank = 0;
        if (absl::SimpleAtoi(r, &rank)) group.ranks.push_back(rank);
      }
      if (!group.name.empty() || !group.ranks.empty()) out_.groups[group.name] = std::move(group);
    });
  }

  void ReadStatus(const V& status) {
    A::ForEachMember(status, [&](const std::string& key, const V& s) {
      FlightRecorderGroupStatus& st = out_.status[key];
      st.last_enqueued = IntOr(A::Get(s, "last_enqueued_collective"), -1);
      st.last_started = IntOr(A::Get(s, "last_started_collective"), -1);
      st.last_completed = IntOr(A::Get(s, "last_completed_collective"), -1);
    });
  }

  absl::Status ReadSizes(const V* v, std::vector<std::vector<int64_t>>& out) {
    if (v == nullptr || !A::IsList(*v)) return absl::OkStatus();
    bool ok = true;
    A::ForEachItem(*v, [&](const V& shape) {
      std::vector<int64_t>& dims = out.emplace_back();
      if (!A::IsList(shape)) {
        ok = false;
        return;
      }
      A::ForEachItem(shape, [&](const V& d) {
        const std::optional<int64_t> n = A::Int(d);
        ok &= n.has_value() && *n >= 0 && dims.size() < 64;
        dims.push_back(n.value_or(0));
      });
    });
    return ok ? absl::OkStatus() : Bad(absl::StrCat("entry ", out_.entries.size(), ": a size that is not a list of counts"));
  }

  void ReadStrings(const V* v, std::vector<std::string>& out) {
    if (v == nullptr || !A::IsList(*v)) return;
    A::ForEachItem(*v, [&](const V& s) { out.push_back(Text(&s)); });
  }

  void ReadFrames(const V* v, std::vector<FlightRecorderFrame>& out) {
    if (v == nullptr || !A::IsList(*v)) return;
    A::ForEachItem(*v, [&](const V& f) {
      out.push_back({Text(A::Get(f, "filename")), Text(A::Get(f, "name")), IntOr(A::Get(f, "line"), 0)});
    });
  }

  absl::Status ReadEntry(const V& e);

  FlightRecorderDump& out_;
};

template <typename A>
absl::Status DumpParser<A>::ReadEntry(const V& e) {
  if (!A::IsDict(e)) return Bad(absl::StrCat("entry ", out_.entries.size(), " is not a dict"));
  FlightRecorderEntry& entry = out_.entries.emplace_back();
  entry.profiling_name = Text(A::Get(e, "profiling_name"));
  ReadFrames(A::Get(e, "frames"), entry.frames);
  // "nccl:send 1->2": backend, then the kind, then the peers. torch_npu
  // names only coalesced and point-to-point ops ("profiling is not
  // supported"): a plain collective's name is "", and its innermost frame,
  // the torch.distributed function called, is its kind, as torch_npu's own
  // analyzer reads it (tools/flight_recorder/components/types.py).
  const size_t colon = entry.profiling_name.find(':');
  if (entry.profiling_name.empty() && !entry.frames.empty() && !entry.frames[0].name.empty()) {
    entry.kind = entry.frames[0].name;
  } else if (colon == std::string::npos) {
    return Bad(absl::StrCat("entry ", out_.entries.size() - 1, ": profiling_name \"", entry.profiling_name,
                            "\" is not backend:kind", entry.profiling_name.empty() ? ", and no frame names the op" : ""));
  } else {
    entry.backend = entry.profiling_name.substr(0, colon);
    const std::string rest = entry.profiling_name.substr(colon + 1);
    const size_t space = rest.find(' ');
    entry.kind = rest.substr(0, space);
    if (space != std::string::npos) entry.peer = rest.substr(space + 1);
  }
  if (const V* pg = A::Get(e, "process_group"); pg && A::IsList(*pg)) {
    int i = 0;
    A::ForEachItem(*pg, [&](const V& part) { (i++ == 0 ? entry.group_name : entry.group_desc) = Text(&part); });
  }
  entry.record_id = IntOr(A::Get(e, "record_id"), -1);
  entry.pg_id = IntOr(A::Get(e, "pg_id"), -1);
  entry.op_id = IntOr(A::Get(e, "op_id"), -1);
  entry.collective_seq_id = IntOr(A::Get(e, "collective_seq_id"), 0);
  entry.p2p_seq_id = IntOr(A::Get(e, "p2p_seq_id"), 0);
  MOERR_RETURN_IF_ERROR(ReadSizes(A::Get(e, "input_sizes"), entry.input_sizes));
  MOERR_RETURN_IF_ERROR(ReadSizes(A::Get(e, "output_sizes"), entry.output_sizes));
  ReadStrings(A::Get(e, "input_dtypes"), entry.input_dtypes);
  ReadStrings(A::Get(e, "output_dtypes"), entry.output_dtypes);
  entry.state = Text(A::Get(e, "state"));
  entry.is_p2p = IntOr(A::Get(e, "is_p2p"), !entry.peer.empty()) != 0;
  entry.retired = IntOr(A::Get(e, "retired"), 0) != 0;
  entry.time_created_ns = IntOr(A::Get(e, "time_created_ns"), 0);
  entry.time_started_ns = IntOr(A::Get(e, "time_discovered_started_ns"), 0);
  entry.time_completed_ns = IntOr(A::Get(e, "time_discovered_completed_ns"), 0);
  if (const V* d = A::Get(e, "duration_ms")) entry.duration_ms = A::Number(*d).value_or(-1);
  entry.timeout_ms = IntOr(A::Get(e, "timeout_ms"), 0);
  entry.thread_id = Text(A::Get(e, "thread_id"));
  entry.thread_name = Text(A::Get(e, "thread_name"));
  return absl::OkStatus();
}

}  // namespace

int64_t RankOfDumpName(absl::string_view file) {
  const size_t slash = file.find_last_of('/');
  if (slash != absl::string_view::npos) file.remove_prefix(slash + 1);
  absl::ConsumeSuffix(&file, ".json");
  size_t digits = 0;
  while (digits < file.size() && digits < 9 && std::isdigit(static_cast<unsigned char>(file[file.size() - 1 - digits]))) {
    ++digits;
  }
  int64_t rank = -1;
  if (digits == 0 || !absl::SimpleAtoi(file.substr(file.size() - digits), &rank)) return -1;
  return rank;
}

absl::StatusOr<FlightRecorderDump> ParseFlightRecorderDump(absl::string_view bytes, const std::string& file) {
  FlightRecorderDump dump;
  dump.file = file;
  dump.rank = RankOfDumpName(file);
  if (dump.rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": its name does not end with the rank (torch writes one dump per rank as <prefix><rank>)"));
  }
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != absl::string_view::npos && bytes[first] == '{') {
    llvm::Expected<llvm::json::Value> root = llvm::json::parse(llvm::StringRef(bytes.data(), bytes.size()));
    if (!root) return absl::InvalidArgumentError(absl::StrCat(file, ": not JSON: ", llvm::toString(root.takeError())));
    MOERR_RETURN_IF_ERROR(DumpParser<JsonAccess>(dump).Parse(*root));
    return dump;
  }
  if (bytes.empty() || static_cast<uint8_t>(bytes[0]) != 0x80) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": neither a pickle nor JSON: not a Flight Recorder dump"));
  }
  TorchUnpickler unpickler(/*plain_data_only=*/true);
  size_t pos = 0;
  absl::StatusOr<const PickleValue*> root = unpickler.Load(bytes, pos);
  if (!root.ok()) return absl::InvalidArgumentError(absl::StrCat(file, " ", root.status().message()));
  MOERR_RETURN_IF_ERROR(DumpParser<PickleAccess>(dump).Parse(**root));
  return dump;
}

absl::StatusOr<FlightRecorderDump> ReadFlightRecorderDump(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be opened"));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || static_cast<uint64_t>(size) > kMaxDumpBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", size, " bytes, more than a dump is read at"));
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  in.read(bytes.data(), size);
  if (!in) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return ParseFlightRecorderDump(bytes, path);
}

}  // namespace moerr::importers
