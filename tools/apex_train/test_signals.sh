#!/usr/bin/env bash
# test_signals.sh APEX_TRAIN: Ctrl-C and SIGTERM with real signals (ctest apex_train_signals).
#  - SIGINT during training: the step in progress finishes, the checkpoint of that step is saved,
#    "interrupted at step N; checkpoint DIR/step-N; add --resume to continue" is printed, exit 130;
#    the log ends at step N; resuming to N+3 gives the same checkpoint bytes as a straight run of N+3;
#  - SIGTERM: the same with exit 143;
#  - without --checkpoint: exit 130 and "nothing saved";
#  - one stop delivered twice at once never kills: `timeout -s INT` (which signals the child, then its
#    process group) five times, and `kill -INT` of the process and then of its group: each saves and
#    exits 130;
#  - on a terminal (test_signals_pty.py): Ctrl-C twice at once is one stop; Ctrl-C again 1.5 s later,
#    inside a step, stops at once with one line and exit 4, and the last checkpoint saved resumes;
#  - --threads past the machine's CPUs is refused in one line.
# Uses the byte-level GPT on Debian's GPL-3 text (always present), so it never skips.
. "$(dirname "$0")/test_lib.sh" "$1"
# A constant lr: the interrupted run (--steps 100000) and the straight one (--steps N+3) end their
# schedules at different steps, and only the stop and the resume are compared here.
G=(--model gpt --threads 2 --batch-size 4 --seq-len 16 --sample-bytes 8 --lr-schedule constant)
# Job control: a background job of a non-interactive shell starts with SIGINT ignored, which
# apex-train (like any program) leaves ignored; with -m the job gets SIGINT as from a terminal.
set -m

# interrupt SIG NAME ARGS...: starts a long run, sends SIG once the log has 3 steps, waits for it.
# Sets rc and leaves NAME.out, NAME.err and NAME.jsonl.
interrupt() {
  local sig=$1 name=$2
  shift 2
  "$BIN" "${G[@]}" --steps 100000 --log "$name.jsonl" "$@" > "$name.out" 2> "$name.err" &
  local pid=$!
  for _ in $(seq 1200); do [ "$({ wc -l < "$name.jsonl"; } 2> /dev/null || echo 0)" -ge 3 ] && break; sleep 0.05; done
  kill "-$sig" $pid
  wait $pid
  rc=$?
}

for sig in INT TERM; do
  want=$([ $sig = INT ] && echo 130 || echo 143)
  interrupt $sig $sig --checkpoint ck$sig
  line=$(grep "interrupted at step" $sig.out)
  n=$(sed -n 's/.*interrupted at step \([0-9]*\);.*/\1/p' <<< "$line")
  last=$(tail -1 $sig.jsonl | sed 's/^{"step":\([0-9]*\),.*/\1/')
  if [ $rc -eq $want ] && [ -n "$n" ] && [ "$line" = "apex-train: interrupted at step $n; checkpoint ck$sig/step-$n; add --resume to continue" ] &&
    [ "$(cat ck$sig/latest)" = "step-$n" ] && [ "$last" = "$n" ]; then
    ok "SIG$sig: exit $rc, saved step $n, log ends at step $n: $line"
  else
    ko "SIG$sig: exit $rc (want $want), line '$line', latest $(cat ck$sig/latest 2> /dev/null), log's last step $last"
    cat $sig.err
  fi
done

# The interrupted run resumes where a straight run would be.
n=$(sed 's/step-//' ckINT/latest)
"$BIN" "${G[@]}" --steps $((n + 3)) --checkpoint ckINT --resume > /dev/null || ko "resume after SIGINT"
"$BIN" "${G[@]}" --steps $((n + 3)) --checkpoint straight > /dev/null || ko "straight run"
same=1
for f in model.safetensors optimizer.bin state.safetensors; do cmp -s ckINT/step-$((n + 3))/$f straight/step-$((n + 3))/$f || same=0; done
[ $same -eq 1 ] && ok "interrupted at $n, resumed to $((n + 3)): the same checkpoint bytes as a straight run" ||
  ko "interrupted and resumed run differs from the straight run"

# The interrupted run's loss curve is drawn beside its log.
[ -s INT.svg ] && grep -q "loss curve INT.svg" INT.out && ok "SIGINT with --log: INT.svg drawn" || ko "SIGINT with --log: no INT.svg: $(cat INT.out)"

interrupt INT nock
[ $rc -eq 130 ] && grep -q "interrupted at step [0-9]*; nothing saved (no --checkpoint)" nock.out &&
  ok "SIGINT without --checkpoint: exit 130, $(grep interrupted nock.out)" || ko "SIGINT without --checkpoint: exit $rc, $(cat nock.out nock.err)"

# One stop delivered twice at once: timeout signals the child and then its process group.
for i in 1 2 3 4 5; do
  timeout --preserve-status -s INT 2 "$BIN" "${G[@]}" --steps 100000 --checkpoint to$i > to$i.out 2> to$i.err
  rc=$?
  n=$(sed -n 's/.*interrupted at step \([0-9]*\);.*/\1/p' to$i.out)
  if [ $rc -eq 130 ] && [ -n "$n" ] && [ "$(cat to$i/latest 2> /dev/null)" = "step-$n" ] && [ -f to$i/step-$n/model.safetensors ]; then
    ok "timeout -s INT, run $i: exit 130, saved step $n"
  else
    ko "timeout -s INT, run $i: exit $rc, latest $(cat to$i/latest 2> /dev/null), $(cat to$i.out to$i.err | tail -3)"
  fi
done
"$BIN" "${G[@]}" --steps 100000 --checkpoint pg --log pg.jsonl > pg.out 2> pg.err &
pid=$!
for _ in $(seq 1200); do [ "$({ wc -l < pg.jsonl; } 2> /dev/null || echo 0)" -ge 3 ] && break; sleep 0.05; done
kill -INT $pid
kill -INT -- -$pid   # set -m: the job is its own process group
wait $pid
rc=$?
n=$(sed -n 's/.*interrupted at step \([0-9]*\);.*/\1/p' pg.out)
[ $rc -eq 130 ] && [ -n "$n" ] && [ "$(cat pg/latest)" = "step-$n" ] && ! grep -q "stopped at once" pg.err &&
  ok "kill -INT of the process, then of its group: one stop, exit 130, saved step $n" || ko "process group: exit $rc, $(cat pg.out pg.err | tail -3)"

# A terminal: Ctrl-C twice at once, and Ctrl-C again after the grace.
if command -v python3 > /dev/null; then
  python3 "$SRC/test_signals_pty.py" "$BIN" || ko "test_signals_pty.py"
  k=$(sed 's/step-//' twice.latest)
  if [ -n "$k" ]; then
    "$BIN" "${G[@]}" --steps $((k + 1)) --checkpoint twice --resume > twice.out 2>&1 && [ "$(cat twice/latest)" = "step-$((k + 1))" ] &&
      ok "stopped at once: the last checkpoint saved (step $k) resumes" || ko "resume after the stop at once: $(cat twice.out)"
  fi
else
  echo "skipped: the pty checks need python3"
fi

bad "--threads past the CPUs" "${G[@]}" --threads 100000 --steps 1
finish
