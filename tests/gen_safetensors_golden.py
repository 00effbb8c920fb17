#!/usr/bin/python3
"""Writes tests/data/golden.safetensors, the oracle for test_safetensors.c, straight from the format's
specification (8-byte little-endian header length, compact JSON header padded with spaces to a multiple
of 8, raw little-endian data), with PyTorch only for the f16/bf16 bit patterns. Tensor i holds
(k * 0.25 - 3) for k = 0..numel-1 in its dtype. Run: /usr/bin/python3 tests/gen_safetensors_golden.py"""
import json
import os
import struct

import torch

tensors = [  # name, dtype tag, torch dtype, shape (written in this order)
    ("layer.weight", "F32", torch.float32, [3, 4]),
    ("layer.bias", "F16", torch.float16, [4]),
    ("emb", "BF16", torch.bfloat16, [2, 3, 2]),
    ("scalar", "F32", torch.float32, []),
    ("empty", "F16", torch.float16, [0, 5]),
]
meta = {"format": "pt", "apex.opt_level": "O2"}

header = {"__metadata__": meta}
blobs = []
at = 0
for name, tag, dt, shape in tensors:
    n = 1
    for s in shape:
        n *= s
    values = torch.arange(n, dtype=torch.float64) * 0.25 - 3
    blob = values.to(dt).reshape(-1).view(torch.uint8).numpy().tobytes() if n else b""
    header[name] = {"dtype": tag, "shape": shape, "data_offsets": [at, at + len(blob)]}
    at += len(blob)
    blobs.append(blob)
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "golden.safetensors")
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for b in blobs:
        f.write(b)
print("wrote", out)
