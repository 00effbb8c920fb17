#!/usr/bin/env bash
# test_default.sh APEX_TRAIN: the default run (the CNN on Fashion-MNIST at O1, two epochs) reaches
# 0.89 test accuracy (ctest apex_train_default, label long). Skips (77) without the data set.
set -uo pipefail
BIN=$1
FM=${APEX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$FM/train-images-idx3-ubyte.gz" ]; then
  echo "Fashion-MNIST not installed in $FM (Debian: dataset-fashion-mnist): skipped"
  exit 77
fi
start=$(date +%s)
out=$("$BIN" --threads 2 --data "$FM") || { echo "$out"; exit 1; }
echo "$out" | tail -3
acc=$(sed -n 's/^apex-train: test accuracy //p' <<< "$out")
echo "default run: test accuracy $acc in $(($(date +%s) - start)) s"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.89) }'
