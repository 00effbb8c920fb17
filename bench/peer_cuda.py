#!/usr/bin/python3
"""peer_cuda.py BUILD_DIR [NAME...]: apex's CUDA kernels against PyTorch on the same GPU, in one run.

For each figure this script times PyTorch (CUDA events around a loop, best of 5 rounds after a warm-up)
and runs BUILD_DIR/bench/bench_cuda --time NAME for apex's seconds on the same problem, then prints
    bench NAME_vs_torch VALUE UNIT ratio=R peer=PEER          R = torch time / apex time
Peers: torch.optim.AdamW(fused=True) over 100M parameters in 20 tensors (f32; and bf16 parameters with
f32 master copies, the bf16 gradients widened into the masters' .grad and the masters copied back, what
amp O2 does around the step); torch.nn.functional.layer_norm forward + backward on [16384, R] bf16 with
f32 weight and bias; torch.matmul on 8192^3 bf16. Skipped, with the reason, without torch or a GPU.
"""
import subprocess
import sys

NP, NT, LN_ROWS = 100_000_000, 20, 16384


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


def layer_norm(torch, cols):
    x = torch.rand(LN_ROWS, cols, device="cuda", dtype=torch.bfloat16).mul_(2).sub_(1).requires_grad_()
    w = torch.full((cols,), 1.1, device="cuda", requires_grad=True)
    b = torch.zeros(cols, device="cuda", requires_grad=True)
    dy = torch.rand_like(x)

    def step():
        y = torch.nn.functional.layer_norm(x, (cols,), w.to(torch.bfloat16) if False else w, b, 1e-5)
        y.backward(dy)
    try:
        return timed(torch, step, 20)
    except RuntimeError:  # older PyTorch: mixed bf16 input and f32 weight not accepted
        w2, b2 = w.to(torch.bfloat16).detach().requires_grad_(), b.to(torch.bfloat16).detach().requires_grad_()
        return timed(torch, lambda: torch.nn.functional.layer_norm(x, (cols,), w2, b2, 1e-5).backward(dy), 20)


def matmul(torch):
    a = torch.rand(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.rand(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return timed(torch, lambda: torch.matmul(a, b))


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    wanted = sys.argv[2:]
    figures = {"cuda_adamw_f32_100M": (lambda t: adamw(t, False), 28.0 * NP, "GB/s", "torch.optim.AdamW(fused=True)"),
               "cuda_adamw_bf16_master_100M": (lambda t: adamw(t, True), 28.0 * NP, "GB/s",
                                               "torch AdamW(fused=True) on f32 masters + bf16 copies"),
               "cuda_matmul_bf16_8192": (matmul, 2.0 * 8192 ** 3 / 1e3, "TFLOP/s", "torch.matmul")}
    for cols in (768, 1024, 2048, 4096, 8192):
        figures["cuda_layer_norm_bf16_%d" % cols] = (lambda t, c=cols: layer_norm(t, c), LN_ROWS * cols * 12.0,
                                                     "GB/s", "torch layer_norm fwd+bwd")
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
        apex_s = float(out.stdout.strip().splitlines()[-1])
        torch_s = fn(torch)
        torch.cuda.empty_cache()
        print("bench %s_vs_torch %.1f %s ratio=%.2f peer=%s (%.1f %s)" % (
            name, work / apex_s / 1e9, unit, torch_s / apex_s, peer, work / torch_s / 1e9, unit), flush=True)


if __name__ == "__main__":
    main()
