// Flight Recorder dumps (importers/flight_recorder_dump.h) read, imported as
// a run (flight_recorder_import.h) and judged (analysis/collective_order.h).
// The real dumps of real gloo jobs, checked against torch's own analyzer,
// are tests/importers/test_flight_recorder.py; here: the parser on a real
// pickle, the refusal of objects, and the verdicts on JSON dumps written
// from the documented layout, alone and beside a recording written here
// (analysis/beside_run.h).
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/beside_run.h"
#include "analysis/collective_order.h"
#include "formats/bundle_writer.h"
#include "formats/collective_op.h"
#include "formats/world_run.h"
#include "gtest/gtest.h"
#include "importers/flight_recorder_dump.h"
#include "importers/flight_recorder_import.h"
#include "importers/torch_unpickler.h"
#include "report/world_section.h"
#include "tests/testing/test_util.h"

namespace moerr::importers {
namespace {

using analysis::OrderSide;
using formats::testing::TempDir;

TEST(FlightRecorderDumpTest, RankComesFromTheFileName) {
  EXPECT_EQ(RankOfDumpName("/tmp/nccl_trace_rank_12"), 12);
  EXPECT_EQ(RankOfDumpName("dumps/fr_3.json"), 3);
  EXPECT_EQ(RankOfDumpName("trace"), -1);
}

TEST(FlightRecorderDumpTest, ReadsARealGlooDump) {
  // Rank 0 of two gloo ranks (torch 2.11): all_reduce in the default group
  // and in a second one, then all_to_all_single.
  auto dump = ReadFlightRecorderDump(MOERR_SOURCE_DIR "/tests/fuzz/flight_recorder_seeds/nccl_trace_rank_0");
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(dump->rank, 0);
  EXPECT_EQ(dump->version, "2.10");
  ASSERT_EQ(dump->entries.size(), 3u);
  const FlightRecorderEntry& e = dump->entries[0];
  EXPECT_EQ(e.backend, "gloo");
  EXPECT_EQ(e.kind, "all_reduce");
  EXPECT_EQ(e.group_desc, "default_pg");
  EXPECT_EQ(e.collective_seq_id, 1);
  ASSERT_EQ(e.input_sizes.size(), 1u);
  EXPECT_EQ(e.input_sizes[0], std::vector<int64_t>{4});
  EXPECT_EQ(e.input_dtypes, std::vector<std::string>{"Float"});
  EXPECT_EQ(dump->entries[2].kind, "all_to_all");
  EXPECT_EQ(dump->status.at("0").last_completed, 3);
  // The JSON variant of the same dump reads the same.
  auto json = ReadFlightRecorderDump(MOERR_SOURCE_DIR "/tests/fuzz/flight_recorder_seeds/nccl_trace_rank_0.json");
  ASSERT_TRUE(json.ok()) << json.status();
  ASSERT_EQ(json->entries.size(), 3u);
  EXPECT_EQ(json->entries[1].group_name, dump->entries[1].group_name);
  EXPECT_EQ(json->status.at("0").last_completed, 3);
}

TEST(FlightRecorderDumpTest, APickleThatBuildsObjectsIsRefusedByByte) {
  // {"version": "2.10", "entries": os.system("x")}: GLOBAL, then REDUCE.
  const std::string pickle("\x80\x02}q\x00(X\x07\x00\x00\x00versionX\x04\x00\x00\x00" "2.10X\x07\x00\x00\x00"
                           "entriescos\nsystem\nX\x01\x00\x00\x00x\x85Ru.", 60);
  auto dump = ParseFlightRecorderDump(pickle, "nccl_trace_rank_1");
  ASSERT_EQ(dump.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dump.status().message().find("nccl_trace_rank_1 byte 39: GLOBAL builds an object"), std::string::npos)
      << dump.status();
  // torch.save's mode reads the same bytes, the call kept as a named object.
  TorchUnpickler lenient;
  size_t pos = 0;
  EXPECT_TRUE(lenient.Load(pickle, pos).ok());
  EXPECT_EQ(ParseFlightRecorderDump("not a dump", "r0").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseFlightRecorderDump("{\"entries\": []}", "r0").status().code(), absl::StatusCode::kInvalidArgument);
}

// A JSON dump of `entries` ("kind:size" each, one all_reduce-like call per
// collective_seq_id from 1) in the default group.
void WriteDump(const std::string& path, const std::vector<std::string>& calls) {
  std::ofstream out(path);
  out << R"({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},)"
      << R"("pg_status": {"0": {"last_enqueued_collective": )" << calls.size()
      << R"(, "last_started_collective": -1, "last_completed_collective": 1}}, "entries": [)";
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string kind = calls[i].substr(0, calls[i].find(':'));
    const std::string size = calls[i].substr(calls[i].find(':') + 1);
    out << (i ? "," : "") << R"({"record_id": )" << i << R"(, "pg_id": 0, "process_group": ["0", "default_pg"],)"
        << R"("collective_seq_id": )" << i + 1 << R"(, "p2p_seq_id": 0, "op_id": )" << i + 1
        << R"(, "profiling_name": "nccl:)" << kind << R"(", "input_sizes": [[)" << size
        << R"(]], "input_dtypes": ["Float"], "output_sizes": [[)" << size << R"(]], "output_dtypes": ["Float"],)"
        << R"("state": ")" << (i < 1 ? "completed" : "scheduled") << R"(", "is_p2p": false, "timeout_ms": 600000,)"
        << R"("frames": [{"filename": "train.py", "line": )" << 40 + i << R"(, "name": "step"}]})";
  }
  out << "]}";
}

TEST(CollectiveOrderTest, NamesTheRankThatCalledAnotherKindAndTheMissingDump) {
  TempDir dir;
  std::filesystem::create_directory(dir.File("dumps"));
  for (int r = 0; r < 3; ++r) {
    WriteDump(dir.File("dumps/nccl_trace_rank_" + std::to_string(r)),
              {"all_reduce:4", r == 2 ? "all_gather:4" : "all_reduce:4", "broadcast:8"});
  }
  // Rank 3 left no dump; pg_config says the world has 4.
  auto imported = ImportFlightRecorder({dir.File("dumps")}, dir.File("run"));
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->bundles.size(), 3u);
  auto world = formats::OpenWorldStep(dir.File("run"));
  ASSERT_TRUE(world.ok()) << world.status();
  const std::vector<analysis::GroupOrder> order = analysis::CheckCollectiveOrder(*world);
  ASSERT_EQ(order.size(), 1u);
  const analysis::GroupOrder& g = order[0];
  EXPECT_EQ(g.group, "world");
  EXPECT_EQ(g.missing, std::vector<int64_t>{3});
  EXPECT_EQ(g.last_completed, 0);  // collective_seq_id 1
  EXPECT_EQ(g.first_disagreement, 1);
  ASSERT_EQ(g.sides.size(), 2u);
  EXPECT_EQ(g.sides[0].kind, OrderSide::Kind::kExpected);
  EXPECT_EQ(g.sides[0].ranks, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(g.sides[1].kind, OrderSide::Kind::kOtherKind);
  EXPECT_EQ(g.sides[1].ranks, std::vector<int64_t>{2});
  EXPECT_EQ(g.sides[1].call.where, "train.py:41 in step");
  const std::string text = analysis::DescribeGroupOrder(g);
  EXPECT_NE(text.find("rank 2 is in all_gather #2 (train.py:41 in step)"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 3 left no dump (missing, not judged)"), std::string::npos) << text;
}

TEST(CollectiveOrderTest, NamesTheRankThatNeverEnteredAndTheOneWithOtherSizes) {
  TempDir dir;
  WriteDump(dir.File("fr_0"), {"all_reduce:4", "all_reduce:4", "all_reduce:4"});
  WriteDump(dir.File("fr_1"), {"all_reduce:4", "all_reduce:4"});
  WriteDump(dir.File("fr_2"), {"all_reduce:4", "all_reduce:4", "all_reduce:4"});
  WriteDump(dir.File("fr_3"), {"all_reduce:4", "all_reduce:4", "all_reduce:8"});
  auto imported = ImportFlightRecorder({dir.File("fr_0"), dir.File("fr_1"), dir.File("fr_2"), dir.File("fr_3")},
                                       dir.File("run"));
  ASSERT_TRUE(imported.ok()) << imported.status();
  auto world = formats::OpenWorldStep(dir.File("run"));
  ASSERT_TRUE(world.ok()) << world.status();
  const analysis::GroupOrder g = analysis::CheckCollectiveOrder(*world).at(0);
  EXPECT_TRUE(g.missing.empty());
  EXPECT_EQ(g.first_disagreement, 2);
  ASSERT_EQ(g.sides.size(), 3u);
  EXPECT_EQ(g.sides[0].ranks, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(g.sides[1].kind, OrderSide::Kind::kNeverEntered);
  EXPECT_EQ(g.sides[1].ranks, std::vector<int64_t>{1});
  EXPECT_EQ(g.sides[1].calls_ahead, -1);
  EXPECT_EQ(g.sides[2].kind, OrderSide::Kind::kOtherSizes);
  EXPECT_EQ(g.sides[2].ranks, std::vector<int64_t>{3});
  const std::string text = analysis::DescribeGroupOrder(g);
  EXPECT_NE(text.find("rank 1 never entered it: the last call is all_reduce #2 (train.py:41 in step), 1 fewer call"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rank 3 entered all_reduce #3 with input [8] Float, output [8] Float where the others have input [4] "
                      "Float, output [4] Float"),
            std::string::npos)
      << text;
}

// A JSON dump of point-to-point ops only: "send:1:4" is a send to group
// rank 1 of 4 floats, "recv:0:4" a recv from group rank 0.
void WriteP2PDump(const std::string& path, int rank, const std::vector<std::string>& ops) {
  std::ofstream out(path);
  out << R"({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},)"
      << R"("entries": [)";
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::vector<std::string> f = absl::StrSplit(ops[i], ':');
    const bool send = f[0] == "send";
    const std::string peers = send ? absl::StrCat(rank, "->", f[1]) : absl::StrCat(rank, "<-", f[1]);
    out << (i ? "," : "") << R"({"record_id": )" << i << R"(, "pg_id": 0, "process_group": ["0", "default_pg"],)"
        << R"("collective_seq_id": 0, "p2p_seq_id": )" << i + 1 << R"(, "op_id": )" << i + 1
        << R"(, "profiling_name": "nccl:)" << f[0] << " " << peers << R"(", "is_p2p": true,)"
        << R"("input_sizes": [[)" << f[2] << R"(]], "input_dtypes": ["Float"], "output_sizes": [[)" << f[2]
        << R"(]], "output_dtypes": ["Float"], "state": "scheduled", "frames": []})";
  }
  out << "]}";
}

TEST(CollectiveOrderTest, PairsSendsWithRecvsInOrder) {
  TempDir dir;
  // Rank 0 sends twice to 1, which posts one recv; rank 2 expects 8 floats
  // from rank 0, which sends 4.
  WriteP2PDump(dir.File("fr_0"), 0, {"send:1:4", "send:1:4", "send:2:4"});
  WriteP2PDump(dir.File("fr_1"), 1, {"recv:0:4"});
  WriteP2PDump(dir.File("fr_2"), 2, {"recv:0:8"});
  ASSERT_TRUE(ImportFlightRecorder({dir.path()}, dir.File("run")).ok());
  auto world = formats::OpenWorldStep(dir.File("run"));
  ASSERT_TRUE(world.ok()) << world.status();
  const analysis::GroupOrder g = analysis::CheckCollectiveOrder(*world).at(0);
  ASSERT_EQ(g.p2p.size(), 2u) << analysis::DescribeGroupOrder(g);
  EXPECT_EQ(g.p2p[0].sender, 0);
  EXPECT_EQ(g.p2p[0].receiver, 1);
  EXPECT_EQ(g.p2p[0].index, 1);
  EXPECT_EQ(g.p2p[0].what, "rank 1 never posted the recv");
  EXPECT_EQ(g.p2p[1].receiver, 2);
  EXPECT_EQ(g.p2p[1].what, "the sizes differ");
  EXPECT_TRUE(g.Broken());
  const std::string text = analysis::DescribeGroupOrder(g);
  EXPECT_NE(text.find("send 2 from rank 0 to rank 1 (input [4] Float, output [4] Float): rank 1 never posted the recv"),
            std::string::npos)
      << text;
}

// Sequence numbers are untrusted: a gap of 10^15 is walked by the numbers
// called, not one by one, and a number no rank called is no disagreement.
TEST(CollectiveOrderTest, AGapInTheNumbersIsNeitherWalkedNorADisagreement) {
  TempDir dir;
  for (int r = 0; r < 2; ++r) {
    std::ofstream(dir.File("fr_" + std::to_string(r)))
        << R"({"version": "2.10", "entries": [)"
        << R"({"process_group": ["0", "default_pg"], "pg_id": 0, "collective_seq_id": 1, "profiling_name": "nccl:all_reduce"},)"
        << R"({"process_group": ["0", "default_pg"], "pg_id": 0, "collective_seq_id": 1000000000000000,)"
        << R"( "profiling_name": "nccl:all_reduce"}]})";
  }
  ASSERT_TRUE(ImportFlightRecorder({dir.path()}, dir.File("run")).ok());
  auto world = formats::OpenWorldStep(dir.File("run"));
  ASSERT_TRUE(world.ok()) << world.status();
  const analysis::GroupOrder g = analysis::CheckCollectiveOrder(*world).at(0);
  EXPECT_EQ(g.first_disagreement, -1) << analysis::DescribeGroupOrder(g);
  EXPECT_EQ(g.reached.at(1), 999999999999999);
}

// moerr's own recording of ranks 0..2 of WriteDump's job (of `kinds.size()`
// ranks in the world group), from its second collective on: rank r's calls `kinds`, each in module layers.<i>, in the
// backward; rank 1's writer never finished (rank1.moerr.partial).
void WriteRecording(const std::string& run, const std::vector<std::vector<std::string>>& kinds) {
  formats::WorldManifest m;
  m.world_size = static_cast<int64_t>(kinds.size());
  m.groups["world"] = {{}};
  for (int64_t r = 0; r < m.world_size; ++r) m.groups["world"][0].push_back(r);
  for (int64_t r = 0; r < m.world_size; ++r) m.ranks.push_back({r, absl::StrCat("rank", r, ".moerr"), {}});
  ASSERT_TRUE(formats::WriteWorldManifest(run, m).ok());
  for (size_t r = 0; r < kinds.size(); ++r) {
    formats::Record ops;
    ops.kind = static_cast<uint16_t>(formats::RecordKind::kOps);
    ops.step = 0;
    for (size_t i = 0; i < kinds[r].size(); ++i) {
      formats::CollectiveOp c;
      c.kind = kinds[r][i];
      c.group = "world";
      c.seq = static_cast<int64_t>(i);
      c.group_rank = static_cast<int64_t>(r);
      c.group_size = m.world_size;
      formats::OpEvent op;
      op.seq = i;
      op.phase = formats::Phase::kBackward;
      op.module = absl::StrCat("layers.", i);
      formats::ToOpEvent(c, op);
      ops.ops.ops.push_back(op);
    }
    auto writer = formats::BundleWriter::Create(absl::StrCat(run, "/rank", r, ".moerr"),
                                                formats::WriterOptions().set_sync(false));
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->BeginStep(0).ok());
    ASSERT_TRUE((*writer)->AppendRecord(ops).ok());
    ASSERT_TRUE((*writer)->EndStep(0).ok());
    if (r != 1) {
      ASSERT_TRUE((*writer)->Close().ok());
    }
  }
}

TEST(BesideRunTest, NamesTheModuleOfEachRanksCallAtTheDisagreement) {
  TempDir dir;
  std::filesystem::create_directory(dir.File("dumps"));
  for (int r = 0; r < 3; ++r) {
    WriteDump(dir.File("dumps/nccl_trace_rank_" + std::to_string(r)),
              {"all_reduce:4", "all_reduce:4", r == 2 ? "all_gather:4" : "all_reduce:4", "broadcast:8"});
  }
  ASSERT_TRUE(ImportFlightRecorder({dir.File("dumps")}, dir.File("run")).ok());
  auto world = formats::OpenWorldStep(dir.File("run"));
  ASSERT_TRUE(world.ok()) << world.status();
  const std::vector<analysis::GroupOrder> order = analysis::CheckCollectiveOrder(*world);
  ASSERT_EQ(order.at(0).first_disagreement, 2);
  std::filesystem::create_directory(dir.File("moerr"));
  WriteRecording(dir.File("moerr"), {{"all_reduce", "all_reduce", "broadcast"},
                                     {"all_reduce", "all_reduce", "broadcast"},
                                     {"all_reduce", "all_gather", "broadcast"}});
  auto beside = analysis::AlignBeside(order, *world, dir.File("moerr"));
  ASSERT_TRUE(beside.ok()) << beside.status();
  EXPECT_EQ(beside->rank_notes,
            std::vector<std::string>{"rank 1: its bundle was never finished; read to its last complete frame"});
  const analysis::GroupBeside& g = beside->groups.at(0);
  EXPECT_EQ(g.moerr_group, "world");
  EXPECT_EQ(g.offset, 1);  // the recording started after the dump's #1
  EXPECT_EQ(g.other_offsets, 0);
  ASSERT_EQ(g.disagreement.size(), 3u);
  for (const analysis::BesideCall& c : g.disagreement) {
    EXPECT_TRUE(c.found);
    EXPECT_EQ(c.seq, 1);
    EXPECT_EQ(c.module, "layers.1");
    EXPECT_EQ(c.phase, "backward");
    EXPECT_EQ(c.kind, c.rank == 2 ? "all_gather" : "all_reduce");
  }
  // Rank 3's dump is missing, and every rank completed only #1: before the recording.
  ASSERT_EQ(g.completed.size(), 4u);
  EXPECT_EQ(g.completed[0].note, "it came before the recording started");
  const std::string text = analysis::DescribeBeside(*beside);
  EXPECT_NE(text.find("rank 2 in #3 (layers.1, backward; moerr's all_gather #1)"), std::string::npos) << text;
  // A recording whose kinds match under no numbering is said so.
  std::filesystem::create_directory(dir.File("other"));
  WriteRecording(dir.File("other"), {{"all_gather"}, {"all_gather"}, {"all_gather"}});
  beside = analysis::AlignBeside(order, *world, dir.File("other"));
  ASSERT_TRUE(beside.ok()) << beside.status();
  EXPECT_EQ(beside->groups.at(0).offset, -1);
}

// A JSON dump of the default group of 2 ranks: "name:size:seq" per entry
// (size 0: no sizes), every one "scheduled".
void WriteEntries(const std::string& path, const std::vector<std::string>& entries) {
  std::ofstream out(path);
  out << R"({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},)"
      << R"("entries": [)";
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::vector<std::string> f = absl::StrSplit(entries[i], ':');
    const std::string sizes = f[1] == "0" ? "[]" : absl::StrCat("[[", f[1], "]]");
    const std::string dtypes = f[1] == "0" ? "[]" : R"(["Float"])";
    out << (i ? "," : "") << R"({"record_id": )" << i << R"(, "pg_id": 0, "process_group": ["0", "default_pg"],)"
        << R"("collective_seq_id": )" << f[2] << R"(, "p2p_seq_id": 0, "op_id": )" << i + 1
        << R"(, "profiling_name": "nccl:)" << f[0] << R"(", "input_sizes": )" << sizes << R"(, "input_dtypes": )"
        << dtypes << R"(, "output_sizes": )" << sizes << R"(, "output_dtypes": )" << dtypes
        << R"(, "state": "scheduled", "is_p2p": false, "frames": []})";
  }
  out << "]}";
}

// NCCL's coalescing manager: the group's ops share collective_seq_id 2,
// closed by a "coalesced" entry. Compared op by op: rank 1's second op has
// other sizes; the strip marks it.
TEST(CollectiveOrderTest, ComparesACoalescedGroupOpByOp) {
  TempDir dir;
  WriteEntries(dir.File("fr_0"), {"all_reduce:4:1", "all_reduce:4:2", "all_reduce:8:2", "coalesced:0:2", "broadcast:4:3"});
  WriteEntries(dir.File("fr_1"), {"all_reduce:4:1", "all_reduce:4:2", "all_reduce:16:2", "coalesced:0:2", "broadcast:4:3"});
  ASSERT_TRUE(ImportFlightRecorder({dir.path()}, dir.File("run")).ok());
  auto world = formats::OpenWorldStep(dir.File("run"));
  ASSERT_TRUE(world.ok()) << world.status();
  const analysis::GroupOrder g = analysis::CheckCollectiveOrder(*world).at(0);
  const std::string text = analysis::DescribeGroupOrder(g);
  EXPECT_EQ(g.first_disagreement, 1) << text;
  ASSERT_EQ(g.sides.size(), 2u) << text;
  EXPECT_EQ(g.sides[1].kind, OrderSide::Kind::kOtherSizes);
  EXPECT_EQ(g.sides[1].ranks, std::vector<int64_t>{1});
  const analysis::CollectiveCall& call = g.sides[1].call;
  EXPECT_EQ(call.kind, "all_reduce+all_reduce");  // the closing entry is no op of the group
  ASSERT_EQ(call.coalesced.size(), 2u);
  EXPECT_EQ(call.coalesced[1].input_sizes, std::vector<std::vector<int64_t>>{{16}});
  EXPECT_EQ(call.input_sizes, (std::vector<std::vector<int64_t>>{{4}, {16}}));
  EXPECT_NE(text.find("rank 1 entered coalesced all_reduce+all_reduce #2 with, at its op 2 (all_reduce), input [16] "
                      "Float, output [16] Float where the others have input [8] Float"),
            std::string::npos)
      << text;
  // The strip: #1 to #3, pg_status absent (nothing completed), rank 1's
  // group of other sizes at #2, marked.
  EXPECT_EQ(g.strip.begin, 0);
  EXPECT_EQ(g.strip.end, 2);
  using Cell = analysis::OrderStrip::Cell;
  EXPECT_EQ(g.strip.cells.at(0), (std::vector<Cell>{Cell::kScheduled, Cell::kScheduled, Cell::kScheduled}));
  EXPECT_EQ(g.strip.cells.at(1), (std::vector<Cell>{Cell::kScheduled, Cell::kOtherSizes, Cell::kScheduled}));
  const std::string strip = analysis::DescribeOrderStrip(g);
  EXPECT_NE(strip.find("  rank 1  QZQ\n           ^ #2, the first disagreement"), std::string::npos) << strip;
  const std::string svg = report::CollectiveOrderFigure(g);
  EXPECT_NE(svg.find("<title>rank 1, #2: other sizes (all_reduce+all_reduce), the first disagreement</title>"),
            std::string::npos);
  EXPECT_NE(svg.find("class=\"marked-col\" x=\"126.0\""), std::string::npos) << svg;  // the second column
  // Alike on both ranks: one call per group, no disagreement.
  WriteEntries(dir.File("fr_1"), {"all_reduce:4:1", "all_reduce:4:2", "all_reduce:8:2", "coalesced:0:2", "broadcast:4:3"});
  ASSERT_TRUE(ImportFlightRecorder({dir.File("fr_0"), dir.File("fr_1")}, dir.File("alike")).ok());
  world = formats::OpenWorldStep(dir.File("alike"));
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(analysis::CheckCollectiveOrder(*world).at(0).first_disagreement, -1);
}

// A recorded run: each rank's calls returned (completed), rank 2's other
// kind at #1 marked, in the report's strip and the terminal's.
TEST(CollectiveOrderTest, TheStripOfARecordedRun) {
  TempDir dir;
  WriteRecording(dir.path(), {{"all_reduce", "all_reduce", "broadcast"},
                              {"all_reduce", "all_reduce", "broadcast"},
                              {"all_reduce", "all_gather", "broadcast"}});
  auto world = formats::OpenWorldStep(dir.path());
  ASSERT_TRUE(world.ok()) << world.status();
  const analysis::GroupOrder g = analysis::CheckCollectiveOrder(*world).at(0);
  ASSERT_EQ(g.first_disagreement, 1) << analysis::DescribeGroupOrder(g);
  using Cell = analysis::OrderStrip::Cell;
  EXPECT_EQ(g.strip.cells.at(2), (std::vector<Cell>{Cell::kCompleted, Cell::kOtherKind, Cell::kCompleted}));
  EXPECT_EQ(g.strip.kinds.at(2)[1], "all_gather");
  const std::string strip = analysis::DescribeOrderStrip(g);
  EXPECT_NE(strip.find("  rank 2  CKC\n           ^ #1, the first disagreement"), std::string::npos) << strip;
  EXPECT_NE(report::CollectiveOrderFigure(g).find("<title>rank 2, #1: other kind (all_gather), the first "
                                                  "disagreement</title>"),
            std::string::npos);
}

// A loop's collectives repeat: several offsets fit. The one under which the
// sides share the most collectives wins, of equals the largest (the dump
// ends where the recording ends).
TEST(BesideRunTest, ARepeatingLoopAlignsWhereTheMostCollectivesCompare) {
  TempDir dir;
  std::filesystem::create_directory(dir.File("dumps"));
  const std::vector<std::string> loop{"all_reduce:4", "all_gather:4", "all_reduce:4", "all_gather:4",
                                      "all_reduce:4", "all_gather:4", "all_reduce:4", "all_gather:4"};
  for (int r = 0; r < 3; ++r) WriteDump(dir.File("dumps/nccl_trace_rank_" + std::to_string(r)), loop);
  ASSERT_TRUE(ImportFlightRecorder({dir.File("dumps")}, dir.File("run")).ok());
  auto world = formats::OpenWorldStep(dir.File("run"));
  ASSERT_TRUE(world.ok()) << world.status();
  std::filesystem::create_directory(dir.File("moerr"));
  // The recording starts at the dump's #3: 6 collectives.
  const std::vector<std::string> recorded{"all_reduce", "all_gather", "all_reduce", "all_gather", "all_reduce",
                                          "all_gather"};
  WriteRecording(dir.File("moerr"), {recorded, recorded, recorded});
  auto beside = analysis::AlignBeside(analysis::CheckCollectiveOrder(*world), *world, dir.File("moerr"));
  ASSERT_TRUE(beside.ok()) << beside.status();
  // Offsets 0 and 2 compare all 6 on each rank, 4 and 6 fewer; 1, 3, 5 and
  // 7 pair all_reduce with all_gather.
  EXPECT_EQ(beside->groups.at(0).offset, 2);
  EXPECT_EQ(beside->groups.at(0).other_offsets, 3);
}

// A JSON dump of the default group of `world` ranks: per entry its
// collective_seq_id as written and its kind, every one "scheduled".
void WriteNumbered(const std::string& path, int world, const std::vector<std::pair<std::string, std::string>>& calls) {
  std::vector<std::string> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(std::to_string(r));
  std::ofstream out(path);
  out << R"({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[)"
      << absl::StrJoin(ranks, ", ") << R"(]"}}, "entries": [)";
  for (size_t i = 0; i < calls.size(); ++i) {
    out << (i ? "," : "") << R"({"record_id": )" << i << R"(, "pg_id": 0, "process_group": ["0", "default_pg"],)"
        << R"("collective_seq_id": )" << calls[i].first << R"(, "p2p_seq_id": 0, "op_id": )" << i + 1
        << R"(, "profiling_name": "nccl:)" << calls[i].second << R"(", "input_sizes": [[4]],)"
        << R"("input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],)"
        << R"("state": "scheduled", "is_p2p": false, "frames": []})";
  }
  out << "]}";
}

// Sequence numbers at the ends of int64 in a dump: judged, stripped, shown
// and aligned beside a recording without overflowing, the alignment refused
// with a note where the numbers are too far apart.
TEST(BesideRunTest, NumbersAtTheEndsOfInt64AreNotedNotOverflowed) {
  const std::string max = "9223372036854775807", min = "-9223372036854775808";
  TempDir dir;
  std::filesystem::create_directory(dir.File("moerr"));
  WriteRecording(dir.File("moerr"), {{"all_reduce", "all_reduce"}, {"all_reduce", "all_reduce"},
                                     {"all_reduce", "all_gather"}});
  // The last numbers of int64: rank 2 all_gathers at the last.
  std::filesystem::create_directory(dir.File("high"));
  for (int r = 0; r < 3; ++r) {
    WriteNumbered(dir.File("high/fr_" + std::to_string(r)), 3,
                  {{"9223372036854775806", "all_reduce"}, {max, r == 2 ? "all_gather" : "all_reduce"}});
  }
  ASSERT_TRUE(ImportFlightRecorder({dir.File("high")}, dir.File("high_run")).ok());
  auto world = formats::OpenWorldStep(dir.File("high_run"));
  ASSERT_TRUE(world.ok()) << world.status();
  std::vector<analysis::GroupOrder> order = analysis::CheckCollectiveOrder(*world);
  const analysis::GroupOrder& g = order.at(0);
  EXPECT_EQ(g.first_disagreement, INT64_MAX - 1);  // stored as collective_seq_id - 1
  EXPECT_EQ(g.strip.begin, INT64_MAX - 2);
  EXPECT_EQ(g.strip.end, INT64_MAX - 1);  // not begin + kStripMax - 1, which overflows
  EXPECT_EQ(g.strip.cells.at(2).size(), 2u);
  EXPECT_NE(analysis::DescribeGroupOrder(g).find("at #" + max + " "), std::string::npos)
      << analysis::DescribeGroupOrder(g);
  EXPECT_NE(analysis::DescribeOrderStrip(g).find("^ #" + max + ", the first disagreement"), std::string::npos)
      << analysis::DescribeOrderStrip(g);
  auto beside = analysis::AlignBeside(order, *world, dir.File("moerr"));
  ASSERT_TRUE(beside.ok()) << beside.status();
  EXPECT_EQ(beside->groups.at(0).offset, INT64_MAX - 2);  // far, but within int64
  EXPECT_NE(analysis::DescribeBeside(*beside).find("rank 2 in #" + max + " (layers.1"), std::string::npos)
      << analysis::DescribeBeside(*beside);
  // Both ends in one dump: the span does not fit in int64.
  std::filesystem::create_directory(dir.File("both"));
  for (int r = 0; r < 3; ++r) {
    WriteNumbered(dir.File("both/fr_" + std::to_string(r)), 3, {{min, "all_reduce"}, {max, "all_reduce"}});
  }
  ASSERT_TRUE(ImportFlightRecorder({dir.File("both")}, dir.File("both_run")).ok());
  world = formats::OpenWorldStep(dir.File("both_run"));
  ASSERT_TRUE(world.ok()) << world.status();
  order = analysis::CheckCollectiveOrder(*world);
  beside = analysis::AlignBeside(order, *world, dir.File("moerr"));
  ASSERT_TRUE(beside.ok()) << beside.status();
  EXPECT_EQ(beside->groups.at(0).offset, -1);
  EXPECT_NE(beside->groups.at(0).note.find("span more than 4194304 to align"), std::string::npos)
      << beside->groups.at(0).note;
  // The first numbers of int64: the dump's minus the recording's is below it.
  std::filesystem::create_directory(dir.File("low"));
  for (int r = 0; r < 3; ++r) {
    WriteNumbered(dir.File("low/fr_" + std::to_string(r)), 3, {{min, "all_reduce"}, {"-9223372036854775806", "all_reduce"}});
  }
  ASSERT_TRUE(ImportFlightRecorder({dir.File("low")}, dir.File("low_run")).ok());
  world = formats::OpenWorldStep(dir.File("low_run"));
  ASSERT_TRUE(world.ok()) << world.status();
  order = analysis::CheckCollectiveOrder(*world);
  EXPECT_EQ(order.at(0).strip.end, -1);  // no number from 0 on to show
  beside = analysis::AlignBeside(order, *world, dir.File("moerr"));
  ASSERT_TRUE(beside.ok()) << beside.status();
  EXPECT_EQ(beside->groups.at(0).offset, -1);
  EXPECT_NE(beside->groups.at(0).note.find("are too far apart to align"), std::string::npos)
      << beside->groups.at(0).note;
}

// 16 ranks whose dumps number 2 calls 4,000,000 apart, each recording 3
// kinds: 64 FFTs of 2^22 points, more than the limit: said, not computed.
TEST(BesideRunTest, ManySparseMembersAreRefusedBeforeTheirFfts) {
  constexpr int kRanks = 16;
  TempDir dir;
  std::filesystem::create_directory(dir.File("dumps"));
  for (int r = 0; r < kRanks; ++r) {
    WriteNumbered(dir.File("dumps/fr_" + std::to_string(r)), kRanks, {{"1", "all_reduce"}, {"4000001", "broadcast"}});
  }
  ASSERT_TRUE(ImportFlightRecorder({dir.File("dumps")}, dir.File("run")).ok());
  auto world = formats::OpenWorldStep(dir.File("run"));
  ASSERT_TRUE(world.ok()) << world.status();
  std::filesystem::create_directory(dir.File("moerr"));
  WriteRecording(dir.File("moerr"), std::vector<std::vector<std::string>>(kRanks, {"all_reduce", "all_gather",
                                                                                   "broadcast"}));
  auto beside = analysis::AlignBeside(analysis::CheckCollectiveOrder(*world), *world, dir.File("moerr"));
  ASSERT_TRUE(beside.ok()) << beside.status();
  const analysis::GroupBeside& g = beside->groups.at(0);
  EXPECT_EQ(g.offset, -1);
  EXPECT_EQ(g.note, "aligning 16 ranks' numbers, spanning 4000003, takes 64 FFTs of 4194304 points: more than "
                    "67108864 points");
}

TEST(FlightRecorderImportTest, TwoDumpsOfOneRankAreRefused) {
  TempDir dir;
  WriteDump(dir.File("fr_0"), {"all_reduce:4"});
  WriteDump(dir.File("fr_0.json"), {"all_reduce:4"});
  auto imported = ImportFlightRecorder({dir.path()}, dir.File("run"));
  ASSERT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(imported.status().message().find("are both dumps of rank 0"), std::string::npos) << imported.status();
  EXPECT_FALSE(std::filesystem::exists(dir.File("run/world.json")));
}

}  // namespace
}  // namespace moerr::importers
