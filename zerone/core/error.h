// Errors, following c10: two distinct checks.
//
//  - User errors (bad config, flag, data file, checkpoint): ZERONE_CHECK(cond, parts...) throws
//    zerone::Error whose message names what was wrong and what was expected. Callers at the tool
//    boundary catch it, print it once and exit non-zero. The library never calls exit().
//  - Internal invariants (a bug in zerone): ZERONE_ASSERT(cond, parts...) prints the expression,
//    file and line and aborts. Always on, also in release builds.
//
// Thread-safety: all functions here are safe to call from any thread.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace zerone {

// Thrown for bad user input. what() is a complete, human-readable sentence.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Parts>
std::string str_cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Prints "internal error: <expr> at file:line: <message>" to stderr and aborts.
[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& message);

}  // namespace zerone

#define ZERONE_CHECK(cond, ...)                                       \
  do {                                                                \
    if (!(cond)) throw ::zerone::Error(::zerone::str_cat(__VA_ARGS__)); \
  } while (0)

#define ZERONE_ASSERT(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond)) ::zerone::assert_fail(#cond, __FILE__, __LINE__, ::zerone::str_cat("" __VA_OPT__(,) __VA_ARGS__)); \
  } while (0)
