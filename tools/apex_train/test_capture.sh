#!/usr/bin/env bash
# test_capture.sh APEX_TRAIN: apex-train's captured step (capture_step.h; ctest apex_train_capture) against
# the eager step (--no-capture), the reference: on the CPU a capture runs the step and each replay runs
# it again, so a captured run must write the eager run's checkpoints byte for byte.
#  - gpt, mlp and cnn at O0, O2 bf16 and O2 f16, each with --grad-accum 1 and 2: 6 steps saved every 3;
#    step-3's and step-6's files (model.safetensors, optimizer.bin, state.safetensors) compared with
#    cmp, and the logs without their timings (loss, loss scale, skipped, lr, grad_norm) with diff;
#  - a captured run resumed from the captured step-3 ends with the eager run's step-6 bytes;
#  - skipped steps: O2 f16 with a static scale of 1e30 overflows every step: the captured log says
#    step_skipped at each step as the eager one does, and the bytes agree;
#  - the summary line names the step's kind: "captured step" by default, "eager step (REASON)" with
#    --no-capture and with --clip-grad-norm (its coefficient is computed on the host).
# The images are a small IDX set made by test_features_util.py (numpy); without numpy only the GPT runs.
. "$(dirname "$0")/test_lib.sh" "$1"
strip() { sed 's/,"samples_per_s.*//' "$1"; } # the log without its timings
FILES=(model.safetensors optimizer.bin state.safetensors)

head -c 3000 /usr/share/common-licenses/GPL-3 > small.txt 2> /dev/null || /usr/bin/python3 -c "print('abcdefgh ' * 400)" > small.txt
COMMON=(--threads 2 --steps 6 --save-every 3)
G=(--model gpt --data small.txt --batch-size 4 --seq-len 16 --n-embd 32 --n-head 2 --sample-bytes 4)
models=(gpt)
if /usr/bin/python3 -c "import numpy" 2> /dev/null; then
  mkdir idx && /usr/bin/python3 "$SRC/test_features_util.py" idx idx 400 100 12 16 3 && models+=(mlp cnn)
fi
I=(--data idx --batch-size 16)
flags_of() { # MODEL: its flags
  case $1 in
  gpt) echo "${G[@]}" ;;
  mlp) echo --model mlp --hidden 32 "${I[@]}" ;;
  cnn) echo --model cnn "${I[@]}" ;;
  esac
}
# same A B NAME: A's and B's checkpoint files at steps 3 and 6 are the same bytes
same() {
  local diff=""
  for s in 3 6; do for f in "${FILES[@]}"; do cmp -s "$1/step-$s/$f" "$2/step-$s/$f" || diff="$diff step-$s/$f"; done; done
  [ -z "$diff" ] && ok "$3: step-3's and step-6's files identical" || ko "$3: differing:$diff"
}

for model in "${models[@]}"; do
  read -r -a M <<< "$(flags_of $model)"
  for level in "O0 f16" "O2 bf16" "O2 f16"; do
    set -- $level
    for K in 1 2; do
      tag=$model-$1-$2-k$K
      A=("${M[@]}" "${COMMON[@]}" --opt-level "$1" --cast-type "$2" --grad-accum $K)
      "$BIN" "${A[@]}" --checkpoint cap-$tag --log cap-$tag.jsonl > cap-$tag.out 2>&1 || { ko "$tag captured: $(tail -2 cap-$tag.out)"; continue; }
      "$BIN" "${A[@]}" --no-capture --checkpoint eag-$tag --log eag-$tag.jsonl > eag-$tag.out 2>&1 || { ko "$tag eager: $(tail -2 eag-$tag.out)"; continue; }
      grep -q "skipped, captured step$" cap-$tag.out && grep -q "skipped, eager step (--no-capture)$" eag-$tag.out ||
        ko "$tag: the summary lines do not name the step: $(grep ' steps in ' cap-$tag.out eag-$tag.out)"
      same cap-$tag eag-$tag "$tag captured = eager"
      diff <(strip cap-$tag.jsonl) <(strip eag-$tag.jsonl) > /dev/null && ok "$tag: the logs agree (loss, skipped, grad_norm)" ||
        ko "$tag: the logs differ: $(diff <(strip cap-$tag.jsonl) <(strip eag-$tag.jsonl) | head -4)"
      # resumed: step-3 of the captured run, 3 more captured steps, the eager run's step-6
      from_step cap-$tag res-$tag 3 && "$BIN" "${A[@]}" --checkpoint res-$tag --resume > res-$tag.out 2>&1 || ko "$tag resumed: $(tail -2 res-$tag.out)"
      diff=""
      for f in "${FILES[@]}"; do cmp -s res-$tag/step-6/$f eag-$tag/step-6/$f || diff="$diff $f"; done
      [ -z "$diff" ] && ok "$tag: captured, resumed at step 3 = eager at step 6" || ko "$tag resumed: differing:$diff"
    done
  done
done

# ---- skipped steps: a static scale of 1e30 overflows f16 at every step ------------------------------------
for model in "${models[@]}"; do
  read -r -a M <<< "$(flags_of $model)"
  A=("${M[@]}" "${COMMON[@]}" --opt-level O2 --cast-type f16 --loss-scale 1e30)
  "$BIN" "${A[@]}" --checkpoint cs-$model --log cs-$model.jsonl > cs-$model.out 2>&1 &&
    "$BIN" "${A[@]}" --no-capture --checkpoint es-$model --log es-$model.jsonl > es-$model.out 2>&1 || ko "$model overflowing: $(tail -2 cs-$model.out es-$model.out)"
  n=$(grep -c '"step_skipped":true' cs-$model.jsonl)
  [ "$n" = 6 ] && diff <(strip cs-$model.jsonl) <(strip es-$model.jsonl) > /dev/null && ok "$model, every step overflowing: 6 skipped steps in both logs" ||
    ko "$model overflowing: $n skipped steps captured (want 6); $(diff <(strip cs-$model.jsonl) <(strip es-$model.jsonl) | head -4)"
  same cs-$model es-$model "$model overflowing: captured = eager"
done

# ---- the step's kind in the summary ------------------------------------------------------------------------
out=$("$BIN" "${G[@]}" --threads 2 --steps 2 --clip-grad-norm 1 2>&1)
grep -q "skipped, eager step (--clip-grad-norm: the clip coefficient is computed on the host)$" <<< "$out" &&
  ok "--clip-grad-norm steps eagerly: $(grep ' steps in ' <<< "$out")" || ko "--clip-grad-norm's summary: $(grep ' steps in ' <<< "$out")"
[ "${#models[@]}" -gt 1 ] || skip "/usr/bin/python3 with numpy makes the IDX set of the mlp and cnn checks (Debian: python3-numpy)"
finish
