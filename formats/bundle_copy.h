// Copies what one bundle holds into another being written: the anomaly
// ring's steps into the recording's bundle (recorder.h), and a killed run's
// ring into its salvaged bundle (salvage.h).
#pragma once

#include "absl/status/status.h"
#include "formats/bundle_reader.h"
#include "formats/bundle_writer.h"

namespace moerr::formats {

// Appends every record of `from` to `to`, in file order: its step markers,
// annotations, ops and routing, and its tensors (stored again, deduplicated
// against what `to` holds) right after its first stepBegin (or first, when
// it has none). A stepEnd ends the step in `to` as well (EndStep).
absl::Status CopyBundle(const BundleReader& from, BundleWriter& to);

}  // namespace moerr::formats
