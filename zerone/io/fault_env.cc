#include "zerone/io/fault_env.h"

#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "zerone/core/error.h"

namespace zerone::io {

FaultEnv FaultEnv::from_environment() {
  FaultEnv env;
  auto var = [](const char* name) -> std::string {
    const char* v = std::getenv(name);  // the one place the test hooks are read
    return v == nullptr ? "" : v;
  };
  env.checkpoint_crash_at = var("ZERONE_CHECKPOINT_CRASH_AT");
  if (const std::string step = var("ZERONE_CHECKPOINT_CRASH_STEP"); !step.empty()) {
    int64_t s = 0;
    auto r = std::from_chars(step.data(), step.data() + step.size(), s);
    ZERONE_CHECK(r.ec == std::errc() && r.ptr == step.data() + step.size() && s >= 0,
                 "ZERONE_CHECKPOINT_CRASH_STEP '", step, "': expected a step number");
    env.checkpoint_crash_step = s;
  }
  env.swap_fault_plan = var("ZERONE_SWAP_FAULT");
  env.grad_swap_fault_plan = var("ZERONE_GRAD_SWAP_FAULT");
  env.speculate = var("ZERONE_SPECULATE");
  ZERONE_CHECK(env.speculate.empty() || env.speculate == "memory" || env.speculate == "always",
               "ZERONE_SPECULATE '", env.speculate, "': expected memory or always");
  return env;
}

const FaultEnv& FaultEnv::none() {
  static const FaultEnv env;
  return env;
}

void FaultEnv::crash_point(const char* point, int64_t step) const {
  if (checkpoint_crash_at.empty() || (checkpoint_crash_step >= 0 && checkpoint_crash_step != step)) return;
  const size_t n = std::strlen(point);
  if (checkpoint_crash_at == point) ::raise(SIGKILL);
  if (checkpoint_crash_at.compare(0, n, point) == 0 && checkpoint_crash_at.substr(n) == ":TERM" &&
      !terminated_.exchange(true))
    ::raise(SIGTERM);
}

}  // namespace zerone::io
