// MOERR_CHECK: the bug tier of the error model. On in every build type; a
// failed check prints file, line, the condition and the streamed context, then
// aborts. Never use it for bad input: that is an absl::Status.
#pragma once

#include <sstream>

namespace moerr::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `MOERR_CHECK(c) << x` be a void expression in the ternary below.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace moerr::internal

#define MOERR_CHECK(condition)                 \
  (condition) ? (void)0                        \
              : ::moerr::internal::Voidify() & \
                    ::moerr::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()
