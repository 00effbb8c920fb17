#!/bin/sh
# run_nccl.sh [BUILD_DIR]: on a machine with an NVIDIA GPU, builds apex (Release; CUDA, MPI and NCCL
# found as CMake finds them) and runs the NCCL process-group test: one rank on GPU 0, which must
# pass (a skip there means the GPU, MPI or NCCL was not usable: the reason is printed), then two
# ranks under mpirun, which need two GPUs and report "skipped" (exit 77) with fewer.
# BUILD_DIR defaults to build-gpu/ beside the sources. JOBS sets the build parallelism.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release | grep -E "apex:|CUDA|MPI" || true
cmake --build "$build" -j"${JOBS:-$(nproc)}" --target test_nccl || exit 1

echo "== test_nccl, 1 rank"
"$build/tests/test_nccl"
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "test_nccl at 1 rank: exit $rc (77 = skipped; on a GPU machine that is a failure)"
  exit 1
fi

echo "== test_nccl, 2 ranks (needs 2 GPUs)"
"$root/tests/mpirun_test.sh" 2 "$build/tests/test_nccl"
rc=$?
case $rc in
  0) echo "test_nccl: 1 rank passed, 2 ranks passed" ;;
  77) echo "test_nccl: 1 rank passed, 2 ranks skipped (fewer GPUs than ranks)" ;;
  *) echo "test_nccl at 2 ranks: exit $rc"; exit 1 ;;
esac
