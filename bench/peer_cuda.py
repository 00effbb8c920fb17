#!/usr/bin/python3
"""peer_cuda.py BUILD_DIR [NAME...]: apex's CUDA kernels against PyTorch on the same GPU, in one run.

For each figure this script times PyTorch (CUDA events around a loop, best of 5 rounds after a warm-up)
and runs BUILD_DIR/bench/bench_cuda --time NAME for apex's seconds on the same problem, then prints
    bench NAME_vs_torch VALUE UNIT ratio=R peer=PEER          R = torch time / apex time
Peers: torch.optim.AdamW(fused=True) over 100M parameters in 20 tensors (f32; and bf16 parameters with
f32 master copies, the bf16 gradients widened into the masters' .grad and the masters copied back, what
amp O2 does around the step); torch.nn.functional.layer_norm forward + backward on [16384, R] bf16 with
f32 weight and bias, R = 256..8192; torch.nn.functional.rms_norm the same way at R = 768 and 4096 (its
weight in bf16 where an f32 one would make y f32: y stays in x's dtype, as apex's); torch.matmul on
8192^3 bf16, and x w^T at GPT-2 small's shapes (x [8192, 768], w [N, 768], N = 2304, 3072, 50304). Skipped,
with the reason, without torch or a GPU, and a figure this torch lacks (rms_norm before 2.4). bench_cuda's
LAMB, NovoGrad and AdamP lines have no peer here: PyTorch has no fused step for them (torch.optim has no LAMB or
NovoGrad, and AdamP lives outside it), so their peer is bench_cuda's device copy of the same bytes.
"""
import subprocess
import sys

NP, NT, LN_ROWS = 100_000_000, 20, 16384
LN_COLS, RMS_COLS, GPT2_N = (256, 512, 768, 1024, 2048, 4096, 8192), (768, 4096), (2304, 3072, 50304)


class Skip(Exception):
    """A figure this torch cannot measure; its message says why."""


def skip(name, why):
    print("bench %s_vs_torch skipped: %s" % (name, why), flush=True)


def timed(torch, fn, iters=10):
    fn()
    torch.cuda.synchronize()
    best = 1e30
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3 / iters)
    return best


def adamw(torch, bf16):
    each = NP // NT
    if not bf16:
        ps = [torch.full((each,), 0.5, device="cuda", requires_grad=True) for _ in range(NT)]
        for p in ps:
            p.grad = torch.full_like(p, 1e-3)
        opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=1e-2, fused=True)
        return timed(torch, opt.step)
    model = [torch.full((each,), 0.5, device="cuda", dtype=torch.bfloat16) for _ in range(NT)]
    grads = [torch.full_like(p, 1e-3) for p in model]
    masters = [p.float().requires_grad_() for p in model]
    opt = torch.optim.AdamW(masters, lr=1e-3, weight_decay=1e-2, fused=True)

    def step():
        for m, g in zip(masters, grads):
            m.grad = g.float()
        opt.step()
        torch._foreach_copy_(model, masters)
    return timed(torch, step)


def norm(torch, cols, rms):
    F = torch.nn.functional
    if rms and not hasattr(F, "rms_norm"):
        raise Skip("torch %s has no torch.nn.functional.rms_norm (2.4 and later)" % torch.__version__)
    x = torch.rand(LN_ROWS, cols, device="cuda", dtype=torch.bfloat16).mul_(2).sub_(1).requires_grad_()
    dy = torch.rand_like(x)

    def params(dtype):
        w = torch.full((cols,), 1.1, device="cuda", dtype=dtype, requires_grad=True)
        return w, None if rms else torch.zeros(cols, device="cuda", dtype=dtype, requires_grad=True)

    def fwd(w, b):
        return F.rms_norm(x, (cols,), w, 1e-5) if rms else F.layer_norm(x, (cols,), w, b, 1e-5)
    w, b = params(torch.float32)
    try:
        promoted = fwd(w, b).dtype != x.dtype  # an f32 weight that makes y f32 moves more bytes than apex
    except RuntimeError:  # older PyTorch: mixed bf16 input and f32 weight not accepted
        promoted = True
    if promoted:
        w, b = params(torch.bfloat16)
    return timed(torch, lambda: fwd(w, b).backward(dy), 20)


def matmul(torch, m, k, n, trans_b):
    a = torch.rand(m, k, device="cuda", dtype=torch.bfloat16)
    if trans_b:  # a layer's x w^T, w stored [n, k]
        w = torch.rand(n, k, device="cuda", dtype=torch.bfloat16)
        return timed(torch, lambda: torch.matmul(a, w.t()))
    b = torch.rand(k, n, device="cuda", dtype=torch.bfloat16)
    return timed(torch, lambda: torch.matmul(a, b))


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    wanted = sys.argv[2:]
    figures = {"cuda_adamw_f32_100M": (lambda t: adamw(t, False), 28.0 * NP, "GB/s", "torch.optim.AdamW(fused=True)"),
               "cuda_adamw_bf16_master_100M": (lambda t: adamw(t, True), 28.0 * NP, "GB/s",
                                               "torch AdamW(fused=True) on f32 masters + bf16 copies"),
               "cuda_matmul_bf16_8192": (lambda t: matmul(t, 8192, 8192, 8192, False), 2.0 * 8192 ** 3 / 1e3, "TFLOP/s",
                                         "torch.matmul")}
    for cols in LN_COLS:
        figures["cuda_layer_norm_bf16_%d" % cols] = (lambda t, c=cols: norm(t, c, False), LN_ROWS * cols * 12.0,
                                                     "GB/s", "torch layer_norm fwd+bwd")
    for cols in RMS_COLS:
        figures["cuda_rms_norm_bf16_%d" % cols] = (lambda t, c=cols: norm(t, c, True), LN_ROWS * cols * 12.0,
                                                   "GB/s", "torch rms_norm fwd+bwd")
    for n in GPT2_N:
        figures["cuda_matmul_bf16_m8192_k768_n%d" % n] = (lambda t, n=n: matmul(t, 8192, 768, n, True),
                                                          2.0 * 8192 * 768 * n / 1e3, "TFLOP/s", "torch.matmul x w^T")
    try:
        import torch
    except ImportError as e:
        for n in figures:
            skip(n, "no torch (%s)" % e)
        return
    if not torch.cuda.is_available():
        for n in figures:
            skip(n, "torch sees no GPU")
        return
    for name, (fn, work, unit, peer) in figures.items():
        if wanted and not any(w in name for w in wanted):
            continue
        out = subprocess.run([build + "/bench/bench_cuda", "--time", name], capture_output=True, text=True)
        if out.returncode != 0:
            skip(name, "bench_cuda failed: " + (out.stderr.strip() or out.stdout.strip()))
            continue
        try:
            apex_s = float(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):  # bench_cuda skipped (apex found no GPU) or printed nothing
            skip(name, "bench_cuda gave no time: " + (out.stdout.strip() or out.stderr.strip()))
            continue
        try:
            torch_s = fn(torch)
        except Skip as e:
            skip(name, str(e))
            continue
        torch.cuda.empty_cache()
        print("bench %s_vs_torch %.1f %s ratio=%.2f peer=%s (%.1f %s)" % (
            name, work / apex_s / 1e9, unit, torch_s / apex_s, peer, work / torch_s / 1e9, unit), flush=True)


if __name__ == "__main__":
    main()
