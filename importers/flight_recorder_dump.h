// One rank's c10d Flight Recorder dump (docs/IMPORT.md, "Flight Recorder"):
// the ring buffer of its last collectives that torch 2.x keeps per process
// (torch/csrc/distributed/c10d/FlightRecorder.hpp) and writes as a pickle of
// plain data, or as JSON (_dump_fr_trace_json), one file per rank named
// <prefix><rank>. torch_npu keeps the same recorder for HCCL.
//
// The pickle is untrusted input: it is read by TorchUnpickler in its plain
// data mode, which runs no code, and its sizes are capped. Fields appeared
// over torch's versions (2.4 on); a field a version lacks is left at its
// "unknown" value below rather than refused.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moerr::importers {

struct FlightRecorderFrame {
  std::string file, name;
  int64_t line = 0;
};

struct FlightRecorderEntry {
  int64_t record_id = -1, pg_id = -1, op_id = -1;
  // Per process group: collectives (and coalesced groups) from 1; point to
  // point ops count apart, in p2p_seq_id. 0 where the op is not of that kind.
  int64_t collective_seq_id = 0, p2p_seq_id = 0;
  std::string group_name, group_desc;  // process_group: (name, desc)
  // profiling_name "nccl:all_reduce", "gloo:all_gather", "hccl:send 1->2":
  // backend "nccl", kind "all_reduce", peer the rest ("1->2") or "". An
  // empty name (torch_npu's plain collectives): backend "", kind the
  // innermost frame's function.
  std::string profiling_name, backend, kind, peer;
  std::vector<std::vector<int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;  // LibTorch's names: "Float", "BFloat16"
  std::string state;  // "scheduled", "started", "completed"
  bool is_p2p = false, retired = false;
  int64_t time_created_ns = 0;
  int64_t time_started_ns = 0, time_completed_ns = 0;  // 0: not discovered
  double duration_ms = -1;                              // -1: not measured
  int64_t timeout_ms = 0;
  std::vector<FlightRecorderFrame> frames;  // innermost first
  std::string thread_id, thread_name;
};

struct FlightRecorderGroup {
  std::string name, desc;
  std::vector<int64_t> ranks;  // global ranks; empty where the backend did not record them (gloo)
};

// pg_status: per group name, the sequence ids it reached (-1: none).
struct FlightRecorderGroupStatus {
  int64_t last_enqueued = -1, last_started = -1, last_completed = -1;
};

struct FlightRecorderDump {
  std::string file;
  int64_t rank = -1;  // from the file name
  std::string version, comm_lib_version;
  std::map<std::string, FlightRecorderGroup> groups;  // pg_config, by name
  std::map<std::string, FlightRecorderGroupStatus> status;
  std::vector<FlightRecorderEntry> entries;  // in record order
};

// Reads `path`, a pickle or JSON dump (told apart by its first byte).
// InvalidArgument naming the file (and the byte offset, for a pickle) for
// anything else: an opcode that is not plain data, a cut-short file, a
// missing field, a name that does not end with the rank.
absl::StatusOr<FlightRecorderDump> ReadFlightRecorderDump(const std::string& path);
// The same, for bytes already read; `file` names them in messages and gives
// the rank.
absl::StatusOr<FlightRecorderDump> ParseFlightRecorderDump(absl::string_view bytes, const std::string& file);

// The rank a dump's file name ends with ("nccl_trace_rank_12" -> 12), as
// torch's analyzer reads it; -1 when it ends with no digits.
int64_t RankOfDumpName(absl::string_view file);

}  // namespace moerr::importers
