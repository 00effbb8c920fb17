#!/bin/bash
# pack.sh [BUILD_DIR]: run at the project's root on the development machine (Debian 12, CUDA 13.0, no
# GPU needed). Builds apex for sm_90 (H100/H200) in BUILD_DIR (default build-gpu/, through ccache when
# it is installed), then packs into .gpupkg/pkg.tar.xz (git ignores .gpupkg/):
#   - the GPU tests and benchmarks (the list below; a binary this tree does not build is left out and
#     named), apex-train and its GPU test (tools/apex_train/test_device.sh), each binary behind a
#     two-line wrapper that sets LD_LIBRARY_PATH for itself alone, so that the PyTorch peers started
#     beside it never load Debian's libraries;
#   - the Debian libraries they load that a GPU image lacks (OpenBLAS, oneDNN, cJSON, cmocka, Open MPI,
#     hwloc, ...; not glibc, the C++ runtime, CUDA's own libraries or NCCL, which the GPU machine has);
#   - Open MPI's mpirun with its plugins and help files (ompi/, relocated with OPAL_PREFIX), so that
#     run.sh can start test_nccl and apex-train as MPI jobs;
#   - the PyTorch peers (bench/peer_*.py) and the GPT-2 loss-parity script (bench/gpt2_loss_parity.py), tests/data, and Fashion-MNIST (the four .gz files of
#     $APEX_FASHION_MNIST, default /usr/share/datasets/fashion-mnist) for apex-train.
# run.sh beside this file unpacks it on the GPU machine and runs everything (README.md).
set -euo pipefail
B=${1:-build-gpu}
FM=${APEX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
launch=()
if command -v ccache > /dev/null; then
  export CCACHE_DIR=${CCACHE_DIR:-/work/.ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  launch=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
mkdir -p "$B"
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DAPEX_CUDA=ON -DAPEX_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90 "${launch[@]}" > "$B/pack.configure.log" 2>&1 ||
  { tail -20 "$B/pack.configure.log"; exit 1; }
# What run.sh runs: tests/, bench/ and tools/ binaries (those missing from this tree are skipped).
WANT="tests/test_cuda tests/test_backend_ops tests/test_graph_cuda tests/test_multi_tensor tests/test_optim_api
      tests/test_optim_golden tests/test_kernels tests/test_nccl tests/test_ddp tests/test_flash_attention tests/test_syncbn_cuda
      tools/apex-train bench/bench_cuda bench/bench_amp bench/bench_nn bench/bench_scaling
      bench/bench_attention tests/test_cuda_epilogues tests/test_cuda_nn_contract
      tests/test_amp_device tests/test_graph_device bench/bench_gpt2_stack bench/gpt2_loss_dump tests/test_generate
      tests/test_capture tests/test_index tests/test_half_grads tests/test_mlp_fusion"
have=$(cmake --build "$B" --target help 2> /dev/null | sed -n 's/^\.\.\. \([A-Za-z0-9_-]*\).*/\1/p')
targets=() skipped=""
for b in $WANT; do
  n=$(basename "$b")
  if grep -qx "$n" <<< "$have"; then targets+=("$n"); else skipped="$skipped $n"; fi
done
echo "pack.sh: building ${#targets[@]} targets in $B (not in this tree:${skipped:- none})"
nice -n5 cmake --build "$B" -j"${JOBS:-$(nproc)}" --target "${targets[@]}" > "$B/pack.build.log" 2>&1 || { grep -E "error|Error" "$B/pack.build.log" | head -20; exit 1; }
grep -E "warning:" "$B/pack.build.log" | head -5 || true

P=$(mktemp -d)
trap 'rm -rf "$P"' EXIT
mkdir -p "$P"/{lib,real,build/bench,build/tests,build/tools,src/bench,src/tests,src/tools/apex_train,data}
for b in $WANT; do
  [ -x "$B/$b" ] || continue
  n=$(basename "$b")
  cp "$B/$b" "$P/real/$n"
  # the package's root is two folders above the wrapper (build/tests/x), wherever it was unpacked
  printf '#!/bin/sh\ng=$(cd "$(dirname "$0")/../.." && pwd)\nexport LD_LIBRARY_PATH=$g/lib${APEX_CUDA_LIBS:+:$APEX_CUDA_LIBS}\nexec "$g/real/%s" "$@"\n' "$n" > "$P/build/$(dirname "$b")/$n"
  chmod +x "$P/build/$(dirname "$b")/$n"
done
# Open MPI: mpirun/orted and the libraries, plugins (MCA and PMIx components) and help files it loads,
# under a prefix that OPAL_PREFIX relocates (run.sh sets it).
OMPI_LIBDIR=/usr/lib/x86_64-linux-gnu/openmpi/lib
if command -v orterun > /dev/null && [ -d "$OMPI_LIBDIR/openmpi3" ]; then
  O=$P/ompi
  mkdir -p "$O/bin" "$O/lib/x86_64-linux-gnu/openmpi/lib" "$O/share" "$O/etc"
  for t in orterun orted; do cp -L "$(command -v $t)" "$O/bin/"; done
  ln -s orterun "$O/bin/mpirun"
  cp -a "$OMPI_LIBDIR/openmpi3" "$O/lib/x86_64-linux-gnu/openmpi/lib/"
  cp -a /usr/share/openmpi "$O/share/"
  [ -d /usr/share/pmix ] && cp -a /usr/share/pmix "$O/share/"
  [ -d /usr/lib/x86_64-linux-gnu/pmix2 ] && mkdir -p "$O/lib/x86_64-linux-gnu" && cp -a /usr/lib/x86_64-linux-gnu/pmix2 "$O/lib/x86_64-linux-gnu/"
  [ -f /etc/openmpi/openmpi-mca-params.conf ] && cp /etc/openmpi/openmpi-mca-params.conf "$O/etc/"
  cp -L "$(command -v orterun)" "$P/real/orterun" # for ldd below
fi
# Every library the binaries and plugins load, less glibc's, the C++ runtime, CUDA's own and NCCL.
{
  for f in "$P"/real/*; do ldd "$f"; done
  [ -d "$P/ompi" ] && find "$P/ompi" -name "*.so" -exec ldd {} \; 2> /dev/null
} | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/libcu|/libnccl|/libcudnn|/libnv' |
  while read -r l; do cp -L "$l" "$P/lib/"; done
rm -f "$P/real/orterun"
cp bench/peer_*.py bench/gpt2_loss_parity.py "$P/src/bench/"
cp -a tests/data "$P/src/tests/"
cp tools/apex_train/test_device.sh tools/apex_train/test_lib.sh "$P/src/tools/apex_train/"
if ls "$FM"/*.gz > /dev/null 2>&1; then
  mkdir -p "$P/data/fashion-mnist" && cp "$FM"/*.gz "$P/data/fashion-mnist/"
else
  echo "pack.sh: warning: no Fashion-MNIST in $FM: apex-train's GPU checks will skip"
fi
git rev-parse --short HEAD > "$P/COMMIT" 2> /dev/null || echo unknown > "$P/COMMIT"
git status --porcelain --untracked-files=no | grep -q . && echo "+local changes" >> "$P/COMMIT" || true
# One xz stream with a dictionary larger than the binaries: they share most of their bytes (libapex and
# its CUDA kernels), which a 160 MiB window finds (63 MB at xz -6, about 50 MB so; 1 GB of memory to
# pack, 160 MiB to unpack). Fashion-MNIST (30 MB of gzip) is most of what is left.
mkdir -p .gpupkg && (cd "$P" && tar cf - . | xz -T1 --lzma2=preset=6,dict=160MiB > "$OLDPWD/.gpupkg/pkg.tar.xz")
echo "pack.sh: $(du -h .gpupkg/pkg.tar.xz | cut -f1) in .gpupkg/pkg.tar.xz: $(ls "$P/real" | tr '\n' ' ')"
[ -z "$skipped" ] || echo "pack.sh: not built here:$skipped"
