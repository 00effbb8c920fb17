#!/usr/bin/env bash
# check.sh SOURCE_DIR BUILD_DIR CC: installs the built apex into a temporary prefix, then checks what the
# README promises of an install:
#  - a program built with CMake's find_package(apex) runs, with no LD_LIBRARY_PATH;
#  - a program built with the README's pkg-config line runs with no LD_LIBRARY_PATH (the .pc carries an
#    rpath) and loads libapex.so.0 from the prefix; static linking through pkg-config --static works;
#  - bin/apex-train is installed and a bare `apex-train` runs from the prefix's bin/ on the PATH.
set -euo pipefail
src=$1
build=$2
cc=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The programs must find libapex through what the install gives them, not through the caller's paths.
unset LD_LIBRARY_PATH
fail() { echo "install check: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$work/prefix" >/dev/null

# 1. find_package(apex)
CC="$cc" cmake -S "$src/tests/install" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer" || fail "the find_package consumer failed"

# 2. the README's line: cc myprog.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs apex)
pcdir=$(dirname "$(find "$work/prefix" -name apex.pc | head -n 1)")
"$cc" "$src/tests/install/consumer.c" -o "$work/pc_shared" $(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs apex)
# ldd's output is taken whole before grep reads it: `ldd | grep -q` under pipefail fails when grep
# exits at its match while ldd is still writing (SIGPIPE), which a loaded machine makes happen.
libs=$(ldd "$work/pc_shared")
grep -q "libapex\.so\.0 => $work/prefix/" <<< "$libs" \
  || fail "the pkg-config program does not load libapex.so.0 from the prefix: $(grep libapex <<< "$libs")"
"$work/pc_shared" || fail "the pkg-config consumer failed"
# Static: the same flags with -lapex pinned to the archive (-l:libapex.a) and the private libraries added.
"$cc" "$src/tests/install/consumer.c" -o "$work/pc_static" $(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags apex) \
  $(PKG_CONFIG_PATH="$pcdir" pkg-config --static --libs apex | sed 's/-lapex\b/-l:libapex.a/')
libs=$(ldd "$work/pc_static" || true)   # "not a dynamic executable" is fine here
if grep -q libapex <<< "$libs"; then fail "the static consumer links libapex.so"; fi
"$work/pc_static" || fail "the static consumer failed"

# 3. apex-train, called bare as the README does: --help lists the flags and a bad flag is refused.
[ -x "$work/prefix/bin/apex-train" ] || fail "bin/apex-train was not installed"
help=$(PATH="$work/prefix/bin:$PATH" apex-train --help) || fail "apex-train --help failed"
grep -q -- "--model" <<< "$help" || fail "apex-train --help does not list --model: $help"
if PATH="$work/prefix/bin:$PATH" apex-train --no-such-flag 2>/dev/null; then fail "apex-train accepted --no-such-flag"; fi
echo "install check: find_package and pkg-config (shared with rpath, static) consumers ran; apex-train runs from bin/"
