// Counting what a rendered page or plot contains (page, plot, report and diff tests).
#pragma once

#include <cstddef>
#include <string>

namespace moerr::testing {

// Occurrences of `what` in `s`, overlapping ones included.
inline size_t Occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace moerr::testing
