// The page of a multi-rank run (`moerr report RUN`): how each rank's step
// ended, where the overflow began and how it spread, a rank x op strip of
// headroom showing where the first overflow appears on each rank, what each
// rank's experts received, any transfer the ranks disagree on, and per
// process group the collective order (analysis/collective_order.h), with a
// ranks x sequence-number strip where it broke.
#pragma once

#include "absl/status/status.h"
#include "analysis/collective_order.h"
#include "formats/world_run.h"
#include "support/html_page.h"

namespace moerr::report {

absl::Status AddWorldSection(HtmlPage& page, const formats::WorldStep& world);

// The rank x op strip: one row per rank, its ops in `bins` columns of equal
// op counts, each coloured by the least headroom of its outputs (finite,
// under 4 bits, not finite), the bin of the rank's first overflow marked.
std::string RankStripFigure(const formats::WorldStep& world, int bins = 48);

// The ranks x sequence-number strip of one group (its OrderStrip): each
// cell coloured by the rank's call there (completed, started, scheduled,
// no entry, another kind, other sizes), the first disagreement's column
// outlined; a missing rank's row is blank.
std::string CollectiveOrderFigure(const analysis::GroupOrder& g);

}  // namespace moerr::report
