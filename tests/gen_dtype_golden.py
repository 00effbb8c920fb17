#!/usr/bin/python3
"""Writes tests/data/dtype_golden.bin: PyTorch's f32 -> f16 and f32 -> bf16 conversions of special
values and random bit patterns, the oracle for test_dtype.c. NaNs are left out (PyTorch canonicalises
bf16 NaNs; apex keeps their sign and payload). Layout: u32 count, then count x (u32 f32 bits,
u16 f16 bits, u16 bf16 bits), little-endian. Run: /usr/bin/python3 tests/gen_dtype_golden.py"""
import os
import struct

import torch

g = torch.Generator().manual_seed(1234)
specials = [0x00000000, 0x80000000, 0x3F800000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001,
            0x7F800000, 0xFF800000, 0x33000000, 0x33000001, 0x33800000, 0x387FC000, 0x387FE000,
            0x38800000, 0x00000001, 0x00008000, 0x00018000, 0x7F7FFFFF, 0x3F808000, 0x3F818000]
bits = torch.randint(-2**31, 2**31, (6000,), generator=g, dtype=torch.int64)
# Values near the f16 range too, where random bit patterns rarely land.
near = (torch.rand(2000, generator=g) * 2 - 1) * 70000
near_bits = near.view(torch.int32).to(torch.int64)
allbits = torch.tensor(specials, dtype=torch.int64).tolist() + bits.tolist() + near_bits.tolist()
f = torch.tensor([b & 0xFFFFFFFF for b in allbits], dtype=torch.int64).to(torch.int32).view(torch.float32)
keep = ~torch.isnan(f)
f = f[keep]
h = f.to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
b = f.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
x = f.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "dtype_golden.bin")
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "wb") as fh:
    fh.write(struct.pack("<I", len(x)))
    for xi, hi, bi in zip(x.tolist(), h.tolist(), b.tolist()):
        fh.write(struct.pack("<IHH", xi, hi, bi))
print("wrote", out, len(x), "values")
