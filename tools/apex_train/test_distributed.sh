#!/usr/bin/env bash
# test_distributed.sh APEX_TRAIN: apex-train --distributed on 2 MPI ranks (ctest apex_train_distributed).
#  - refusals, each one apex-train line on stderr, a non-zero exit and no file written: --distributed
#    outside mpirun, mpirun without --distributed, --sync-bn without --distributed or on a model
#    without batch norm, resuming a 2-rank checkpoint in one process or a 1-process one on 2 ranks
#    (the global batch, ranks x --batch-size, is named);
#  - a 2-rank run ends with every rank's training state identical (apex-train compares hashes of the
#    weights, masters, optimizer and amp state over the ranks) and prints progress, the test
#    accuracy and the checkpoint once (rank 0 only);
#  - bitwise resume: 20 steps straight = 10 steps, a new 2-rank job in which every rank restores the
#    checkpoint, and 10 more (losses in the logs and every checkpoint file, compared with cmp);
#  - the CNN with --sync-bn at O2 runs and ends identical on both ranks;
#  - SIGTERM or SIGINT sent to mpirun alone (which passes SIGTERM to every rank): the ranks stop after
#    the same step, rank 0 saves it and says so once, mpirun exits 1, and the checkpoint resumes.
# Skips (77) with the reason when mpirun or Fashion-MNIST is absent or apex was built without MPI,
# after the checks that need neither pass.
. "$(dirname "$0")/test_lib.sh" "$1"
FM=${APEX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
# Open MPI refuses root and more ranks than cores unless told; one thread per rank on a small machine.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
# Open MPI's initialisation leaks by design: LeakSanitizer stays off under mpirun only.
mpi() { ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" mpirun -np "$@"; }

bad_run "--distributed outside mpirun" "$BIN" --distributed --model mlp --steps 1
bad_run "--sync-bn without --distributed" "$BIN" --sync-bn --model cnn --steps 1
command -v mpirun > /dev/null 2>&1 || skip "mpirun is not on PATH (Debian: apt-get install openmpi-bin)"
nompi=$("$BIN" --distributed --steps 1 2>&1 || true)   # whole, then grep: no SIGPIPE under pipefail
grep -q "has no MPI" <<< "$nompi" && skip "this apex-train was built without MPI (APEX_MPI=OFF)"
[ -f "$FM/train-images-idx3-ubyte.gz" ] || skip "Fashion-MNIST not found in $FM (Debian: apt-get install dataset-fashion-mnist)"

A=(--data "$FM" --model mlp --batch-size 16)
bad_run "mpirun without --distributed" mpi 2 "$BIN" "${A[@]}" --steps 2
bad_run "--sync-bn on a model without batch norm" mpi 2 "$BIN" "${A[@]}" --distributed --sync-bn --steps 2
bad_run "a bad flag, reported once" mpi 2 "$BIN" "${A[@]}" --distributed --opt-level O7

# ---- a run, and bitwise resume with every rank restoring -----------------------------------------------
mpi 2 "$BIN" "${A[@]}" --distributed --steps 20 --save-every 10 --checkpoint s --log s.jsonl > s.out 2> s.err || { ko "2-rank run"; cat s.err; }
for what in "training state identical on all 2 ranks" "test accuracy" "checkpoint s/step-20" "per rank x 2 ranks"; do
  [ "$(grep -c "$what" s.out)" = 1 ] || ko "'$what' printed $(grep -c "$what" s.out) times (rank 0 only should print)"
done
[ "$(wc -l < s.jsonl)" = 20 ] && ok "2-rank run: identical states, one report, one 20-line log" || ko "log has $(wc -l < s.jsonl) lines"
from_step s r 10
mpi 2 "$BIN" "${A[@]}" --distributed --steps 20 --checkpoint r --log r2.jsonl --resume > r2.out 2> r.err || { ko "resumed half"; cat r.err; }
a=$(sed -n '11,20p' s.jsonl | sed 's/,"samples_per_s.*//')
b=$(sed 's/,"samples_per_s.*//' r2.jsonl)
same=1
for f in model.safetensors optimizer.bin state.safetensors; do cmp -s s/step-20/$f r/step-20/$f || same=0; done
if [ "$a" = "$b" ] && [ -n "$a" ] && [ $same -eq 1 ] && grep -q "identical on all 2 ranks" r2.out; then
  ok "2 ranks: 20 straight steps, resumed from their step 10 on every rank, bit for bit (losses, weights, optimizer, state)"
else
  ko "2 ranks: resume differs"; diff <(echo "$a") <(echo "$b") | head -5
fi

# ---- the world size is part of the checkpoint's identity ------------------------------------------------
bad_run "resume a 2-rank checkpoint in one process" "$BIN" "${A[@]}" --steps 30 --checkpoint s --resume
"$BIN" "${A[@]}" --steps 2 --checkpoint one > /dev/null || ko "one-process run"
bad_run "resume a 1-process checkpoint on 2 ranks" mpi 2 "$BIN" "${A[@]}" --distributed --steps 4 --checkpoint one --resume

# ---- the CNN with SyncBatchNorm at O2 ---------------------------------------------------------------------
mpi 2 "$BIN" --data "$FM" --model cnn --batch-size 8 --opt-level O2 --distributed --sync-bn --steps 6 > c.out 2> c.err &&
  grep -q "identical on all 2 ranks" c.out && grep -q "SyncBatchNorm" c.out && grep -q "test accuracy" c.out &&
  ok "cnn --sync-bn O2 on 2 ranks: identical states" || { ko "cnn --sync-bn"; cat c.out c.err; }

# ---- a stop sent to mpirun alone ------------------------------------------------------------------------
set -m # the job gets SIGINT (a background job of a non-interactive shell would ignore it)
for sig in TERM INT; do
  # mpirun itself, not the mpi function (whose $! would be a subshell)
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" mpirun -np 2 "$BIN" "${A[@]}" --distributed --epochs 1000 --checkpoint m$sig \
    --log m$sig.jsonl > m$sig.out 2> m$sig.err &
  pid=$!
  for _ in $(seq 1200); do [ "$({ wc -l < m$sig.jsonl; } 2> /dev/null || echo 0)" -ge 3 ] && break; sleep 0.05; done
  kill -$sig $pid
  wait $pid
  rc=$?
  n=$(sed -n 's/.*interrupted at step \([0-9]*\);.*/\1/p' m$sig.out)
  last=$(tail -1 m$sig.jsonl | sed 's/^{"step":\([0-9]*\),.*/\1/')
  if [ $rc -eq 1 ] && [ -n "$n" ] && [ "$(grep -c "interrupted at step" m$sig.out)" = 1 ] && [ "$(cat m$sig/latest)" = "step-$n" ] &&
    [ "$last" = "$n" ] && mpi 2 "$BIN" "${A[@]}" --distributed --epochs 1000 --steps $((n + 2)) --checkpoint m$sig --resume > m$sig.r 2>&1 &&
    grep -q "identical on all 2 ranks" m$sig.r; then
    ok "SIG$sig to mpirun: both ranks stopped at step $n, saved once, mpirun exit $rc; resumed on 2 ranks"
  else
    ko "SIG$sig to mpirun: exit $rc, step '$n', latest $(cat m$sig/latest 2> /dev/null), log's last $last"; tail -n 3 m$sig.out m$sig.err
  fi
done
set +m

finish
