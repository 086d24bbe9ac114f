// `inspect RUN --beside MOERR_RUN`'s alignment (analysis/beside_run.h) on a
// large job: from a Flight Recorder import RUN, writes OUT, a moerr
// recording of the same ranks holding each rank's default-group collectives
// from the dump's number --offset on (numbered from 0 there, a module per
// call), then times CheckCollectiveOrder and AlignBeside, best of
// --repeats. Prints one JSON line for bench_flight_recorder.py.
//
//   beside_bench RUN OUT [--offset 5] [--repeats 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "analysis/beside_run.h"
#include "analysis/collective_order.h"
#include "formats/bundle_writer.h"
#include "formats/collective_op.h"
#include "formats/world_run.h"
#include "support/seconds_since.h"

namespace {

using moerr::formats::WorldStep;

// OUT: rank<K>.moerr per rank of `fr`, and world.json.
bool WriteRecording(const WorldStep& fr, const std::string& out, int64_t offset) {
  namespace f = moerr::formats;
  std::filesystem::create_directories(out);
  f::WorldManifest m;
  m.world_size = fr.manifest.world_size;
  std::vector<int64_t> all;
  for (int64_t r = 0; r < m.world_size; ++r) all.push_back(r);
  m.groups["world"] = {all};
  for (int64_t r = 0; r < m.world_size; ++r) m.ranks.push_back({r, absl::StrCat("rank", r, ".moerr"), {}});
  if (!f::WriteWorldManifest(out, m).ok()) return false;
  for (const f::RankStep& rank : fr.ranks) {
    if (!rank.trace) continue;
    f::Record ops;
    ops.kind = static_cast<uint16_t>(f::RecordKind::kOps);
    ops.step = 0;
    for (const f::OpEvent& op : rank.trace->ops) {
      absl::StatusOr<f::CollectiveOp> c = f::CollectiveOf(op);
      if (!c.ok() || c->group != "world" || c->seq < offset) continue;
      c->seq -= offset;
      c->inputs.clear();
      f::OpEvent rec;
      rec.seq = ops.ops.ops.size();
      rec.phase = f::Phase::kBackward;
      rec.module = absl::StrCat("layers.", c->seq % 48);
      f::ToOpEvent(*c, rec);
      ops.ops.ops.push_back(rec);
    }
    auto writer = f::BundleWriter::Create(absl::StrCat(out, "/rank", rank.rank, ".moerr"), f::WriterOptions().set_sync(false));
    if (!writer.ok() || !(*writer)->BeginStep(0).ok() || !(*writer)->AppendRecord(ops).ok() ||
        !(*writer)->EndStep(0).ok() || !(*writer)->Close().ok()) {
      return false;
    }
  }
  return true;
}

using moerr::SecondsSince;

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: beside_bench RUN OUT [--offset 5] [--repeats 3]\n");
    return 2;
  }
  int64_t offset = 5;
  int repeats = 3;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--offset") offset = std::atoll(argv[i + 1]);
    if (flag == "--repeats") repeats = std::atoi(argv[i + 1]);
  }
  absl::StatusOr<WorldStep> fr = moerr::formats::OpenWorldStep(argv[1]);
  if (!fr.ok()) {
    std::fprintf(stderr, "%s\n", std::string(fr.status().message()).c_str());
    return 1;
  }
  if (!WriteRecording(*fr, argv[2], offset)) {
    std::fprintf(stderr, "cannot write the recording in %s\n", argv[2]);
    return 1;
  }
  double order_s = 1e9, align_s = 1e9;
  int64_t found = -1, others = 0;
  for (int i = 0; i < repeats; ++i) {
    auto t = std::chrono::steady_clock::now();
    const std::vector<moerr::analysis::GroupOrder> order = moerr::analysis::CheckCollectiveOrder(*fr);
    order_s = std::min(order_s, SecondsSince(t));
    t = std::chrono::steady_clock::now();
    absl::StatusOr<moerr::analysis::BesideRun> beside = moerr::analysis::AlignBeside(order, *fr, argv[2]);
    align_s = std::min(align_s, SecondsSince(t));
    if (!beside.ok() || beside->groups.empty()) return 1;
    found = beside->groups[0].offset;
    others = beside->groups[0].other_offsets;
  }
  std::printf("{\"order_s\": %.4f, \"align_s\": %.4f, \"offset\": %lld, \"true_offset\": %lld, \"other_offsets\": %lld}\n",
              order_s, align_s, static_cast<long long>(found), static_cast<long long>(offset),
              static_cast<long long>(others));
  return 0;
}
