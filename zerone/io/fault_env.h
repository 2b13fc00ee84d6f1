// FaultEnv: the test hooks of a run, handed down as an object (leveldb's Env) instead of being read
// from the process environment wherever they act. Production code never calls getenv for them:
// the `zerone` program builds one FaultEnv from ZERONE_* variables at start-up
// (FaultEnv::from_environment) and passes it to the trainer, which passes it to the checkpoint
// writer and the swap I/O. A default-constructed FaultEnv injects nothing.
//
// The hooks (the tests that use them):
//   checkpoint_crash_at / checkpoint_crash_step: Note [Crash points] (io/sharded_checkpoint.cc),
//     ZERONE_CHECKPOINT_CRASH_AT / ZERONE_CHECKPOINT_CRASH_STEP (tests/zero/checkpoint_resume.sh).
//   swap_fault_plan / grad_swap_fault_plan: io::parse_fault_plan specs for the swap I/O
//     (ZERONE_SWAP_FAULT / ZERONE_GRAD_SWAP_FAULT, tests/zero/offload_faults.sh).
//   speculate: "", "memory" or "always" (ZERONE_SPECULATE; Note [Speculative early step]).
//
// Thread-safety: immutable after construction, except crash_point's record of a SIGTERM already
// sent, which is atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace zerone::io {

class FaultEnv {
 public:
  FaultEnv() = default;
  FaultEnv(const FaultEnv& other)
      : checkpoint_crash_at(other.checkpoint_crash_at),
        checkpoint_crash_step(other.checkpoint_crash_step),
        swap_fault_plan(other.swap_fault_plan),
        grad_swap_fault_plan(other.grad_swap_fault_plan),
        speculate(other.speculate) {}
  FaultEnv& operator=(const FaultEnv& other) {
    checkpoint_crash_at = other.checkpoint_crash_at;
    checkpoint_crash_step = other.checkpoint_crash_step;
    swap_fault_plan = other.swap_fault_plan;
    grad_swap_fault_plan = other.grad_swap_fault_plan;
    speculate = other.speculate;
    return *this;
  }

  // Reads the ZERONE_* variables above; for the program's main() only. Throws Error for a value
  // that is not understood (a test that would silently inject nothing).
  static FaultEnv from_environment();
  // The env that injects nothing.
  static const FaultEnv& none();

  std::string checkpoint_crash_at;      // "" none; copy|file|manifest|rename|latest|prune[:TERM]
  int64_t checkpoint_crash_step = -1;   // -1: the first save that passes the point
  std::string swap_fault_plan;
  std::string grad_swap_fault_plan;
  std::string speculate;

  // Note [Crash points]: SIGKILL (or one SIGTERM for "POINT:TERM") when the save of `step` passes
  // `point`; nothing otherwise.
  void crash_point(const char* point, int64_t step) const;

 private:
  mutable std::atomic<bool> terminated_{false};
};

}  // namespace zerone::io
