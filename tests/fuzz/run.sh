#!/usr/bin/env bash
# run.sh SOURCE_DIR [SECONDS]: builds the safetensors reader with clang's libFuzzer + AddressSanitizer
# + UBSan and fuzzes it for SECONDS (default 60), starting from the golden file and tests/fuzz/corpus
# (valid seeds and one malformed file per rule of the format; made by tests/fuzz/make_corpus.py).
# Exits 77 (ctest: skipped) when clang or its fuzzer runtime is missing; non-zero on any crash.
set -euo pipefail
src=$1
seconds=${2:-60}
clang=$(command -v clang || command -v clang-14 || true)
if [ -z "$clang" ]; then echo "skipped: clang is not installed (apt-get install clang)"; exit 77; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$src/include" -I"$src/src"
       -D_POSIX_C_SOURCE=200809L -DAPEX_HAVE_X86=0 $(pkg-config --cflags libcjson))
if ! echo 'int LLVMFuzzerTestOneInput(const char*d,long n){(void)d;(void)n;return 0;}' \
     | "$clang" -x c -fsanitize=fuzzer - -o "$work/probe" 2>/dev/null; then
  echo "skipped: clang has no libFuzzer runtime (apt-get install libclang-rt-14-dev)"; exit 77
fi
# The reader and the core it uses (host memory only); the AVX2 fast path is left out (APEX_HAVE_X86=0:
# portable path).
sources=("$src/src/io/safetensors.c" "$src/src/io/json_strict.c" "$src/src/core/status.c" "$src/src/core/tensor.c" "$src/src/core/releasable.c" "$src/src/core/convert.c" "$src/src/core/cpu.c"
         "$src/src/core/host_memory.c")
"$clang" "${flags[@]}" "${sources[@]}" "$src/tests/fuzz/fuzz_safetensors.c" -o "$work/fuzz" $(pkg-config --libs libcjson) -lm
mkdir -p "$work/corpus"
cp "$src/tests/data/golden.safetensors" "$src"/tests/fuzz/corpus/* "$work/corpus/"
# 80,000 one-element tensors (header ~5 MB): past -max_len, so run once on its own, where a reader
# that is quadratic in the tensor count runs into -timeout (the quadratic reader took over 60 s here
# under the sanitizers, the n log n one 0.9 s).
perl -e 'my $n = 80000;
        my $h = "{" . join(",", map { sprintf("\"t%d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}", $_, 4 * $_, 4 * $_ + 4) } 0 .. $n - 1) . "}";
        $h .= " " x ((8 - length($h) % 8) % 8);
        print pack("Q<", length($h)), $h, "\0" x (4 * $n);' > "$work/many_tensors"
"$work/fuzz" -timeout=20 "$work/many_tensors" 2>&1 | tail -n 5
"$work/fuzz" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$work/corpus" 2>&1 | tail -n 15
echo "fuzz: no crash in ${seconds}s"
