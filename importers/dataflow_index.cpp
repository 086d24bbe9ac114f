#include "importers/dataflow_index.h"

#include <cmath>
#include <cstring>

namespace moerr::importers {
namespace {

// The bits from the leading to the trailing one of `v`'s significand
// (1.0: 1, 1.5: 2, a random double: about 53).
int SignificantBits(double v) {
  int exponent = 0;
  double m = std::frexp(std::abs(v), &exponent);  // in [0.5, 1)
  int bits = 0;
  while (m != 0 && bits < 64) {
    m = m * 2 - std::floor(m * 2);
    ++bits;
  }
  return bits;
}

uint64_t Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

}  // namespace

std::optional<double> ExtremeOf(std::optional<double> max, std::optional<double> min) {
  if (!max || !min || std::isnan(*max) || std::isnan(*min)) return std::nullopt;
  const double e = std::abs(*max) >= std::abs(*min) ? *max : *min;
  if (!std::isfinite(e) || e == 0 || SignificantBits(e) < kExtremeBits) return std::nullopt;
  return e;
}

void DataflowIndex::Clear() {
  outputs_.clear();
  inputs_.clear();
  extremes_.clear();
}

void DataflowIndex::AddOutput(const ValueKey& key, uint64_t id, uint64_t seq, bool scope) {
  if (key.content) {
    std::vector<Produced>& at = outputs_[Exact{*key.content, static_cast<uint8_t>(key.dtype), key.shape}];
    if (!scope || at.empty()) at.push_back(Produced{id, seq});
  }
  if (key.extreme) {
    std::vector<uint64_t>& at = extremes_[{static_cast<uint8_t>(key.dtype), Bits(*key.extreme)}];
    if (!scope || at.empty()) at.push_back(id);
  }
}

void DataflowIndex::AddInput(const ValueKey& key, uint64_t id) {
  if (key.content) inputs_.emplace(Exact{*key.content, static_cast<uint8_t>(key.dtype), key.shape}, id);
}

std::optional<DataflowIndex::Link> DataflowIndex::Find(const ValueKey& key) const {
  if (key.content) {
    const Exact exact{*key.content, static_cast<uint8_t>(key.dtype), key.shape};
    if (auto it = outputs_.find(exact); it != outputs_.end()) {
      Link link{it->second.back().id, LinkKind::kExact, {}};
      if (it->second.size() > 1) {
        link.kind = LinkKind::kAmbiguous;
        for (const Produced& p : it->second) link.candidates.push_back(p.seq);
      }
      return link;
    }
    if (auto it = inputs_.find(exact); it != inputs_.end()) return Link{it->second, LinkKind::kSameInput, {}};
  }
  if (key.extreme) {
    auto it = extremes_.find({static_cast<uint8_t>(key.dtype), Bits(*key.extreme)});
    if (it != extremes_.end()) {
      return Link{it->second.back(), LinkKind::kExtreme, {}};
    }
  }
  return std::nullopt;
}

}  // namespace moerr::importers
