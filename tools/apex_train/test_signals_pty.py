#!/usr/bin/env python3
"""test_signals_pty.py APEX_TRAIN: Ctrl-C typed on a terminal (a pty), for test_signals.sh.

 - twice within the grace (a terminal signals the whole foreground group; a hasty double press):
   one stop, the step saved, exit 130;
 - twice, the second 1.5 s after the first while the run is busy inside a step: the second stops at
   once with its one line and exit 4, and the last checkpoint saved stays intact (test_signals.sh
   resumes from it). The run is kept inside a step by its --log: a FIFO with a one-page buffer that
   this script stops reading, so that the log's write blocks until the process ends.
Prints ok/FAIL lines; exit 1 on any failure. Run in a scratch directory."""
import fcntl, os, pty, select, sys, termios, time, struct

BIN = sys.argv[1]
G = ["--model", "gpt", "--threads", "2", "--batch-size", "4", "--seq-len", "16", "--sample-bytes", "8", "--lr-schedule", "constant"]
fails = 0


def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    fails += not cond


def start(name, extra):
    fifo = name + ".fifo"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    fcntl.fcntl(rfd, 1031, 4096)  # F_SETPIPE_SZ: one page, so that a stalled reader stalls the writer soon
    pid, master = pty.fork()
    if pid == 0:
        os.execv(BIN, [BIN] + G + ["--steps", "100000", "--checkpoint", name, "--log", fifo] + extra)
    return pid, master, rfd


def pump(master, rfd, out, log, read_log=True, seconds=0.05):
    """Reads what the terminal and (if read_log) the log have, for about `seconds`."""
    end = time.monotonic() + seconds
    while True:
        fds = [master] + ([rfd] if read_log else [])
        r, _, _ = select.select(fds, [], [], max(0.0, end - time.monotonic()))
        for fd in r:
            try:
                b = os.read(fd, 65536)
            except OSError:  # the pty's slave side closed: the process ended
                b = b""
            (out if fd == master else log).extend(b)
        if time.monotonic() >= end:
            return


def log_steps(log):
    return log.count(b"\n")


def wait_exit(pid, master, rfd, out, log, read_log=True, limit=60):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            pump(master, rfd, out, log, read_log, 0.1)
            return os.waitstatus_to_exitcode(status)
        pump(master, rfd, out, log, read_log, 0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def ctrl_c(master):
    os.write(master, bytes([termios.tcgetattr(master)[6][termios.VINTR][0]]))


# ---- twice at once: one stop, saved ------------------------------------------------------------------
pid, master, rfd = start("hasty", [])
out, log = bytearray(), bytearray()
t0 = time.monotonic()
while log_steps(log) < 3 and time.monotonic() - t0 < 60:
    pump(master, rfd, out, log)
ctrl_c(master)
ctrl_c(master)
rc = wait_exit(pid, master, rfd, out, log)
text = out.decode(errors="replace")
latest = open("hasty/latest").read().strip() if os.path.exists("hasty/latest") else None
saved = [l for l in text.splitlines() if "interrupted at step" in l]
check(rc == 130 and saved and latest and ("checkpoint hasty/" + latest) in saved[0] and "stopped at once" not in text,
      "Ctrl-C twice at once on a terminal: exit %s, one stop, latest %s: %s" % (rc, latest, saved[0].strip() if saved else text[-300:]))

# ---- twice, 1.5 s apart, while a step is in progress: stopped at once, the last save intact -------------
pid, master, rfd = start("twice", ["--save-every", "2"])
out, log = bytearray(), bytearray()
t0 = time.monotonic()
while log_steps(log) < 5 and time.monotonic() - t0 < 60:
    pump(master, rfd, out, log)
# Stop reading the log; once the pipe's page is full the run waits inside a step's report.
last, still = -1, 0
while still < 10 and time.monotonic() - t0 < 60:
    pump(master, rfd, out, log, read_log=False, seconds=0.1)
    n = struct.unpack("i", fcntl.ioctl(rfd, termios.FIONREAD, b"\0\0\0\0"))[0]
    still = still + 1 if n == last else 0
    last = n
before = open("twice/latest").read().strip() if os.path.exists("twice/latest") else None
ctrl_c(master)
pump(master, rfd, out, log, read_log=False, seconds=1.5)
acked = "stopping after this step" in out.decode(errors="replace")
ctrl_c(master)
rc = wait_exit(pid, master, rfd, out, log, read_log=False)
text = out.decode(errors="replace")
after = open("twice/latest").read().strip() if os.path.exists("twice/latest") else None
line = [l.strip() for l in text.splitlines() if "stopped at once" in l]
check(acked and rc == 4 and line and before and before == after and all(
    os.path.exists("twice/%s/%s" % (after, f)) for f in ("model.safetensors", "optimizer.bin", "state.safetensors")),
      "Ctrl-C, then again 1.5 s later inside a step: exit %s, '%s', latest %s before and %s after" %
      (rc, line[0] if line else text[-300:], before, after))
print(after or "", file=open("twice.latest", "w"))
sys.exit(1 if fails else 0)
