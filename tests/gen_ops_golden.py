#!/usr/bin/python3
"""gen_ops_golden.py: PyTorch's forward and backward values for the op cases of tests/nn_cases.h.

Run with Debian's python3-torch (CPU): /usr/bin/python3 tests/gen_ops_golden.py
Writes tests/data/nn_ops_golden.bin, read by tests/test_nn_golden.c.

For each case and each dtype (f32, f16, bf16) the inputs are rounded to the dtype, the op runs in
PyTorch in f32 (apex's ops accumulate in f32 too), L = sum(out * R) with R[i] = sin(0.7 i + 0.3) is
run backward, and the output and input gradients are rounded to the dtype. So the f16/bf16 values are
"f32 math on the rounded inputs, rounded once", which is what apex promises within a few ulp.

File format (little-endian), a sequence of records:
  u32 name length, name bytes, u32 ndim, i64 shape[ndim], f32 data[prod(shape)]
Names: "<case>.in<k>" (f32 inputs, before rounding), "<case>.<dtype>.out", "<case>.<dtype>.grad<k>".
Dropout is left out: PyTorch's generator is not apex's, so its masks differ by design.
"""
import math
import os
import struct

import torch
import torch.nn.functional as F

torch.manual_seed(1234)
CE_TARGETS = torch.tensor([0, 3, 1, 2, 3, 0])
EMB_IDS = torch.tensor([2, 0, 2, 4, 1])
BN_MEAN = torch.tensor([0.2, -0.1])
BN_VAR = torch.tensor([0.5, 2.0])


def rms_norm(x, w, eps=1e-5, dims=(-1,)):
    return x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps) * w


def causal_attention(q, k, v):
    t, d = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v


# name, function, input shapes, positive-input mask (bit k: input k in [0.1, 0.9]); as in nn_cases.h
CASES = [
    ("add", lambda a, b: a + b, [(2, 3, 4), (3, 1)], 0),
    ("sub", lambda a, b: a - b, [(3, 4), (4,)], 0),
    ("mul", lambda a, b: a * b, [(2, 1, 4), (1, 3, 4)], 0),
    ("div", lambda a, b: a / b, [(3, 4), (3, 4)], 2),
    ("scale", lambda x: x * -1.5, [(3, 5)], 0),
    ("relu", F.relu, [(4, 5)], 0),
    ("gelu", F.gelu, [(4, 5)], 0),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), [(4, 5)], 0),
    ("tanh", torch.tanh, [(4, 5)], 0),
    ("sigmoid", torch.sigmoid, [(4, 5)], 0),
    ("matmul", torch.matmul, [(2, 3, 4), (4, 5)], 0),
    ("matmul_batched", torch.matmul, [(2, 3, 4), (2, 4, 2)], 0),
    ("linear", F.linear, [(3, 4), (5, 4), (5,)], 0),
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 1)), [(2, 2, 5, 4), (3, 2, 3, 2), (3,)], 0),
    ("max_pool2d", lambda x: F.max_pool2d(x, (3, 2), stride=(2, 2), padding=(1, 0)), [(2, 2, 5, 4)], 0),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, (2, 3), stride=(1, 2), padding=(0, 1)), [(2, 2, 4, 5)], 0),
    ("batch_norm_train", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [(3, 2, 2, 3), (2,), (2,)], 0),
    ("batch_norm_eval", lambda x, w, b: F.batch_norm(x, BN_MEAN, BN_VAR, w, b, training=False), [(3, 2, 4), (2,), (2,)], 0),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (5,), w, b, 1e-5), [(2, 3, 5), (5,), (5,)], 0),
    ("rms_norm", rms_norm, [(4, 6), (6,)], 0),
    ("embedding", lambda w: F.embedding(EMB_IDS, w), [(5, 3)], 0),
    ("softmax", lambda x: torch.softmax(x, 1), [(2, 4, 3)], 0),
    ("log_softmax", lambda x: torch.log_softmax(x, -1), [(3, 5)], 0),
    ("cross_entropy", lambda x: F.cross_entropy(x, CE_TARGETS, ignore_index=2, label_smoothing=0.1), [(6, 4)], 0),
    ("cross_entropy_none", lambda x: F.cross_entropy(x, CE_TARGETS, reduction="none"), [(6, 4)], 0),
    ("mse_loss", F.mse_loss, [(3, 4), (3, 4)], 0),
    ("bce_with_logits", lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction="sum"), [(3, 4), (3, 4)], 2),
    ("bce", lambda p, y: F.binary_cross_entropy(p, y, reduction="none"), [(3, 4), (3, 4)], 3),
    ("sum_all", torch.sum, [(2, 3, 4)], 0),
    ("mean_dim", lambda x: x.mean(1, keepdim=True), [(2, 3, 4)], 0),
    ("sum_dim", lambda x: x.sum(-1), [(2, 3, 4)], 0),
    ("reshape", lambda x, y: x.reshape(-1, 4) * y, [(2, 3, 4), (6, 4)], 0),
    ("permute", lambda x: x.permute(2, 0, 1), [(2, 3, 4)], 0),
    ("transpose", lambda x: x.transpose(0, 1), [(3, 5)], 0),
    ("concat", lambda a, b, c: torch.cat([a, b, c], 1), [(2, 3), (2, 1), (2, 2)], 0),
    ("causal_attention", causal_attention, [(1, 2, 4, 3)] * 3, 0),
    # issue #4: concat of more than four inputs, norms over several trailing dims (appended, so the
    # cases above draw the same inputs as before)
    ("concat_many", lambda *xs: torch.cat(xs, 0), [(1, 3), (2, 3), (1, 3), (3, 3), (1, 3), (2, 3)], 0),
    ("concat_mid", lambda *xs: torch.cat(xs, -2), [(2, 1, 3), (2, 2, 3), (2, 1, 3), (2, 3, 3), (2, 1, 3)], 0),
    ("layer_norm_2d", lambda x, w, b: F.layer_norm(x, (3, 4), w, b, 1e-5), [(2, 3, 4), (3, 4), (3, 4)], 0),
    ("rms_norm_3d", lambda x, w: rms_norm(x, w, dims=(-3, -2, -1)), [(2, 2, 3, 2), (2, 3, 2)], 0),
    # issue #5: exp, log, pow and the L2 norm (Apex's FP32 list), appended for the same reason
    ("exp", torch.exp, [(4, 5)], 0),
    ("log", torch.log, [(4, 5)], 1),
    ("pow2", lambda x: torch.pow(x, 2.0), [(3, 4)], 0),
    ("pow_half", lambda x: torch.pow(x, 0.5), [(3, 4)], 1),
    ("pow3", lambda x: torch.pow(x, 3.0), [(3, 4)], 0),
    ("pow_tensor", torch.pow, [(3, 4), (4,)], 3),
    ("norm_all", torch.linalg.vector_norm, [(2, 3, 4)], 0),
    ("norm_dim", lambda x: torch.norm(x, 2, 1, keepdim=True), [(2, 3, 4)], 0),
    ("norm_last", lambda x: torch.norm(x, 2, -1), [(3, 5)], 0),
]

DTYPES = [("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)]


def draw(shape, positive):
    u = torch.rand(shape)
    if positive:
        return 0.1 + 0.8 * u
    return torch.where(u < 0.5, -1.0, 1.0) * (0.15 + 1.7 * (u - 0.5).abs())


def record(f, name, t):
    t = t.detach().float().contiguous()
    nb = name.encode()
    f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<I", t.dim()))
    f.write(struct.pack("<%dq" % t.dim(), *t.shape))
    f.write(t.numpy().astype("<f4").tobytes())


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "nn_ops_golden.bin")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "wb") as f:
        for name, fn, shapes, positive in CASES:
            xs = [draw(s, positive >> k & 1) for k, s in enumerate(shapes)]
            for k, x in enumerate(xs):
                record(f, "%s.in%d" % (name, k), x)
            for dname, dt in DTYPES:
                ins = [x.to(dt).float().detach().clone().requires_grad_(True) for x in xs]
                y = fn(*ins)
                r = torch.sin(0.7 * torch.arange(y.numel(), dtype=torch.float64) + 0.3).float().reshape(y.shape)
                (y * r).sum().backward()
                record(f, "%s.%s.out" % (name, dname), y.to(dt))
                for k, x in enumerate(ins):
                    record(f, "%s.%s.grad%d" % (name, dname, k), x.grad.to(dt))
    print("wrote", out)


if __name__ == "__main__":
    main()
