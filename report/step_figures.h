// The figures of a report, from recorded data: a step's per-op headroom
// with its first overflow, its expert load per layer, a proxy's cluster map
// and metric trajectories of two runs. Each returns inline SVG.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/first_overflow.h"
#include "formats/trace.h"

namespace moerr::report {

// Per op (x: execution order) the least headroom of its floating outputs in
// bits, log2(max / |max|), each against its own dtype's largest value (an
// fp32 output against fp32's); integer and bool outputs have none. Forward
// and backward ops apart, each dot's details on hover. `first`, the step's
// first overflow (analysis::FindFirstOverflow; nullptr when it has none), is
// marked. Each of `would_fit` (kF16, kBF16) overlays the same ops against
// that format's range: would they fit if held in it?
std::string HeadroomFigure(const formats::Trace& trace, const analysis::FirstOverflow* first,
                           const std::vector<formats::DType>& would_fit = {});

// Layers x experts: each expert's share of the layer's routed slots, as a
// multiple of the fair share 1/E. Empty when the step has no routing.
std::string ExpertLoadFigure(const formats::Trace& trace);

// A proxy's experts per layer: the colour is the kept expert (cluster) an
// original expert maps to; kept experts read "K", forced keeps "F".
struct ClusterLayer {
  int64_t layer = 0;
  std::vector<int64_t> medoid_of;  // per original expert: the kept expert it maps to
  std::vector<int64_t> forced;     // forced keeps
};
std::string ClusterMapFigure(const std::vector<ClusterLayer>& layers);

// One metric over steps, two runs (or one: `b` empty); non-finite values
// leave gaps.
std::string TrajectoryFigure(const std::string& metric, const std::string& a_name, const std::vector<double>& a,
                             const std::string& b_name, const std::vector<double>& b);

}  // namespace moerr::report
