#!/usr/bin/env bash
# check.sh SOURCE_DIR BUILD_DIR CC: installs the built apex into a temporary prefix, then builds and runs
# a consumer program twice: with CMake's find_package(apex), and with pkg-config (shared and static).
set -euo pipefail
src=$1
build=$2
cc=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
CC="$cc" cmake -S "$src/tests/install" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib" "$work/consumer/consumer"
libdir=$(dirname "$(find "$work/prefix" -name apex.pc | head -n 1)")
export PKG_CONFIG_PATH="$libdir"
"$cc" "$src/tests/install/consumer.c" -o "$work/pc_shared" $(pkg-config --cflags --libs apex)
LD_LIBRARY_PATH="$work/prefix/lib" "$work/pc_shared"
# Static: the same flags with -lapex pinned to the archive (-l:libapex.a) and the private libraries added.
"$cc" "$src/tests/install/consumer.c" -o "$work/pc_static" $(pkg-config --cflags apex) \
  $(pkg-config --static --libs apex | sed 's/-lapex\b/-l:libapex.a/')
"$work/pc_static"
echo "install check: find_package and pkg-config (shared, static) consumers ran"
