#!/usr/bin/env bash
# bench/setup_peers.sh: installs today's PyTorch (and DeepSpeed, for its CPU Adam) from PyPI into
# .peers/ (a venv, gitignored), the peers bench/run measures apex against. A venv of its own keeps
# Debian's torch 1.13 (/usr/bin/python3) as the golden-file oracle of the tests; the library,
# scripts/test and apex-train never use .peers/. Safe to rerun; PEERS_DIR overrides the folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${PEERS_DIR:-$root/.peers}
[ -x "$dir/bin/python" ] || /usr/bin/python3 -m venv "$dir"
pip=("$dir/bin/python" -m pip install --disable-pip-version-check --no-input)
# The CPU-only wheel (~200 MB) where PyTorch's index is reachable; PyPI's default wheel otherwise
# (it pulls the CUDA libraries, several GB, which the CPU benchmarks never load).
if ! timeout 600 "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu torch; then
  echo "setup_peers: PyTorch's CPU index unreachable; installing torch from PyPI (with its CUDA dependencies)" >&2
  "${pip[@]}" torch
fi
# DeepSpeed builds its CPU Adam op (C++, with ninja) on first use, in ~/.cache/torch_extensions.
"${pip[@]}" numpy ninja py-cpuinfo deepspeed
"$dir/bin/python" -c 'import torch; print("setup_peers: torch", torch.__version__, "in", torch.__file__)'
"$dir/bin/python" -c 'import deepspeed; print("setup_peers: deepspeed", deepspeed.__version__)' \
  || echo "setup_peers: deepspeed did not import; optim_adamw_f32 will skip its peer" >&2
