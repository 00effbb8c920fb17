/* signals.c: a stop request from SIGINT or SIGTERM, honoured between steps (signals.h). */
#define _POSIX_C_SOURCE 200809L
#include "signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t pending;
static int quiet_;
static const int handled[] = {SIGINT, SIGTERM};
#define NHANDLED (sizeof handled / sizeof handled[0])

static void on_signal(int sig) {
  /* Only async-signal-safe calls here: the flag and write(2). */
  static const char msg[] = "\napex-train: stopping after this step (send the signal again to stop at once)\n";
  if (!pending) pending = sig;
  if (quiet_) return;
  ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)w;
}

int signals_install(int quiet) {
  quiet_ = quiet;
  for (size_t i = 0; i < NHANDLED; i++) {
    struct sigaction old;
    if (sigaction(handled[i], NULL, &old) != 0) return 1;
    if (old.sa_handler == SIG_IGN) continue;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    /* SA_RESETHAND: the second signal finds the default action. SA_RESTART: a write or read in
     * progress goes on instead of failing with EINTR. */
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    if (sigaction(handled[i], &sa, NULL) != 0) return 1;
  }
  return 0;
}

int signals_pending(void) { return (int)pending; }

void signals_restore(void) {
  for (size_t i = 0; i < NHANDLED; i++) {
    struct sigaction old;
    if (sigaction(handled[i], NULL, &old) == 0 && old.sa_handler == on_signal) signal(handled[i], SIG_DFL);
  }
}

int signals_exit_status(int sig) { return 128 + sig; }
