#!/bin/sh
# run_all.sh [BUILD_DIR]: every GPU check of the CUDA issue, for a lent GPU machine (the device tool's
# `run`): builds apex with CUDA (Release, for this GPU's architecture only), then runs test_cuda (the
# device, allocator, streams and events), test_backend_ops (every case on every backend, the parity
# cases of backend_parity_cases.h among them: each CUDA kernel against the CPU) and test_graph_cuda
# (autograd on a CUDA graph against the CPU graph), the GPU benchmarks bench_cuda with the PyTorch peer (bench/peer_cuda.py, same GPU, same run),
# GPT-2 small training (bench_gpt2_stack against bench/peer_gpt2.py: PyTorch eager autocast and
# torch.compile) and the NCCL test (run_nccl.sh).
# STEPS="test bench gpt2 nccl" (the default; "build" alone only builds) picks the steps; a failing step
# does not stop the others. One `run` is limited to 600 s, so run the steps as separate calls made back to
# back (STEPS=test, then STEPS=gpt2, then STEPS=bench): the build folder (BUILD_DIR, default build-gpu/,
# ignored by git) survives only while the machine is warm, and each call rebuilds nothing then. Every step
# prints its seconds. Without OpenBLAS, cJSON or cmocka on the machine, carry .gpudeps
# (tests/gpu/fetch_deps.sh fills it here): they are unpacked under /tmp/apex-deps and used instead.
# Logs go to $OUT when it is set (the device tool brings that folder back), else to BUILD_DIR. Exit
# status: 1 when test_cuda, test_backend_ops or test_graph_cuda failed or the build failed, else 0.
set -u
steps=${STEPS:-test bench gpt2 nccl}
want() { case " $(echo "$steps" | tr ',' ' ') " in *" $1 "*) return 0 ;; esac; return 1; }
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}
logs=${OUT:-$build}
mkdir -p "$logs"
t0=$(date +%s)
since() { echo "   ($1: $(($(date +%s) - t0)) s since the start)"; }
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L

# Carried Debian packages (see fetch_deps.sh): unpacked once per machine, used when the system lacks them.
deps=/tmp/apex-deps
if ls "$root"/.gpudeps/*.deb >/dev/null 2>&1 && [ ! -e "$deps/.done" ]; then
  for f in "$root"/.gpudeps/*.deb; do dpkg -x "$f" "$deps" || exit 1; done
  touch "$deps/.done"
fi
dlib=$deps/usr/lib/x86_64-linux-gnu

# One architecture (this GPU's, e.g. 90 on an H100) halves nvcc's work; CUDA_ARCH overrides.
arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')}
configure() {
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DAPEX_CUDA=ON ${arch:+-DCMAKE_CUDA_ARCHITECTURES=$arch} "$@" \
    > "$logs/configure.log" 2>&1
}
configure_deps() { # against the unpacked packages alone (pkg-config sees only theirs, their paths under $deps)
  export LD_LIBRARY_PATH="$dlib/openblas-pthread:$dlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" # for the programs too
  PKG_CONFIG_LIBDIR="$dlib/pkgconfig:$deps/usr/share/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$deps" configure \
    -DPKG_CONFIG_EXECUTABLE="$(command -v pkg-config || echo "$deps/usr/bin/pkgconf")" -DCMAKE_PREFIX_PATH="$deps/usr" \
    -DBLAS_LIBRARIES="$dlib/openblas-pthread/libopenblas.so" \
    -DCMAKE_C_FLAGS="-I$deps/usr/include/x86_64-linux-gnu/openblas-pthread -I$deps/usr/include"
}
if [ -e "$deps/.done" ] && grep -q "$deps" "$build/CMakeCache.txt" 2>/dev/null; then
  configure_deps || { tail -30 "$logs/configure.log"; exit 1; }
elif ! configure; then
  if [ -e "$deps/.done" ]; then
    echo "configuring against the system's libraries failed; using the carried ones under $deps"
    rm -f "$build/CMakeCache.txt"
    configure_deps || { tail -30 "$logs/configure.log"; exit 1; }
  else
    tail -30 "$logs/configure.log"
    echo "configure failed; if OpenBLAS, cJSON or cmocka is missing, run tests/gpu/fetch_deps.sh here and carry .gpudeps"
    exit 1
  fi
fi
since "configured"
[ "$steps" = configure ] && exit 0 # for checking the configure step alone
cmake --build "$build" -j"${JOBS:-$(nproc)}" --target ${TARGETS:-test_cuda test_backend_ops test_graph_cuda bench_cuda bench_gpt2_stack} > "$logs/build.log" 2>&1 ||
  { grep -E -A3 "error" "$logs/build.log" | head -40; exit 1; }
since "built"

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
  for t in test_cuda test_backend_ops test_graph_cuda; do
    echo "== $t"
    timeout 420 "$build/tests/$t" 2>&1 | tee "$logs/$t.log"
    tail -1 "$logs/$t.log" | grep -q "FAILED" && rc=1
    grep -q "PASSED" "$logs/$t.log" || rc=1
    since "$t"
  done
fi

if want bench; then
  echo "== bench_cuda vs PyTorch"
  timeout 280 "$build/bench/bench_cuda" 2>&1 | tee "$logs/bench_cuda.log"
  timeout 280 python3 "$root/bench/peer_cuda.py" "$build" 2>&1 | tee "$logs/peer_cuda.log"
  since "bench"
fi

if want gpt2; then
  # apex's figure is handed to the peer, so that the model is trained once each way; torch.compile's
  # warm-up is bounded inside the script, the whole step by timeout.
  echo "== GPT-2 small training: bench_gpt2_stack (the library) vs PyTorch eager and torch.compile"
  timeout 150 "$build/bench/bench_gpt2_stack" 2>&1 | tee "$logs/bench_gpt2_stack.log"
  tps=$(awk '$1 == "bench" && $2 == "gpt2_stack_bf16_tokens_per_s" {print $3}' "$logs/bench_gpt2_stack.log")
  timeout 330 python3 "$root/bench/peer_gpt2.py" "$build" ${tps:+--apex-tokens-per-s "$tps"} --compile-timeout 240 2>&1 |
    tee "$logs/peer_gpt2.log"
  since "gpt2"
fi

if want nccl; then
  echo "== NCCL"
  sh "$root/tests/gpu/run_nccl.sh" "$build" 2>&1 | tee "$logs/nccl.log"
fi
exit "$rc"
