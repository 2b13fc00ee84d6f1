// Ctrl-C and kill for a training run: stop cleanly at a step boundary, say what was kept.
//
// Note [Interrupts]: the first SIGINT, SIGTERM or SIGHUP (a closed terminal or ssh session)
// records the signal (and says so on stderr) and unlinks the run's NVMe swap files (Note [Swap
// directories]: their data stays reachable through the open descriptors, so the step still completes);
// the trainer checks at every step, agrees with the other ranks (the flag rides on the step's loss
// all-reduce, so every rank stops at the same step and none waits in a collective), stops before
// the optimizer step and reports what was kept. A write in progress (a --save) finishes, so it is
// never left half-done. A second signal ends the process at once: the handler removes the
// temporaries of atomic writes in flight (io::remove_temporaries_in_flight), so no ".tmp" or swap
// file is left behind, and exits with 128 + the signal number. A signal during start-up (before the
// first step) stops there (Interrupted). SIGPIPE is ignored while training, so `zerone train | head -1`
// loses only the output, not the run, its metrics or its --save.
//
// Thread-safety: install once from the main thread; the queries are lock-free.
#pragma once

#include "zerone/core/error.h"

namespace zerone::train {

// Installs the SIGINT/SIGTERM/SIGHUP handlers and ignores SIGPIPE. The previous dispositions are
// restored by InterruptGuard's destructor.
class InterruptGuard {
 public:
  // `stopping`: what the first signal's notice says happens next (a string literal, it must
  // outlive the guard), e.g. "stopping at the next step boundary".
  explicit InterruptGuard(const char* stopping = "stopping at the next step boundary");
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};

// The signal number received (SIGINT, SIGTERM or SIGHUP), 0 if none.
int interrupt_signal();

// "SIGINT", "SIGTERM", "SIGHUP".
const char* signal_name(int signal_number);

// Thrown when a signal stops the run before its first step; the program exits 128 + signal.
class Interrupted : public Error {
 public:
  explicit Interrupted(int signal_number);
  int signal_number() const { return signal_; }

 private:
  int signal_;
};

// Throws Interrupted if a signal has arrived (for start-up phases: materializing, scanning data).
void throw_if_interrupted();

}  // namespace zerone::train
