#!/usr/bin/env bash
# test_amp_accuracy.sh APEX_TRAIN: mixed precision costs no accuracy. The MLP and the CNN, two epochs
# with the same seed, at O1 and O2 in f16 and in bf16, each within 0.5 points of test accuracy of
# the same run at O0 (ctest apex_train_amp_accuracy, label long; ~15 minutes on 2 cores). Skips (77)
# without the data set.
set -uo pipefail
BIN=$1
FM=${APEX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "Fashion-MNIST not installed in $FM: skipped"; exit 77; }
fails=0
acc_of() { "$BIN" --threads 2 --data "$FM" --seed 1 "$@" | sed -n 's/^apex-train: test accuracy //p'; }
for model in mlp cnn; do
  base=$(acc_of --model $model --opt-level O0)
  echo "$model O0: $base"
  for level in O1 O2; do
    for cast in f16 bf16; do
      acc=$(acc_of --model $model --opt-level $level --cast-type $cast)
      if [ -n "$acc" ] && awk -v a="$acc" -v b="$base" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.005) }'; then
        echo "ok   $model $level $cast: $acc (O0 $base)"
      else
        echo "FAIL $model $level $cast: $acc, more than 0.5 points from O0's $base"
        fails=$((fails + 1))
      fi
    done
  done
done
[ $fails -eq 0 ]
