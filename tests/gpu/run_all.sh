#!/bin/sh
# run_all.sh [BUILD_DIR]: every GPU check of the CUDA issue in one command, for a lent GPU machine
# (the device tool's `run`, where each call costs a machine start): builds apex with CUDA (Release),
# then runs the parity suite test_cuda, the GPU benchmarks bench_cuda with the PyTorch peer
# (bench/peer_cuda.py, same GPU, same run), GPT-2 small training (bench_gpt2_cuda against
# bench/peer_gpt2.py: PyTorch eager autocast and torch.compile) and the NCCL test (run_nccl.sh).
# STEPS="test bench gpt2 nccl" (the default) picks which run, e.g. STEPS=gpt2 to fit one call's time
# limit; a failing step does not stop the others. Logs go to $OUT when it is set (the device tool brings
# that folder back), else to BUILD_DIR. Exit status: test_cuda's (0 when it did not run).
set -u
steps=${STEPS:-test bench gpt2 nccl}
want() { case " $(echo "$steps" | tr ',' ' ') " in *" $1 "*) return 0 ;; esac; return 1; }
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}
logs=${OUT:-$build}
mkdir -p "$logs"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DAPEX_CUDA=ON > "$logs/configure.log" 2>&1 ||
  { tail -20 "$logs/configure.log"; exit 1; }
cmake --build "$build" -j"${JOBS:-$(nproc)}" --target test_cuda bench_cuda bench_gpt2_cuda > "$logs/build.log" 2>&1 ||
  { grep -E "error" "$logs/build.log" | head -20; exit 1; }

# cuDNN for the convolution: the system's, else the one PyTorch's wheels ship (its sub-libraries beside it).
if [ -z "${APEX_CUDNN:-}" ] && ! ldconfig -p 2>/dev/null | grep -q "libcudnn.so.9 "; then
  d=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))" 2>/dev/null)
  if [ -n "$d" ] && [ -e "$d/libcudnn.so.9" ]; then
    export APEX_CUDNN="$d/libcudnn.so.9" LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuDNN: $APEX_CUDNN"
  fi
fi

rc=0
if want test; then
  echo "== test_cuda"
  "$build/tests/test_cuda" 2>&1 | tee "$logs/test_cuda.log"
  rc=$(tail -1 "$logs/test_cuda.log" | grep -q "FAILED" && echo 1 || echo 0)
  grep -q "PASSED" "$logs/test_cuda.log" || rc=1
fi

if want bench; then
  echo "== bench_cuda vs PyTorch"
  "$build/bench/bench_cuda" 2>&1 | tee "$logs/bench_cuda.log"
  python3 "$root/bench/peer_cuda.py" "$build" 2>&1 | tee "$logs/peer_cuda.log"
fi

if want gpt2; then
  # apex's figure is handed to the peer, so that the model is trained once each way; torch.compile's
  # warm-up is bounded inside the script, the whole step by timeout.
  echo "== GPT-2 small training: bench_gpt2_cuda vs PyTorch eager and torch.compile"
  timeout 180 "$build/bench/bench_gpt2_cuda" 2>&1 | tee "$logs/bench_gpt2_cuda.log"
  tps=$(awk '$1 == "bench" && $2 == "gpt2_small_bf16_tokens_per_s" {print $3}' "$logs/bench_gpt2_cuda.log")
  timeout 400 python3 "$root/bench/peer_gpt2.py" "$build" ${tps:+--apex-tokens-per-s "$tps"} --compile-timeout 280 2>&1 |
    tee "$logs/peer_gpt2.log"
fi

if want nccl; then
  echo "== NCCL"
  sh "$root/tests/gpu/run_nccl.sh" "$build" 2>&1 | tee "$logs/nccl.log"
fi
exit "$rc"
