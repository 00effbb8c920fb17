#!/usr/bin/env bash
# test_zero.sh APEX_TRAIN: apex-train --distributed --zero (ctest apex_train_zero), the GPT on its
# default text file, against the unsharded (DDP) run of the same flags in the same test:
#  - refusals, each one apex-train line: --zero without --distributed, --zero 3, --zero with O3;
#  - --zero 2 on 2 ranks at O2 (f16, dynamic loss scale, clipping) and --zero 1 on 3 ranks (LAMB, O1)
#    train to the unsharded run's losses and checkpoint files, bit for bit (every line of the logs
#    but the timings, and model.safetensors, optimizer.bin, state.safetensors compared with cmp);
#  - an unsharded checkpoint resumed with --zero 2 and a --zero 2 checkpoint resumed without --zero
#    both end where 10 straight unsharded steps end (the files are one format);
#  - resume at another number of ranks: a 2-rank --zero 2 checkpoint (2 x 6 sequences) resumed with
#    --zero 2 on 3 ranks (x 4) and on 1 (x 12) ends where the unsharded run resumed the same way ends,
#    bit for bit; another global batch is refused in one line naming the --batch-size to give;
#  - the progress line names the optimizer state each rank holds;
#  - a --zero 2 checkpoint of 2 ranks evaluates in one process (--eval-only loads at any world size);
#  - the CNN with --sync-bn at O2 (f16 and f32 parameters) matches too, where Fashion-MNIST is installed.
# Skips (77) with the reason when mpirun is absent or apex was built without MPI.
. "$(dirname "$0")/test_lib.sh" "$1"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
mpi() { ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" mpirun -np "$@"; }

G=(--model gpt --epochs 1 --batch-size 4 --seq-len 32)
bad "--zero without --distributed" "${G[@]}" --zero 2 --steps 2
bad "--zero 3" "${G[@]}" --zero 3 --steps 2
command -v mpirun > /dev/null 2>&1 || skip "mpirun is not on PATH (Debian: apt-get install openmpi-bin)"
nompi=$("$BIN" --distributed --steps 1 2>&1 || true)
grep -q "has no MPI" <<< "$nompi" && skip "this apex-train was built without MPI (APEX_MPI=OFF)"
mpi 2 "$BIN" "${G[@]}" --distributed --zero 1 --opt-level O3 --steps 2 > o3.out 2> o3.err
[ $? -ne 0 ] && [ "$(grep -c '^apex-train:' o3.err)" = 1 ] && ok "--zero with O3: $(grep '^apex-train:' o3.err)" ||
  { ko "--zero with O3 not refused in one line"; cat o3.err; }

# same NAME DIR_A LOG_A DIR_B LOG_B STEP: the logs without timings, and the checkpoint files, equal.
same() {
  local a b f s=1
  a=$(sed 's/,"samples_per_s.*//' "$3")
  b=$(sed 's/,"samples_per_s.*//' "$5")
  for f in model.safetensors optimizer.bin state.safetensors; do cmp -s "$2/step-$6/$f" "$4/step-$6/$f" || s=0; done
  if [ -n "$a" ] && [ "$a" = "$b" ] && [ $s -eq 1 ]; then
    ok "$1: the same losses and checkpoint files, bit for bit"
  else
    ko "$1: differs (files equal: $s)"; diff <(echo "$a") <(echo "$b") | head -4
  fi
}

# ---- --zero 2 on 2 ranks, O2 f16 with clipping ------------------------------------------------------------
F=("${G[@]}" --distributed --opt-level O2 --clip-grad-norm 0.5 --steps 10)
mpi 2 "$BIN" "${F[@]}" --save-every 5 --checkpoint d --log d.jsonl > d.out 2> d.err || { ko "unsharded 2-rank run"; cat d.err; }
mpi 2 "$BIN" "${F[@]}" --save-every 5 --zero 2 --checkpoint z --log z.jsonl > z.out 2> z.err || { ko "--zero 2 run"; cat z.err; }
same "--zero 2 on 2 ranks (O2, f16, clipping)" d d.jsonl z z.jsonl 10
grep -q "identical on all 2 ranks" z.out && ok "--zero 2: every rank's state (gathered) identical" || ko "--zero 2: no identical-state line"
grep -q "optimizer state" z.out && ok "--zero 2: $(grep -o 'optimizer state[^,)]*' z.out | head -1)" || ko "--zero 2: the optimizer state per rank is not shown"

# ---- --zero 1 on 3 ranks, LAMB at O1 (f16, dynamic scale) -------------------------------------------------
L=("${G[@]}" --distributed --optimizer lamb --steps 6)
mpi 3 "$BIN" "${L[@]}" --checkpoint dl --log dl.jsonl > /dev/null 2> dl.err || { ko "unsharded 3-rank run"; cat dl.err; }
mpi 3 "$BIN" "${L[@]}" --zero 1 --checkpoint zl --log zl.jsonl > /dev/null 2> zl.err || { ko "--zero 1 3-rank run"; cat zl.err; }
same "--zero 1 on 3 ranks (LAMB, O1)" dl dl.jsonl zl zl.jsonl 6

# ---- one checkpoint format: resume across sharded and unsharded -------------------------------------------
from_step d r1 5
mpi 2 "$BIN" "${F[@]}" --zero 2 --checkpoint r1 --resume --log r1.jsonl > /dev/null 2> r1.err || { ko "--zero 2 resuming an unsharded checkpoint"; cat r1.err; }
log_until d.jsonl 10 | sed -n '6,10p' > d_tail.jsonl
same "unsharded steps 1-5, --zero 2 steps 6-10" d d_tail.jsonl r1 r1.jsonl 10
from_step z r2 5
mpi 2 "$BIN" "${F[@]}" --checkpoint r2 --resume --log r2.jsonl > /dev/null 2> r2.err || { ko "unsharded run resuming a --zero 2 checkpoint"; cat r2.err; }
same "--zero 2 steps 1-5, unsharded steps 6-10" d d_tail.jsonl r2 r2.jsonl 10

# ---- resume at another number of ranks, the global batch kept --------------------------------------------
# 2 ranks of 6 sequences save at step 5; 3 ranks of 4 and one process of 12 resume. The reference is the
# unsharded run resumed from the same checkpoint at the new size (the batch is split otherwise, so the
# bits are the new size's, not the old one's).
RW=(--model gpt --epochs 1 --seq-len 32 --opt-level O2 --clip-grad-norm 0.5 --steps 10)
mpi 2 "$BIN" "${RW[@]}" --batch-size 6 --distributed --zero 2 --save-every 5 --checkpoint w 2> w.err > /dev/null ||
  { ko "--zero 2 run of 2 x 6"; cat w.err; }
for d in w3z w3d w1z w1d; do from_step w $d 5; done
mpi 3 "$BIN" "${RW[@]}" --batch-size 4 --distributed --zero 2 --checkpoint w3z --resume --log w3z.jsonl > w3z.out 2> w3z.err ||
  { ko "--zero 2 resumed on 3 ranks"; cat w3z.err; }
mpi 3 "$BIN" "${RW[@]}" --batch-size 4 --distributed --checkpoint w3d --resume --log w3d.jsonl > /dev/null 2> w3d.err || { ko "unsharded resumed on 3 ranks"; cat w3d.err; }
same "a 2-rank --zero 2 checkpoint resumed on 3 ranks (x 4) with --zero 2, as unsharded on 3" w3d w3d.jsonl w3z w3z.jsonl 10
grep -q "identical on all 3 ranks" w3z.out && ok "2 -> 3 ranks: every rank's state identical" || ko "2 -> 3 ranks: no identical-state line"
mpi 1 "$BIN" "${RW[@]}" --batch-size 12 --distributed --zero 2 --checkpoint w1z --resume --log w1z.jsonl > /dev/null 2> w1z.err ||
  { ko "--zero 2 resumed on 1 rank"; cat w1z.err; }
"$BIN" "${RW[@]}" --batch-size 12 --checkpoint w1d --resume --log w1d.jsonl > /dev/null 2> w1d.err || { ko "one process resumed"; cat w1d.err; }
same "a 2-rank --zero 2 checkpoint resumed on 1 rank (x 12) with --zero 2, as one plain process" w1d w1d.jsonl w1z w1z.jsonl 10
bad_run "resume 2 x 6 on 3 ranks of 6 (another global batch)" mpi 3 "$BIN" "${RW[@]}" --batch-size 6 --distributed --zero 2 --checkpoint w --resume
grep -q "resume with --batch-size 4" <<< "$LAST_ERR" && ok "the refusal names --batch-size 4" || ko "the refusal does not name --batch-size 4: $LAST_ERR"
bad_run "resume 2 x 6 on 5 ranks (no batch size fits)" mpi 5 "$BIN" "${RW[@]}" --batch-size 2 --distributed --zero 2 --checkpoint w --resume

# ---- a checkpoint of 2 sharded ranks evaluates in one process ---------------------------------------------
"$BIN" --eval-only --checkpoint z > e1.out 2> e1.err || { ko "--eval-only of a --zero 2 checkpoint in one process"; cat e1.err; }
mpi 2 "$BIN" --eval-only --distributed --checkpoint d > e2.out 2> e2.err || { ko "--eval-only of the unsharded checkpoint on 2 ranks"; cat e2.err; }
a=$(grep "validation loss" e1.out)
[ -n "$a" ] && [ "$a" = "$(grep "validation loss" e2.out)" ] && ok "a --zero 2 checkpoint evaluated in one process: $a (as the unsharded one on 2 ranks)" ||
  { ko "one-process evaluation differs"; cat e1.out e2.out; }

# ---- the CNN with SyncBatchNorm at O2 (its batch norm parameters kept in f32 beside f16 ones) --------------
FM=${APEX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ -f "$FM/train-images-idx3-ubyte.gz" ]; then
  C=(--data "$FM" --model cnn --batch-size 8 --opt-level O2 --optimizer sgd --distributed --sync-bn --steps 4)
  mpi 2 "$BIN" "${C[@]}" --checkpoint cd --log cd.jsonl > /dev/null 2> cd.err || { ko "cnn --sync-bn unsharded"; cat cd.err; }
  mpi 2 "$BIN" "${C[@]}" --zero 2 --checkpoint cz --log cz.jsonl > /dev/null 2> cz.err || { ko "cnn --sync-bn --zero 2"; cat cz.err; }
  same "--zero 2 with --sync-bn (cnn, O2, SGD)" cd cd.jsonl cz cz.jsonl 4
else
  echo "skipped: --sync-bn with --zero (Fashion-MNIST not found in $FM)"
fi

finish
