#!/bin/sh
# fetch_deps.sh: downloads (here, where Debian's archive is reachable) the Debian packages apex builds
# against but a GPU machine's image may lack (OpenBLAS with its Fortran runtime, cJSON, cmocka,
# pkg-config, zlib's headers) into .gpudeps/ beside the sources, which git ignores. A device `run`
# that names .gpudeps in its carry (about 15 MiB) lets tests/gpu/run_all.sh unpack them (dpkg -x
# into /tmp/apex-deps, never into /) when configuring against the system's libraries fails.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/.gpudeps"
cd "$root/.gpudeps"
apt-get download libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0 \
  libcjson-dev libcjson1 libcmocka-dev libcmocka0 pkgconf-bin libpkgconf3 zlib1g-dev
du -sh "$root/.gpudeps"
