#!/usr/bin/env bash
# test_device.sh APEX_TRAIN [CUDA_BUILD]: apex-train --device cuda (ctest apex_train_device).
#  - everywhere: --device cuda without a usable GPU is one line on stderr and nothing written: "no GPU
#    found" with exit 1 in a CUDA build (CUDA_BUILD=1), "built without CUDA" with exit 2 otherwise;
#    then, without a GPU, the test reports SKIP (77) with the reason;
#  - on a GPU (needs Fashion-MNIST): the CNN at O1 f16 and O2 bf16 for GPU_STEPS steps (default one
#    epoch) reaches the CPU's test accuracy within 0.5 points (the CPU run with the same flags, CPU_THREADS
#    threads); the GPT's losses at O0 follow the CPU's step by step (1e-3 relative) and at O2 bf16
#    (3e-2); resume is bitwise on the GPU (20 steps straight = 10 + 10 resumed, every checkpoint file
#    compared with cmp) at O0 and O2 with clipping and accumulation; a GPU checkpoint evaluates on the
#    CPU and a CPU checkpoint on the GPU with the same test accuracy (0.2 points: the same weights,
#    each device's own rounding), and a CPU checkpoint resumes on the GPU; --init-from a GPU
#    checkpoint's weights; --eval-every, --log and the plot on the GPU; the progress line shows tok/s
#    and the GPU's memory, and the summary "captured step" (the eager step's rate beside it);
#  - the captured step (the default) on the GPU against --no-capture, byte for byte: the GPT at O0, O2 bf16
#    (--grad-accum 2) and O2 f16, 20 steps saved at 10 and 20 and resumed from 10, and the MLP at O2 bf16.
# Each GPU check prints one PASS/FAIL line with its numbers, so that one run on a GPU tells.
. "$(dirname "$0")/test_lib.sh" "$1"
CUDA_BUILD=${2:-1}
FM=${APEX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
CPU_THREADS=${CPU_THREADS:-$(nproc)}
PY=${PYTHON:-python3}

# ---- without a GPU: one clear line -----------------------------------------------------------------------
has_gpu=0
if ! "$BIN" --device cuda --help > /dev/null 2>&1; then ko "--device cuda --help fails"; fi
"$BIN" --device cuda --model mlp --steps 1 --data "$W/no-such-dir" > out.txt 2> err.txt
rc=$?
if grep -q "no GPU found\|built without CUDA" err.txt; then
  want_rc=1 want_msg="no GPU found"
  [ "$CUDA_BUILD" = 0 ] && want_rc=2 want_msg="built without CUDA"
  lines=$(wc -l < err.txt)
  if [ $rc -eq $want_rc ] && [ "$lines" -eq 1 ] && grep -q "$want_msg" err.txt && [ ! -s out.txt ]; then
    ok "--device cuda without a GPU (exit $rc): $(cat err.txt)"
  else
    ko "--device cuda without a GPU: exit $rc (want $want_rc), $lines lines, want \"$want_msg\": $(cat err.txt)"
  fi
elif grep -q "no-such-dir" err.txt; then
  has_gpu=1 # a GPU: the run went on to the (missing) data
  ok "--device cuda with a GPU goes on to load the data"
else
  ko "--device cuda: exit $rc: $(cat err.txt)"
  finish
  exit 1
fi
rm -f out.txt err.txt
[ $has_gpu = 1 ] || skip "no usable GPU here: the --device cuda training checks need one"
[ -f "$FM/train-images-idx3-ubyte.gz" ] || skip "Fashion-MNIST not found in $FM (Debian's dataset-fashion-mnist)"
command -v "$PY" > /dev/null || skip "$PY is needed to compare the logs"

pass() { echo "PASS $*"; }
flunk() { echo "FAIL $*"; fails=$((fails + 1)); }
acc() { sed -n 's/^apex-train: test accuracy \([0-9.]*\)$/\1/p' "$1"; }
I=(--data "$FM")
GPU_STEPS=${GPU_STEPS:-0} # 0: one whole epoch

# ---- the CNN at O1 f16 and O2 bf16: GPU accuracy = CPU accuracy within 0.5 points ---------------------------
steps=()
[ "$GPU_STEPS" -gt 0 ] && steps=(--steps "$GPU_STEPS")
for cfg in "O1 f16" "O2 bf16"; do
  set -- $cfg
  tag=$1-$2
  "$BIN" "${I[@]}" --model cnn --opt-level "$1" --cast-type "$2" --epochs 1 "${steps[@]}" --device cuda > gpu-$tag.txt 2>&1 || { flunk "cnn $tag on the GPU: $(tail -2 gpu-$tag.txt)"; continue; }
  "$BIN" "${I[@]}" --model cnn --opt-level "$1" --cast-type "$2" --epochs 1 "${steps[@]}" --threads "$CPU_THREADS" > cpu-$tag.txt 2>&1 || { flunk "cnn $tag on the CPU: $(tail -2 cpu-$tag.txt)"; continue; }
  ga=$(acc gpu-$tag.txt) ca=$(acc cpu-$tag.txt)
  rate=$(grep -o '([0-9]* samples/s' gpu-$tag.txt | tr -d '(')
  crate=$(grep -o '([0-9]* samples/s' cpu-$tag.txt | tr -d '(')
  msg="cnn $tag accuracy: gpu $ga ($rate) cpu $ca ($crate, $CPU_THREADS threads)"
  if awk -v g="$ga" -v c="$ca" 'BEGIN { d = g - c; if (d < 0) d = -d; exit !(g != "" && c != "" && d <= 0.005) }'; then pass "$msg"; else flunk "$msg: more than 0.5 points apart"; fi
done

# ---- the GPT's losses on both devices -----------------------------------------------------------------------
head -c 200000 /usr/share/common-licenses/GPL-3 > text.txt 2> /dev/null || $PY -c "import random; random.seed(1); print(''.join(random.choice('abcdefgh ') for _ in range(200000)))" > text.txt
G=(--model gpt --data text.txt --batch-size 8 --seq-len 64 --steps 30 --sample-bytes 8)
cmp_losses() { # NAME LOG_A LOG_B REL
  $PY - "$@" << 'PYEOF'
import json, sys
name, a, b, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
la = [json.loads(l) for l in open(a) if '"loss"' in l]
lb = [json.loads(l) for l in open(b) if '"loss"' in l]
worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(la, lb))
ok = len(la) == len(lb) and len(la) > 0 and worst <= tol
print(("PASS " if ok else "FAIL ") + "%s: %d steps, first %.5f/%.5f last %.5f/%.5f (gpu/cpu), worst rel diff %.2e (allowed %.0e)"
      % (name, len(la), la[0]["loss"], lb[0]["loss"], la[-1]["loss"], lb[-1]["loss"], worst, tol))
sys.exit(0 if ok else 1)
PYEOF
}
for cfg in "O0 f16 1e-3" "O2 bf16 3e-2"; do
  set -- $cfg
  "$BIN" "${G[@]}" --opt-level "$1" --cast-type "$2" --device cuda --log g-$1.jsonl > g-$1.txt 2>&1 || flunk "gpt $1 on the GPU: $(tail -2 g-$1.txt)"
  "$BIN" "${G[@]}" --opt-level "$1" --cast-type "$2" --threads "$CPU_THREADS" --log c-$1.jsonl > c-$1.txt 2>&1 || flunk "gpt $1 on the CPU: $(tail -2 c-$1.txt)"
  cmp_losses "gpt $1 $2 losses" g-$1.jsonl c-$1.jsonl "$3" || fails=$((fails + 1))
done
# The plain progress line (every 100 steps off a terminal) names tok/s and the GPU's memory; the summary
# says the step was captured. The same run with --no-capture gives the eager step's rate beside it.
"$BIN" "${G[@]}" --steps 100 --device cuda > line.txt 2>&1
"$BIN" "${G[@]}" --steps 100 --device cuda --no-capture > line-eager.txt 2>&1
if grep -q "tok/s.*gpu [0-9.]*/[0-9.]* GB" line.txt && grep -q "tokens/s.*GPU memory peak.*, captured step$" line.txt; then
  pass "progress line: $(grep 'step 100/100' line.txt); captured $(grep -o '[0-9]* tokens/s, [0-9.]* ms/step' line.txt), eager $(grep -o '[0-9]* tokens/s, [0-9.]* ms/step' line-eager.txt)"
else
  flunk "progress line lacks tok/s, the GPU's memory or \"captured step\": $(tail -3 line.txt)"
fi

# ---- the captured step (the default) against --no-capture on the GPU, byte for byte --------------------------
# 20 steps saved at 10 and 20, at O0, O2 bf16 with --grad-accum 2 and O2 f16; then the captured run resumed
# from its step-10. The reference is the eager run's checkpoint files.
for cfg in "O0 f16 1" "O2 bf16 2" "O2 f16 1"; do
  set -- $cfg
  tag=$1-$2-k$3
  A=("${G[@]}" --steps 20 --save-every 10 --opt-level "$1" --cast-type "$2" --grad-accum "$3" --device cuda)
  "$BIN" "${A[@]}" --checkpoint gc-$tag > gc-$tag.txt 2>&1 && "$BIN" "${A[@]}" --no-capture --checkpoint ge-$tag > ge-$tag.txt 2>&1 &&
    from_step gc-$tag gr-$tag 10 && "$BIN" "${A[@]}" --checkpoint gr-$tag --resume > gr-$tag.txt 2>&1
  rc=$? diff=""
  for f in model.safetensors state.safetensors optimizer.bin; do
    for s in 10 20; do cmp -s gc-$tag/step-$s/$f ge-$tag/step-$s/$f || diff="$diff step-$s/$f"; done
    cmp -s gr-$tag/step-20/$f ge-$tag/step-20/$f || diff="$diff resumed/$f"
  done
  rates="captured $(grep -o '[0-9]* tokens/s, [0-9.]* ms/step' gc-$tag.txt), eager $(grep -o '[0-9]* tokens/s, [0-9.]* ms/step' ge-$tag.txt)"
  if [ $rc -ne 0 ]; then flunk "gpt $tag captured on the GPU: rc $rc: $(tail -2 gc-$tag.txt ge-$tag.txt gr-$tag.txt)"
  elif ! grep -q ", captured step$" gc-$tag.txt; then flunk "gpt $tag: not captured: $(grep -h 'capture\| steps in ' gc-$tag.txt)"
  elif [ -n "$diff" ]; then flunk "gpt $tag captured = eager on the GPU: differing:$diff ($rates)"
  else pass "gpt $tag captured = eager on the GPU: step-10's, step-20's and the resumed step-20's files identical ($rates)"; fi
done
# the images: the MLP at O2 bf16 with --grad-accum 2, captured = eager
MA=("${I[@]}" --model mlp --batch-size 32 --opt-level O2 --cast-type bf16 --grad-accum 2 --steps 20 --device cuda)
"$BIN" "${MA[@]}" --checkpoint mc > mc.txt 2>&1 && "$BIN" "${MA[@]}" --no-capture --checkpoint me > me.txt 2>&1
rc=$? diff=""
for f in model.safetensors state.safetensors optimizer.bin; do cmp -s mc/step-20/$f me/step-20/$f || diff="$diff $f"; done
[ $rc -eq 0 ] && [ -z "$diff" ] && grep -q ", captured step$" mc.txt && pass "mlp O2 bf16 accum 2 captured = eager on the GPU: step-20's files identical" ||
  flunk "mlp captured on the GPU: rc $rc, differing:$diff; $(grep -h 'capture\| steps in ' mc.txt)"

# ---- bitwise resume on the GPU -------------------------------------------------------------------------------
R=(--model mlp --batch-size 32 --device cuda --clip-grad-norm 1 --grad-accum 2)
# The straight run's own step-10 is resumed (from_step): a run of --steps 10 has another lr schedule.
for ol in O0 O2; do
  "$BIN" "${I[@]}" "${R[@]}" --opt-level $ol --cast-type bf16 --steps 20 --save-every 10 --checkpoint s-$ol > /dev/null 2>&1 &&
    from_step s-$ol r-$ol 10 &&
    "$BIN" "${I[@]}" "${R[@]}" --opt-level $ol --cast-type bf16 --steps 20 --checkpoint r-$ol --resume > /dev/null 2>&1
  rc=$? diff=""
  for f in model.safetensors state.safetensors optimizer.bin; do cmp -s s-$ol/step-20/$f r-$ol/step-20/$f || diff="$diff $f"; done
  [ $rc -eq 0 ] && [ -z "$diff" ] && pass "bitwise resume on the GPU at $ol (clip, accum): step-20's files identical" ||
    flunk "resume on the GPU at $ol: rc $rc, differing:$diff"
done

# ---- checkpoints across devices -------------------------------------------------------------------------------
E=(--model cnn --opt-level O2 --cast-type bf16 --batch-size 64)
"$BIN" "${I[@]}" "${E[@]}" --steps 40 --device cuda --checkpoint ckg > ckg.txt 2>&1 || flunk "cnn checkpoint on the GPU: $(tail -2 ckg.txt)"
"$BIN" "${I[@]}" "${E[@]}" --steps 40 --threads "$CPU_THREADS" --checkpoint ckc > ckc.txt 2>&1 || flunk "cnn checkpoint on the CPU: $(tail -2 ckc.txt)"
for src in g c; do
  for dev in cpu cuda; do
    "$BIN" "${I[@]}" "${E[@]}" --steps 40 --device $dev --threads "$CPU_THREADS" --checkpoint ck$src --eval-only > ev-$src-$dev.txt 2>&1
  done
  a1=$(acc ev-$src-cpu.txt) a2=$(acc ev-$src-cuda.txt) a0=$(acc ck$src.txt)
  msg="a checkpoint made on the $([ $src = g ] && echo GPU || echo CPU) evaluates on both: trained $a0, cpu $a1, gpu $a2"
  awk -v a="$a1" -v b="$a2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 0.002) }' && pass "$msg" || flunk "$msg"
done
"$BIN" "${I[@]}" "${E[@]}" --steps 50 --device cuda --checkpoint ckc --resume > res.txt 2>&1 &&
  grep -q "resumed from ckc/step-40" res.txt && [ -f ckc/step-50/model.safetensors ] &&
  pass "a CPU checkpoint resumes on the GPU: $(acc res.txt)" || flunk "a CPU checkpoint resumed on the GPU: $(tail -2 res.txt)"
"$BIN" "${I[@]}" "${E[@]}" --steps 20 --device cuda --init-from ckg/step-40/model.safetensors > init.txt 2>&1 &&
  pass "--init-from a GPU checkpoint's weights on the GPU: $(acc init.txt)" || flunk "--init-from on the GPU: $(tail -2 init.txt)"

# ---- evaluation, log and plot on the GPU ------------------------------------------------------------------------
"$BIN" "${I[@]}" --model cnn --steps 30 --eval-every 10 --device cuda --log ev.jsonl > evl.txt 2>&1
n_eval=$(grep -c '"eval_accuracy"' ev.jsonl 2> /dev/null)
if [ "$n_eval" = 3 ] && grep -q '"gpu_mem_gb"' ev.jsonl && [ -s ev.svg ]; then pass "--eval-every, --log and the plot on the GPU: 3 evaluations, $(acc evl.txt)"
else flunk "--eval-every/--log/plot on the GPU: $n_eval evaluations; $(tail -2 evl.txt)"; fi
finish
