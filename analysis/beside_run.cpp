#include "analysis/beside_run.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/annotations.h"
#include "formats/collective_op.h"
#include "support/status.h"

namespace moerr::analysis {
namespace {

using Kinds = std::map<int64_t, BesideCall>;  // by the side's own number
using RankGroups = std::map<std::string, Kinds>;  // by group name

// The collectives of every step of every rank of the recording, and the one
// each rank failed in (recorder.h's "collective_failed" annotation: it never
// returned, so it is no op of the trace).
absl::StatusOr<std::vector<RankGroups>> ReadRecording(const std::string& dir, std::vector<std::string>& notes) {
  MOERR_ASSIGN_OR_RETURN(formats::WorldStep world, formats::OpenWorld(dir));
  std::vector<RankGroups> out(world.ranks.size());
  std::set<int64_t> steps;
  for (const formats::RankStep& r : world.ranks) {
    if (!r.reader) {
      notes.push_back(absl::StrFormat("rank %d: its bundle cannot be read: %s", r.rank, r.error.message()));
      continue;
    }
    // An import (Flight Recorder's, msprobe's) knows no module: aligning
    // the dumps with one would only name nothing.
    const std::optional<formats::Recording> recording = formats::RecordingOf(*r.reader);
    if (recording && recording->imported) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is imported from another tool's dumps, not recorded by moerr.record", r.path));
    }
    if (r.partial) notes.push_back(absl::StrFormat("rank %d: its bundle was never finished; read to its last "
                                                   "complete frame", r.rank));
    for (int64_t s : r.reader->Steps()) steps.insert(s);
  }
  for (int64_t step : steps) {
    if (!formats::ReadWorldStep(world, step).ok()) continue;
    for (size_t r = 0; r < world.ranks.size(); ++r) {
      if (!world.ranks[r].trace) continue;
      for (const formats::OpEvent& op : world.ranks[r].trace->ops) {
        if (!formats::IsCollective(op)) continue;
        absl::StatusOr<formats::CollectiveOp> c = formats::CollectiveOf(op);
        if (!c.ok()) continue;  // cross_rank.h reports a malformed record
        BesideCall call{static_cast<int64_t>(r), c->seq, -1, true, c->kind, op.module,
                        std::string(formats::PhaseName(op.phase)), ""};
        out[r][c->group].emplace(c->seq, std::move(call));  // a coalesced group: its first op
      }
    }
  }
  for (size_t r = 0; r < world.ranks.size(); ++r) {
    if (!world.ranks[r].reader) continue;
    // Absent or malformed: the rank failed in no collective it saw.
    absl::StatusOr<formats::CollectiveFailed> failed =
        formats::ReadCollectiveFailed(*world.ranks[r].reader, world.ranks[r].path);
    if (!failed.ok()) continue;
    BesideCall call{static_cast<int64_t>(r), failed->seq, -1, true, failed->kind, failed->module, "",
                    "it never returned: " + failed->error};
    out[r][failed->group].emplace(call.seq, std::move(call));
  }
  return out;
}

// The dump's collectives as the import wrote them: kind per rank, group, seq.
std::vector<RankGroups> ReadDumps(const formats::WorldStep& fr) {
  std::vector<RankGroups> out(fr.ranks.size());
  for (size_t r = 0; r < fr.ranks.size(); ++r) {
    if (!fr.ranks[r].trace) continue;
    for (const formats::OpEvent& op : fr.ranks[r].trace->ops) {
      if (!formats::IsCollective(op)) continue;
      absl::StatusOr<formats::CollectiveOp> c = formats::CollectiveOf(op);
      if (!c.ok()) continue;
      out[r][c->group].emplace(c->seq, BesideCall{static_cast<int64_t>(r), c->seq, c->seq, true, c->kind, "", "", ""});
    }
  }
  return out;
}

// The same call under both names: gloo runs reduce_scatter_tensor as one
// all_reduce, which Flight Recorder sees; and a recording whose
// moerr.record wrapped all_gather (before collectives were recorded from
// the dispatcher) ran it on gloo as an all_to_all_single.
bool SameKind(const std::string& dumped, const std::string& recorded) {
  return dumped == recorded || (recorded == "all_gather" && dumped == "all_to_all") ||
         (recorded == "reduce_scatter" && dumped == "all_reduce");
}

// The recording's name of the order analysis' group: the default group is
// "world" in both; another is "ranks:" and its members in the recording.
std::string RecordedGroup(const GroupOrder& g) {
  return g.group == "world" ? g.group : absl::StrCat("ranks:", absl::StrJoin(g.ranks, ","));
}

using Complex = std::complex<double>;
constexpr double kPi = 3.14159265358979323846;

// In-place radix-2 FFT; `a.size()` a power of two. `inverse` leaves the
// result unscaled (times the size).
void Fft(std::vector<Complex>& a, bool inverse) {
  const size_t n = a.size();
  for (size_t i = 1, j = 0; i < n; ++i) {
    size_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
  for (size_t len = 2; len <= n; len <<= 1) {
    const double angle = 2 * kPi / static_cast<double>(len) * (inverse ? 1 : -1);
    const Complex w_len(std::cos(angle), std::sin(angle));
    for (size_t i = 0; i < n; i += len) {
      Complex w(1);
      for (size_t k = 0; k < len / 2; ++k, w *= w_len) {
        const Complex u = a[i + k], v = a[i + k + len / 2] * w;
        a[i + k] = u + v;
        a[i + k + len / 2] = u - v;
      }
    }
  }
}

// Adds to `sum` the spectrum of the correlation of x with y, real and of
// the spectrum's size, given as z = x + iy (x reversed by its caller): both
// transformed in one complex FFT, in place (z is scratch afterwards).
void AddCorrelation(std::vector<Complex>& z, std::vector<Complex>& sum) {
  const size_t n = sum.size();
  Fft(z, false);
  for (size_t j = 0; j < n; ++j) {
    const Complex a = z[j], b = std::conj(z[(n - j) % n]);
    sum[j] += (a + b) * 0.5 * ((a - b) * Complex(0, -0.5));  // X[j] * Y[j]
  }
}

// The numbers of one member: what the dump and the recording called, by number.
struct MemberKinds {
  const Kinds* dumped;
  const Kinds* recorded;
};

// The numbers both sides of a group hold, over its members: each side's
// lowest and highest, and the recorded kinds.
struct Spans {
  std::vector<MemberKinds> members;
  int64_t rlo = INT64_MAX, rhi = INT64_MIN, dlo = INT64_MAX, dhi = INT64_MIN;
  std::set<std::string> kinds;
};

// Per offset d (the dump's number minus the recording's) from `first`
// (dlo - rhi): how many numbers both sides hold, and how many of those
// have the same kind (SameKind), summed over the members. Correlations by
// FFT over the numbers' spans: O(K n log n) for K recorded kinds, where
// trying each offset in turn is O(n^2) per member. `n` the FFT's size (a
// power of two, at least the spans' sum); the spans fit in size_t (FitOffset).
struct OffsetCounts {
  int64_t first = 0;
  std::vector<int64_t> compared, alike;
};

OffsetCounts CountByOffset(const Spans& sp, size_t n, int64_t first) {
  const size_t lr = static_cast<size_t>(sp.rhi - sp.rlo) + 1, ld = static_cast<size_t>(sp.dhi - sp.dlo) + 1;
  // One buffer for every FFT's input, x in the real parts, y in the imaginary.
  std::vector<Complex> compared(n), alike(n), z(n);
  // Index t of the correlation: (rhi - s) + (s' - dlo), so d = s' - s = t + first.
  for (const MemberKinds& m : sp.members) {
    std::fill(z.begin(), z.end(), Complex());
    for (const auto& [seq, _] : *m.recorded) z[static_cast<size_t>(sp.rhi - seq)].real(1);
    for (const auto& [seq, _] : *m.dumped) z[static_cast<size_t>(seq - sp.dlo)].imag(1);
    AddCorrelation(z, compared);
    for (const std::string& kind : sp.kinds) {
      std::fill(z.begin(), z.end(), Complex());
      bool any = false;
      for (const auto& [seq, call] : *m.recorded) {
        if (call.kind == kind) z[static_cast<size_t>(sp.rhi - seq)].real(1), any = true;
      }
      if (!any) continue;
      for (const auto& [seq, call] : *m.dumped) {
        if (SameKind(call.kind, kind)) z[static_cast<size_t>(seq - sp.dlo)].imag(1);
      }
      AddCorrelation(z, alike);
    }
  }
  Fft(compared, true);
  Fft(alike, true);
  OffsetCounts out;
  out.first = first;
  for (size_t t = 0; t < lr + ld - 1; ++t) {
    out.compared.push_back(std::llround(compared[t].real() / static_cast<double>(n)));
    out.alike.push_back(std::llround(alike[t].real() / static_cast<double>(n)));
  }
  return out;
}

// A dump's numbers are untrusted: each side's span is at most kMaxSpan
// numbers, and the points the FFTs transform (per member, one per kind it
// recorded and one more, each of the FFT's size) at most kMaxWork: at the
// limits, 3 vectors of 2^23 complex numbers (384 MiB), 8 FFTs of them.
constexpr int64_t kMaxSpan = int64_t{1} << 22;
constexpr uint64_t kMaxWork = uint64_t{1} << 26;

// The offset (0 or more) under which every number both sides hold for a
// member has the same kind, comparing the most numbers (ties: the largest
// offset), and how many others fit; offset -1 and a note when none does or
// the numbers are too far apart or too many to align.
struct Fit {
  int64_t offset = -1, others = 0;
  std::string note;
};

Fit FitOffset(const GroupOrder& g, const std::string& recorded, const std::vector<RankGroups>& dumps,
              const std::vector<RankGroups>& rec) {
  Spans sp;
  for (int64_t r : g.ranks) {
    if (r < 0 || static_cast<size_t>(r) >= dumps.size() || static_cast<size_t>(r) >= rec.size()) continue;
    auto dumped = dumps[static_cast<size_t>(r)].find(g.group);
    auto recorded_calls = rec[static_cast<size_t>(r)].find(recorded);
    if (dumped == dumps[static_cast<size_t>(r)].end() || dumped->second.empty()) continue;
    if (recorded_calls == rec[static_cast<size_t>(r)].end() || recorded_calls->second.empty()) continue;
    sp.members.push_back({&dumped->second, &recorded_calls->second});
    sp.rlo = std::min(sp.rlo, recorded_calls->second.begin()->first);
    sp.rhi = std::max(sp.rhi, recorded_calls->second.rbegin()->first);
    sp.dlo = std::min(sp.dlo, dumped->second.begin()->first);
    sp.dhi = std::max(sp.dhi, dumped->second.rbegin()->first);
  }
  Fit fit;
  if (sp.members.empty()) {
    fit.note = "no numbering of the recording's collectives matches the dump's kinds";
    return fit;
  }
  // Each difference checked before it is used: the numbers span all of int64.
  int64_t rspan = 0, dspan = 0, first = 0, last = 0;
  if (__builtin_sub_overflow(sp.rhi, sp.rlo, &rspan) || __builtin_sub_overflow(sp.dhi, sp.dlo, &dspan) ||
      rspan >= kMaxSpan || dspan >= kMaxSpan) {
    fit.note = absl::StrFormat("the numbers of the dump (#%d to #%d) or the recording (#%d to #%d) span more than "
                               "%d to align", sp.dlo, sp.dhi, sp.rlo, sp.rhi, kMaxSpan);
    return fit;
  }
  if (__builtin_sub_overflow(sp.dlo, sp.rhi, &first) || __builtin_sub_overflow(sp.dhi, sp.rlo, &last)) {
    fit.note = absl::StrFormat("the numbers of the dump (#%d to #%d) and the recording's (#%d to #%d) are too far "
                               "apart to align", sp.dlo, sp.dhi, sp.rlo, sp.rhi);
    return fit;
  }
  size_t n = 1;
  while (n < static_cast<size_t>(rspan) + static_cast<size_t>(dspan) + 1) n <<= 1;
  // Per member: one FFT of its numbers, one per kind it recorded.
  uint64_t ffts = 0;
  for (const MemberKinds& m : sp.members) {
    std::set<std::string> own;
    for (const auto& [_, call] : *m.recorded) own.insert(call.kind);
    ffts += 1 + own.size();
    sp.kinds.insert(own.begin(), own.end());
  }
  if (ffts > kMaxWork / n) {
    fit.note = absl::StrFormat("aligning %d ranks' numbers, spanning %d, takes %d FFTs of %d points: more than %d "
                               "points", sp.members.size(), rspan + dspan + 1, ffts, n, kMaxWork);
    return fit;
  }
  const OffsetCounts counts = CountByOffset(sp, n, first);
  int64_t most = 0, fits = 0;
  for (size_t t = 0; t < counts.compared.size(); ++t) {
    const int64_t d = counts.first + static_cast<int64_t>(t);  // at most `last`
    if (d < 0 || counts.compared[t] == 0 || counts.alike[t] != counts.compared[t]) continue;
    ++fits;
    if (counts.compared[t] >= most) fit.offset = d, most = counts.compared[t];
  }
  if (fit.offset < 0) {
    fit.note = "no numbering of the recording's collectives matches the dump's kinds";
  } else {
    fit.others = fits - 1;
  }
  return fit;
}

BesideCall Lookup(int64_t rank, int64_t fr_seq, const GroupBeside& gb, const std::string& dumped_kind,
                  const std::vector<RankGroups>& rec) {
  BesideCall out;
  out.rank = rank;
  out.fr_seq = fr_seq;
  // gb.offset >= 0: only a number far below the dump's others underflows,
  // one before the recording started.
  if (__builtin_sub_overflow(fr_seq, gb.offset, &out.seq)) out.seq = -1;
  if (rank < 0 || static_cast<size_t>(rank) >= rec.size()) {
    out.note = "the recording has no such rank";
    return out;
  }
  if (out.seq < 0) {
    out.note = "it came before the recording started";
    return out;
  }
  auto group = rec[static_cast<size_t>(rank)].find(gb.moerr_group);
  auto it = group == rec[static_cast<size_t>(rank)].end() ? Kinds::const_iterator() : group->second.find(out.seq);
  if (group == rec[static_cast<size_t>(rank)].end() || it == group->second.end()) {
    out.note = absl::StrFormat("the recording of rank %d has no #%d in %s", rank, out.seq, gb.moerr_group);
    return out;
  }
  out = it->second;
  out.fr_seq = fr_seq;
  if (!dumped_kind.empty() && !SameKind(dumped_kind, out.kind)) {
    out.note = absl::StrCat("the recording has ", out.kind, " where the dump has ", dumped_kind,
                            out.note.empty() ? "" : "; ", out.note);
  }
  return out;
}

GroupBeside AlignGroup(const GroupOrder& g, const std::vector<RankGroups>& dumps, const std::vector<RankGroups>& rec,
                       const std::set<std::string>& recorded_groups) {
  GroupBeside gb;
  gb.group = g.group;
  gb.flight_recorder = g.flight_recorder;
  const std::string name = RecordedGroup(g);
  if (!recorded_groups.count(name)) {
    gb.note = absl::StrCat("the recording has no collective in group ", name);
    return gb;
  }
  gb.moerr_group = name;
  Fit fit = FitOffset(g, name, dumps, rec);
  gb.offset = fit.offset;
  gb.other_offsets = fit.others;
  if (gb.offset < 0) {
    gb.note = std::move(fit.note);
    return gb;
  }
  if (g.last_completed >= 0) {
    for (int64_t r : g.ranks) gb.completed.push_back(Lookup(r, g.last_completed, gb, g.completed_call.kind, rec));
  }
  for (const OrderSide& s : g.sides) {
    const bool entered = s.kind != OrderSide::Kind::kNeverEntered;
    if (!entered && s.last_seq < 0) continue;
    for (int64_t r : s.ranks) {
      gb.disagreement.push_back(Lookup(r, entered ? g.first_disagreement : s.last_seq, gb, s.call.kind, rec));
    }
  }
  return gb;
}

// "layers.1, forward; moerr's #1", or what the recording lacks.
std::string Where(const BesideCall& c) {
  if (!c.found) return c.note;
  std::string where = c.module.empty() ? "no module" : c.module;
  if (!c.phase.empty()) absl::StrAppend(&where, ", ", c.phase);
  absl::StrAppend(&where, "; moerr's ", c.kind, " #", c.seq);
  return c.note.empty() ? where : absl::StrCat(where, "; ", c.note);
}

// "rank 0 in #9 (layers.1, forward; moerr's all_reduce #1), rank 1 in ...",
// numbered as the dump is (SeqName).
std::string CallsText(const GroupBeside& g, const std::vector<BesideCall>& calls) {
  std::vector<std::string> parts;
  for (const BesideCall& c : calls) {
    parts.push_back(absl::StrFormat("rank %d in #%d (%s)", c.rank, ShownSeq(c.fr_seq, g.flight_recorder), Where(c)));
  }
  return absl::StrJoin(parts, ", ");
}

llvm::json::Object CallJson(const BesideCall& c) {
  return llvm::json::Object{{"rank", c.rank},         {"seq", c.seq},     {"dump_seq", c.fr_seq}, {"found", c.found},
                            {"kind", c.kind},         {"module", c.module}, {"phase", c.phase},
                            {"note", c.note}};
}

}  // namespace

absl::StatusOr<BesideRun> AlignBeside(const std::vector<GroupOrder>& order, const formats::WorldStep& fr,
                                      const std::string& moerr_dir) {
  BesideRun run;
  run.dir = moerr_dir;
  absl::StatusOr<std::vector<RankGroups>> read = ReadRecording(moerr_dir, run.rank_notes);
  if (!read.ok()) {
    return absl::Status(read.status().code(),
                        absl::StrCat("the moerr run beside the dumps, ", moerr_dir, ": ", read.status().message()));
  }
  const std::vector<RankGroups>& rec = *read;
  const std::vector<RankGroups> dumps = ReadDumps(fr);
  std::set<std::string> recorded_groups;
  for (const RankGroups& r : rec) {
    for (const auto& [name, _] : r) recorded_groups.insert(name);
  }
  for (const GroupOrder& g : order) run.groups.push_back(AlignGroup(g, dumps, rec, recorded_groups));
  return run;
}

std::string DescribeBeside(const BesideRun& run) {
  std::vector<std::string> lines{absl::StrCat("beside moerr run ", run.dir, ":")};
  for (const std::string& n : run.rank_notes) lines.push_back("  " + n);
  for (const GroupBeside& g : run.groups) {
    std::string line = absl::StrCat("  group ", g.group);
    if (g.offset < 0) {
      lines.push_back(absl::StrCat(line, ": ", g.note));
      continue;
    }
    absl::StrAppendFormat(&line, " is its %s, numbered %d later in the dump%s", g.moerr_group, g.offset,
                          g.other_offsets ? absl::StrFormat(" (%d other numberings fit too)", g.other_offsets) : "");
    if (!g.completed.empty()) absl::StrAppend(&line, "; last completed: ", CallsText(g, g.completed));
    if (!g.disagreement.empty()) absl::StrAppend(&line, "; at the disagreement: ", CallsText(g, g.disagreement));
    lines.push_back(line);
  }
  return absl::StrJoin(lines, "\n");
}

llvm::json::Object BesideJson(const BesideRun& run) {
  llvm::json::Array groups;
  for (const GroupBeside& g : run.groups) {
    llvm::json::Array completed, disagreement;
    for (const BesideCall& c : g.completed) completed.push_back(CallJson(c));
    for (const BesideCall& c : g.disagreement) disagreement.push_back(CallJson(c));
    groups.push_back(llvm::json::Object{{"group", g.group}, {"moerr_group", g.moerr_group}, {"offset", g.offset},
                                        {"other_offsets", g.other_offsets}, {"note", g.note},
                                        {"completed", std::move(completed)},
                                        {"disagreement", std::move(disagreement)}});
  }
  return llvm::json::Object{{"run", run.dir}, {"rank_notes", llvm::json::Array(run.rank_notes)},
                            {"groups", std::move(groups)}, {"text", DescribeBeside(run)}};
}

}  // namespace moerr::analysis
