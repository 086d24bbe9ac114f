#include "proxy/resident_memory.h"

#include <cstdio>
#include <cstring>

namespace moerr::proxy {
namespace {

// The "KEY:   N kB" line of /proc/self/status, in bytes.
int64_t StatusBytes(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  int64_t kb = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') {
      long long v = 0;
      if (std::sscanf(line + n + 1, "%lld", &v) == 1) kb = v;
      break;
    }
  }
  std::fclose(f);
  return kb * 1024;
}

}  // namespace

int64_t PeakResidentBytes() { return StatusBytes("VmHWM"); }
int64_t ResidentBytes() { return StatusBytes("VmRSS"); }

}  // namespace moerr::proxy
