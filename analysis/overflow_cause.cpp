#include "analysis/overflow_cause.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "formats/dtype.h"
#include "formats/module_path.h"

namespace moerr::analysis {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Two magnitudes this close (in bits) are the same value cast or viewed:
// rounding to bf16 moves an abs-max by at most 2^-8 of itself (0.006 bits).
constexpr double kSameBits = 0.01;
// A view or cast chain longer than this is not followed further.
constexpr int kMaxPassThrough = 64;

// Lookups over one step's trace.
class StepIndex {
 public:
  explicit StepIndex(const formats::Trace& trace) : trace_(trace) {
    for (size_t i = 0; i < trace.ops.size(); ++i) by_seq_[trace.ops[i].seq] = i;
    uninitialised_ = formats::UninitialisedValues(trace);
  }
  const formats::Trace& trace() const { return trace_; }

  // `id` when it holds floating, initialised values of non-zero abs-max.
  const formats::TensorMeta* Value(uint64_t id) const {
    const formats::TensorMeta* meta = id ? trace_.Find(id) : nullptr;
    if (meta == nullptr || !formats::IsFloating(meta->dtype) || uninitialised_.contains(id)) return nullptr;
    return meta->fingerprint.abs_max > 0 ? meta : nullptr;
  }

  // The index of the op that produced `meta`, if it is in the trace and
  // runs before op `before`.
  std::optional<size_t> Producer(const formats::TensorMeta& meta, size_t before) const {
    if (meta.producer < 0) return std::nullopt;
    auto it = by_seq_.find(static_cast<uint64_t>(meta.producer));
    if (it == by_seq_.end() || it->second >= before) return std::nullopt;
    return it->second;
  }

  // The floating values op `i` reads, each once.
  std::vector<const formats::TensorMeta*> Inputs(size_t i) const {
    std::vector<const formats::TensorMeta*> out;
    auto add = [&](int64_t id) {
      const formats::TensorMeta* meta = id > 0 ? Value(static_cast<uint64_t>(id)) : nullptr;
      if (meta != nullptr && std::find(out.begin(), out.end(), meta) == out.end()) out.push_back(meta);
    };
    for (const formats::OpArg& a : trace_.ops[i].args) {
      if (a.kind == formats::OpArg::Kind::kTensor) add(a.i);
      if (a.kind == formats::OpArg::Kind::kTensors || a.kind == formats::OpArg::Kind::kOptionalTensors) {
        for (int64_t id : a.ints) add(id);
      }
    }
    return out;
  }

  // log2 of the largest abs-max of the floating values op `i` produced
  // (not inputs it returned); NaN when it produced none.
  double OpBits(size_t i) const {
    double bits = kNaN;
    for (uint64_t id : trace_.ops[i].outputs) {
      const formats::TensorMeta* meta = Value(id);
      if (meta == nullptr || meta->producer != static_cast<int64_t>(trace_.ops[i].seq)) continue;
      const double b = std::log2(meta->fingerprint.abs_max);
      if (std::isnan(bits) || b > bits) bits = b;
    }
    return bits;
  }

  // Whether `meta` is a step input: produced by no op of the step, or a
  // view or cast of one (an op with that one floating input and the same
  // abs-max), as a transposed weight is.
  bool IsStepInput(const formats::TensorMeta* meta, size_t before) const {
    for (int hop = 0; hop < kMaxPassThrough; ++hop) {
      const std::optional<size_t> p = Producer(*meta, before);
      if (!p) return true;
      const std::vector<const formats::TensorMeta*> in = Inputs(*p);
      if (in.size() != 1 ||
          std::abs(std::log2(in[0]->fingerprint.abs_max) - std::log2(meta->fingerprint.abs_max)) > kSameBits) {
        return false;
      }
      meta = in[0];
      before = *p;
    }
    return false;
  }

 private:
  const formats::Trace& trace_;
  absl::flat_hash_map<uint64_t, size_t> by_seq_;
  absl::flat_hash_set<uint64_t> uninitialised_;
};

// The ops with the same name, module class and phase, and their
// magnitudes (OpBits), over this step and the earlier ones.
class Peers {
 public:
  void Add(const StepIndex& step) {
    for (size_t i = 0; i < step.trace().ops.size(); ++i) {
      const double bits = step.OpBits(i);
      if (!std::isnan(bits)) groups_[Key(step.trace().ops[i])].push_back(bits);
    }
  }

  // The median magnitude of `op`'s peers, `op` itself (of magnitude
  // `own_bits`, NaN if it has none) left out; NaN when it has no peers.
  double Median(const formats::OpEvent& op, double own_bits, size_t& count) {
    count = 0;
    auto it = groups_.find(Key(op));
    if (it == groups_.end()) return kNaN;
    std::vector<double> others = it->second;
    if (!std::isnan(own_bits)) {
      auto self = std::find(others.begin(), others.end(), own_bits);
      if (self != others.end()) others.erase(self);
    }
    count = others.size();
    if (others.empty()) return kNaN;
    const size_t mid = others.size() / 2;
    std::nth_element(others.begin(), others.begin() + mid, others.end());
    if (others.size() % 2 == 1) return others[mid];
    const double upper = others[mid];
    return (*std::max_element(others.begin(), others.begin() + mid) + upper) / 2;
  }

 private:
  std::string Key(const formats::OpEvent& op) {
    auto cls = classes_.find(op.module);
    if (cls == classes_.end()) cls = classes_.emplace(op.module, formats::ModuleClass(op.module)).first;
    return absl::StrCat(op.name, "|", cls->second, "|", static_cast<int>(op.phase));
  }

  absl::flat_hash_map<std::string, std::vector<double>> groups_;
  absl::flat_hash_map<std::string, std::string> classes_;
};

// The chain back from op `first` (whose output `output` overflowed):
// each op's largest floating input, until a step input. Execution order.
std::vector<CauseLink> WalkBack(const StepIndex& step, size_t first, uint64_t output) {
  std::vector<CauseLink> chain;
  size_t at = first;
  uint64_t through = output;
  while (true) {
    CauseLink link;
    link.op_index = at;
    link.op = &step.trace().ops[at];
    link.output = through;
    const formats::TensorMeta* out = step.trace().Find(through);
    link.abs_max = out != nullptr ? out->fingerprint.abs_max : 0;
    chain.push_back(link);
    const formats::TensorMeta* largest = nullptr;
    for (const formats::TensorMeta* in : step.Inputs(at)) {
      if (largest == nullptr || in->fingerprint.abs_max > largest->fingerprint.abs_max) largest = in;
    }
    const std::optional<size_t> producer = largest ? step.Producer(*largest, at) : std::nullopt;
    if (!producer) break;
    at = *producer;
    through = largest->id;
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

// Fills in `link`'s rises and whether it exploded (overflow_cause.h).
void Judge(const StepIndex& step, Peers& peers, CauseLink& link) {
  const double bits = std::log2(link.abs_max);
  double computed = kNaN;
  for (const formats::TensorMeta* in : step.Inputs(link.op_index)) {
    if (step.IsStepInput(in, link.op_index)) {
      link.outside_abs_max = std::max(link.outside_abs_max, in->fingerprint.abs_max);
      continue;
    }
    computed = std::isnan(computed) ? std::log2(in->fingerprint.abs_max)
                                    : std::max(computed, std::log2(in->fingerprint.abs_max));
  }
  link.input_rise_bits = bits - computed;
  link.peer_rise_bits = bits - peers.Median(*link.op, step.OpBits(link.op_index), link.peers);
  // NaN compares false: no computed input, never exploded; no peers, no veto.
  link.exploded = link.abs_max > 0 && link.input_rise_bits >= kInputRiseBits &&
                  (std::isnan(link.peer_rise_bits) || link.peer_rise_bits >= kPeerRiseBits);
  if (!std::isnan(computed)) return;
  double largest = kNaN;  // of every input, step inputs included
  for (const formats::TensorMeta* in : step.Inputs(link.op_index)) {
    const double b = std::log2(in->fingerprint.abs_max);
    largest = std::isnan(largest) ? b : std::max(largest, b);
  }
  if (std::isnan(link.peer_rise_bits)) {
    // A lone op on step inputs alone (a one-off rescale of a weight, a loss
    // scale on a leaf): judged against those inputs, by the wider margin.
    link.input_rise_bits = bits - largest;
    link.exploded = link.abs_max > 0 && link.input_rise_bits >= kLoneRiseBits;
  } else {
    // An op on step inputs alone among peers (in an imported dump, a linear
    // whose activation came through a call the dump does not hold): named
    // when it stands far above its peers and grew the value past its largest
    // input, which a view, cast or gather of a large weight never does.
    link.exploded = link.abs_max > 0 && link.peer_rise_bits >= kLoneRiseBits && bits - largest > kSameBits;
  }
}

// A scope op (OpEvent::scope: an imported module boundary) computes nothing:
// when it is named, the value was made by an op inside it. That is the first
// op of the scope's run (the ops just before it, in its phase, whose module
// is the scope's or nested in it) that exploded; nullopt when none did.
std::optional<CauseLink> InnerCause(const StepIndex& step, Peers& peers, size_t scope) {
  const std::vector<formats::OpEvent>& ops = step.trace().ops;
  const std::string& path = ops[scope].module;
  auto inside = [&](const formats::OpEvent& op) {
    return op.phase == ops[scope].phase &&
           (op.module == path || (op.module.size() > path.size() && op.module.compare(0, path.size(), path) == 0 &&
                                  op.module[path.size()] == '.'));
  };
  size_t begin = scope;
  while (begin > 0 && inside(ops[begin - 1])) --begin;
  for (size_t j = begin; j < scope; ++j) {
    CauseLink link;
    link.op_index = j;
    link.op = &ops[j];
    for (uint64_t id : ops[j].outputs) {
      const formats::TensorMeta* meta = step.Value(id);
      if (meta != nullptr && meta->fingerprint.abs_max > link.abs_max) {
        link.output = id;
        link.abs_max = meta->fingerprint.abs_max;
      }
    }
    if (link.output == 0) continue;
    Judge(step, peers, link);
    if (link.exploded) return link;
  }
  return std::nullopt;
}


// The walk back from `first` (its op and the output the walk starts from),
// over `step` with `peers` filled. `judge_first`: whether `first`'s own op
// may be the cause (the start of a walk that is not an overflow).
OverflowCause CauseFrom(const StepIndex& step, Peers& peers, FirstOverflow first, bool judge_first) {
  std::vector<CauseLink> chain = WalkBack(step, first.op_index, first.output);
  // The first overflow is judged too (its finite values), but is the cause
  // only as the fallback: the walk looks for an exploded op before it.
  Judge(step, peers, chain.back());
  const bool last_exploded = judge_first && chain.back().exploded;
  chain.back().exploded = false;
  size_t cause = chain.size() - 1;
  for (size_t k = chain.size() - 1; !last_exploded && k-- > 0;) {
    Judge(step, peers, chain[k]);
    if (chain[k].exploded) {
      cause = k;
      break;
    }
  }
  chain.back().exploded = last_exploded;
  OverflowCause out;
  out.first = std::move(first);
  out.found_explosion = last_exploded || cause + 1 < chain.size();
  if (out.found_explosion && chain[cause].op->scope) {
    if (std::optional<CauseLink> inner = InnerCause(step, peers, chain[cause].op_index)) {
      out.chain.push_back(*inner);
    }
  }
  out.chain.insert(out.chain.end(), chain.begin() + static_cast<std::ptrdiff_t>(cause), chain.end());
  out.cause = out.chain.front();
  return out;
}

Peers PeersOf(const StepIndex& step, const std::vector<const formats::Trace*>& earlier) {
  Peers peers;
  peers.Add(step);
  for (const formats::Trace* t : earlier) {
    if (t != nullptr) peers.Add(StepIndex(*t));
  }
  return peers;
}

}  // namespace

std::optional<OverflowCause> FindOverflowCause(const formats::Trace& trace, const OverflowOptions& options,
                                               const std::vector<const formats::Trace*>& earlier) {
  std::optional<FirstOverflow> first = FindFirstOverflow(trace, options);
  if (!first) return std::nullopt;
  const StepIndex step(trace);
  Peers peers = PeersOf(step, earlier);
  return CauseFrom(step, peers, *std::move(first), /*judge_first=*/false);
}

std::optional<OverflowCause> FindCauseOf(const formats::Trace& trace, size_t op_index, uint64_t output,
                                         const std::vector<const formats::Trace*>& earlier) {
  const formats::TensorMeta* meta = op_index < trace.ops.size() ? trace.Find(output) : nullptr;
  if (meta == nullptr) return std::nullopt;
  const StepIndex step(trace);
  Peers peers = PeersOf(step, earlier);
  FirstOverflow start;
  start.op_index = op_index;
  start.op = &trace.ops[op_index];
  start.output = output;
  start.fingerprint = meta->fingerprint;
  return CauseFrom(step, peers, std::move(start), /*judge_first=*/true);
}

void AddUncertainLinks(const llvm::json::Value& imported_step, const formats::Trace& trace, OverflowCause& found) {
  const llvm::json::Object* step = imported_step.getAsObject();
  const llvm::json::Object* dataflow = step ? step->getObject("dataflow") : nullptr;
  const llvm::json::Array* uncertain = dataflow ? dataflow->getArray("uncertain") : nullptr;
  if (uncertain == nullptr) return;
  absl::flat_hash_map<uint64_t, size_t> index_of;  // seq -> op index
  for (size_t i = 0; i < trace.ops.size(); ++i) index_of[trace.ops[i].seq] = i;
  // (consumer seq, tensor id) -> the entry.
  absl::flat_hash_map<std::pair<int64_t, int64_t>, const llvm::json::Object*> by_link;
  for (const llvm::json::Value& v : *uncertain) {
    const llvm::json::Object* o = v.getAsObject();
    if (o == nullptr) continue;
    by_link[std::make_pair(o->getInteger("op").getValueOr(-1), o->getInteger("tensor").getValueOr(-1))] = o;
  }
  for (size_t k = 0; k + 1 < found.chain.size(); ++k) {
    const CauseLink& from = found.chain[k];
    const CauseLink& to = found.chain[k + 1];
    auto it = by_link.find(std::make_pair(static_cast<int64_t>(to.op->seq), static_cast<int64_t>(from.output)));
    if (it == by_link.end()) continue;
    UncertainLink link{from.op_index, to.op_index, std::string(it->second->getString("how").getValueOr("")), {}};
    if (const llvm::json::Array* candidates = it->second->getArray("candidates")) {
      for (const llvm::json::Value& c : *candidates) {
        auto op = index_of.find(static_cast<uint64_t>(c.getAsInteger().getValueOr(-1)));
        if (op != index_of.end()) link.candidates.push_back(op->second);
      }
    }
    found.uncertain.push_back(std::move(link));
  }
}

}  // namespace moerr::analysis
