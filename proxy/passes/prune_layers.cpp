// prune-layers: drop one decoder layer, the last first, never the layer the
// failure is in or the last one left; later layers move down one index, with
// their weights, Adam moments, routing and sliding-window flag.
#include <regex>

#include "absl/strings/str_format.h"
#include "proxy/passes/reduce_pass.h"

namespace moerr::proxy {
namespace {

// "PREFIX/model.layers.N.REST" with N > dropped renumbered; N == dropped: nullopt.
std::optional<std::string> Renumber(const std::string& name, int64_t dropped) {
  static const std::regex re(R"(^(.*model\.layers\.)(\d+)(\..*)$)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return name;
  const int64_t layer = std::stoll(m[2]);
  if (layer == dropped) return std::nullopt;
  return absl::StrFormat("%s%d%s", m[1].str(), layer > dropped ? layer - 1 : layer, m[3].str());
}

class PruneLayers : public ReducePass {
 public:
  absl::string_view name() const override { return "prune-layers"; }

  std::vector<Candidate> Propose(const StepBundle& current) const override {
    std::vector<Candidate> out;
    const moe::MoeConfig& c = current.config;
    // Dropping a layer would shift a moe_layer_freq / decoder_sparse_step pattern.
    if (!c.MoeLayersAreASuffix()) return out;
    for (int64_t drop = c.num_layers - 1; drop >= 0 && c.num_layers > 1; --drop) {
      bool failing = false;
      for (const auto& [layer, expert] : current.implicated) failing = failing || layer == drop;
      const bool last_moe = c.IsMoeLayer(drop) && c.num_layers - c.first_k_dense == 1;
      if (failing || last_moe) continue;
      Candidate cand{current, absl::StrFormat("decoder layers %d -> %d (layer %d)", c.num_layers, c.num_layers - 1, drop)};
      StepBundle& b = cand.bundle;
      b.config.num_layers -= 1;
      if (drop < c.first_k_dense) b.config.first_k_dense -= 1;
      // One window flag per layer: the later layers keep their own.
      if (!c.sliding_layers.empty()) b.config.sliding_layers.erase(b.config.sliding_layers.begin() + drop);
      b.state = MapTrainerState(current.state, [&](const std::string& name, const at::Tensor& t) {
        std::optional<std::pair<std::string, at::Tensor>> out;
        if (auto renamed = Renumber(name, drop)) out.emplace(*renamed, t);
        return out;
      });
      b.routing.clear();
      for (const RoutingEntry& r : current.routing) {
        if (r.layer == drop) continue;
        b.routing.push_back(r);
        if (r.layer > drop) b.routing.back().layer -= 1;
      }
      for (auto& [layer, expert] : b.implicated) layer -= layer > drop ? 1 : 0;
      out.push_back(std::move(cand));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<ReducePass> MakePruneLayersPass() { return std::make_unique<PruneLayers>(); }

}  // namespace moerr::proxy
