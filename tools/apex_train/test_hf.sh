#!/usr/bin/env bash
# test_hf.sh APEX_TRAIN: apex-train and Hugging Face GPT-2 files (ctest apex_train_hf).
#  - --init-from a GPT2LMHeadModel's model.safetensors (tests/data/gpt2_hf_tiny.safetensors, written by
#    Transformers: tests/gen_gpt2_hf_golden.py) trains with the file's sizes; the checkpoint keeps
#    apex-train's names and --seq-len rows of the position table;
#  - export then import is the identity: `apex-train export --format hf` of that checkpoint, given back
#    to --init-from, trains to the same bytes as --init-from the checkpoint's own model.safetensors;
#  - bad input, one line each and nothing written: a Hugging Face file for --model cnn, sizes that
#    disagree with the file, --seq-len past its positions, no --n-head for a width GPT-2 never had, a
#    file of neither layout, a truncated file; export of no checkpoint, of a non-GPT checkpoint, with
#    another --format, without --out, with an unknown flag, into a directory that cannot be made.
# The numbers against Transformers itself are test_gpt_hf's (golden file, and live where it imports).
. "$(dirname "$0")/test_lib.sh" "$1"
G=$SRC/../../tests/data/gpt2_hf_tiny.safetensors
for i in $(seq 200); do printf 'It was the best of times, it was the worst of times %d. ' "$i"; done > text.txt
GPT=(--model gpt --data text.txt --seq-len 16 --batch-size 2 --threads 1 --steps 2)

"$BIN" "${GPT[@]}" --init-from "$G" --n-head 4 --checkpoint a > a.out 2>&1 || { ko "--init-from a Hugging Face file failed:"; cat a.out; }
grep -q '"wpe.weight":{"dtype":"F32","shape":\[16,32\]' a/step-2/model.safetensors &&
  grep -q '"h1.attn.q.weight":{"dtype":"F32","shape":\[32,32\]' a/step-2/model.safetensors &&
  ok "--init-from HF: the checkpoint has apex-train's names, the file's width and --seq-len positions" ||
  ko "--init-from HF: unexpected tensor names or shapes in a/step-2/model.safetensors"

out=$("$BIN" export --format hf --checkpoint a --out hf 2>&1) && [ -f hf/model.safetensors ] && [ -f hf/config.json ] &&
  ok "export: $out" || ko "export failed: $out"
grep -q '"n_head": 4' hf/config.json && grep -q '"vocab_size": 300' hf/config.json && grep -q '"n_positions": 16' hf/config.json &&
  ok "export: config.json has n_head 4, vocab 300, 16 positions" || { ko "export: config.json:"; cat hf/config.json; }
grep -q '"transformer.h.1.attn.c_attn.weight":{"dtype":"F32","shape":\[32,96\]' hf/model.safetensors &&
  ok "export: Hugging Face names and Conv1D shapes" || ko "export: no transformer.h.1.attn.c_attn.weight [32, 96]"

# import(export(x)) == x: the same training from both files gives the same bytes.
SIZES=(--n-layer 2 --n-embd 32 --n-head 4 --vocab 300)
"$BIN" "${GPT[@]}" "${SIZES[@]}" --init-from a/step-2/model.safetensors --checkpoint b > b.out 2>&1 || { ko "--init-from apex's file:"; cat b.out; }
"$BIN" "${GPT[@]}" --n-head 4 --init-from hf/model.safetensors --checkpoint c > c.out 2>&1 || { ko "--init-from the export:"; cat c.out; }
cmp -s b/step-2/model.safetensors c/step-2/model.safetensors && cmp -s b/step-2/optimizer.bin c/step-2/optimizer.bin &&
  ok "export then --init-from trains to the same bytes as the checkpoint's own weights" ||
  ko "export then --init-from differs from --init-from the checkpoint's weights"

bad "HF file for the cnn" --model cnn --init-from "$G" --threads 1
bad "HF file, --n-layer disagrees" "${GPT[@]}" --init-from "$G" --n-head 4 --n-layer 3
bad "HF file, --vocab disagrees" "${GPT[@]}" --init-from "$G" --n-head 4 --vocab 512
bad "HF file, --seq-len past its positions" --model gpt --data text.txt --seq-len 65 --init-from "$G" --n-head 4 --threads 1
bad "HF file of width 32 without --n-head" "${GPT[@]}" --init-from "$G"
bad "HF file, --n-head does not divide the width" "${GPT[@]}" --init-from "$G" --n-head 5
bad "a file of neither layout" "${GPT[@]}" --init-from "$SRC/../../tests/data/golden.safetensors"
head -c 5000 "$G" > snap_trunc.safetensors
bad "a truncated HF file" "${GPT[@]}" --init-from snap_trunc.safetensors --n-head 4
rm -f snap_trunc.safetensors
bad "export: no checkpoint" export --format hf --checkpoint nowhere --out x
bad "export: another format" export --format onnx --checkpoint a --out x
bad "export: no --out" export --format hf --checkpoint a
bad "export: unknown flag" export --format hf --checkpoint a --out x --bogus
bad "export: --out cannot be made" export --format hf --checkpoint a --out no/such/dir
bad "export: --out is a file" export --format hf --checkpoint a --out text.txt
grep -q "apex-train export --format hf" <("$BIN" --help) && ok "--help names the export subcommand" || ko "--help lacks export"
"$BIN" export --help | grep -q -- "--checkpoint DIR" && ok "export --help" || ko "export --help"

FM=${APEX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ -f "$FM/train-images-idx3-ubyte.gz" ]; then
  "$BIN" --model mlp --data "$FM" --steps 1 --threads 1 --checkpoint mlp > /dev/null 2>&1 || ko "mlp run failed"
  bad "export: an mlp checkpoint" export --format hf --checkpoint mlp --out x
else
  echo "skipped: export of a non-GPT checkpoint (no Fashion-MNIST in $FM)"
fi
finish
