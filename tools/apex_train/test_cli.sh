#!/usr/bin/env bash
# test_cli.sh APEX_TRAIN: apex-train's command line, checkpoints and resume (ctest apex_train_cli).
#  - bad input (unknown flags, invalid values, missing or unreadable data, unwritable checkpoint
#    directory, mismatched or corrupted checkpoints): non-zero exit, exactly one line on stderr, no
#    file left behind or changed;
#  - --help lists every flag of the table in args.c;
#  - bitwise resume at O0, O1 and O2: 20 steps straight = 10 steps, a new process resuming, 10 more
#    (losses of steps 11..20 in the JSON logs, and every checkpoint file, compared with cmp);
#  - the same training state gives the same checkpoint bytes; a save killed midway leaves the last
#    good checkpoint resumable.
# Needs Fashion-MNIST (Debian's dataset-fashion-mnist) for the training parts; without it those are
# skipped and the test reports SKIP (77) after the other checks pass.
set -uo pipefail
BIN=$(realpath "$1")
SRC=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
fails=0
ok() { echo "ok   $*"; }
ko() { echo "FAIL $*"; fails=$((fails + 1)); }
FM=${APEX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
have_data=0
[ -f "$FM/train-images-idx3-ubyte.gz" ] && have_data=1
COMMON=(--threads 2 --data "$FM")

# A listing (names, sizes, contents) of the work directory, to see that nothing changed.
snapshot() { find . -path ./snap -prune -o -type f -print0 | sort -z | xargs -0 -r sha256sum; find . -path ./snap -prune -o -print | sort; }

# bad NAME ARGS...: refused with one line on stderr, nothing written or changed under $W.
bad() {
  local name=$1
  shift
  local before after rc lines
  before=$(snapshot)
  "$BIN" "$@" > /dev/null 2> "$W/../err.$$"
  rc=$?
  lines=$(wc -l < "$W/../err.$$")
  after=$(snapshot)
  if [ $rc -eq 0 ]; then
    ko "$name: exit 0 for: $*"
  elif [ "$lines" -ne 1 ]; then
    ko "$name: $lines lines on stderr:"; cat "$W/../err.$$"
  elif [ "$before" != "$after" ]; then
    ko "$name: files changed:"; diff <(echo "$before") <(echo "$after") | head
  else
    ok "$name (exit $rc): $(cat "$W/../err.$$")"
  fi
  rm -f "$W/../err.$$"
}

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
bad "cuda without a backend" --device cuda
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
bad "checkpoint is a file" --model gpt --steps 1 --checkpoint "$W/afile"
bad "resume from an empty directory" --model gpt --steps 1 --checkpoint "$W/junk" --resume
bad "log in a missing directory" --model gpt --steps 1 --log "$W/no-dir/log.jsonl"
bad "gpt with a bad seq-len" --model gpt --seq-len 1

# ---- checkpoints (text model: always available) -------------------------------------------------------
G=(--model gpt --threads 2 --batch-size 4 --seq-len 16 --sample-bytes 8)
"$BIN" "${G[@]}" --steps 4 --checkpoint g1 --log g1.jsonl > /dev/null || ko "gpt run with a checkpoint"
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
"$BIN" "${G[@]}" --steps 12 --checkpoint g1 --resume --save-every 2 > /dev/null && [ "$(cat g1/latest)" = step-12 ] &&
  [ "$(ls -d g1/step-* | wc -l)" = 2 ] && ok "--save-every keeps the latest and the previous checkpoint" || ko "--save-every: $(ls g1)"

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
    "$BIN" "${A[@]}" --steps 20 --checkpoint s --log s.jsonl > /dev/null || ko "$level $model: straight run"
    "$BIN" "${A[@]}" --steps 10 --checkpoint r --log r.jsonl > /dev/null || ko "$level $model: first half"
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

echo "$fails failures"
[ $fails -eq 0 ]
