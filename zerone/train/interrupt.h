// Ctrl-C and kill for a training run: stop cleanly at a step boundary, say what was kept.
//
// Note [Interrupts]: the first SIGINT or SIGTERM records the signal (and says so on stderr) and
// unlinks the run's NVMe swap files (Note [Swap directories]: their data stays reachable through
// the open descriptors, so the step still completes);
// the trainer checks at every step, agrees with the other ranks (the flag rides on the step's loss
// all-reduce, so every rank stops at the same step and none waits in a collective), stops before
// the optimizer step and reports what was kept. A write in progress (a --save) finishes, so it is
// never left half-done. A second signal ends the process at once: the handler removes the
// temporaries of atomic writes in flight (io::remove_temporaries_in_flight), so no ".tmp" or swap
// file is left behind, and exits with 128 + the signal number.
//
// Thread-safety: install once from the main thread; the queries are lock-free.
#pragma once

namespace zerone::train {

// Installs the SIGINT/SIGTERM handlers (idempotent). The previous handlers are restored by
// InterruptGuard's destructor.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};

// The signal number received (SIGINT or SIGTERM), 0 if none.
int interrupt_signal();

// "SIGINT", "SIGTERM".
const char* signal_name(int signal_number);

}  // namespace zerone::train
