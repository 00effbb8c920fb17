#!/usr/bin/env bash
# redetect.sh SOURCE_DIR CC: the automatic choices follow what is installed (cmake/apex_choices.cmake).
# A build directory is configured with MPI hidden (CMAKE_DISABLE_FIND_PACKAGE_MPI, as before
# `scripts/deps` installed Open MPI), then configured again with MPI present: the status line says
# MPI was found and turns on --distributed, the cache holds AUTO (not the OFF an option() kept), and
# the apex-train built there has MPI: outside mpirun it asks for mpirun instead of saying the build has
# no MPI, and under `mpirun -np 2` it trains on both ranks. Skipped (77) where MPI is not installed.
set -uo pipefail
src=$1
cc=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL $*"; exit 1; }
b="$work/build"
common=(-DCMAKE_BUILD_TYPE=Release -DAPEX_BUILD_TESTS=OFF -DAPEX_BUILD_BENCH=OFF -DAPEX_CUDA=OFF -DCMAKE_C_COMPILER="$cc")

out=$(cmake -S "$src" -B "$b" "${common[@]}" -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON 2>&1) || fail "configure with MPI hidden: $out"
line=$(grep -- "-- apex: CUDA" <<< "$out")
grep -q "MPI not found" <<< "$line" || fail "MPI hidden, yet: $line"
grep -q "^APEX_MPI:STRING=AUTO$" "$b/CMakeCache.txt" || fail "the cache after a miss: $(grep '^APEX_MPI' "$b/CMakeCache.txt")"
echo "ok   MPI hidden: $line"

out=$(cmake -S "$src" -B "$b" -UCMAKE_DISABLE_FIND_PACKAGE_MPI 2>&1) || fail "reconfigure: $out"
line=$(grep -- "-- apex: CUDA" <<< "$out")
if grep -q "MPI not found" <<< "$line"; then
  echo "skipped: MPI is not installed here, so there is nothing to re-detect ($line)"
  exit 77
fi
grep -q "MPI found: --distributed" <<< "$line" || fail "MPI present, yet: $line"
echo "ok   the same build directory, MPI present: $line"

cmake --build "$b" --target apex-train -j2 > "$work/build.log" 2>&1 || { tail -20 "$work/build.log"; fail "building apex-train"; }
bin="$b/tools/apex-train"
cd "$work"
err=$("$bin" --distributed --model gpt --steps 1 2>&1 > /dev/null)
grep -q "not started by mpirun" <<< "$err" || fail "apex-train --distributed outside mpirun: $err"
echo "ok   its apex-train has MPI: $err"
if command -v mpirun > /dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  out=$(mpirun -np 2 "$bin" --distributed --model gpt --steps 2 --threads 1 --batch-size 2 --seq-len 16 --sample-bytes 4 2>&1) ||
    fail "mpirun -np 2 apex-train --distributed: $out"
  grep -q "identical on all 2 ranks" <<< "$out" || fail "two ranks: $out"
  echo "ok   mpirun -np 2 apex-train --distributed: $(grep 'identical on all 2 ranks' <<< "$out")"
fi
echo "0 failures"
