#!/bin/sh
# mpirun_test.sh NP PROGRAM [ARGS]: runs a test program on NP ranks with mpirun (used by
# tests/test_parallel.cmake and tests/test_ddp.cmake). Without mpirun it says why and exits 77, which
# ctest reports as skipped (SKIP_RETURN_CODE); the plain run of the same program covers its local
# cases and skips its MPI ones with the reason.
np=$1
shift
if ! command -v mpirun >/dev/null 2>&1; then
  echo "skipped: mpirun is not on PATH (Debian: apt-get install openmpi-bin)"
  exit 77
fi
# Open MPI refuses root and more ranks than cores unless told; these variables are ignored elsewhere.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI's initialisation leaks by design; ASan's leak check would fail every rank at exit.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
exec mpirun -np "$np" "$@"
