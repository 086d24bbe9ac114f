// Elapsed wall time for reports' timings, on the monotonic clock.
#pragma once

#include <chrono>

namespace moerr {

// Seconds from `start` to now.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace moerr
