// What an msprobe statistics entry says about a tensor, as a moerr
// fingerprint: the fields the dump determines exactly, and the others marked
// unknown (formats::Fingerprint::unknown), never invented. docs/IMPORT.md
// gives the derivation of each field.
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/dtype.h"
#include "formats/trace.h"
#include "importers/msprobe_dump.h"

namespace moerr::importers {

// "torch.float32", "torch.bfloat16", "Float16" (MindSpore), "float32" (numpy)
// ...; nullopt for a dtype moerr does not store (complex, float8, uint16...).
std::optional<formats::DType> DTypeFromDumpName(absl::string_view name);

// The fingerprint of a tensor of `dtype` and `numel` elements from its
// Max, Min, Mean, Norm (and Max_except_inf_nan, Min_except_inf_nan). The hash
// is always unknown: a dump's CRC-32 is not the XXH3 of the bytes.
formats::Fingerprint FingerprintFromStats(const DumpValue& value, formats::DType dtype, uint64_t numel);

// The nan_check task's flag (DumpEntry::is_nan) on an output of `entry`:
// where it is set, a floating output whose fingerprint says finite counts as
// holding a NaN, a lower bound of 1 with the count unknown, since the flag
// does not say which output holds it.
void ApplyNanCheck(const DumpEntry& entry, formats::DType dtype, formats::Fingerprint& f);

}  // namespace moerr::importers
