#include "zerone/core/error.h"

#include <cstdio>
#include <cstdlib>

namespace zerone {

void assert_fail(const char* expr, const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "zerone internal error: %s failed at %s:%d%s%s\n", expr, file, line,
               message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace zerone
