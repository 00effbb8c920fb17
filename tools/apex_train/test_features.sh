#!/usr/bin/env bash
# test_features.sh APEX_TRAIN: apex-train's training features (ctest apex_train_features).
#  - evaluation: --eval-every lines in the log; training bits unchanged by evaluating; the GPT's
#    held-out validation loss (ln 256 for an untrained model); --eval-only and --sample from a
#    checkpoint give the training run's figures and write nothing;
#  - knobs: --lr-schedule/--warmup against the closed form; --clip-grad-norm and the logged gradient
#    norm against the weights' own update (SGD from one --init-from start); --grad-accum K x B equal
#    to one batch of K B; each knob recorded and checked on resume; bitwise resume with them all on;
#  - data: an IDX set of another size and class count (MNIST's file names) learned by the MLP and
#    the CNN; llm.c .bin tokens (vocabulary rule); bad IDX and .bin files refused;
#  - --tokenizer: a .bin run's sample decoded to text with a GPT-2 vocab.json (tests/data/gpt2_tokenizer),
#    checked against test_features_util.py's decoding of the same sample's ids; bad vocabularies refused;
#  - the validation split: its size against the closed form, training bits unchanged when the held-out
#    images are replaced, --val-fraction 0 and checkpoints without the record (a fixture made by the
#    build before the split, tests/presplit) train and resume as before, bit for bit, a split run
#    resumes bitwise, bad fractions exit 2 in one line;
#  - --init-from: names and shapes checked; --n-layer/--n-embd/--n-head/--seq-len/--hidden shape the
#    model and are refused for the other models;
#  - the SVG loss curve: next to the log, and `apex-train plot` of one and several logs, every point
#    checked against the logs; its bad inputs.
# The expected values come from test_features_util.py (closed forms and numpy), not from apex-train.
. "$(dirname "$0")/test_lib.sh" "$1"
U() { /usr/bin/python3 "$SRC/test_features_util.py" "$@"; }
if ! /usr/bin/python3 -c "import numpy" 2> /dev/null; then
  echo "SKIP: /usr/bin/python3 with numpy is needed for the independent checks (Debian: python3-numpy)"
  exit 77
fi
check() { # NAME COMMAND...: ok when the command succeeds
  local name=$1
  shift
  local out
  if out=$("$@" 2>&1); then ok "$name: $(tail -1 <<< "$out")"; else ko "$name: $out"; fi
}
strip() { sed 's/,"samples_per_s.*//' "$1"; } # the log without its timings

head -c 2000 /usr/share/common-licenses/GPL-3 > small.txt
G=(--model gpt --threads 2 --batch-size 4 --seq-len 16 --sample-bytes 16 --data small.txt)

# ---- refusals ------------------------------------------------------------------------------------------
bad "--n-layer for the mlp" --model mlp --n-layer 2
bad "--n-embd for the cnn" --model cnn --n-embd 32
bad "--seq-len for the cnn" --seq-len 32
bad "--hidden for the gpt" --model gpt --hidden 64
bad "--sample for the cnn" --sample --checkpoint ck
bad "--eval-only without a checkpoint" --model gpt --eval-only
bad "--eval-only and --sample" --model gpt --eval-only --sample --checkpoint ck
bad "--init-from with --resume" --model gpt --init-from x.safetensors --resume --checkpoint ck
bad "bad --lr-schedule" --lr-schedule step
bad "--grad-accum 0" --grad-accum 0
bad "--clip-grad-norm not a number" --clip-grad-norm big
bad "--warmup negative" --warmup -1
bad "--n-embd not a multiple of --n-head" "${G[@]}" --n-embd 30 --n-head 4
bad "--seq-len past 1024" --model gpt --seq-len 2000
bad "--n-layer 0" --model gpt --n-layer 0
bad "--grad-accum with --distributed" --model gpt --grad-accum 2 --distributed
bad "--grad-accum past an epoch" "${G[@]}" --grad-accum 1000
bad "--eval-only from an empty directory" "${G[@]}" --eval-only --checkpoint "$W"

# ---- llm.c token files ---------------------------------------------------------------------------------
U bin good.bin good && U bin big.bin big
for k in magic version count zero odd header; do U bin "$k.bin" "$k"; done
: > empty.bin && : > empty.txt
bad ".bin: bad magic" "${G[@]}" --data magic.bin
bad ".bin: bad version" "${G[@]}" --data version.bin
bad ".bin: count larger than the tokens" "${G[@]}" --data count.bin
bad ".bin: zero tokens" "${G[@]}" --data zero.bin
bad ".bin: odd byte after the tokens" "${G[@]}" --data odd.bin
bad ".bin: truncated header" "${G[@]}" --data header.bin
bad ".bin: empty file" "${G[@]}" --data empty.bin
bad "text: empty file" "${G[@]}" --data empty.txt
out=$("$BIN" "${G[@]}" --data good.bin --steps 2 --n-embd 16 --n-head 2 --checkpoint tb 2>&1)
grep -q "vocabulary 50257" <<< "$out" && U shape tb/step-2/model.safetensors wte.weight 50257 16 > /dev/null &&
  ok ".bin of GPT-2 tokens: vocabulary 50257 (wte [50257, 16])" || ko ".bin vocabulary: $out"
grep -q "validation loss" <<< "$out" && grep -qE "^0( [0-9]+){16}$" <<< "$out" && ok ".bin: validation loss and a sample of 16 token ids" ||
  ko ".bin validation and sample: $out"
# --vocab: a head of 300 for tokens all below 300 (good.bin: ids 0-299); one at or under a token is refused.
out=$("$BIN" "${G[@]}" --data good.bin --steps 2 --n-embd 16 --n-head 2 --vocab 300 --checkpoint tv 2>&1)
grep -q "vocabulary 300" <<< "$out" && U shape tv/step-2/model.safetensors wte.weight 300 16 > /dev/null &&
  ok "--vocab 300 on a .bin of ids below 300: wte [300, 16]" || ko "--vocab 300: $out"
out=$("$BIN" --checkpoint tv --data good.bin --threads 2 --eval-only 2>&1) && grep -q "validation loss" <<< "$out" &&
  ok "--eval-only of a --vocab 300 checkpoint: the vocabulary from its shapes" || ko "--eval-only of tv: $out"
bad "--vocab below a token" "${G[@]}" --data good.bin --steps 1 --vocab 200
grep -q "has token 299; give at least 300" <<< "$LAST_ERR" || ko "--vocab 200 message: $LAST_ERR"
out=$("$BIN" "${G[@]}" --data big.bin --steps 1 --n-embd 16 --n-head 2 --checkpoint tb2 2>&1)
grep -q "vocabulary 60001" <<< "$out" && U shape tb2/step-1/model.safetensors wte.weight 60001 16 > /dev/null &&
  ok ".bin with token 60000: vocabulary 60001" || ko ".bin big vocabulary: $out"
rm -rf tb tb2

# ---- --tokenizer: the sample of a token file as text (GPT-2 byte-level BPE, tests/data/gpt2_tokenizer) ---------
TOKD="$SRC/../../tests/data/gpt2_tokenizer"
"$BIN" "${G[@]}" --data good.bin --steps 2 --n-embd 16 --n-head 2 --vocab 300 --sample-bytes 60 --checkpoint tk > /dev/null 2>&1 ||
  ko "a --vocab 300 run for the tokenizer"
"$BIN" --checkpoint tk --data good.bin --threads 2 --sample > tk_ids.out 2>&1 || ko "--sample as ids: $(cat tk_ids.out)"
"$BIN" --checkpoint tk --data good.bin --threads 2 --sample --tokenizer "$TOKD" > tk_text.out 2>&1 || ko "--sample --tokenizer: $(cat tk_text.out)"
check "--tokenizer: the sample's ids decoded by test_features_util.py (GPT-2's byte table) are the text printed" \
  U decode "$TOKD/vocab.json" tk_ids.out tk_text.out
# With <|endoftext|> in the model's vocabulary the sample starts from it, as GPT-2's own samples do.
"$BIN" "${G[@]}" --data good.bin --steps 1 --n-embd 16 --n-head 2 --vocab 301 --sample-bytes 8 --tokenizer "$TOKD" > tk_eot.out 2>&1 &&
  sed -n '/^apex-train: sample:$/{n;p}' tk_eot.out | LC_ALL=C grep -q '^<|endoftext|>' && ok "--tokenizer: the sample starts at <|endoftext|>" ||
  ko "--tokenizer prompt: $(cat tk_eot.out)"
mkdir tok_none tok_json tok_char tok_id tok_dup
echo '{"a": 0,' > tok_json/vocab.json
echo '{"a": 0, "\u4e00": 1}' > tok_char/vocab.json
echo '{"a": "zero"}' > tok_id/vocab.json
echo '{"a": 0, "b": 0}' > tok_dup/vocab.json
bad "--tokenizer for the mlp" --model mlp --tokenizer "$TOKD"
bad "--tokenizer for byte-level text" "${G[@]}" --steps 1 --tokenizer "$TOKD"
bad "--tokenizer: no vocab.json" "${G[@]}" --data good.bin --vocab 300 --steps 1 --tokenizer tok_none
bad "--tokenizer: not JSON" "${G[@]}" --data good.bin --vocab 300 --steps 1 --tokenizer tok_json
bad "--tokenizer: a character outside GPT-2's byte table" "${G[@]}" --data good.bin --vocab 300 --steps 1 --tokenizer tok_char
bad "--tokenizer: an id that is not a number" "${G[@]}" --data good.bin --vocab 300 --steps 1 --tokenizer tok_id
bad "--tokenizer: two tokens with one id" "${G[@]}" --data good.bin --vocab 300 --steps 1 --tokenizer tok_dup
bad "--tokenizer smaller than the model's vocabulary (50257)" "${G[@]}" --data good.bin --steps 1 --tokenizer "$TOKD"
rm -rf tk tok_none tok_json tok_char tok_id tok_dup

# ---- IDX image sets ---------------------------------------------------------------------------------------
mkdir idx && U idx idx 2000 400 12 16 3
# 2000 training images, the last 200 held out for validation (the default --val-fraction 0.1): 56 steps of 32.
out=$("$BIN" --model mlp --data idx --threads 2 --batch-size 32 --epochs 2 --hidden 64 --eval-every 40 --log m.jsonl --checkpoint mk 2>&1)
acc=$(sed -n 's/^apex-train: test accuracy //p' <<< "$out")
grep -q "of 12x16, 3 classes" <<< "$out" && awk "BEGIN{exit !($acc > 0.95)}" && U shape mk/step-112/model.safetensors 0.weight 64 192 > /dev/null &&
  U shape mk/step-112/model.safetensors 4.weight 3 32 > /dev/null && ok "MLP on a 12x16, 3-class IDX set (MNIST names, --hidden 64): accuracy $acc" ||
  ko "MLP on the IDX set: $out"
[ "$(grep -c eval_accuracy m.jsonl)" = 3 ] && [ "$(grep -c test_accuracy m.jsonl)" = 1 ] && [ "$(tail -1 m.jsonl | grep -c '"step":112,"test_loss"')" = 1 ] &&
  ok "--eval-every 40 of 112 steps: validation at 40, 80 and the end, the test set once at the end" || ko "eval lines: $(grep eval m.jsonl)"
grep -q "^apex-train: step 40: validation loss [0-9.]* accuracy [0-9.]*$" <<< "$out" &&
  grep -q "^apex-train: validation loss [0-9.]* accuracy [0-9.]* (200 held-out training images)$" <<< "$out" && ! grep -q "step [0-9]*: test" <<< "$out" &&
  ok "the lines during training are the validation split's; the end prints validation and test" || ko "validation lines: $out"
out=$("$BIN" --model cnn --data idx --threads 2 --batch-size 32 --steps 30 2>&1)
acc=$(sed -n 's/^apex-train: test accuracy //p' <<< "$out")
awk "BEGIN{exit !($acc > 0.9)}" && ok "CNN on the 12x16 set: accuracy $acc" || ko "CNN on the IDX set: $out"
cp -r idx bi
bad_idx() { # NAME FILE PYTHON-TRANSFORM
  rm -rf bi && cp -r idx bi && /usr/bin/python3 -c "import sys; p='bi/$2'; b=open(p,'rb').read(); open(p,'wb').write($3)"
  bad "IDX: $1" --model mlp --data bi --threads 2
}
bad_idx "truncated images" train-images.idx3-ubyte "b[:len(b)//2]"
bad_idx "bad magic" train-images.idx3-ubyte "b'\\x00\\x00\\x07\\x03' + b[4:]"
bad_idx "label count mismatch" train-labels.idx1-ubyte "b[:4] + (1999).to_bytes(4, 'big') + b[8:-1]"
bad_idx "empty file" t10k-images.idx3-ubyte "b''"
bad_idx "zero images" train-images.idx3-ubyte "b[:4] + (0).to_bytes(4, 'big') + b[8:16]"
bad_idx "test label past the classes" t10k-labels.idx1-ubyte "b[:8] + bytes([7]) + b[9:]"
bad_idx "test images of another size" t10k-images.idx3-ubyte "b[:8] + (16).to_bytes(4, 'big') + (12).to_bytes(4, 'big') + b[16:]"
rm -rf bi && mkdir bi && cp idx/train-* bi/
bad "IDX: test files missing" --model mlp --data bi

# ---- the validation split (--val-fraction) -------------------------------------------------------------------
# Its size, closed form (test_features_util.py split): V = round(F N) of the N = 2000 training images.
V=(--model mlp --data idx --threads 2 --batch-size 32 --hidden 16)
for f in 0.1 0.25 0.333 0.0004 0.05; do
  read -r nv nt spe < <(U split 2000 32 $f)
  out=$("$BIN" "${V[@]}" --val-fraction $f --steps 1 2>&1)
  grep -q "($nt training images of 12x16, 3 classes; the last $nv held out for validation).* epochs of $spe steps" <<< "$out" &&
    ok "--val-fraction $f: $nv held out, $nt train, $spe steps of 32" || ko "--val-fraction $f (want $nv/$nt/$spe): $(head -1 <<< "$out")"
done
# Training never reads a validation image: replacing the held-out 200 changes no training bit, only the validation figures.
U swap-val idx idxv 200 > /dev/null
"$BIN" "${V[@]}" --epochs 2 --eval-every 30 --log va.jsonl --save-every 56 --checkpoint va > va.out 2>&1 || ko "split run: $(tail -1 va.out)"
"$BIN" "${V[@]}" --epochs 2 --eval-every 30 --log vb.jsonl --checkpoint vb --data idxv > vb.out 2>&1 || ko "split run, other validation images: $(tail -1 vb.out)"
same=1
for f in model.safetensors optimizer.bin state.safetensors; do cmp -s va/step-112/$f vb/step-112/$f || same=0; done
[ $same = 1 ] && [ "$(grep -v eval_ va.jsonl | grep -v test_ | sed 's/,"samples_per_s.*//')" = "$(grep -v eval_ vb.jsonl | grep -v test_ | sed 's/,"samples_per_s.*//')" ] &&
  [ "$(grep "test loss" va.out)" = "$(grep "test loss" vb.out)" ] && [ "$(grep "^apex-train: validation" va.out)" != "$(grep "^apex-train: validation" vb.out)" ] &&
  ok "the 200 held-out images replaced: the same losses and checkpoint bytes, the same test loss, another validation loss" ||
  ko "the held-out images reach training: $(grep -h "validation loss\|test loss" va.out vb.out)"
[ "$(U meta va/step-112/state.safetensors val_fraction)" = 0.1 ] && ok "state.safetensors records val_fraction 0.1" || ko "val_fraction record: $(U meta va/step-112/state.safetensors val_fraction)"
# --val-fraction 0 is the build before the split: no record, --eval-every reports the test set, and the bits of the pre-split build
# (the checkpoint in tests/presplit: tiny IDX data, 15 of 20 steps of the command below, made by that build; the sha256 of its
# straight run's step-20 files, recorded with it).
P=(--model mlp --hidden 8 --data "$SRC/tests/presplit/data" --batch-size 16 --epochs 2 --seed 3 --threads 1)
REC="3c0eb3aba639d99b0bf29d33e2fb3bf0c7b86b7e4a8800d50919668aab000454 model.safetensors
cdcbefcbfb9db835f6f28277851b85462a38c74a9ff49ad15ffa293b965455af optimizer.bin
07f75d01336b0fd8f9b9b3148f1a0cd64b80dcbec05e7c99beeec7a6c3c7984a state.safetensors"
sums() { (cd "$1" && sha256sum model.safetensors optimizer.bin state.safetensors | sed 's/  / /'); }
out=$("$BIN" "${P[@]}" --val-fraction 0 --eval-every 10 --save-every 5 --checkpoint z0 2>&1)
grep -q "(160 training images of 8x8, 4 classes)" <<< "$out" && grep -q "^apex-train: step 10: test loss" <<< "$out" && ! grep -q validation <<< "$out" &&
  [ "$(U meta z0/step-20/state.safetensors val_fraction)" = absent ] && ok "--val-fraction 0: every image trains, --eval-every reports the test set, no record" ||
  ko "--val-fraction 0: $out"
cp -r "$SRC/tests/presplit/ck" pre && chmod -R u+w pre
"$BIN" "${P[@]}" --checkpoint pre --resume > pre.out 2>&1 || ko "resume the pre-split checkpoint: $(cat pre.out)"
grep -q "(160 training images of 8x8, 4 classes)" pre.out && ok "a pre-split checkpoint resumes with no split (default flags)" || ko "pre-split resume: $(head -1 pre.out)"
if [ "$(sums z0/step-20)" = "$REC" ]; then
  ok "--val-fraction 0: 20 steps give the pre-split build's checkpoint bytes (recorded sha256)"
  [ "$(sums pre/step-20)" = "$REC" ] && ok "the pre-split build's checkpoint at step 15 resumes to its straight run's bytes at step 20" ||
    ko "the pre-split checkpoint resumed differs from its straight run: $(sums pre/step-20)"
else
  echo "note: this CPU's arithmetic differs from the machine that recorded tests/presplit (a fresh --val-fraction 0 run differs from the record too); the recorded-bytes checks are skipped here, the same-machine ones below still run"
fi
# The same without the record: a --val-fraction 0 checkpoint (no val_fraction, as before the flag) resumed with the default flags.
from_step z0 z1 15
"$BIN" "${P[@]}" --checkpoint z1 --resume > /dev/null 2>&1 || ko "resume a --val-fraction 0 checkpoint"
same=1
for f in model.safetensors optimizer.bin state.safetensors; do cmp -s z0/step-20/$f z1/step-20/$f || same=0; done
[ $same = 1 ] && ok "a checkpoint without val_fraction resumed with the default flags: no split, bit for bit (20 = 15 + 5)" || ko "no-split resume differs"
# A split run resumes bitwise too, its fraction coming from the checkpoint.
from_step va vr 56
"$BIN" "${V[@]}" --epochs 2 --checkpoint vr --resume > /dev/null 2>&1 || ko "resume the split run"
same=1
for f in model.safetensors optimizer.bin state.safetensors; do cmp -s va/step-112/$f vr/step-112/$f || same=0; done
[ $same = 1 ] && ok "a split run: 112 steps = 56 + resume + 56, bit for bit" || ko "split resume differs"
eo=$("$BIN" --checkpoint va --data idx --threads 2 --eval-only 2>&1)
[ "$(grep -E "^apex-train: (validation|test)" <<< "$eo")" = "$(grep -E "^apex-train: (validation|test)" va.out)" ] &&
  ok "--eval-only of a split checkpoint: the run's validation and test figures" || ko "--eval-only of va: $eo"
bad "--val-fraction negative" "${V[@]}" --val-fraction -0.1
rc_all=$LAST_RC
bad "--val-fraction 1" "${V[@]}" --val-fraction 1
rc_all="$rc_all $LAST_RC"
bad "--val-fraction 1.5" "${V[@]}" --val-fraction 1.5
rc_all="$rc_all $LAST_RC"
bad "--val-fraction that holds out no image (round(0.0002 x 2000) = 0)" "${V[@]}" --val-fraction 0.0002
rc_all="$rc_all $LAST_RC"
bad "--val-fraction that leaves no training batch (20 images for a batch of 32)" "${V[@]}" --val-fraction 0.99
rc_all="$rc_all $LAST_RC"
bad "--val-fraction for the gpt" "${G[@]}" --val-fraction 0.1
rc_all="$rc_all $LAST_RC"
bad "--val-fraction not a number" "${V[@]}" --val-fraction some
rc_all="$rc_all $LAST_RC"
[ "$rc_all" = "2 2 2 2 2 2 2" ] && ok "each bad --val-fraction exits 2" || ko "bad --val-fraction exits: $rc_all"
bad "resume a split run with another --val-fraction" "${V[@]}" --epochs 2 --checkpoint va --resume --val-fraction 0.2
grep -q "was made with --val-fraction 0.1, this run gives --val-fraction 0.2" <<< "$LAST_ERR" || ko "the mismatch message: $LAST_ERR"
bad "resume a pre-split checkpoint with --val-fraction 0.1" "${P[@]}" --checkpoint z1 --resume --val-fraction 0.1
grep -q "was made with --val-fraction 0 (no validation split)" <<< "$LAST_ERR" || ko "the pre-split mismatch message: $LAST_ERR"

# ---- metrics and schedules ----------------------------------------------------------------------------
"$BIN" "${G[@]}" --epochs 1 --log lin.jsonl > lin.out 2>&1 || ko "linear run: $(cat lin.out)"
spe=$(sed -n 's/.* epochs of \([0-9]*\) steps.*/\1/p' lin.out)
U log-keys lin.jsonl loss lr grad_norm loss_scale skipped step_skipped samples_per_s tokens_per_s && ok "the log has lr, grad_norm, loss_scale, skipped, tokens/s" ||
  ko "log keys"
check "default schedule: linear to 5%, no warmup" U schedule lin.jsonl linear 0.003 0 "$spe"
"$BIN" "${G[@]}" --epochs 1 --warmup 5 --lr-schedule cosine --lr 0.01 --log cos.jsonl > /dev/null 2>&1
check "cosine with warmup 5" U schedule cos.jsonl cosine 0.01 5 "$spe"
"$BIN" "${G[@]}" --steps 12 --warmup 4 --lr-schedule constant --log con.jsonl > /dev/null 2>&1
check "constant with warmup 4" U schedule con.jsonl constant 0.003 4 "$spe"
"$BIN" "${G[@]}" --epochs 2 --warmup 3 --log lin2.jsonl > /dev/null 2>&1
check "linear with warmup 3 over 2 epochs" U schedule lin2.jsonl linear 0.003 3 $((2 * spe))
# The schedule ends at the run's last step: --steps before the end of the epochs ends it there.
"$BIN" "${G[@]}" --epochs 2 --steps 30 --log st.jsonl --checkpoint st > /dev/null 2>&1
check "--steps 30: linear ends at step 30 (5% of the peak)" U schedule st.jsonl linear 0.003 0 30
[ "$(tail -1 st.jsonl | sed 's/.*"lr":\([^,]*\),.*/\1/')" = "0.000150000007" ] && ok "--steps 30: the last step's lr is 5% of 0.003" ||
  ko "--steps 30: last lr $(tail -1 st.jsonl | sed 's/.*"lr":\([^,]*\),.*/\1/')"
"$BIN" "${G[@]}" --epochs 1 --steps 20 --warmup 4 --lr-schedule cosine --lr 0.01 --log cs.jsonl > /dev/null 2>&1
check "--steps 20: cosine with warmup 4 ends at step 20" U schedule cs.jsonl cosine 0.01 4 20
# A checkpoint of the old rule (no lr_schedule_total: written before the rule changed) resumes with
# the schedule ending at the end of the epochs, as it was trained.
"$BIN" "${G[@]}" --epochs 1 --steps 6 --checkpoint old > /dev/null 2>&1
U strip-total old/step-6/state.safetensors > /dev/null || ko "strip lr_schedule_total"
"$BIN" "${G[@]}" --epochs 1 --steps 9 --checkpoint old --resume --log old.jsonl > /dev/null 2>&1 || ko "resume the old-rule checkpoint"
check "an old-rule checkpoint resumes with the schedule over the epochs ($spe steps)" U schedule old.jsonl linear 0.003 0 "$spe"

# ---- evaluation --------------------------------------------------------------------------------------
"$BIN" "${G[@]}" --steps 1 --lr 1e-12 --lr-schedule constant > ln.out 2>&1
vl=$(sed -n 's/^apex-train: validation loss \([0-9.]*\).*/\1/p' ln.out)
awk "BEGIN{exit !($vl > 5.545 - 0.03 && $vl < 5.545 + 0.03)}" && ok "untrained GPT: validation loss $vl = ln 256 within 0.03" || ko "untrained validation loss: $(cat ln.out)"
"$BIN" "${G[@]}" --steps 12 --eval-every 4 --checkpoint ev --log ev.jsonl > ev.out 2>&1 || ko "eval run: $(cat ev.out)"
"$BIN" "${G[@]}" --steps 12 --log noev.jsonl > /dev/null 2>&1
[ "$(grep -v eval ev.jsonl | sed 's/,"samples_per_s.*//')" = "$(strip noev.jsonl)" ] && ok "evaluating every 4 steps leaves the training bits unchanged" ||
  ko "--eval-every changed training"
[ "$(grep -c eval_perplexity ev.jsonl)" = 3 ] && ok "gpt: validation loss and perplexity logged at 4, 8 and 12" || ko "gpt eval lines: $(grep eval ev.jsonl)"
last=$(sed -n 's/^apex-train: validation loss //p' ev.out)
before=$(snapshot)
eo=$("$BIN" "${G[@]}" --steps 12 --eval-only --checkpoint ev 2>&1)
sa=$("$BIN" "${G[@]}" --steps 12 --sample --checkpoint ev 2>&1)
[ "$(sed -n 's/^apex-train: validation loss //p' <<< "$eo")" = "$last" ] && ok "--eval-only: the run's validation loss $last" || ko "--eval-only: $eo"
[ "$(sed -n '/^apex-train: sample:/,$p' <<< "$sa")" = "$(sed -n '/^apex-train: sample:/,$p' ev.out)" ] && ok "--sample: the run's sample" || ko "--sample: $sa"
[ "$before" = "$(snapshot)" ] && ok "--eval-only and --sample write nothing" || ko "--eval-only/--sample changed files"

# ---- --init-from, --clip-grad-norm and the gradient norm -------------------------------------------------
S=("${G[@]}" --opt-level O0 --optimizer sgd --lr 0.1 --lr-schedule constant --steps 1)
"$BIN" "${G[@]}" --steps 3 --checkpoint w0 > /dev/null 2>&1
"$BIN" "${S[@]}" --init-from w0/step-3/model.safetensors --checkpoint cn --log cn.jsonl > /dev/null 2>&1 || ko "--init-from run"
"$BIN" "${S[@]}" --init-from w0/step-3/model.safetensors --checkpoint cc --log cc.jsonl --clip-grad-norm 0.25 > /dev/null 2>&1 || ko "clipped run"
check "--init-from, gradient norm and --clip-grad-norm" U clip w0/step-3/model.safetensors cn/step-1/model.safetensors cc/step-1/model.safetensors \
  cn.jsonl cc.jsonl 0.1 0.25
bad "--init-from a missing file" "${G[@]}" --init-from nothing.safetensors
bad "--init-from another model's weights" --model mlp --data idx --init-from w0/step-3/model.safetensors
bad "--init-from another shape" "${G[@]}" --n-embd 32 --init-from w0/step-3/model.safetensors
bad "--init-from not safetensors" "${G[@]}" --init-from small.txt

# ---- --grad-accum: K micro-batches of B = one batch of K B -----------------------------------------------
A=("${G[@]}" --lr-schedule constant --steps 6)
"$BIN" "${A[@]}" --opt-level O0 --batch-size 8 --log b8.jsonl > /dev/null 2>&1
"$BIN" "${A[@]}" --opt-level O0 --batch-size 4 --grad-accum 2 --log a2.jsonl > /dev/null 2>&1
check "O0: --grad-accum 2 x 4 = batch 8" U same-losses b8.jsonl a2.jsonl 1e-4
"$BIN" "${A[@]}" --batch-size 8 --log b8o1.jsonl > /dev/null 2>&1
"$BIN" "${A[@]}" --batch-size 4 --grad-accum 2 --log a2o1.jsonl > /dev/null 2>&1
check "O1 f16 (scaled gradients kept scaled between micro-batches): --grad-accum 2 x 4 = batch 8" U same-losses b8o1.jsonl a2o1.jsonl 2e-3

# ---- model sizes ----------------------------------------------------------------------------------------------
"$BIN" "${G[@]}" --steps 1 --n-layer 1 --n-embd 32 --n-head 2 --seq-len 8 --checkpoint sz > /dev/null 2>&1
U shape sz/step-1/model.safetensors wte.weight 256 32 > /dev/null && U shape sz/step-1/model.safetensors wpe.weight 8 32 > /dev/null &&
  U absent sz/step-1/model.safetensors h1.ln_1.weight > /dev/null && ok "--n-layer 1 --n-embd 32 --seq-len 8: wte [256, 32], wpe [8, 32], no h1" ||
  ko "gpt sizes: $(U shape sz/step-1/model.safetensors wte.weight 256 32)"
bad "resume with another --n-head" "${G[@]}" --steps 2 --n-layer 1 --n-embd 32 --n-head 4 --seq-len 8 --checkpoint sz --resume

# ---- resume: knobs recorded, checked, and bitwise ------------------------------------------------------
K=("${G[@]}" --warmup 3 --lr-schedule cosine --clip-grad-norm 0.5 --grad-accum 2 --eval-every 2)
"$BIN" "${K[@]}" --steps 8 --save-every 4 --checkpoint ks --log ks.jsonl > /dev/null 2>&1 || ko "knobs: straight run"
from_step ks kr 4
log_until ks.jsonl 4 > kr.jsonl
"$BIN" "${K[@]}" --steps 8 --checkpoint kr --log kr.jsonl --resume > /dev/null 2>&1 || ko "knobs: resumed half"
same=1
for f in model.safetensors optimizer.bin state.safetensors; do cmp -s ks/step-8/$f kr/step-8/$f || same=0; done
[ "$(strip ks.jsonl)" = "$(strip kr.jsonl)" ] && [ $same -eq 1 ] &&
  ok "warmup, cosine, clipping, accumulation, evaluation: 8 steps = 4 + resume + 4, bit for bit" || {
  ko "resume with the knobs differs"
  diff <(strip ks.jsonl) <(strip kr.jsonl) | head -5
}

# ---- --eval-only and --sample: the configuration comes from the checkpoint ------------------------------
"$BIN" "${K[@]}" --steps 8 --checkpoint ks --eval-only > ev_all.out 2>&1 || ko "--eval-only with every flag: $(cat ev_all.out)"
"$BIN" --checkpoint ks --data small.txt --threads 2 --eval-only > ev.out 2>&1
[ -n "$(grep "validation loss" ev.out)" ] && [ "$(grep "validation loss" ev.out)" = "$(grep "validation loss" ev_all.out)" ] &&
  ok "--eval-only with no flag but --data: the checkpoint's configuration, the same result: $(grep "validation loss" ev.out)" ||
  ko "--eval-only from the checkpoint: $(cat ev.out)"
"$BIN" --checkpoint ks --data small.txt --threads 2 --sample > sa.out 2>&1 && grep -q "sample:" sa.out &&
  ok "--sample with no model flag: the checkpoint's gpt" || ko "--sample from the checkpoint: $(cat sa.out)"
bad "--eval-only with another --warmup" --checkpoint ks --data small.txt --eval-only --warmup 5
grep -q "^apex-train: --eval-only: .*--warmup 3, this run gives --warmup 5; drop --warmup" <<< "$LAST_ERR" && ok "the error names --eval-only and --warmup" ||
  ko "the mismatch message: $LAST_ERR"
bad "--sample with another --n-embd" --checkpoint ks --data small.txt --sample --n-embd 32
grep -q "^apex-train: --sample: " <<< "$LAST_ERR" && ok "the error names --sample" || ko "the --sample message: $LAST_ERR"
bad "resume with another --warmup" "${K[@]}" --warmup 4 --steps 10 --checkpoint kr --resume
bad "resume with another --lr-schedule" "${K[@]}" --lr-schedule linear --steps 10 --checkpoint kr --resume
bad "resume with another --clip-grad-norm" "${K[@]}" --clip-grad-norm 1 --steps 10 --checkpoint kr --resume
bad "resume with another --grad-accum" "${K[@]}" --grad-accum 1 --steps 10 --checkpoint kr --resume

# ---- loss curves --------------------------------------------------------------------------------------------
[ -f ks.svg ] && check "the SVG next to a run's log (train and eval loss, loss scale)" U svg ks.svg ks.jsonl || ko "no ks.svg next to ks.jsonl"
# 60 steps at bf16: the moving average over the raw loss, and no loss-scale axis (the scale never changes).
"$BIN" "${G[@]}" --steps 60 --opt-level O2 --cast-type bf16 --log bf.jsonl > /dev/null 2>&1
[ -f bf.svg ] && ! grep -q "loss scale\|loss-scale" bf.svg && check "bf16, 60 steps: moving average drawn, no loss-scale axis" U svg bf.svg bf.jsonl ||
  ko "bf.svg: $(grep -c loss-scale bf.svg 2>&1) loss-scale elements"
U fake-log fake.jsonl
"$BIN" plot fake.jsonl > /dev/null && check "plot of a log with skips, a null loss and scale changes" U svg fake.svg fake.jsonl ||
  ko "apex-train plot fake.jsonl"
# A log whose scale moves beside a bf16 one: the scale axis, each run's scale line in its own colour (U svg checks the strokes).
"$BIN" plot -o mixed.svg fake.jsonl bf.jsonl > /dev/null && grep -q "loss scale (dotted)" mixed.svg &&
  check "plot of a moving-scale log and a bf16 log: scale axis, each scale line in its run's colour" U svg mixed.svg fake.jsonl bf.jsonl ||
  ko "apex-train plot fake.jsonl bf.jsonl"
for lvl in O0 O1 O2; do "$BIN" "${G[@]}" --steps 10 --opt-level $lvl --eval-every 5 --log $lvl.jsonl > /dev/null 2>&1; done
"$BIN" plot -o levels.svg O0.jsonl O1.jsonl O2.jsonl > /dev/null && check "plot of three logs (O0, O1, O2)" U svg levels.svg O0.jsonl O1.jsonl O2.jsonl ||
  ko "apex-train plot of three logs"
[ -n "${APEX_TRAIN_KEEP_PLOTS:-}" ] && cp levels.svg fake.svg ks.svg "$APEX_TRAIN_KEEP_PLOTS"/
echo '{"step":1,"loss":2}' > one.jsonl && echo 'not json' >> one.jsonl
bad "plot: a line that is not JSON" plot one.jsonl
bad "plot: a missing log" plot nothing.jsonl
echo '{"step":3,"eval_loss":1}' > evonly.jsonl
bad "plot: a log without training steps" plot evonly.jsonl
bad "plot: no log" plot
bad "plot: unknown option" plot -x fake.jsonl
bad "plot: output in a missing directory" plot -o no/dir.svg fake.jsonl

finish
