// The process's resident memory as Linux accounts it (/proc/self/status):
// what a memory cap or an OOM killer sees, file-backed pages a mapping
// touched included.
#pragma once

#include <cstdint>

namespace moerr::proxy {

// VmHWM: the peak resident set size so far, in bytes (0 where unreadable).
int64_t PeakResidentBytes();
// VmRSS: the resident set size now, in bytes (0 where unreadable).
int64_t ResidentBytes();

}  // namespace moerr::proxy
