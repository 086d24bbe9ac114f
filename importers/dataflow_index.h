// The dataflow of an imported step, rebuilt from the values themselves. A
// dump names no tensor: an op's input is some earlier op's output only by
// what the dump says about both (docs/IMPORT.md, "Dataflow"). Bisect's
// cause walk (analysis/overflow_cause.h) follows these links back from the
// first overflow; a link that is not certain is reported as such.
//
// Links, in order of trust:
//  * exact: the input's dtype, shape and content key equal an earlier
//    output's. The content key is the XXH3 of the bytes (tensor dumps) or of
//    the four statistics Max, Min, Mean and Norm (statistics dumps). When
//    outputs of several ops match, the link is ambiguous: it goes to the
//    latest (what a read of the value finds), and the others are kept.
//  * same input: an input equal to an earlier input that no op produced is
//    the same tensor (a weight read twice); its bytes are stored once.
//  * extreme: no output matches, but the input's value of largest magnitude
//    equals, bit for bit, the same extreme of an earlier output of the same
//    dtype: the input is a part of that output (a slice no dumped API made,
//    as Tensor.__getitem__ is not dumped) or holds it (a scatter whose
//    result no entry holds, as Tensor.__setitem__ returns None). The latest
//    such output. Only an extreme with enough significant bits counts (1.0
//    or 0.5 recur by chance).
// A scope's output (an msprobe Module entry, which repeats the output of
// the last API run inside it) is a link target only when no op produced
// the value, so links go to the innermost op.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "formats/dtype.h"

namespace moerr::importers {

// What the dump says identifies a value.
struct ValueKey {
  formats::DType dtype = formats::DType::kF32;
  std::vector<int64_t> shape;
  std::optional<uint64_t> content;  // XXH3 of the bytes or of the statistics; nullopt: unknown
  // The signed value of largest magnitude, when finite, non-zero and with
  // at least kExtremeBits significant bits.
  std::optional<double> extreme;
};

// Significant bits an extreme needs to link by (1.5 has 2, a random float 24).
inline constexpr int kExtremeBits = 5;

// `max` and `min` (the dump's or the bytes'; nullopt when unknown) as the
// extreme of ValueKey: the larger in magnitude, when it qualifies.
std::optional<double> ExtremeOf(std::optional<double> max, std::optional<double> min);

class DataflowIndex {
 public:
  enum class LinkKind : uint8_t { kExact, kAmbiguous, kSameInput, kExtreme };
  struct Link {
    uint64_t id = 0;
    LinkKind kind = LinkKind::kExact;
    // kAmbiguous: the seqs of every op whose output matched, the chosen
    // (latest) last.
    std::vector<uint64_t> candidates;
  };

  void Clear();
  // `id` is an output of op `seq`; `scope`: of a module entry (above).
  void AddOutput(const ValueKey& key, uint64_t id, uint64_t seq, bool scope);
  // `id` is an input no earlier output matched.
  void AddInput(const ValueKey& key, uint64_t id);
  // The earlier value an input with `key` is, if any.
  std::optional<Link> Find(const ValueKey& key) const;

 private:
  using Exact = std::tuple<uint64_t, uint8_t, std::vector<int64_t>>;
  struct Produced {
    uint64_t id, seq;
  };
  // Exact key -> the outputs holding it, in op order.
  absl::flat_hash_map<Exact, std::vector<Produced>> outputs_;
  absl::flat_hash_map<Exact, uint64_t> inputs_;
  // (dtype, bits of the extreme) -> the outputs holding it, in op order.
  absl::flat_hash_map<std::pair<uint8_t, uint64_t>, std::vector<uint64_t>> extremes_;
};

}  // namespace moerr::importers
