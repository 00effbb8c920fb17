#!/usr/bin/env bash
# test_cli.sh APEX_TRAIN: apex-train's command line, checkpoints and resume (ctest apex_train_cli).
#  - bad input (unknown flags, invalid values, missing or unreadable data, unwritable checkpoint
#    directory, mismatched or corrupted checkpoints): non-zero exit, exactly one line on stderr, no
#    file left behind or changed;
#  - --help lists every flag of the table in args.c;
#  - bitwise resume at O0, O1 and O2: 20 steps straight = 10 steps, a new process resuming, 10 more
#    (losses of steps 11..20 in the JSON logs, and every checkpoint file, compared with cmp);
#  - the same training state gives the same checkpoint bytes; a save killed midway leaves the last
#    good checkpoint resumable;
#  - issue #19: a diverged run stops (exit 3, one line, the last good checkpoint kept); the log is
#    JSON (python3's json reads every line, NaN as null); a full disk under --log fails; --epochs and
#    --steps end at the first limit; the bar fits $COLUMNS and becomes plain lines under an MPI
#    launcher's variables; one line per --save-every save; -h, --version, o1, gpt-only flags, O0 says
#    f32; a refused lr shows the typed value; a resume past --steps says so; --checkpoint makes its
#    parents; elapsed_s goes on after a resume; gpt prints tokens/s and ms/step.
# Needs Fashion-MNIST (Debian's dataset-fashion-mnist) for the training parts; without it those are
# skipped and the test reports SKIP (77) after the other checks pass.
. "$(dirname "$0")/test_lib.sh" "$1"
FM=${APEX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
have_data=0
[ -f "$FM/train-images-idx3-ubyte.gz" ] && have_data=1
COMMON=(--threads 2 --data "$FM")

# ---- --help ----------------------------------------------------------------------------------------
help=$("$BIN" --help)
[ $? -eq 0 ] || ko "--help exits non-zero"
missing=""
for f in $(grep -o '^    {"[a-z0-9-]*", T_' "$SRC/args.c" | sed 's/^    {"\([a-z0-9-]*\)".*/\1/'); do
  line=$(grep -E -- "^  --$f( |$)" <<< "$help")
  [ -n "$line" ] || missing="$missing --$f"
done
for f in model data opt-level cast-type loss-scale keep-batchnorm-fp32 master-weights optimizer lr weight-decay \
  batch-size epochs steps seed threads checkpoint save-every resume log device help; do
  grep -qE -- "^  --$f( |$)" <<< "$help" || missing="$missing --$f"
done
[ -z "$missing" ] && ok "--help lists every flag" || ko "--help misses$missing"
# The README's flags table names every flag --help lists (--help itself is named in its text).
undocumented=""
for f in $(grep -oE '^  --[a-z0-9-]+' <<< "$help" | tr -d ' '); do
  [ "$f" = --help ] || grep -qF -- "\`$f" "$SRC/../../README.md" || undocumented="$undocumented $f"
done
[ -z "$undocumented" ] && ok "README.md documents every flag" || ko "README.md lacks$undocumented"
for o in sgd adam adamw adamp lamb adadelta adagrad rmsprop rmsprop_tf novograd; do
  grep -q -- "$o" <<< "$help" || ko "--help does not name optimizer $o"
done
grep -q "default: cnn" <<< "$help" && grep -q "default: O1" <<< "$help" || ko "--help lacks defaults"

# ---- bad flags and values ----------------------------------------------------------------------------
bad "unknown flag" --bogus
bad "unknown flag with value" --bogus=3
bad "positional argument" mlp
bad "missing value" --model
bad "bad model" --model rnn
bad "bad opt level" --opt-level O4
bad "bad cast type" --cast-type f8
bad "bad loss scale" --loss-scale lots
bad "negative loss scale" --loss-scale -4
bad "bad boolean" --keep-batchnorm-fp32 maybe
bad "bad optimizer" --optimizer adamax
bad "negative lr" --lr -1
bad "lr not a number" --lr fast
bad "bad weight decay" --weight-decay x
bad "zero batch" --batch-size 0
bad "bad epochs" --epochs 0
bad "bad steps" --steps -3
bad "bad threads" --threads two
bad "switch with value" --resume=yes
bad "bad device" --device tpu
bad "O1 with master weights" --opt-level O1 --master-weights true
bad "O3 static scale with dynamic tunables is fine, O1 keep-bn refused" --opt-level O1 --keep-batchnorm-fp32 true
bad "save-every without checkpoint" --save-every 5
bad "resume without checkpoint" --resume
bad "missing data set" --data "$W/no-such-dir"
mkdir junk && for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do echo "not idx" > junk/$f.gz; done
bad "unreadable data set" --data "$W/junk"
bad "missing text" --model gpt --data "$W/no-such-file"
echo "tiny" > tiny.txt
bad "text too short" --model gpt --data "$W/tiny.txt"
bad "text is a directory" --model gpt --data "$W/junk"
echo x > afile
bad "checkpoint under a file" --model gpt --steps 1 --checkpoint "$W/afile/ck"
grep -qF "$W/afile is not a directory" <<< "$LAST_ERR" && ok "the message names the file in the way" || ko "checkpoint under a file: $LAST_ERR"
bad "parents made for a refused run are removed" --model gpt --steps 1 --checkpoint "$W/x/y/ck" --log "$W/no-dir/log.jsonl"
bad "checkpoint is a file" --model gpt --steps 1 --checkpoint "$W/afile"
bad "resume from an empty directory" --model gpt --steps 1 --checkpoint "$W/junk" --resume
bad "log in a missing directory" --model gpt --steps 1 --log "$W/no-dir/log.jsonl"
bad "gpt with a bad seq-len" --model gpt --seq-len 1

# ---- threads and OpenMP's placement (issue #33) ---------------------------------------------------------
# Binding narrows the main thread's mask to one place; the CPUs counted are the places' (or, unbound, the
# process's mask), so a bound run may use every place, and a count past them is refused in the singular or
# plural it needs. A run on fewer threads than the machine's CPUs says how many and on which CPUs.
NCPU=$(nproc) # this process's mask
T=(--model gpt --batch-size 4 --seq-len 16 --sample-bytes 8 --steps 2)
bad "more threads than CPUs" "${T[@]}" --threads $((NCPU + 1))
grep -qF "runs $NCPU thread" <<< "$LAST_ERR" && grep -qF "affinity mask holds" <<< "$LAST_ERR" && ok "the refusal counts the mask's CPUs" ||
  ko "more threads than CPUs: $LAST_ERR"
# the cases below take the whole machine as the mask (not so under a taskset of the test itself)
if [ "$NCPU" -ge 2 ] && [ "$NCPU" -eq "$(getconf _NPROCESSORS_ONLN)" ]; then
  env OMP_PLACES="{0}" OMP_PROC_BIND=close "$BIN" "${T[@]}" --threads 2 > /dev/null 2> one.err
  grep -qF "runs 1 thread at once (OpenMP's places hold CPU 0); give 1," one.err && ! grep -q "1 threads" one.err &&
    ok "one place: one thread, in the singular" || ko "one place: $(cat one.err)"
  for e in "OMP_PLACES=cores OMP_PROC_BIND=close" "OMP_PLACES=cores OMP_PROC_BIND=spread" "OMP_PROC_BIND=true" "OMP_PLACES=threads" \
    "OMP_PLACES=cores OMP_PROC_BIND=close OMP_NUM_THREADS=1"; do
    env $e "$BIN" "${T[@]}" --threads "$NCPU" > bound.out 2>&1 && ! grep -q "thread.* on CPU" bound.out &&
      ok "$e: --threads $NCPU runs (every place)" || ko "$e --threads $NCPU: $(tail -2 bound.out)"
  done
  env OMP_PLACES=cores OMP_PROC_BIND=close "$BIN" "${T[@]}" > bound.out 2>&1 && ok "bound, OpenMP's default threads" || ko "bound default: $(tail -2 bound.out)"
  if [ $have_data -eq 1 ]; then # the issue's own command
    env OMP_PLACES=cores OMP_PROC_BIND=close "$BIN" --model mlp --threads 2 --steps 2 --data "$FM" > bound.out 2>&1 &&
      ok "OMP_PLACES=cores OMP_PROC_BIND=close apex-train --model mlp --threads 2" || ko "bound mlp --threads 2: $(tail -2 bound.out)"
  fi
  env OMP_PLACES=cores OMP_PROC_BIND=close "$BIN" "${T[@]}" --threads 1 > bound.out 2>&1
  grep -qE "^apex-train: 1 thread on CPU [0-9]+ \(of the machine's $NCPU, bound by OpenMP\)$" bound.out &&
    ok "bound to fewer places than the machine has: says so" || ko "bound --threads 1: $(grep thread bound.out)"
  "$BIN" "${T[@]}" --threads 1 > one.out 2>&1
  grep -qE "^apex-train: 1 thread on CPUs [0-9,-]+ \(of the machine's $NCPU\)$" one.out && ok "unbound --threads 1: the CPUs it floats over" ||
    ko "unbound --threads 1: $(grep thread one.out)"
  taskset -c 0 "$BIN" "${T[@]}" > one.out 2>&1
  grep -qE "^apex-train: 1 thread on CPU 0 \(of the machine's $NCPU\)$" one.out && ok "a narrowed mask (taskset, mpirun's binding): its CPUs" ||
    ko "taskset -c 0: $(grep thread one.out)"
  taskset -c 0 "$BIN" "${T[@]}" --threads 2 > /dev/null 2> one.err
  grep -qF "runs 1 thread at once (its affinity mask holds CPU 0)" one.err && ok "taskset -c 0 --threads 2 refused, in the singular" ||
    ko "taskset -c 0 --threads 2: $(cat one.err)"
fi

# ---- checkpoints (text model: always available) -------------------------------------------------------
G=(--model gpt --threads 2 --batch-size 4 --seq-len 16 --sample-bytes 8)
"$BIN" "${G[@]}" --steps 4 --checkpoint g1 --log g1.jsonl > g1.out || ko "gpt run with a checkpoint"
"$BIN" "${G[@]}" --steps 4 --checkpoint g2 > /dev/null || ko "second gpt run"
same=1
for f in latest step-4/model.safetensors step-4/optimizer.bin step-4/state.safetensors; do cmp -s g1/$f g2/$f || same=0; done
[ $same -eq 1 ] && ok "the same training state gives the same checkpoint bytes" || ko "identical runs gave different checkpoint files"
grep -q '"step":4,' g1.jsonl && grep -q '"loss_scale":' g1.jsonl && grep -q '"skipped":' g1.jsonl && grep -q '"samples_per_s":' g1.jsonl &&
  grep -q '"elapsed_s":' g1.jsonl && ok "JSON log has step, loss, loss scale, skipped, samples/s, elapsed" || ko "JSON log fields"
rm -rf g2
bad "fresh run into a directory holding a checkpoint" "${G[@]}" --steps 4 --checkpoint g1
bad "resume with another opt level" "${G[@]}" --steps 8 --checkpoint g1 --resume --opt-level O2
bad "resume with another seq-len (shapes)" "${G[@]}" --seq-len 32 --steps 8 --checkpoint g1 --resume
bad "resume with another optimizer" "${G[@]}" --optimizer lamb --steps 8 --checkpoint g1 --resume
bad "resume with another cast type" "${G[@]}" --cast-type bf16 --steps 8 --checkpoint g1 --resume
# Corruptions: each refused, nothing overwritten.
corrupt() { # NAME FILE (flip one byte at OFFSET from the end, or truncate with "trunc")
  local name=$1 file=$2 how=$3
  rm -rf c && cp -a g1 c
  if [ "$how" = trunc ]; then
    truncate -s $(($(stat -c %s "c/$file") / 2)) "c/$file"
  else
    local size off byte
    size=$(stat -c %s "c/$file")
    off=$((size - how))
    byte=$(od -An -tu1 -j $off -N1 "c/$file" | tr -d ' ')
    printf "$(printf '\\%03o' $(((byte ^ 1) & 255)))" | dd of="c/$file" bs=1 seek=$off conv=notrunc status=none
  fi
  bad "$name" "${G[@]}" --steps 8 --checkpoint c --resume
}
corrupt "flipped byte in model.safetensors data" step-4/model.safetensors 5
corrupt "flipped byte in model.safetensors header" step-4/model.safetensors $(($(stat -c %s g1/step-4/model.safetensors) - 20))
corrupt "truncated model.safetensors" step-4/model.safetensors trunc
corrupt "flipped byte in optimizer.bin" step-4/optimizer.bin 100
corrupt "truncated optimizer.bin" step-4/optimizer.bin trunc
corrupt "flipped byte in state.safetensors" step-4/state.safetensors 30
corrupt "flipped byte inside state.safetensors" step-4/state.safetensors $(($(stat -c %s g1/step-4/state.safetensors) / 2))
corrupt "truncated state.safetensors" step-4/state.safetensors trunc
rm -rf c && cp -a g1 c && echo "step-99" > c/latest
bad "latest naming a missing step" "${G[@]}" --steps 8 --checkpoint c --resume
rm -rf c && cp -a g1 c && printf 'garbage' > c/latest
bad "corrupted latest" "${G[@]}" --steps 8 --checkpoint c --resume
rm -rf c
# A killed save: a stale partial directory is ignored and cleaned by the next save.
mkdir g1/step-6.partial && echo half > g1/step-6.partial/model.safetensors
"$BIN" "${G[@]}" --steps 6 --checkpoint g1 --resume --log g1.jsonl > /dev/null && [ "$(cat g1/latest)" = step-6 ] &&
  [ ! -e g1/step-6.partial ] && [ -d g1/step-4 ] && ok "a stale partial save is replaced; the previous checkpoint is kept" ||
  ko "resume past a stale partial save"
"$BIN" "${G[@]}" --steps 12 --checkpoint g1 --resume --save-every 2 > g1.out && [ "$(cat g1/latest)" = step-12 ] &&
  [ "$(ls -d g1/step-* | wc -l)" = 2 ] && ok "--save-every keeps the latest and the previous checkpoint" || ko "--save-every: $(ls g1)"
[ "$(grep -c '^apex-train: checkpoint g1/step-' g1.out)" = 3 ] && grep -q "checkpoint g1/step-8$" g1.out &&
  grep -q "checkpoint g1/step-10$" g1.out && ok "one line per save (steps 8 and 10 by --save-every, 12 at the end)" ||
  ko "--save-every lines: $(grep checkpoint g1.out)"

# ---- issue #19 ---------------------------------------------------------------------------------------
[ "$("$BIN" -h)" = "$help" ] && ok "-h prints --help" || ko "-h differs from --help"
want=$(sed -n 's/^#define APEX_VERSION_STRING "\(.*\)"$/\1/p' "$SRC/../../include/apex/version.h")
v=$("$BIN" --version)
[ $? -eq 0 ] && [ -n "$want" ] && [ "$v" = "apex-train $want (apex library $want)" ] && ok "--version: $v" || ko "--version: '$v' (want $want)"
grep -q "first limit reached" <<< "$help" && ok "--help states when training ends" || ko "--help lacks the --steps/--epochs rule"
grep -q "IDX image/label files" <<< "$help" && grep -q "llm.c .bin of uint16 tokens" <<< "$help" && ok "--help names the data formats (IDX, bytes, llm.c .bin)" ||
  ko "--help does not name the data formats: $(grep -- --data <<< "$help")"
bad "gpt-only --seq-len for mlp" --model mlp --seq-len 32
bad "gpt-only --sample-bytes for cnn" --model cnn --sample-bytes 10
bad "negative --max-bad-steps" --max-bad-steps -1
out=$("$BIN" "${G[@]}" --opt-level o1 --steps 1) && grep -q ", O1 f16," <<< "$out" && ok "--opt-level o1 is O1, as amp takes it" ||
  ko "--opt-level o1: $out"
out=$("$BIN" "${G[@]}" --opt-level O0 --cast-type bf16 --steps 1) && grep -q ", O0 f32," <<< "$out" && ok "O0 says f32" || ko "O0 banner: $out"
grep -q "tokens/s, [0-9.]* ms/step)" g1.out && grep -q '"tokens_per_s":' g1.jsonl && grep -q '"ms_per_step":' g1.jsonl &&
  ok "gpt reports tokens/s and ms/step: $(grep ' steps in ' g1.out)" || ko "gpt rates: $(grep ' steps in ' g1.out)"

# A refused lr shows the values typed (the gpt's default is 3e-3), not float round-trip noise.
bad "resume with another lr" "${G[@]}" --lr 0.002 --steps 14 --checkpoint g1 --resume
grep -q "lr 0.003, this run has lr 0.002;" <<< "$LAST_ERR" && ok "the lr as typed" || ko "lr message: $LAST_ERR"
bad "resume at --steps" "${G[@]}" --steps 12 --checkpoint g1 --resume
grep -q "at step 12, already at --steps 12" <<< "$LAST_ERR" || ko "resume at --steps: $LAST_ERR"
bad "resume past --steps" "${G[@]}" --steps 10 --checkpoint g1 --resume
grep -q "at step 12, already past --steps 10" <<< "$LAST_ERR" && ok "a resume past --steps says so" || ko "resume past --steps: $LAST_ERR"

"$BIN" "${G[@]}" --steps 2 --checkpoint p/q/ck > /dev/null && [ "$(cat p/q/ck/latest)" = step-2 ] &&
  ok "--checkpoint p/q/ck makes the missing parents" || ko "--checkpoint with missing parents: $(ls -R p 2>&1)"
rm -rf p

# --log to a full disk fails (the open works, the writes do not).
bad "--log /dev/full" "${G[@]}" --steps 2 --log /dev/full
grep -q "No space left" <<< "$LAST_ERR" || ko "--log /dev/full: $LAST_ERR"

# --epochs 1 --steps 5000 on a text of 712 bytes (a tenth, 71, held out for validation; 641 training
# bytes make 10 steps of 4 x 16 per epoch) ends at step 10.
head -c 712 /usr/share/common-licenses/GPL-3 > small.txt
out=$("$BIN" "${G[@]}" --data small.txt --epochs 1 --steps 5000 --log e.jsonl)
rc=$?
if [ $rc -eq 0 ] && grep -q "ending at step 10 (end of the epochs)" <<< "$out" && grep -q "^apex-train: 10 steps in" <<< "$out" &&
  [ "$(wc -l < e.jsonl)" = 10 ] && ! grep -q '"epoch":2' e.jsonl; then
  ok "--epochs 1 --steps 5000 ends at the end of the epoch (step 10)"
else
  ko "--epochs 1 --steps 5000: rc $rc: $out"
fi

# The bar: at most $COLUMNS - 1 wide on a terminal (script(1) gives a pty, of width 0, so $COLUMNS
# rules); plain lines, no \r, when an MPI launcher's variables are set.
if command -v script > /dev/null; then
  COLUMNS=60 script -qec "$BIN --model gpt --threads 2 --batch-size 4 --seq-len 16 --sample-bytes 8 --steps 3" /dev/null > tty.out < /dev/null
  widest=$(tr '\r' '\n' < tty.out | sed 's/\x1b\[K//g' | grep 'step [0-9]*/3' | awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }')
  if grep -q $'\r' tty.out && [ "$widest" -gt 0 ] && [ "$widest" -le 59 ]; then
    ok "bar on a 60-column terminal: redrawn with \\r, widest line $widest"
  else
    ko "bar at COLUMNS=60: widest $widest: $(cat -v tty.out | head -5)"
  fi
  OMPI_COMM_WORLD_SIZE=1 script -qec "$BIN --model gpt --threads 2 --batch-size 4 --seq-len 16 --sample-bytes 8 --steps 3" /dev/null > mpi.out < /dev/null
  if ! grep -q $'\r' <(sed 's/\r$//' mpi.out) && grep -q "step 3/3" mpi.out; then
    ok "under an MPI launcher's environment, on a pty: plain lines"
  else
    ko "plain lines under mpirun: $(cat -v mpi.out | head -5)"
  fi
else
  echo "script(1) not found (util-linux): the bar checks on a pty were skipped"
fi

# A diverged run: lr 1e6 makes the loss NaN; 10 bad steps in a row stop it with exit 3 and one line;
# the last checkpoint is the last step whose loss was finite; every log line is JSON.
"$BIN" "${G[@]}" --lr 1e6 --steps 300 --max-bad-steps 10 --checkpoint dv --save-every 1 --log dv.jsonl > dv.out 2> dv.err
rc=$?
if [ $rc -eq 3 ] && [ "$(wc -l < dv.err)" = 1 ] && grep -q "stopped at step [0-9]*: the run diverged" dv.err; then
  ok "diverged run: exit 3: $(cat dv.err)"
else
  ko "diverged run: exit $rc: $(cat dv.err)"
fi
[ -s dv.svg ] && grep -q "loss curve dv.svg" dv.out && ok "diverged run: its loss curve dv.svg is drawn" || ko "diverged run: no dv.svg: $(cat dv.out)"
# A full disk (a file size limit: writes fail with EFBIG) while saving: one line naming the
# checkpoint that survived.
"$BIN" "${G[@]}" --steps 2 --checkpoint fd > /dev/null 2>&1 || ko "fd: first run"
(trap '' XFSZ; ulimit -f 8; "$BIN" "${G[@]}" --steps 4 --checkpoint fd --resume > /dev/null 2> fd.err)
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l < fd.err)" = 1 ] && grep -q "File too large; fd/step-2 is intact: free space and add --resume to continue from it" fd.err &&
  [ "$(cat fd/latest)" = step-2 ] && ok "a full disk while saving: exit 1, $(cat fd.err)" || ko "full disk: exit $rc, $(cat fd.err)"
# Diverged before its first save: no checkpoint, and no empty directory left behind.
"$BIN" "${G[@]}" --lr 1e6 --steps 300 --max-bad-steps 3 --checkpoint dv0/sub > /dev/null 2> dv0.err
rc=$?
[ $rc -eq 3 ] && [ ! -e dv0 ] && grep -q "no checkpoint written" dv0.err && ok "diverged before any save: exit 3, no directory left: $(cat dv0.err)" ||
  ko "diverged before any save: exit $rc, $(ls -R dv0 2>&1 | head -3), $(cat dv0.err)"
if command -v python3 > /dev/null; then
  # Stop step and last good step worked out from the log alone, by the rule in divergence.h.
  if python3 - dv.jsonl "$(cat dv/latest 2> /dev/null)" <<'PY'
import json, math, sys
rows = [json.loads(line) for line in open(sys.argv[1])]  # raises on -nan and friends
prev_skipped, streak, stop, last_good = 0, 0, None, None
for r in rows:
    bad = r["loss"] is None or r["skipped"] > prev_skipped
    prev_skipped = r["skipped"]
    streak = streak + 1 if bad else 0
    if r["loss"] is not None and math.isfinite(r["loss"]):
        last_good = r["step"]
    if streak == 10:
        stop = r["step"]
        break
assert any(r["loss"] is None for r in rows), "no null loss in the log"
assert stop == rows[-1]["step"], (stop, rows[-1]["step"])
assert sys.argv[2] == "step-%d" % last_good, (sys.argv[2], last_good)
print("log: %d lines of JSON, stopped at step %d, checkpoint step-%d (last finite loss)" % (len(rows), stop, last_good))
PY
  then ok "the log is JSON; the run stopped after 10 bad steps; the checkpoint is the last good step"
  else ko "diverged run's log or checkpoint"; fi
else
  echo "python3 not found: the JSON parse of the log was skipped"
fi

# elapsed_s goes on after a resume (g1: steps 1-4, then resumed at 5).
e4=$(grep '^{"step":4,' g1.jsonl | sed 's/.*"elapsed_s":\([0-9.]*\).*/\1/')
e5=$(grep '^{"step":5,' g1.jsonl | sed 's/.*"elapsed_s":\([0-9.]*\).*/\1/')
[ -n "$e4" ] && [ -n "$e5" ] && awk -v a="$e4" -v b="$e5" 'BEGIN { exit !(b > a) }' && [ -f g1/step-12/timing.json ] &&
  ok "elapsed_s goes on after a resume: step 4 at ${e4}s, step 5 at ${e5}s" || ko "elapsed_s after a resume: $e4 then $e5"

if [ $have_data -eq 0 ]; then
  echo "Fashion-MNIST not found in $FM: the bitwise resume checks were skipped"
  [ $fails -eq 0 ] && exit 77
  exit 1
fi

# ---- bitwise resume on Fashion-MNIST at O0, O1, O2 ----------------------------------------------------
bad "resume with another model" "${COMMON[@]}" --model mlp --steps 8 --checkpoint g1 --resume
for level in O0 O1 O2; do
  for model in mlp cnn; do
    A=("${COMMON[@]}" --model $model --opt-level $level --batch-size 16)
    "$BIN" "${A[@]}" --steps 20 --save-every 10 --checkpoint s --log s.jsonl > /dev/null || ko "$level $model: straight run"
    from_step s r 10
    "$BIN" "${A[@]}" --steps 20 --checkpoint r --log r2.jsonl --resume --threads 1 > /dev/null || ko "$level $model: resumed half"
    a=$(sed -n '11,20p' s.jsonl | sed 's/,"samples_per_s.*//')
    b=$(sed 's/,"samples_per_s.*//' r2.jsonl)
    same=1
    for f in model.safetensors optimizer.bin state.safetensors; do cmp -s s/step-20/$f r/step-20/$f || same=0; done
    if [ "$a" = "$b" ] && [ -n "$a" ] && [ $same -eq 1 ]; then
      ok "$level $model: 20 straight steps = 10 + resume + 10, bit for bit (losses, weights, optimizer, state)"
    else
      ko "$level $model: resume differs"; diff <(echo "$a") <(echo "$b") | head -5
    fi
    rm -rf s r s.jsonl r.jsonl r2.jsonl
  done
done
# A process killed while saving every step: the last complete checkpoint resumes.
"$BIN" "${COMMON[@]}" --model mlp --batch-size 16 --steps 100000 --save-every 1 --checkpoint k > /dev/null 2>&1 &
pid=$!
for _ in $(seq 600); do [ -f k/latest ] && break; sleep 0.1; done # the first save, however slow the machine
sleep 0.5
kill -9 $pid 2> /dev/null
wait $pid 2> /dev/null
n=$(sed 's/step-//' k/latest)
if [ -f k/step-$n/state.safetensors ] && "$BIN" "${COMMON[@]}" --model mlp --batch-size 16 --steps $((n + 2)) --checkpoint k --resume > /dev/null; then
  ok "killed during saves at step ~$n: the latest checkpoint resumes"
else
  ko "killed run: latest=$(cat k/latest) $(ls k)"
fi

finish
