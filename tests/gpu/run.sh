#!/bin/bash
# run.sh [LOGDIR]: on the GPU machine, from the project's root with .gpupkg/pkg.tar.xz beside it (made by
# pack.sh on the development machine): unpacks it under /tmp/g, finds the GPU machine's cuBLASLt, cuDNN
# and NCCL, runs every GPU check under a time cap so that the whole run ends within DEADLINE seconds
# (default 230: under 4 minutes on an H100), and prints ONE SUMMARY TABLE at the end: each step's name,
# exit status, seconds and its key figure (tests passed/failed, tokens/s, ratios against PyTorch),
# followed by every PASS/FAIL and benchmark line the steps printed. Every step's full output is kept in
# LOGDIR/steps/NAME.log (LOGDIR: $OUT when set, else /tmp/apex-gpu-logs) and everything in LOGDIR/all.log.
# A step that fails, crashes or finds no GPU does not stop the others; a step reached with under 10 s
# left is listed as "not run". SKIP="name1 name2" leaves steps out; ONLY="name..." runs just those.
# Exit status: 0 when every test step passed (rc 0; a benchmark's rc does not count), else 1.
set -u
T0=$(date +%s)
DEADLINE=${DEADLINE:-230}
LOGS=${1:-${OUT:-/tmp/apex-gpu-logs}}
L=$LOGS/steps
G=${APEX_GPU_PKG_DIR:-/tmp/g}
mkdir -p "$L"
exec > >(tee -a "$LOGS/all.log") 2>&1
now() { echo $(($(date +%s) - T0)); }
ROWS=() FAILED_TESTS=""

# ---- key figures, one per kind of step --------------------------------------------------------------------
key_cmocka() { # cmocka: passed/failed/skipped cases, the failed names, or the crash
  local f=$1 ok fl sk names
  ok=$(grep -c '^\[       OK \]' "$f")
  sk=$(grep -c '^\[  SKIPPED \]' "$f")
  names=$(grep '^\[  FAILED  \] [a-z]' "$f" | awk '{print $4}' | sort -u | tr '\n' ' ')
  fl=$(grep '^\[  FAILED  \] [a-z]' "$f" | awk '{print $4}' | sort -u | grep -c .)
  echo "passed $ok, failed $fl, skipped $sk${names:+: $names}"
}
key_passfail() { # PASS/FAIL lines (test_device.sh) and ok/FAIL lines (test_lib.sh)
  local f=$1
  echo "PASS $(grep -c '^PASS ' "$f"), FAIL $(grep -c '^FAIL ' "$f") $(grep -m1 '^skipped:' "$f")"
}
key_bench() { # the ratios against the peer: NAME=RATIO, at most 4, then a count
  local f=$1 n
  n=$(grep -c '^bench .* ratio=' "$f")
  grep '^bench .* ratio=' "$f" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^ratio=/) r = substr($i, 7); printf "%s %s %s x%s; ", $2, $3, $4, r}' |
    cut -c1-150 | tr -d '\n'
  [ "$n" -gt 0 ] || grep -m1 'skipped' "$f" | cut -c1-100
}
key_gpt2() { # the library's GPT-2 (bench_gpt2_stack): tokens/s with its ratio, host waits a step, phases
  local f=$1
  awk '$1 == "bench" && $2 ~ /gpt2_stack_bf16_(tokens_per_s|mfu|host_waits_per_step|eager_tokens_per_s)$/ && $3 != "failed:" {printf "%s %s %s; ", substr($2, 17), $3, $4}' "$f"
  grep -m1 -E 'skipped|failed' "$f" | cut -c1-100
}
key_profile() { # the host's microseconds per backward call of the costliest op kinds (APEX_BACKWARD_PROFILE)
  local f=$1
  awk '$1 == "#" && $NF == "call" && $(NF-1) == "a" {printf "%s %s\n", $(NF-3), $2}' "$f" | sort -gr | head -4 |
    awk '{printf "%s %.0f us; ", $2, $1}'
  awk '$1 == "#" && $2 == "linear" && $3 == "dgelu" {printf "%s linears fused GELU backward; ", $4}' "$f" # ops_linear.c's peephole
  grep -m1 -E '# APEX_BACKWARD_PROFILE' "$f" | sed 's/.*, \(.*\) in all/all \1/'
}
key_parity() { # the largest relative loss difference over the steps, apex / torch at the last, the verdict
  local f=$1
  awk '$1 == "bench" && $2 ~ /loss_parity$/ {printf "max rel %s %s; ", $3, $5}' "$f"
  grep -m1 -E '^(PASS|FAIL) |skipped' "$f" | cut -c1-90
}
key_memcheck() { grep -m1 'ERROR SUMMARY' "$1" | sed 's/^=* *//'; }
key_nccl() {
  local f=$1
  grep -E "passed|skipped|identical|FAIL" "$f" | grep -v '^\[' | tail -2 | tr '\n' ' ' | cut -c1-150
  key_cmocka "$f" | grep -v '^passed 0, failed 0, skipped 0$'
  grep -E '^apex-train: ' "$f" | tail -1 | cut -c1-150 # apex-train's last word (its error, or the test accuracy)
}
key_scaling() { grep -E '^bench .*(_t16|_worst_doubling) ' "$1" | awk '{printf "%s %s; ", $2, $3}' | sed 's/scaling_//g' | cut -c1-150; }

# step NAME CAP KIND KEYFN CMD...: runs CMD under min(CAP, time left), logs it, records a table row.
# KIND is "test" (its rc counts in run.sh's exit status) or "bench".
step() {
  local name=$1 cap=$2 kind=$3 keyfn=$4
  shift 4
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  if [[ " ${SKIP:-} " == *" $name "* ]]; then ROWS+=("$name|-|0|left out (SKIP)"); return; fi
  local t=$((DEADLINE - $(now)))
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 10 ]; then
    ROWS+=("$name|-|0|not run: no time left")
    [ "$kind" = test ] && FAILED_TESTS="$FAILED_TESTS $name(not-run)"
    return
  fi
  local a
  for a in "$@"; do # every packaged binary or script the command names must be there
    if [[ "$a" == "$G"/* ]] && [ ! -e "$a" ]; then
      ROWS+=("$name|-|0|not packed: ${a#"$G"/}")
      return
    fi
  done
  if [ ! -x "$1" ] && ! command -v "$1" > /dev/null 2>&1; then
    ROWS+=("$name|-|0|not found: $1")
    return
  fi
  echo "== $name (cap ${t}s, at $(now)s): $*"
  local s rc secs key
  s=$(date +%s)
  timeout -k 5 "$t" "$@" > "$L/$name.log" 2>&1
  rc=$?
  secs=$(($(date +%s) - s))
  tail -n 25 "$L/$name.log"
  key=$($keyfn "$L/$name.log" 2> /dev/null | tr '|' '/' | head -c 200)
  case $rc in
    124 | 137) key="TIMED OUT at ${t}s; $key" ;;
    139) key="SEGFAULT; $key" ;;
    127) key="cannot start (a library missing?): $(grep -m1 -i 'error while loading\|not found' "$L/$name.log" | cut -c1-120)" ;;
    77) key="skipped: $(grep -m1 -i 'skip' "$L/$name.log" | cut -c1-120)" ;;
  esac
  ROWS+=("$name|$rc|$secs|$key")
  [ "$kind" = test ] && [ "$rc" -ne 0 ] && FAILED_TESTS="$FAILED_TESTS $name"
  echo "== $name: rc=$rc in ${secs}s"
}

# ---- the machine, the package, CUDA's libraries --------------------------------------------------------------
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2> /dev/null || echo "nvidia-smi: no GPU driver here"
NGPU=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
lscpu 2> /dev/null | grep -E "Model name|^CPU\(s\)"
if [ ! -f "$G/.unpacked" ] || [ .gpupkg/pkg.tar.xz -nt "$G/.unpacked" ]; then
  rm -rf "$G" && mkdir -p "$G" && tar xJf .gpupkg/pkg.tar.xz -C "$G" || { echo "run.sh: cannot unpack .gpupkg/pkg.tar.xz (run pack.sh first)"; exit 1; }
  touch "$G/.unpacked"
fi
echo "package: commit $(tr '\n' ' ' < "$G/COMMIT"), unpacked in $(now)s"
find_lib() { # NAME: the directory of the GPU machine's copy of a CUDA library, or nothing
  local p
  p=$(ldconfig -p 2> /dev/null | awk -v n="$1" '$1 == n {print $NF; exit}')
  [ -z "$p" ] && p=$(find /usr/local/cuda* /usr/lib /opt -name "$1" 2> /dev/null | head -1)
  [ -z "$p" ] && p=$(python3 -c "import site, glob; print(next(iter(sum((glob.glob(s + '/nvidia/*/lib/$1') + glob.glob(s + '/torch/lib/$1') for s in site.getsitepackages()), [])), ''))" 2> /dev/null)
  echo "$p"
}
libs=""
for n in libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
  p=$(find_lib $n)
  echo "$n -> ${p:-NOT FOUND}"
  [ -n "$p" ] && libs="$libs:$(dirname "$p")"
  [ "$n" = libcudnn.so.9 ] && [ -n "$p" ] && export APEX_CUDNN=$p
done
export APEX_CUDA_LIBS=${libs#:} APEX_ROOT=$G/src APEX_TEST_DATA=$G/src/tests/data
export APEX_PEERS_PYTHON=${APEX_PEERS_PYTHON:-$(command -v python3)}
export APEX_FASHION_MNIST=$G/data/fashion-mnist
B=$G/build
# Open MPI from the package (OPAL_PREFIX relocates it), for test_nccl and apex-train --distributed.
MPIRUN=()
if [ -x "$G/ompi/bin/orterun" ]; then
  MPIRUN=(env OPAL_PREFIX="$G/ompi" PMIX_PREFIX="$G/ompi/lib/x86_64-linux-gnu/pmix2" PATH="$G/ompi/bin:$PATH" LD_LIBRARY_PATH="$G/lib"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    "$G/ompi/bin/orterun" -x LD_LIBRARY_PATH -x APEX_CUDA_LIBS -x APEX_CUDNN -x APEX_TEST_DATA)
fi

# ---- the tests (their rc counts) -----------------------------------------------------------------------------
step test_cuda 30 test key_cmocka "$B/tests/test_cuda"
step test_backend_ops 75 test key_cmocka "$B/tests/test_backend_ops"
step test_graph_cuda 40 test key_cmocka "$B/tests/test_graph_cuda"
step test_flash_attention 60 test key_cmocka "$B/tests/test_flash_attention"
step test_syncbn_cuda 20 test key_cmocka "$B/tests/test_syncbn_cuda"
# the library's captured step (apex_step_capture: one CUDA graph) against its eager step, bit for bit, and
# the device-side ids it reads (apex_index) against host ids
[ -x "$B/tests/test_capture" ] && step test_capture 60 test key_cmocka "$B/tests/test_capture"
[ -x "$B/tests/test_index" ] && step test_index 30 test key_cmocka "$B/tests/test_index"
# gradients in the values' dtype (amp's default on a GPU): each op's half path against round_bf16 of its f32 path,
# and a GPT's master gradients with them on and off
[ -x "$B/tests/test_half_grads" ] && step test_half_grads 40 test key_cmocka "$B/tests/test_half_grads"
# the MLP's GELU backward in the projection's product (cuBLASLt DGELU_BGRAD): the fused graph's gradients against
# the unfused graph's, and whether the fusion took place
[ -x "$B/tests/test_mlp_fusion" ] && step test_mlp_fusion 30 test key_cmocka "$B/tests/test_mlp_fusion"
# generation with a key/value cache on the GPU: the cached tokens against the uncached forward's argmax
[ -x "$B/tests/test_generate" ] && step test_generate 40 test key_cmocka "$B/tests/test_generate"
for t in test_cuda_epilogues test_cuda_nn_contract test_amp_device test_graph_device; do
  [ -x "$B/tests/$t" ] && step $t 30 test key_cmocka "$B/tests/$t"
done
# apex-train --device cuda against the CPU (16 threads): CNN O1 f16 / O2 bf16 accuracy, GPT losses,
# bitwise resume, checkpoints across devices (tools/apex_train/test_device.sh; PASS/FAIL lines).
step apex_train_cuda ${APEX_TRAIN_CAP:-100} test key_passfail env CPU_THREADS=${CPU_THREADS:-16} GPU_STEPS=${GPU_STEPS:-0} \
  bash "$G/src/tools/apex_train/test_device.sh" "$B/tools/apex-train" 1
# NCCL: one rank (mpirun from the package, else a singleton process); two ranks with two GPUs.
if [ ${#MPIRUN[@]} -gt 0 ]; then
  step nccl_1rank 30 test key_nccl "${MPIRUN[@]}" -np 1 "$B/tests/test_nccl"
  step ddp_cuda_1rank 40 test key_nccl "${MPIRUN[@]}" -np 1 "$B/tools/apex-train" --distributed --device cuda --model cnn \
    --sync-bn --steps 60 --opt-level O2 --cast-type bf16 --data "$APEX_FASHION_MNIST"
  # ZeRO stage 2 over NCCL (ncclReduceScatter / ncclAllGather, after the backward: NCCL has no unequal parts)
  step zero_cuda_1rank 40 test key_nccl "${MPIRUN[@]}" -np 1 "$B/tools/apex-train" --distributed --zero 2 --device cuda \
    --model cnn --steps 60 --opt-level O2 --cast-type bf16 --data "$APEX_FASHION_MNIST"
  if [ "$NGPU" -ge 2 ]; then
    step nccl_2ranks 40 test key_nccl "${MPIRUN[@]}" -np 2 "$B/tests/test_nccl"
    step ddp_cuda_2ranks 60 test key_nccl "${MPIRUN[@]}" -np 2 "$B/tools/apex-train" --distributed --device cuda --model cnn \
      --sync-bn --steps 60 --opt-level O2 --cast-type bf16 --data "$APEX_FASHION_MNIST"
  else
    [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" nccl_2ranks "* ]] || ROWS+=("nccl_2ranks|-|0|skipped: $NGPU GPU(s), two ranks need two")
  fi
else
  step nccl_1rank 30 test key_nccl "$B/tests/test_nccl"
fi
# ---- the benchmarks against PyTorch on the same GPU ----------------------------------------------------------
# GPT-2 small through the library (apex_gpt_create, autograd, amp O2-bf16, AdamW: bench_gpt2_stack), then PyTorch
# on the same problem, given apex's figure for its ratios (eager; GPT2_MODES=eager,compile adds torch.compile, whose
# warm-up takes about a minute: give GPT2_TORCH_CAP and GPT2_COMPILE_TIMEOUT room for it)
step gpt2_stack 60 bench key_gpt2 "$B/bench/bench_gpt2_stack"
# the captured step's figure, else (a capture that failed) the eager one's
tps_of() { awk '$1 == "bench" && $2 == "gpt2_stack_bf16_tokens_per_s" && $3 != "failed:" {c = $3} $1 == "bench" && $2 == "gpt2_stack_bf16_eager_tokens_per_s" {e = $3} END {print c ? c : e}' "$1" 2> /dev/null; }
tps=$(tps_of "$L/gpt2_stack.log")
step gpt2_torch ${GPT2_TORCH_CAP:-60} bench key_bench python3 "$G/src/bench/peer_gpt2.py" "$B" ${tps:+--apex-tokens-per-s $tps} \
  --modes "${GPT2_MODES:-eager}" --compile-timeout ${GPT2_COMPILE_TIMEOUT:-40}
# the host's time per op kind in the library's backward (issue #31: microseconds, not hundreds), eager steps
step gpt2_host_profile 40 bench key_profile env APEX_BACKWARD_PROFILE=1 "$B/bench/bench_gpt2_stack" --steps 3 --warmup 1
# apex's GPT-2 and PyTorch's from the same initial weights on the same batch: 13 bf16 steps, every loss within 1%
# (gpt2_loss_dump writes GPT-2 small's weights, 500 MB, to a temporary directory that the script removes)
step gpt2_loss_parity 60 test key_parity python3 "$G/src/bench/gpt2_loss_parity.py" --apex "$B/bench/gpt2_loss_dump"
# the same pair at B = 16
step gpt2_stack_b16 60 bench key_gpt2 "$B/bench/bench_gpt2_stack" --batch 16
tps16=$(tps_of "$L/gpt2_stack_b16.log")
step gpt2_torch_b16 ${GPT2_TORCH_CAP:-60} bench key_bench python3 "$G/src/bench/peer_gpt2.py" "$B" --batch 16 \
  ${tps16:+--apex-tokens-per-s $tps16} --modes "${GPT2_MODES:-eager}" --compile-timeout ${GPT2_COMPILE_TIMEOUT:-40}
# what gradients in the values' dtype save (amp's half_grads, on by default on a GPU): the B = 8 step with them off
step gpt2_stack_f32grads 45 bench key_gpt2 "$B/bench/bench_gpt2_stack" --f32-grads --steps 5
# bench_cuda: AdamW over 100M parameters (f32; bf16 with f32 masters), LAMB, NovoGrad and AdamP over 100M f32 (10 s
# of the cap) and layer norm fwd+bwd at 256..8192 columns
# and RMSNorm at 768 and 4096 (GB/s against a device copy), bf16 GEMMs at 8192^3 and GPT-2's x w^T (M 8192, K 768,
# N 2304, 3072, 50304; TFLOP/s); peer_cuda.py: each against PyTorch, bench_cuda --time giving apex's seconds
step bench_cuda 55 bench key_bench "$B/bench/bench_cuda"
step peer_cuda 90 bench key_bench python3 "$G/src/bench/peer_cuda.py" "$B"
step bench_attention 60 bench key_bench "$B/bench/bench_attention"
step peer_attention 60 bench key_bench python3 "$G/src/bench/peer_attention.py" "$B"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -1)
step memcheck 50 test key_memcheck "${CS:-compute-sanitizer}" --tool memcheck --print-limit 20 --error-exitcode 1 "$B/tests/test_graph_cuda"
# ---- the tests that are mostly the CPU's (their GPU cases included), then the CPU benchmarks (optional) ----------
step test_kernels 20 test key_cmocka "$B/tests/test_kernels"
step test_multi_tensor 40 test key_cmocka "$B/tests/test_multi_tensor"
for t in test_optim_api test_optim_golden; do step $t 40 test key_cmocka "$B/tests/$t"; done
step bench_scaling ${SCALING_CAP:-120} bench key_scaling "$B/bench/bench_scaling"
# the same under OpenMP's usual binding, one thread a core (issue #33: every thread count must run, never slower
# with more threads); its lines are named scaling_bound_*
step scaling_bound ${SCALING_BOUND_CAP:-120} bench key_scaling env OMP_PLACES=cores OMP_PROC_BIND=close "$B/bench/bench_scaling"
# the half products' grid without its column split (16 row tiles as wide as the product: the grid issue #33's run
# measured as --half-min-tiles 16) against the default's figures just above: the measure that keeps or drops the split
step scaling_rows16 ${SCALING_ROWS_CAP:-90} bench key_scaling "$B/bench/bench_scaling" --models mlp,gpt_c256,gpt_c768 --no-peer --half-rows-only
step cpu_amp 30 bench key_bench env OMP_NUM_THREADS=16 "$B/bench/bench_amp" _step

# ---- the summary -------------------------------------------------------------------------------------------------
echo
echo "==================== apex GPU check: $(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1) commit $(head -1 "$G/COMMIT"), $(now)s of ${DEADLINE}s ===================="
printf '%-20s %4s %5s  %s\n' step rc secs "key figure"
for r in "${ROWS[@]}"; do
  IFS='|' read -r n rc s k <<< "$r"
  printf '%-20s %4s %5s  %s\n' "$n" "$rc" "$s" "$k"
done
echo "---- PASS/FAIL and benchmark lines ----"
for f in "$L"/*.log; do
  [ -f "$f" ] || continue
  grep -hE '^(PASS|FAIL) |^bench .*(ratio=|skipped)|^apex-train: training state identical|^test_nccl' "$f" | sed "s|^|$(basename "$f" .log): |" | cut -c1-220
done
if [ -n "$FAILED_TESTS" ]; then
  echo "RESULT: FAILED:$FAILED_TESTS (logs in $L)"
  exit 1
fi
echo "RESULT: every test step passed (logs in $L)"
