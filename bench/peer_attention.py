#!/usr/bin/python3
"""peer_attention.py [BUILD_DIR] [--apex-ms-1024 X --apex-ms-2048 Y]: causal attention, apex's fused kernel
against PyTorch's scaled_dot_product_attention(is_causal=True), forward + backward, on the same GPU.

Shapes as bench/bench_attention.c: B = 8, H = 12, head dim 64, T = 1024 and 2048, bf16. PyTorch gets its
best layout: q, k, v contiguous [B, H, T, d] leaves, gradients by torch.autograd.grad (no accumulation into
.grad); apex reads the heads in place from a packed qkv [B, T, 3C] and writes a packed dqkv. Timing as
apex's: 20 iterations between two synchronisations, best of 5 rounds, host clock. apex's figure comes
from BUILD_DIR/bench/bench_attention --time, or from --apex-ms-T when the caller has it. Prints
    bench attention_T_fwdbwd_vs_torch APEX_MS ms ratio=R peer=...    R = torch ms / apex ms (>= 1: apex faster)
    bench attention_T_fwd_vs_torch APEX_MS ms ratio=R peer=...       the same for the forward alone
and PyTorch's own milliseconds and TFLOP/s (FlashAttention's count: 3.5 x 4 B H T^2 d / 2). Skipped, with
the reason, without torch or a GPU.
"""
import argparse
import subprocess
import sys
import time

B, H, D = 8, 12, 64


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build", nargs="?", default="build")
    p.add_argument("--apex-ms-1024", type=float, default=None)
    p.add_argument("--apex-ms-2048", type=float, default=None)
    p.add_argument("--iters", type=int, default=20)
    return p.parse_args()


def apex_times(args):
    """({T: fwd+bwd ms}, {T: fwd ms}, why): the library's default road, from bench_attention --time."""
    given = {1024: args.apex_ms_1024, 2048: args.apex_ms_2048}
    fwd = {}
    if all(v is not None for v in given.values()):
        return given, fwd, None
    try:
        out = subprocess.run([args.build + "/bench/bench_attention", "--time"], capture_output=True, text=True,
                             timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return given, fwd, "bench_attention --time did not run: %s" % e
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) in (2, 3) and parts[0].isdigit():
            t = int(parts[0])
            if given.get(t) is None:
                given[t] = float(parts[1])
            if len(parts) == 3:
                fwd[t] = float(parts[2])
    if any(v is None for v in given.values()):
        return given, fwd, "bench_attention --time printed: %s" % (out.stdout.strip() or out.stderr.strip())[-300:]
    return given, fwd, None


def main():
    args = parse()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print("bench attention_1024_fwdbwd_vs_torch skipped: no torch (%s)" % e)
        return 0
    if not torch.cuda.is_available():
        print("bench attention_1024_fwdbwd_vs_torch skipped: torch sees no CUDA GPU")
        return 0
    apex_ms, apex_fwd_ms, why = apex_times(args)
    if why:
        print("# apex's figure: %s" % why)
    dev = torch.cuda.get_device_name(0)
    print("# peer_attention on %s: torch %s, SDPA backends flash=%s mem_efficient=%s" % (
        dev, torch.__version__, torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled()))
    for t in (1024, 2048):
        g = torch.Generator(device="cuda").manual_seed(t)
        q, k, v = [(torch.rand(B, H, t, D, device="cuda", generator=g) * 3 - 1.5).to(torch.bfloat16).requires_grad_()
                   for _ in range(3)]
        dy = (torch.rand(B, H, t, D, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)

        def step():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(y, (q, k, v), dy)

        def forward():  # with autograd on, as apex's forward keeps its statistics for a backward
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def best_of(fn):
            fn()
            torch.cuda.synchronize()
            best = 1e30
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    fn()
                torch.cuda.synchronize()
                best = min(best, (time.perf_counter() - t0) / args.iters)
            return best

        best = best_of(step)
        torch_ms, torch_fwd_ms = 1e3 * best, 1e3 * best_of(forward)
        flops = 3.5 * 4.0 * B * H * t * t * D / 2
        print("bench attention_%d_torch_sdpa_fwdbwd_ms %.4f ms (%.1f TFLOP/s)" % (t, torch_ms, flops / best / 1e12))
        a = apex_ms.get(t)
        if a:
            print("bench attention_%d_fwdbwd_vs_torch %.4f ms ratio=%.3f peer=torch SDPA is_causal fwd+bwd %.4f ms "
                  "(apex %.1f TFLOP/s)" % (t, a, torch_ms / a, torch_ms, flops / (a / 1e3) / 1e12), flush=True)
        else:
            print("bench attention_%d_fwdbwd_vs_torch skipped: no apex figure" % t, flush=True)
        af = apex_fwd_ms.get(t)
        print("bench attention_%d_torch_sdpa_fwd_ms %.4f ms" % (t, torch_fwd_ms))
        if af:
            print("bench attention_%d_fwd_vs_torch %.4f ms ratio=%.3f peer=torch SDPA is_causal forward %.4f ms" % (
                t, af, torch_fwd_ms / af, torch_fwd_ms), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
