#include "zerone/train/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "zerone/io/aio.h"
#include "zerone/io/file.h"

namespace zerone::train {
namespace {

std::atomic<int> g_signal{0};
std::atomic<const char*> g_stopping{"stopping at the next step boundary"};
struct sigaction g_previous_int, g_previous_term, g_previous_hup, g_previous_pipe;

void write_stderr(const char* text) {
  ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void on_signal(int signal_number) {
  int expected = 0;
  // Swap files go at once (Note [Swap directories]): the run keeps their data through its open
  // descriptors, and a SIGKILL that may follow (mpiexec ending a failed job) leaves nothing behind.
  io::remove_swap_directories_in_flight();
  if (g_signal.compare_exchange_strong(expected, signal_number)) {
    write_stderr(signal_number == SIGINT ? "\nzerone: SIGINT: " : signal_number == SIGHUP ? "\nzerone: SIGHUP: " : "\nzerone: SIGTERM: ");
    write_stderr(g_stopping.load());
    write_stderr(" (again to stop at once)\n");
    return;
  }
  io::remove_temporaries_in_flight();
  write_stderr("\nzerone: stopped at once by a second signal; files being written and swap files were removed\n");
  ::_exit(128 + signal_number);
}

}  // namespace

InterruptGuard::InterruptGuard(const char* stopping) {
  g_signal = 0;
  g_stopping = stopping;
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, &g_previous_int);
  ::sigaction(SIGTERM, &action, &g_previous_term);
  ::sigaction(SIGHUP, &action, &g_previous_hup);
  struct sigaction ignore;
  std::memset(&ignore, 0, sizeof ignore);
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &g_previous_pipe);
}

InterruptGuard::~InterruptGuard() {
  ::sigaction(SIGINT, &g_previous_int, nullptr);
  ::sigaction(SIGTERM, &g_previous_term, nullptr);
  ::sigaction(SIGHUP, &g_previous_hup, nullptr);
  ::sigaction(SIGPIPE, &g_previous_pipe, nullptr);
}

Interrupted::Interrupted(int signal_number)
    : Error(str_cat("stopped by ", signal_name(signal_number), " during start-up, before the first step: nothing ",
                    "was trained or written")),
      signal_(signal_number) {}

void throw_if_interrupted() {
  if (int sig = interrupt_signal(); sig != 0) throw Interrupted(sig);
}

int interrupt_signal() { return g_signal.load(); }

const char* signal_name(int signal_number) {
  return signal_number == SIGINT ? "SIGINT" : signal_number == SIGTERM ? "SIGTERM" : signal_number == SIGHUP ? "SIGHUP" : "a signal";
}

}  // namespace zerone::train
