/* signals.c: a stop request from SIGINT or SIGTERM, honoured between steps (signals.h). */
#define _POSIX_C_SOURCE 200809L
#include "signals.h"

#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t pending;
static struct timespec first_at; /* when the first signal was handled */
static int quiet_;
static const int handled[] = {SIGINT, SIGTERM};
#define NHANDLED (sizeof handled / sizeof handled[0])

static void say(const char *msg, size_t n) {
  if (quiet_) return;
  ssize_t w = write(STDERR_FILENO, msg, n);
  (void)w;
}

static void on_signal(int sig) {
  /* Only async-signal-safe calls here: the flag, clock_gettime, write(2) and _exit. */
  static const char ack[] = "\napex-train: stopping after this step (press Ctrl-C again to stop at once)\n";
  static const char now[] = "\napex-train: stopped at once by a second signal; this step is not saved (the last checkpoint saved is intact)\n";
  if (!pending) {
    clock_gettime(CLOCK_MONOTONIC, &first_at);
    pending = sig;
    say(ack, sizeof ack - 1);
    return;
  }
  /* One stop often arrives twice within microseconds: timeout(1) signals its child and then the
   * child's process group, a terminal signals the whole foreground group, mpirun relays. Only a
   * signal after the grace is a person asking again. */
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  double since = (double)(t.tv_sec - first_at.tv_sec) + 1e-9 * (double)(t.tv_nsec - first_at.tv_nsec);
  if (since < SIGNALS_GRACE_S) return;
  say(now, sizeof now - 1);
  _exit(SIGNALS_EXIT_AT_ONCE);
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
    /* Both signals blocked while either is handled, so that the handler never runs twice at once.
     * SA_RESTART: a write or read in progress goes on instead of failing with EINTR. */
    sigemptyset(&sa.sa_mask);
    for (size_t j = 0; j < NHANDLED; j++) sigaddset(&sa.sa_mask, handled[j]);
    sa.sa_flags = SA_RESTART;
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
